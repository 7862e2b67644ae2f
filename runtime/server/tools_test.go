package server

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/parleyhq/parley/runtime/sched"
)

// Chat templates with a tool section in each family's format, for the stories model.
const (
	hermesTemplate = `{%- if tools %}<|system|>{% for tool in tools %}{{ tool.function.name }} {% endfor %}<tool_call></tool_call>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|assistant|>{% for tc in m.tool_calls %}<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>{% endfor %}
{% elif m.role == 'tool' %}<|tool|><tool_response>{{ m.tool_call_id }}: {{ m.content }}</tool_response>
{% else %}<|{{ m.role }}|>{{ m.content }}
{% endif %}
{%- endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}`
	llama3Template = `{%- if tools %}<|system|>{% for tool in tools %}{{ tool.function.name }} {% endfor %}
{% endif %}{%- for m in messages %}<|{{ m.role }}|>{% if m.tool_calls %}{{ m.tool_calls[0].function | tojson }}{% else %}{{ m.content }}{% endif %}
{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}`
	mistralTemplate = `{%- for m in messages %}{% if m.role == 'user' %}{% if tools and loop.last %}[AVAILABLE_TOOLS]{% for tool in tools %}{{ tool.function.name }} {% endfor %}[/AVAILABLE_TOOLS]{% endif %}[INST]{{ m.content }}[/INST]{% elif m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls | tojson }}{% else %}{{ m.content }}{% endif %}{% endfor %}`
)

const weatherTools = `[
 {"type":"function","function":{"name":"get_weather","description":"Weather in a city","parameters":{"type":"object","properties":{"city":{"type":"string","maxLength":8},"unit":{"enum":["c","f"]}},"required":["city","unit"],"additionalProperties":false}}},
 {"type":"function","function":{"name":"add","parameters":{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"integer"}},"required":["a","b"],"additionalProperties":false}}}
]`

// newToolsHarness serves the stories model as "hermes", "llama3" and "mistral", each with a
// chat template of that family.
func newToolsHarness(t *testing.T) *harness {
	t.Helper()
	p := modelPath(t)
	var ms []*Model
	for _, c := range []struct{ name, tmpl string }{{"hermes", hermesTemplate}, {"llama3", llama3Template}, {"mistral", mistralTemplate}} {
		e := openLLM(t, withTemplate(t, p, c.tmpl))
		s, _ := newSched(t, e, sched.Config{}, true)
		ms = append(ms, llmModel(c.name, e, s, testCtx))
	}
	h := &harness{}
	var err error
	if h.s, err = New(Config{}, ms); err != nil {
		t.Fatal(err)
	}
	h.s.SetReady(true)
	h.srv = httptest.NewServer(h.s.Handler())
	t.Cleanup(h.srv.Close)
	return h
}

type gotCall struct{ id, name, args string }

// chatCalls reads each choice's content, tool calls and finish reason from a response or,
// assembled as a client assembles them, from a stream.
func chatCalls(t *testing.T, b []byte, stream bool) (contents []*string, calls [][]gotCall, finish []string) {
	t.Helper()
	grow := func(i int) {
		for len(calls) <= i {
			contents, calls, finish = append(contents, nil), append(calls, nil), append(finish, "")
		}
	}
	for _, c := range responseChunks(t, b, stream) {
		var r struct {
			Choices []struct {
				Index        int
				FinishReason *string `json:"finish_reason"`
				Message      *struct {
					Content   *string
					ToolCalls []struct {
						ID, Type string
						Function struct{ Name, Arguments string }
					} `json:"tool_calls"`
				}
				Delta *struct {
					Content   *string
					ToolCalls []struct {
						Index    int
						ID, Type string
						Function struct{ Name, Arguments string }
					} `json:"tool_calls"`
				}
			}
		}
		if err := json.Unmarshal([]byte(c), &r); err != nil {
			t.Fatalf("%v: %s", err, c)
		}
		for _, ch := range r.Choices {
			grow(ch.Index)
			if ch.FinishReason != nil {
				finish[ch.Index] = *ch.FinishReason
			}
			if m := ch.Message; m != nil {
				contents[ch.Index] = m.Content
				for _, tc := range m.ToolCalls {
					if tc.Type != "function" {
						t.Errorf("tool call type %q", tc.Type)
					}
					calls[ch.Index] = append(calls[ch.Index], gotCall{tc.ID, tc.Function.Name, tc.Function.Arguments})
				}
			}
			if d := ch.Delta; d != nil {
				if d.Content != nil && *d.Content != "" {
					s := ""
					if contents[ch.Index] != nil {
						s = *contents[ch.Index]
					}
					s += *d.Content
					contents[ch.Index] = &s
				}
				for _, tc := range d.ToolCalls {
					cs := calls[ch.Index]
					for len(cs) <= tc.Index {
						cs = append(cs, gotCall{})
					}
					if tc.ID != "" {
						cs[tc.Index].id, cs[tc.Index].name = tc.ID, tc.Function.Name
					}
					cs[tc.Index].args += tc.Function.Arguments
					calls[ch.Index] = cs
				}
			}
		}
	}
	return contents, calls, finish
}

