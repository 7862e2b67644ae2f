package server

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"github.com/ardanlabs/jinja"

	"github.com/parleyhq/parley/runtime/decode/grammar"
)

// toolFormat is how a chat template's model writes tool calls, read from the template's source.
type toolFormat int

const (
	// formatJSON: Llama 3.x, the whole answer one JSON object {"name", "parameters"} (or
	// "arguments"), after an optional <|python_tag|>; several separated by ";".
	formatJSON toolFormat = iota
	// formatHermes: Hermes and Qwen, each call a JSON object {"name", "arguments"} between
	// <tool_call> and </tool_call>, text around them the answer's content.
	formatHermes
	// formatMistral: Mistral, [TOOL_CALLS] (a control token, absent from the text) then a JSON
	// array of {"name", "arguments"}.
	formatMistral
)

// toolFormatOf says how the model of template src writes tool calls.
func toolFormatOf(src string) toolFormat {
	switch {
	case strings.Contains(src, "<tool_call>"):
		return formatHermes
	case strings.Contains(src, "[TOOL_CALLS]"):
		return formatMistral
	}
	return formatJSON
}

// toolDef is one function a request offers.
type toolDef struct {
	name   string
	params json.RawMessage // its parameters' JSON Schema
}

// tools is what a chat request says about tools, validated.
type tools struct {
	defs     []toolDef
	raw      []any  // the tools as sent, for the template
	choice   string // auto, none, required or function (named)
	named    string // the function tool_choice names
	parallel bool   // several calls in one answer
	format   toolFormat
}

// active reports whether the answer may hold tool calls.
func (t *tools) active() bool { return t != nil && t.choice != "none" }

// forced reports whether the answer must be tool calls.
func (t *tools) forced() bool { return t != nil && (t.choice == "required" || t.choice == "function") }

var toolName = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// parseTools reads tools, tool_choice and parallel_tool_calls; nil when no tools are offered.
func parseTools(rawTools, rawChoice json.RawMessage, parallel *bool) (*tools, *apiError) {
	choice, named := "auto", ""
	if !isNull(rawChoice) {
		var s string
		var obj struct {
			Type     string `json:"type"`
			Function *struct {
				Name string `json:"name"`
			} `json:"function"`
		}
		switch {
		case json.Unmarshal(rawChoice, &s) == nil:
			if s != "none" && s != "auto" && s != "required" {
				return nil, invalid("tool_choice", fmt.Sprintf("Invalid 'tool_choice': expected none, auto, required or a function, but got %q.", s))
			}
			choice = s
		case json.Unmarshal(rawChoice, &obj) == nil && obj.Type == "function" && obj.Function != nil && obj.Function.Name != "":
			choice, named = "function", obj.Function.Name
		default:
			return nil, invalid("tool_choice", `Invalid 'tool_choice': expected "none", "auto", "required" or {"type": "function", "function": {"name": ...}}.`)
		}
	}
	if isNull(rawTools) {
		if choice == "required" || choice == "function" {
			return nil, invalid("tool_choice", "Invalid 'tool_choice': tools must be given when 'tool_choice' is required or names a function.")
		}
		return nil, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(rawTools, &list); err != nil {
		return nil, invalid("tools", "Invalid 'tools': expected an array of tools.")
	}
	if len(list) == 0 {
		if choice == "required" || choice == "function" {
			return nil, invalid("tool_choice", "Invalid 'tool_choice': tools must be given when 'tool_choice' is required or names a function.")
		}
		return nil, nil
	}
	t := &tools{choice: choice, named: named, parallel: parallel == nil || *parallel}
	seen := map[string]bool{}
	for i, raw := range list {
		param := fmt.Sprintf("tools[%d]", i)
		var td struct {
			Type     string `json:"type"`
			Function *struct {
				Name       string          `json:"name"`
				Parameters json.RawMessage `json:"parameters"`
			} `json:"function"`
		}
		if err := json.Unmarshal(raw, &td); err != nil || td.Type != "function" || td.Function == nil {
			return nil, invalid(param, fmt.Sprintf("Invalid '%s': expected {\"type\": \"function\", \"function\": {...}}.", param))
		}
		if !toolName.MatchString(td.Function.Name) {
			return nil, invalid(param+".function.name", fmt.Sprintf("Invalid '%s.function.name': %q must be 1 to 64 letters, digits, underscores or dashes.", param, td.Function.Name))
		}
		if seen[td.Function.Name] {
			return nil, invalid(param+".function.name", fmt.Sprintf("Invalid '%s.function.name': %q is given twice.", param, td.Function.Name))
		}
		seen[td.Function.Name] = true
		params := td.Function.Parameters
		if isNull(params) {
			params = json.RawMessage(`{"type":"object","properties":{}}`)
		} else if p, e := compactSchema(param+".function.parameters", params); e != nil {
			return nil, e
		} else {
			params = p
		}
		var v any
		d := json.NewDecoder(bytes.NewReader(raw))
		d.UseNumber()
		d.Decode(&v)
		t.defs = append(t.defs, toolDef{name: td.Function.Name, params: params})
		t.raw = append(t.raw, v)
	}
	if named != "" && !seen[named] {
		return nil, invalid("tool_choice", fmt.Sprintf("Invalid 'tool_choice': function %q is not among the tools.", named))
	}
	return t, nil
}

// callSchema is the JSON Schema of one call of the offered functions (the named one, when
// tool_choice names it): {"name": its name, key: its arguments}.
func (t *tools) callSchema(key string) []byte {
	var alts []string
	for _, d := range t.defs {
		if t.named != "" && d.name != t.named {
			continue
		}
		n, _ := json.Marshal(d.name)
		alts = append(alts, fmt.Sprintf(`{"type":"object","properties":{"name":{"const":%s},%q:%s},"required":["name",%q],"additionalProperties":false}`, n, key, d.params, key))
	}
	if len(alts) == 1 {
		return []byte(alts[0])
	}
	return []byte(`{"anyOf":[` + strings.Join(alts, ",") + `]}`)
}

var rootRule = regexp.MustCompile(`(?m)^root ::=`)

// grammar is the GBNF of the answer that tool_choice required or a named function forces: the
// calls written as the model's format writes them, each call's arguments valid against its
// function's parameters.
func (t *tools) grammar() (string, *apiError) {
	key := "arguments"
	if t.format == formatJSON {
		key = "parameters"
	}
	call := t.callSchema(key)
	schema := call
	if t.format == formatMistral {
		most := ""
		if !t.parallel {
			most = `,"maxItems":1`
		}
		schema = []byte(`{"type":"array","items":` + string(call) + `,"minItems":1` + most + `}`)
	}
	g, err := grammar.SchemaToGBNF(schema)
	if err != nil {
		return "", grammarError(&constraint{param: "tools"}, err)
	}
	if t.format != formatHermes {
		return g, nil
	}
	g = rootRule.ReplaceAllString(g, "tool-call-body ::=")
	more := ""
	if t.parallel {
		more = ` ("\n" tool-call)*`
	}
	return "root ::= tool-call" + more + "\ntool-call ::= \"<tool_call>\\n\" tool-call-body \"\\n</tool_call>\"\n" + g, nil
}

// toolCall is one call the model made.
type toolCall struct {
	ID       string           `json:"id"`
	Type     string           `json:"type"`
	Function toolCallFunction `json:"function"`
}

type toolCallFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"` // JSON text
}

