package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/parleyhq/parley/runtime/decode"
)

// Limits on what one request may ask for.
const (
	maxN          = 16   // choices per request
	maxLogitBias  = 1024 // logit_bias entries
	maxCompletion = 16   // default max_tokens of /v1/completions, as OpenAI's
)

// commonRequest holds the fields /v1/completions and /v1/chat/completions share. Pointers tell
// an absent (or null) field from a zero one.
type commonRequest struct {
	Model               string             `json:"model"`
	MaxTokens           *int               `json:"max_tokens"`
	MaxCompletionTokens *int               `json:"max_completion_tokens"`
	Temperature         *float64           `json:"temperature"`
	TopP                *float64           `json:"top_p"`
	Seed                *int64             `json:"seed"`
	Stop                json.RawMessage    `json:"stop"`
	PresencePenalty     *float64           `json:"presence_penalty"`
	FrequencyPenalty    *float64           `json:"frequency_penalty"`
	LogitBias           map[string]float64 `json:"logit_bias"`
	N                   *int               `json:"n"`
	Stream              bool               `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	TopK      *int     `json:"top_k"`
	MinP      *float64 `json:"min_p"`
	IgnoreEOS bool     `json:"ignore_eos"`
	// Grammar (GBNF) and JSONSchema constrain the output, as llama.cpp's server's fields do.
	Grammar    *string         `json:"grammar"`
	JSONSchema json.RawMessage `json:"json_schema"`
	// KeepAlive is how long an on-demand model stays loaded after this request, as Ollama's
	// keep_alive: a duration string or seconds; 0 unloads it, negative keeps it.
	KeepAlive json.RawMessage `json:"keep_alive"`
}

type completionRequest struct {
	commonRequest
	Prompt   json.RawMessage `json:"prompt"`
	Logprobs *int            `json:"logprobs"`
	Echo     *bool           `json:"echo"` // the prompt before the completion, with its logprobs
	// Not implemented: refused when set to anything but their defaults.
	Suffix *string `json:"suffix"`
	BestOf *int    `json:"best_of"`
}

type chatRequest struct {
	commonRequest
	Messages    json.RawMessage `json:"messages"`
	Logprobs    *bool           `json:"logprobs"`
	TopLogprobs *int            `json:"top_logprobs"`
	// ChatTemplateKwargs are extra variables for the model's chat template (an extension, as in
	// vLLM and llama-server), such as Qwen3's enable_thinking.
	ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs"`
	// ResponseFormat is text, json_object or json_schema (constrain.go).
	ResponseFormat json.RawMessage `json:"response_format"`
	// Tools, ToolChoice and ParallelToolCalls offer functions to call (tools.go).
	Tools             json.RawMessage `json:"tools"`
	ToolChoice        json.RawMessage `json:"tool_choice"`
	ParallelToolCalls *bool           `json:"parallel_tool_calls"`
	// Not implemented: refused when set to anything but their defaults.
	Functions    json.RawMessage `json:"functions"`
	FunctionCall json.RawMessage `json:"function_call"`
	Audio        json.RawMessage `json:"audio"`
	Modalities   json.RawMessage `json:"modalities"`
	Prediction   json.RawMessage `json:"prediction"`
}

// unsupported is the 400 for a parameter this server does not implement, set to a value that
// would change the answer.
func unsupported(param, why string) *apiError {
	return invalidCode(param, "unsupported_parameter", fmt.Sprintf("Unsupported parameter: '%s' %s is not supported by this server.", param, why))
}

func isNull(raw json.RawMessage) bool { return len(raw) == 0 || string(raw) == "null" }

// checkUnsupported refuses the fields of /v1/completions that parley does not implement when
// they ask for something; n is the request's n.
func (c *completionRequest) checkUnsupported(n int) *apiError {
	if c.Suffix != nil && *c.Suffix != "" {
		return unsupported("suffix", "(text after the completion)")
	}
	if c.BestOf != nil {
		if *c.BestOf < 1 || *c.BestOf > maxN {
			return invalid("best_of", fmt.Sprintf("Invalid 'best_of': expected a value in [1, %d], but got %d instead.", maxN, *c.BestOf))
		}
		if *c.BestOf != n {
			return unsupported("best_of", fmt.Sprintf("other than n (%d, got %d)", n, *c.BestOf))
		}
	}
	return nil
}

// nonEmptyArray reports whether raw, not null, is an array with elements; a value of another
// type is a 400.
func nonEmptyArray(param string, raw json.RawMessage) (bool, *apiError) {
	if isNull(raw) {
		return false, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return false, invalid(param, fmt.Sprintf("Invalid type for '%s': expected an array.", param))
	}
	return len(list) > 0, nil
}