// checkCall validates a call's arguments against its function's parameters by hand.
func checkCall(c gotCall) error {
	if !strings.HasPrefix(c.id, "call_") {
		return fmt.Errorf("id %q", c.id)
	}
	var args map[string]any
	d := json.NewDecoder(strings.NewReader(c.args))
	d.UseNumber()
	if err := d.Decode(&args); err != nil {
		return fmt.Errorf("arguments %q: %v", c.args, err)
	}
	switch c.name {
	case "get_weather":
		city, ok := args["city"].(string)
		unit, _ := args["unit"].(string)
		if !ok || len([]rune(city)) > 8 || (unit != "c" && unit != "f") || len(args) != 2 {
			return fmt.Errorf("get_weather arguments %s", c.args)
		}
	case "add":
		a, oka := args["a"].(json.Number)
		b, okb := args["b"].(json.Number)
		if !oka || !okb || strings.ContainsAny(string(a)+string(b), ".eE") || len(args) != 2 {
			return fmt.Errorf("add arguments %s", c.args)
		}
	default:
		return fmt.Errorf("function %q", c.name)
	}
	return nil
}

// TestForcedToolCalls: with tool_choice required or naming a function, every family's answer is
// tool calls whose arguments validate, streamed or not; a stream assembles to the calls of the
// same request answered whole; parallel_tool_calls false gives one call.
func TestForcedToolCalls(t *testing.T) {
	h := newToolsHarness(t)
	msgs := []any{
		map[string]any{"role": "user", "content": "Rome?"},
		map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "c1", "type": "function", "function": map[string]any{"name": "get_weather", "arguments": `{"city":"Rome","unit":"c"}`}}}},
		map[string]any{"role": "tool", "tool_call_id": "c1", "content": "21"},
		map[string]any{"role": "user", "content": "2+2?"},
	}
	for _, model := range []string{"hermes", "llama3", "mistral"} {
		for _, choice := range []any{"required", map[string]any{"type": "function", "function": map[string]any{"name": "add"}}} {
			for _, parallel := range []bool{true, false} {
				name := fmt.Sprintf("%s %v parallel=%v", model, choice, parallel)
				var whole [][]gotCall
				for _, stream := range []bool{false, true} {
					req := map[string]any{"model": model, "messages": msgs, "tools": json.RawMessage(weatherTools), "tool_choice": choice,
						"parallel_tool_calls": parallel, "temperature": 0, "n": 2, "stream": stream}
					resp, b := h.post(t, "/v1/chat/completions", req)
					if resp.StatusCode != 200 {
						t.Fatalf("%s: status %d: %s", name, resp.StatusCode, b)
					}
					contents, calls, finish := chatCalls(t, b, stream)
					if len(calls) != 2 {
						t.Fatalf("%s: %d choices", name, len(calls))
					}
					for i := range calls {
						if finish[i] != "tool_calls" || len(calls[i]) == 0 || (!parallel && len(calls[i]) != 1) {
							t.Errorf("%s stream=%v choice %d: finish %q, %d calls, content %v: %s", name, stream, i, finish[i], len(calls[i]), contents[i], b)
							continue
						}
						if contents[i] != nil && *contents[i] != "" {
							t.Errorf("%s: content %q beside the calls", name, *contents[i])
						}
						for _, c := range calls[i] {
							if err := checkCall(c); err != nil {
								t.Errorf("%s stream=%v choice %d: %v", name, stream, i, err)
							}
							if _, ok := choice.(map[string]any); ok && c.name != "add" {
								t.Errorf("%s: called %s, not the named add", name, c.name)
							}
						}
					}
					if !stream {
						whole = calls
						continue
					}
					for i := range calls {
						for k := range calls[i] {
							if k >= len(whole[i]) || calls[i][k].name != whole[i][k].name || calls[i][k].args != whole[i][k].args {
								t.Errorf("%s choice %d: streamed calls %v, whole %v", name, i, calls[i], whole[i])
							}
						}
					}
				}
			}
		}
	}
}