func newCallID() string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 24)
	rand.Read(b)
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return "call_" + string(b)
}

// call reads one call object {"name", "arguments" or "parameters"} of an offered function.
func (t *tools) call(raw []byte) (toolCall, bool) {
	var c struct {
		Name       string          `json:"name"`
		Arguments  json.RawMessage `json:"arguments"`
		Parameters json.RawMessage `json:"parameters"`
	}
	if json.Unmarshal(raw, &c) != nil || c.Name == "" {
		return toolCall{}, false
	}
	known := false
	for _, d := range t.defs {
		known = known || d.name == c.Name
	}
	if !known {
		return toolCall{}, false
	}
	args := c.Arguments
	if isNull(args) {
		args = c.Parameters
	}
	if isNull(args) {
		args = json.RawMessage("{}")
	}
	var s string
	if json.Unmarshal(args, &s) == nil { // arguments given as a JSON string
		args = json.RawMessage(s)
	}
	var b bytes.Buffer
	if json.Compact(&b, args) != nil {
		return toolCall{}, false
	}
	return toolCall{ID: newCallID(), Type: "function", Function: toolCallFunction{Name: c.Name, Arguments: b.String()}}, true
}

var hermesCall = regexp.MustCompile(`(?s)<tool_call>\s*(.*?)\s*(?:</tool_call>|$)`)

// parse splits an answer into its content and the tool calls it makes, as the model's format
// writes them; text that does not parse as calls stays content.
func (t *tools) parse(text string) (string, []toolCall) {
	var calls []toolCall
	content := text
	switch t.format {
	case formatHermes:
		for _, m := range hermesCall.FindAllStringSubmatch(text, -1) {
			if c, ok := t.call([]byte(m[1])); ok {
				calls = append(calls, c)
			}
		}
		if len(calls) > 0 {
			content = strings.TrimSpace(hermesCall.ReplaceAllString(text, ""))
		}
	case formatMistral:
		s := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(text), "[TOOL_CALLS]"))
		var list []json.RawMessage
		if json.Unmarshal([]byte(s), &list) == nil {
			for _, raw := range list {
				if c, ok := t.call(raw); ok {
					calls = append(calls, c)
				}
			}
		}
		if len(calls) > 0 {
			content = ""
		}
	default:
		s := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(text), "<|python_tag|>"))
		for _, part := range splitCalls(s) {
			c, ok := t.call([]byte(part))
			if !ok {
				calls = nil
				break
			}
			calls = append(calls, c)
		}
		if len(calls) > 0 {
			content = ""
		}
	}
	if !t.parallel && len(calls) > 1 {
		calls = calls[:1]
	}
	return content, calls
}

// splitCalls splits s into the JSON values it holds one after another, separated by ";" or
// white space; nil when it holds anything else.
func splitCalls(s string) []string {
	var out []string
	d := json.NewDecoder(strings.NewReader(s))
	for {
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			if d.More() || len(out) == 0 {
				return nil
			}
			break
		}
		out = append(out, string(v))
		rest := strings.TrimLeft(s[d.InputOffset():], " \t\r\n;")
		if rest == "" {
			break
		}
		d = json.NewDecoder(strings.NewReader(rest))
		s = rest
	}
	return out
}

// toolCallsValue turns an assistant message's tool_calls into template values, each call's
// arguments an object (parsed from their JSON text) as Hugging Face templates expect them.
func toolCallsValue(calls []toolCall) jinja.Value {
	list := make([]any, len(calls))
	for i, c := range calls {
		var args any = c.Function.Arguments
		d := json.NewDecoder(strings.NewReader(c.Function.Arguments))
		d.UseNumber()
		var v any
		if d.Decode(&v) == nil {
			args = v
		}
		list[i] = map[string]any{"id": c.ID, "type": "function", "function": map[string]any{"name": c.Function.Name, "arguments": args}}
	}
	return jinja.FromGoValue(list)
}