// checkUnsupported refuses the fields of /v1/chat/completions that parley does not implement
// (legacy functions, audio, predicted outputs) when they ask for something.
func (c *chatRequest) checkUnsupported() *apiError {
	if yes, e := nonEmptyArray("functions", c.Functions); e != nil || yes {
		if e == nil {
			e = unsupported("functions", "(function calling)")
		}
		return e
	}
	if !isNull(c.FunctionCall) {
		var s string
		if err := json.Unmarshal(c.FunctionCall, &s); err != nil || (s != "none" && s != "auto") {
			return unsupported("function_call", "other than \"none\" or \"auto\"")
		}
	}
	if !isNull(c.Audio) {
		return unsupported("audio", "(audio output)")
	}
	if !isNull(c.Modalities) {
		var list []string
		if err := json.Unmarshal(c.Modalities, &list); err != nil {
			return invalid("modalities", "Invalid type for 'modalities': expected an array of strings.")
		}
		for _, m := range list {
			if m != "text" {
				return unsupported("modalities", fmt.Sprintf("with %q", m))
			}
		}
	}
	if !isNull(c.Prediction) {
		return unsupported("prediction", "(predicted outputs)")
	}
	return nil
}

// decodeBody parses a JSON request body into v, turning every failure into a 400 that names the
// offending field where there is one.
func decodeBody(body []byte, v any) *apiError {
	if !utf8.Valid(body) {
		return invalid("", "The request body is not valid UTF-8.")
	}
	if err := json.Unmarshal(body, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			field := strings.TrimPrefix(te.Field, "commonRequest.")
			if field == "" {
				return invalid("", "The request body must be a JSON object.")
			}
			return invalid(field, fmt.Sprintf("Invalid type for '%s': expected %s, got %s.", field, jsonKind(te.Type.Kind().String()), te.Value))
		}
		return invalid("", "We could not parse the JSON body of your request. The body must be a JSON object.")
	}
	return nil
}

func jsonKind(goKind string) string {
	switch goKind {
	case "int", "int64", "int32", "uint64":
		return "an integer"
	case "float64", "float32":
		return "a number"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "map", "struct":
		return "an object"
	case "slice":
		return "an array"
	}
	return "a different type"
}

// genParams is what a request asks of generation, validated.
type genParams struct {
	maxTokens    int    // 0: not given (or given as 0: see scoreOnly)
	scoreOnly    bool   // max_tokens 0 (allowed with echo only): the prompt, nothing generated
	maxParam     string // the field that gave it: max_tokens or max_completion_tokens
	sampling     decode.Params
	stop         []string
	n            int
	ignoreEOS    bool
	stream       bool
	includeUsage bool
}

// float32In stores the request number v, when given, in dst as a float32, once decode.CheckParam
// finds it in param's range.
func float32In(param string, v *float64, dst *float32) *apiError {
	if v == nil {
		return nil
	}
	if err := decode.CheckParam(param, *v); err != nil {
		return paramError(err)
	}
	*dst = float32(*v)
	return nil
}

// paramError is the 400 of a sampling parameter that decode's request checks refuse.
func paramError(err error) *apiError {
	var pe *decode.ParamError
	if errors.As(err, &pe) {
		return invalid(pe.Param, pe.Error())
	}
	return invalid("", "Invalid sampling parameters: "+err.Error())
}

// parseCommon validates the shared fields against a vocabulary of vocab tokens and a context of
// ctx positions.
func parseCommon(c *commonRequest, vocab, ctx int, seed func() uint64) (*genParams, *apiError) {
	return parseGen(c, vocab, ctx, 1, seed)
}