// TestToolChoiceAutoAndNone: with auto the answer is content or calls, never both broken; with
// none it is content, and the template gets no tools.
func TestToolChoiceAutoAndNone(t *testing.T) {
	h := newToolsHarness(t)
	msgs := []any{map[string]any{"role": "user", "content": "Weather in Paris?"}}
	for _, choice := range []string{"auto", "none"} {
		for _, stream := range []bool{false, true} {
			resp, b := h.post(t, "/v1/chat/completions", map[string]any{"model": "hermes", "messages": msgs, "tools": json.RawMessage(weatherTools),
				"tool_choice": choice, "max_tokens": 20, "temperature": 0, "stream": stream})
			if resp.StatusCode != 200 {
				t.Fatalf("%s: %d %s", choice, resp.StatusCode, b)
			}
			contents, calls, finish := chatCalls(t, b, stream)
			if len(calls[0]) > 0 && (choice == "none" || finish[0] != "tool_calls") || len(calls[0]) == 0 && (contents[0] == nil || finish[0] == "tool_calls") {
				t.Errorf("%s stream=%v: content %v calls %v finish %q", choice, stream, contents[0], calls[0], finish[0])
			}
		}
	}
}

// TestToolTemplate: tools, an assistant's tool calls (arguments as an object) and a tool's answer
// reach the template as apply_chat_template passes them.
func TestToolTemplate(t *testing.T) {
	tmpl, err := parseChatTemplate(`{% for tool in tools %}{{ tool | tojson }}{% endfor %}`+hermesTemplate, "<s>", "</s>")
	if err != nil {
		t.Fatal(err)
	}
	tl, e := parseTools(json.RawMessage(weatherTools), nil, nil)
	if e != nil {
		t.Fatal(e)
	}
	msgs := []message{
		{Role: "user", Content: "Weather?"},
		{Role: "assistant", ToolCalls: []toolCall{{ID: "call_1", Type: "function", Function: toolCallFunction{Name: "get_weather", Arguments: `{"city":"Oslo","unit":"c"}`}}}},
		{Role: "tool", ToolCallID: "call_1", Content: "-3"},
	}
	out, err := tmpl.renderTools(msgs, tl.raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`{"function": {"description": "Weather in a city", "name": "get_weather", "parameters": {"additionalProperties": false, "properties": {"city": {"maxLength": 8, "type": "string"}`,
		`{"function": {"name": "add", "parameters"`, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": \"c\"}}\n</tool_call>", "<tool_response>call_1: -3</tool_response>", "<|assistant|>"} {
		if !strings.Contains(out, want) {
			t.Errorf("rendered template lacks %q:\n%s", want, out)
		}
	}
}

