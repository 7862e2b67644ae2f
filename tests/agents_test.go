package tests

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/gguf"
)

// nodeScript runs tests/node/<script> with args and returns its stdout (openAINode says when
// node or the openai package is missing).
func nodeScript(t *testing.T, script string, args ...string) []byte {
	t.Helper()
	node := openAINode(t, "")
	cmd := exec.Command(node, append([]string{filepath.Join("node", script)}, args...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", script, err, out)
	}
	return out
}

// person is what structured.mjs's schema describes; checkPerson validates one.
type person struct {
	Name *string  `json:"name"`
	Age  *float64 `json:"age"`
	Pets []string `json:"pets"`
	Home *struct {
		City *string  `json:"city"`
		Lat  *float64 `json:"lat"`
	} `json:"home"`
}

func checkPerson(t *testing.T, what, text string) {
	t.Helper()
	var raw map[string]json.RawMessage
	var p person
	if err := json.Unmarshal([]byte(text), &raw); err != nil {
		t.Errorf("%s: %q is not a JSON object: %v", what, text, err)
		return
	}
	for k := range raw {
		if !slices.Contains([]string{"name", "age", "pets", "home"}, k) {
			t.Errorf("%s: %q has property %q", what, text, k)
		}
	}
	if err := json.Unmarshal([]byte(text), &p); err != nil {
		t.Errorf("%s: %q: %v", what, text, err)
		return
	}
	ok := p.Name != nil && len([]rune(*p.Name)) <= 12 && p.Age != nil && *p.Age == float64(int64(*p.Age)) &&
		len(p.Pets) >= 1 && len(p.Pets) <= 3 && p.Home != nil && p.Home.City != nil && len([]rune(*p.Home.City)) <= 8 && p.Home.Lat != nil
	for _, pet := range p.Pets {
		ok = ok && (pet == "cat" || pet == "dog" || pet == "fish")
	}
	if !ok {
		t.Errorf("%s: %q does not validate against the schema", what, text)
	}
}

// TestServeStructuredOutput: the openai npm client asks the stories model, whose output is
// random-ish text, for JSON under a schema, any JSON object, and text under a GBNF grammar; every
// answer parses and validates, and a schema or grammar that cannot be compiled is a 400.
func TestServeStructuredOutput(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	chat := filepath.Join(t.TempDir(), "chat.gguf")
	withChatTemplate(t, model, chat)
	srv := startServer(t, "--backend", "go", "-m", "stories="+model, "-m", "chat="+chat, "--parallel", "8", "--ctx", "256")
	out := nodeScript(t, "structured.mjs", srv.base+"/v1", "stories", "chat")
	var r struct {
		SchemaChat []struct {
			Content      string `json:"content"`
			FinishReason string `json:"finish_reason"`
			Logprobs     int    `json:"logprobs"`
		} `json:"schema_chat"`
		SchemaStream      []string `json:"schema_stream"`
		ObjectChat        string   `json:"object_chat"`
		GrammarCompletion []string `json:"grammar_completion"`
		SchemaCompletion  string   `json:"schema_completion"`
		BadSchema         *struct {
			Status int    `json:"status"`
			Code   string `json:"code"`
			Param  string `json:"param"`
		} `json:"bad_schema_error"`
		BadGrammar *struct {
			Status int    `json:"status"`
			Code   string `json:"code"`
			Param  string `json:"param"`
		} `json:"bad_grammar_error"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(r.SchemaChat) != 3 || len(r.SchemaStream) != 2 || len(r.GrammarCompletion) != 2 {
		t.Fatalf("choices: %s", out)
	}
	for _, c := range r.SchemaChat {
		checkPerson(t, "json_schema chat", c.Content)
		if c.Logprobs == 0 {
			t.Errorf("json_schema chat %q: no logprobs", c.Content)
		}
	}
	for _, c := range r.SchemaStream {
		checkPerson(t, "json_schema chat stream", c)
	}
	checkPerson(t, "json_schema completion stream", r.SchemaCompletion)
	var obj map[string]any
	if err := json.Unmarshal([]byte(r.ObjectChat), &obj); err != nil {
		t.Errorf("json_object chat %q: %v", r.ObjectChat, err)
	}
	re := regexp.MustCompile(`^(yes|no), [0-9]{1,3}$`)
	for _, c := range r.GrammarCompletion {
		if !re.MatchString(c) {
			t.Errorf("grammar completion %q is not in the grammar's language", c)
		}
	}
	if e := r.BadSchema; e == nil || e.Status != 400 || e.Code != "invalid_json_schema" || e.Param != "response_format.json_schema.schema" {
		t.Errorf("uncompilable schema: %+v", e)
	}
	if e := r.BadGrammar; e == nil || e.Status != 400 || e.Code != "invalid_grammar" || e.Param != "grammar" {
		t.Errorf("bad grammar: %+v", e)
	}
}

// TestServeEmbeddings: a random-weight bge-small written by `parley synth`, and the stories model
// run as a decoder embedder (--embeddings), through the openai npm client's embeddings API.
func TestServeEmbeddings(t *testing.T) {
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	bge := filepath.Join(t.TempDir(), "bge-small.gguf")
	if r := parley(t, "", "synth", "--arch", "bert", "--shape", "bge-small", "--type", "q8_0", "-o", bge); r.code != 0 {
		t.Fatalf("synth: %d %s", r.code, r.stderr)
	}
	srv := startServer(t, "--backend", "go", "-m", "bge="+bge, "-m", "stories="+model, "--embeddings", "--ctx", "128")
	out := nodeScript(t, "embeddings.mjs", srv.base+"/v1", "bge", "stories")
	type apiErr struct {
		Status int    `json:"status"`
		Code   string `json:"code"`
		Param  string `json:"param"`
	}
	var r struct {
		One struct {
			N, Dim int
			Norm   float64
			Object string
			Model  string
			Usage  struct {
				PromptTokens int `json:"prompt_tokens"`
			}
		}
		Many struct {
			N        int
			Indexes  []int
			CosSame  float64 `json:"cos_same"`
			CosOther float64 `json:"cos_other"`
		}
		IDs struct {
			N, Dim int
			Usage  struct {
				PromptTokens int `json:"prompt_tokens"`
			}
		}
		Decoder struct {
			N, Dim int
			Norm   float64
		}
		Dimensions *apiErr `json:"dimensions_error"`
		Empty      *apiErr `json:"empty_error"`
		Generate   *apiErr `json:"generate_error"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if r.One.N != 1 || r.One.Dim != 384 || r.One.Norm < 0.9999 || r.One.Norm > 1.0001 || r.One.Object != "list" || r.One.Model != "bge" || r.One.Usage.PromptTokens < 3 {
		t.Errorf("one input: %+v", r.One)
	}
	if r.Many.N != 3 || !slices.Equal(r.Many.Indexes, []int{0, 1, 2}) || r.Many.CosSame < 0.99999 || r.Many.CosOther > 0.9999 {
		t.Errorf("three inputs: %+v", r.Many)
	}
	if r.IDs.N != 2 || r.IDs.Dim != 384 || r.IDs.Usage.PromptTokens != 6 {
		t.Errorf("token ids: %+v", r.IDs)
	}
	if r.Decoder.N != 2 || r.Decoder.Dim == 0 || r.Decoder.Norm < 0.9999 || r.Decoder.Norm > 1.0001 {
		t.Errorf("decoder embedder: %+v", r.Decoder)
	}
	if e := r.Dimensions; e == nil || e.Status != 400 || e.Param != "dimensions" || e.Code != "unsupported_parameter" {
		t.Errorf("dimensions: %+v", e)
	}
	if e := r.Empty; e == nil || e.Status != 400 || e.Param != "input" {
		t.Errorf("empty input: %+v", e)
	}
	if e := r.Generate; e == nil || e.Status != 400 || e.Param != "model" || e.Code != "model_not_supported" {
		t.Errorf("chat on an embedding model: %+v", e)
	}
}

// toolsTemplate is a Hermes-style chat template with a tool section, for the stories model.
const toolsTemplate = `{%- if tools %}<|system|>{% for tool in tools %}{{ tool.function.name }} {% endfor %}<tool_call></tool_call>
{% endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|assistant|>{% for tc in m.tool_calls %}{{ tc.function.name }}{{ tc.function.arguments | tojson }}{% endfor %}
{% elif m.role == 'tool' %}<|tool|>{{ m.content }}
{% else %}<|{{ m.role }}|>{{ m.content }}
{% endif %}
{%- endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}`

// TestServeTools: the openai npm client offers tools to the stories model with a Hermes-style
// template; forced calls (required, named) parse, validate against their parameters, and
// stream into the same calls through the client's stream helper.
func TestServeTools(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	chat := filepath.Join(t.TempDir(), "tools.gguf")
	rewriteGGUF(t, model, chat, func(w *gguf.Writer) { w.SetString("tokenizer.chat_template", toolsTemplate) })
	srv := startServer(t, "--backend", "go", "-m", "tools="+chat, "--parallel", "8")
	out := nodeScript(t, "tools.mjs", srv.base+"/v1", "tools")
	type call struct {
		ID, Type, Name, Arguments string
	}
	type answer struct {
		FinishReason string  `json:"finish_reason"`
		Content      *string `json:"content"`
		Calls        []call  `json:"calls"`
	}
	var r struct {
		Required, Named answer
		RequiredStream  answer `json:"required_stream"`
		NamedStream     answer `json:"named_stream"`
		Single          []int
		Auto            struct {
			FinishReason string `json:"finish_reason"`
			HasContent   bool   `json:"has_content"`
			Calls        int
		}
		History struct {
			FinishReason string `json:"finish_reason"`
			Calls, Usage int
		}
		Absent *struct {
			Status int
			Param  string
		} `json:"absent_error"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	valid := func(c call) bool {
		var args map[string]any
		if json.Unmarshal([]byte(c.Arguments), &args) != nil || len(args) != 2 || c.Type != "function" || len(c.ID) < 6 {
			return false
		}
		switch c.Name {
		case "get_weather":
			city, ok := args["city"].(string)
			return ok && len([]rune(city)) <= 8 && (args["unit"] == "c" || args["unit"] == "f")
		case "add":
			a, oka := args["a"].(float64)
			b, okb := args["b"].(float64)
			return oka && okb && a == float64(int64(a)) && b == float64(int64(b))
		}
		return false
	}
	for name, pair := range map[string][2]answer{"required": {r.Required, r.RequiredStream}, "named": {r.Named, r.NamedStream}} {
		whole, streamed := pair[0], pair[1]
		if whole.FinishReason != "tool_calls" || len(whole.Calls) == 0 || streamed.FinishReason != "tool_calls" || len(streamed.Calls) != len(whole.Calls) {
			t.Errorf("%s: %+v, streamed %+v", name, whole, streamed)
			continue
		}
		for i, c := range whole.Calls {
			if !valid(c) || (name == "named" && c.Name != "add") {
				t.Errorf("%s: call %+v", name, c)
			}
			if s := streamed.Calls[i]; s.Name != c.Name || s.Arguments != c.Arguments || !valid(s) {
				t.Errorf("%s: streamed call %+v, whole %+v", name, s, c)
			}
		}
	}
	if !slices.Equal(r.Single, []int{1, 1, 1}) {
		t.Errorf("parallel_tool_calls false: calls per choice %v", r.Single)
	}
	if (r.Auto.Calls > 0) != (r.Auto.FinishReason == "tool_calls") || (r.Auto.Calls == 0 && !r.Auto.HasContent) {
		t.Errorf("auto: %+v", r.Auto)
	}
	if r.History.Calls != 0 || r.History.FinishReason == "tool_calls" || r.History.Usage < 30 {
		t.Errorf("a conversation with a call and its answer, tool_choice none: %+v", r.History)
	}
	if r.Absent == nil || r.Absent.Status != 400 || r.Absent.Param != "tool_choice" {
		t.Errorf("tool_choice naming an absent function: %+v", r.Absent)
	}
}