// parseGen is parseCommon with max_tokens (or max_completion_tokens) allowed from minTokens on:
// 1, or 0 for a completion that echoes its prompt (scoreOnly when it is 0).
func parseGen(c *commonRequest, vocab, ctx, minTokens int, seed func() uint64) (*genParams, *apiError) {
	g := &genParams{n: 1, stream: c.Stream, ignoreEOS: c.IgnoreEOS, maxParam: "max_tokens"}
	if c.StreamOptions != nil && c.Stream {
		g.includeUsage = c.StreamOptions.IncludeUsage
	}
	mt, param := c.MaxTokens, "max_tokens"
	if c.MaxCompletionTokens != nil {
		mt, param = c.MaxCompletionTokens, "max_completion_tokens"
	}
	if mt != nil {
		if *mt < minTokens {
			return nil, invalid(param, fmt.Sprintf("Invalid '%s': integer below minimum value. Expected a value >= %d, but got %d instead.", param, minTokens, *mt))
		}
		g.scoreOnly = *mt == 0
		if *mt > ctx {
			return nil, invalidCode(param, "context_length_exceeded", fmt.Sprintf("Invalid '%s': %d is larger than the model's context of %d tokens.", param, *mt, ctx))
		}
		g.maxTokens, g.maxParam = *mt, param
	}
	if c.N != nil {
		if *c.N < 1 || *c.N > maxN {
			return nil, invalid("n", fmt.Sprintf("Invalid 'n': expected a value in [1, %d], but got %d instead.", maxN, *c.N))
		}
		g.n = *c.N
	}

	p := decode.DefaultParams()
	p.Temperature = 1 // OpenAI's defaults: temperature 1, top_p 1, no top-k or min-p
	p.TopK = 0
	p.TopP = 1
	p.MinP = 0
	p.RepeatPenalty = 1
	p.RepeatLastN = 0
	if e := float32In("temperature", c.Temperature, &p.Temperature); e != nil {
		return nil, e
	}
	if e := float32In("top_p", c.TopP, &p.TopP); e != nil {
		return nil, e
	}
	if v := c.TopK; v != nil && *v > 0 { // 0 or negative (vLLM's -1): no top-k
		p.TopK = *v
	}
	if e := float32In("min_p", c.MinP, &p.MinP); e != nil {
		return nil, e
	}
	if e := float32In("presence_penalty", c.PresencePenalty, &p.PresencePenalty); e != nil {
		return nil, e
	}
	if e := float32In("frequency_penalty", c.FrequencyPenalty, &p.FrequencyPenalty); e != nil {
		return nil, e
	}
	if len(c.LogitBias) > 0 {
		if len(c.LogitBias) > maxLogitBias {
			return nil, invalid("logit_bias", fmt.Sprintf("Invalid 'logit_bias': at most %d entries are allowed.", maxLogitBias))
		}
		p.LogitBias = make(map[int32]float32, len(c.LogitBias))
		for k, v := range c.LogitBias {
			id, err := strconv.ParseInt(k, 10, 32)
			if err != nil {
				return nil, invalid("logit_bias", fmt.Sprintf("Invalid 'logit_bias': key %q is not a token id of this model (0 to %d).", k, vocab-1))
			}
			if err := decode.CheckLogitBias(id, v, vocab); err != nil {
				return nil, paramError(err)
			}
			p.LogitBias[int32(id)] = float32(v)
		}
	}
	if c.Seed != nil {
		p.Seed = uint64(*c.Seed)
	} else {
		p.Seed = seed()
	}
	if err := p.Check(vocab); err != nil { // what the command line checks too
		return nil, paramError(err)
	}
	stop, e := parseStop(c.Stop)
	if e != nil {
		return nil, e
	}
	g.stop = stop
	g.sampling = p
	return g, nil
}

// parseStop reads stop: null, a string, or an array of strings.
func parseStop(raw json.RawMessage) ([]string, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	var list []string
	if err := json.Unmarshal(raw, &one); err == nil {
		list = []string{one}
	} else if err := json.Unmarshal(raw, &list); err != nil {
		return nil, invalid("stop", "Invalid 'stop': expected a string or an array of strings.")
	}
	if len(list) > decode.MaxStopStrings {
		return nil, invalid("stop", fmt.Sprintf("Invalid 'stop': at most %d stop strings are allowed.", decode.MaxStopStrings))
	}
	for _, s := range list {
		if s == "" || len(s) > decode.MaxStopBytes {
			return nil, invalid("stop", fmt.Sprintf("Invalid 'stop': each stop string must hold 1 to %d bytes.", decode.MaxStopBytes))
		}
	}
	return list, nil
}

// promptInput is a completion prompt: text to tokenize, or token ids as given.
type promptInput struct {
	text   string
	tokens []int32
	isText bool
}

// parsePrompt reads prompt: a string, an array of token ids, or an array of several of either
// (a batch: each is generated with n choices of its own).
func parsePrompt(raw json.RawMessage, vocab int) ([]*promptInput, *apiError) {
	if isNull(raw) {
		return nil, invalid("prompt", "Missing required parameter: 'prompt'.")
	}
	if p, e, ok := parseOnePrompt(raw, vocab, "prompt"); ok {
		if e != nil {
			return nil, e
		}
		return []*promptInput{p}, nil
	}
	var batch []json.RawMessage
	if err := json.Unmarshal(raw, &batch); err == nil && len(batch) > 0 {
		out := make([]*promptInput, len(batch))
		for i, b := range batch {
			p, e, ok := parseOnePrompt(b, vocab, fmt.Sprintf("prompt[%d]", i))
			if !ok {
				return nil, invalid("prompt", fmt.Sprintf("Invalid 'prompt[%d]': expected a string or an array of token ids.", i))
			}
			if e != nil {
				return nil, e
			}
			out[i] = p
		}
		return out, nil
	}
	return nil, invalid("prompt", "Invalid 'prompt': expected a string, an array of token ids, or an array of either.")
}