// TestParseToolCalls: each family's way of writing calls, with text around them, several calls,
// unknown functions and text that only looks like a call.
func TestParseToolCalls(t *testing.T) {
	tl, e := parseTools(json.RawMessage(weatherTools), nil, nil)
	if e != nil {
		t.Fatal(e)
	}
	cases := []struct {
		format  toolFormat
		text    string
		content string
		calls   []string // name:arguments
	}{
		{formatHermes, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"unit\": \"c\"}}\n</tool_call>", "Let me check.", []string{`get_weather:{"city":"Oslo","unit":"c"}`}},
		{formatHermes, "<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":1,\"b\":2}}</tool_call>\n<tool_call>{\"name\":\"add\",\"arguments\":{\"a\":3,\"b\":4}}</tool_call>", "", []string{`add:{"a":1,"b":2}`, `add:{"a":3,"b":4}`}},
		{formatHermes, "<tool_call>{\"name\":\"nope\",\"arguments\":{}}</tool_call>", "<tool_call>{\"name\":\"nope\",\"arguments\":{}}</tool_call>", nil},
		{formatHermes, "just text", "just text", nil},
		{formatJSON, `{"name": "add", "parameters": {"a": 1, "b": 2}}`, "", []string{`add:{"a":1,"b":2}`}},
		{formatJSON, `<|python_tag|>{"name": "add", "arguments": "{\"a\":5,\"b\":6}"}; {"name":"get_weather","parameters":{"city":"x","unit":"f"}}`, "", []string{`add:{"a":5,"b":6}`, `get_weather:{"city":"x","unit":"f"}`}},
		{formatJSON, `{"name": "add"} and more`, `{"name": "add"} and more`, nil},
		{formatJSON, `The answer is {"a": 1}`, `The answer is {"a": 1}`, nil},
		{formatMistral, `[{"name": "add", "arguments": {"a": 1, "b": 2}}]`, "", []string{`add:{"a":1,"b":2}`}},
		{formatMistral, `[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Rome", "unit": "c"}}, {"name":"add","arguments":{"a":0,"b":0}}]`, "", []string{`get_weather:{"city":"Rome","unit":"c"}`, `add:{"a":0,"b":0}`}},
		{formatMistral, `[1, 2]`, `[1, 2]`, nil},
	}
	for _, c := range cases {
		tl.format = c.format
		content, calls := tl.parse(c.text)
		var got []string
		for _, k := range calls {
			got = append(got, k.Function.Name+":"+k.Function.Arguments)
		}
		if content != c.content || strings.Join(got, "|") != strings.Join(c.calls, "|") {
			t.Errorf("format %d %q: content %q calls %v, want %q %v", c.format, c.text, content, got, c.content, c.calls)
		}
	}
}

// TestToolErrors: bad tools and tool choices are 400s naming the field.
func TestToolErrors(t *testing.T) {
	h := newToolsHarness(t)
	const base = `{"model":"hermes","messages":[{"role":"user","content":"hi"}],"max_tokens":4,`
	tools := strings.ReplaceAll(weatherTools, "\n", "")
	cases := []struct{ body, param, code string }{
		{base + `"tools":` + tools + `,"tool_choice":{"type":"function","function":{"name":"absent"}}}`, "tool_choice", ""},
		{base + `"tool_choice":"required"}`, "tool_choice", ""},
		{base + `"tools":` + tools + `,"tool_choice":"sometimes"}`, "tool_choice", ""},
		{base + `"tools":[{"type":"retrieval"}]}`, "tools[0]", ""},
		{base + `"tools":[{"type":"function","function":{"name":"a b"}}]}`, "tools[0].function.name", ""},
		{base + `"tools":[{"type":"function","function":{"name":"f"}},{"type":"function","function":{"name":"f"}}]}`, "tools[1].function.name", ""},
		{base + `"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"string","pattern":"(a)\\1"}}}}}],"tool_choice":"required"}`, "tools", "invalid_json_schema"},
		{base + `"tools":` + tools + `,"tool_choice":"required","response_format":{"type":"json_object"}}`, "tool_choice", ""},
		{`{"model":"hermes","messages":[{"role":"tool","content":"x"}]}`, "messages[0].tool_call_id", ""},
		{`{"model":"hermes","messages":[{"role":"user","content":"x","tool_calls":[]}]}`, "messages[0].tool_calls", ""},
		{`{"model":"hermes","messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"arguments":"{}"}}]}]}`, "messages[0].tool_calls[0].function.name", ""},
	}
	for _, c := range cases {
		h.expectError(t, "/v1/chat/completions", c.body, c.param, c.code)
	}
}