// parseOnePrompt reads raw as one prompt, a string or an array of token ids; ok is false when
// it is neither. Errors name the parameter prompt, what the message.
func parseOnePrompt(raw json.RawMessage, vocab int, what string) (p *promptInput, e *apiError, ok bool) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		if s == "" {
			return nil, invalid("prompt", fmt.Sprintf("Invalid '%s': the prompt must not be empty.", what)), true
		}
		return &promptInput{text: s, isText: true}, nil, true
	}
	var ids []int64
	if err := json.Unmarshal(raw, &ids); err != nil {
		return nil, nil, false
	}
	if len(ids) == 0 {
		return nil, invalid("prompt", fmt.Sprintf("Invalid '%s': the prompt must not be empty.", what)), true
	}
	toks := make([]int32, len(ids))
	for i, id := range ids {
		if id < 0 || id >= int64(vocab) {
			return nil, invalid("prompt", fmt.Sprintf("Invalid '%s': token id %d at index %d is outside the vocabulary (0 to %d).", what, id, i, vocab-1)), true
		}
		toks[i] = int32(id)
	}
	return &promptInput{tokens: toks}, nil, true
}

// chatMessage is one entry of messages as sent.
type chatMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCalls  json.RawMessage `json:"tool_calls"`   // assistant
	ToolCallID string          `json:"tool_call_id"` // tool
	Name       string          `json:"name"`
}

var chatRoles = map[string]bool{"system": true, "developer": true, "user": true, "assistant": true, "tool": true}

// parseMessages reads messages: a non-empty array of {role, content}, content a string, null
// (assistant only) or an array of text parts.
func parseMessages(raw json.RawMessage) ([]message, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, invalid("messages", "Missing required parameter: 'messages'.")
	}
	var list []chatMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, invalid("messages", "Invalid 'messages': expected an array of message objects.")
	}
	if len(list) == 0 {
		return nil, invalid("messages", "Invalid 'messages': empty array. Expected an array with minimum length 1.")
	}
	out := make([]message, len(list))
	for i, m := range list {
		param := fmt.Sprintf("messages[%d]", i)
		if !chatRoles[m.Role] {
			return nil, invalid(param+".role", fmt.Sprintf("Invalid '%s.role': expected one of system, developer, user, assistant, tool, but got %q.", param, m.Role))
		}
		text, e := parseContent(m.Content, m.Role, param+".content")
		if e != nil {
			return nil, e
		}
		out[i] = message{Role: m.Role, Content: text, Name: m.Name, ToolCallID: m.ToolCallID}
		if !isNull(m.ToolCalls) {
			if m.Role != "assistant" {
				return nil, invalid(param+".tool_calls", fmt.Sprintf("Invalid '%s.tool_calls': only assistant messages make tool calls.", param))
			}
			var calls []toolCall
			if err := json.Unmarshal(m.ToolCalls, &calls); err != nil {
				return nil, invalid(param+".tool_calls", fmt.Sprintf("Invalid '%s.tool_calls': expected an array of {id, type, function: {name, arguments}}.", param))
			}
			for k, c := range calls {
				if c.Function.Name == "" {
					return nil, invalid(fmt.Sprintf("%s.tool_calls[%d].function.name", param, k), fmt.Sprintf("Missing required parameter: '%s.tool_calls[%d].function.name'.", param, k))
				}
			}
			out[i].ToolCalls = calls
		}
		if m.Role == "tool" && m.ToolCallID == "" {
			return nil, invalid(param+".tool_call_id", fmt.Sprintf("Missing required parameter: '%s.tool_call_id'.", param))
		}
	}
	return out, nil
}

func parseContent(raw json.RawMessage, role, param string) (string, *apiError) {
	if len(raw) == 0 || string(raw) == "null" {
		if role == "assistant" {
			return "", nil
		}
		return "", invalid(param, fmt.Sprintf("Missing required parameter: '%s'.", param))
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string  `json:"type"`
		Text *string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", invalid(param, fmt.Sprintf("Invalid '%s': expected a string or an array of content parts.", param))
	}
	var b strings.Builder
	for j, p := range parts {
		if p.Type != "text" || p.Text == nil {
			return "", invalid(fmt.Sprintf("%s[%d]", param, j), fmt.Sprintf("Invalid '%s[%d]': only text content parts are supported.", param, j))
		}
		b.WriteString(*p.Text)
	}
	return b.String(), nil
}
