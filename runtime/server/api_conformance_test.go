package server

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/parleyhq/parley/runtime/sched"
)

// expectError posts body to path and checks the answer is a 400 invalid_request_error naming
// param, with code (none when code is "").
func (h *harness) expectError(t *testing.T, path, body, param, code string) *errorBody {
	t.Helper()
	resp, b := h.do(t, "POST", path, body)
	if resp.StatusCode != 400 {
		t.Fatalf("%s: status %d, want 400: %s", body, resp.StatusCode, b)
	}
	var eb errorBody
	if err := json.Unmarshal(b, &eb); err != nil || eb.Error == nil {
		t.Fatalf("error body %s (%v)", b, err)
	}
	if eb.Error.Type != typeInvalidRequest || deref(eb.Error.Param) != param || deref(eb.Error.Code) != code {
		t.Errorf("%s: type %q param %q code %q, want %s %q %q: %s", body, eb.Error.Type, deref(eb.Error.Param), deref(eb.Error.Code), typeInvalidRequest, param, code, b)
	}
	return &eb
}

// TestUnsupportedParameters: fields parley does not implement are refused, naming them, when
// they ask for something; set to their defaults, and harmless fields, are accepted.
func TestUnsupportedParameters(t *testing.T) {
	h := newHarness(t, Config{})
	const comp = `{"model":"stories","prompt":"Once","max_tokens":2,`
	const chat = `{"model":"stories-chat","messages":[{"role":"user","content":"hi"}],"max_tokens":2,`
	refused := []struct{ path, fields, param string }{
		{"/v1/completions", `"suffix":" the end."`, "suffix"},
		{"/v1/completions", `"best_of":3`, "best_of"},
		{"/v1/completions", `"best_of":3,"n":2`, "best_of"},
		{"/v1/chat/completions", `"functions":[{"name":"f","parameters":{}}]`, "functions"},
		{"/v1/chat/completions", `"function_call":{"name":"f"}`, "function_call"},
		{"/v1/chat/completions", `"audio":{"voice":"alloy","format":"wav"}`, "audio"},
		{"/v1/chat/completions", `"modalities":["text","audio"]`, "modalities"},
		{"/v1/chat/completions", `"prediction":{"type":"content","content":"hello"}`, "prediction"},
	}
	for _, c := range refused {
		t.Run("refused "+c.fields, func(t *testing.T) {
			base := comp
			if c.path == "/v1/chat/completions" {
				base = chat
			}
			eb := h.expectError(t, c.path, base+c.fields+"}", c.param, "unsupported_parameter")
			if !strings.Contains(eb.Error.Message, "'"+c.param+"'") {
				t.Errorf("message %q does not name %s", eb.Error.Message, c.param)
			}
		})
	}
	accepted := []struct{ path, fields string }{
		{"/v1/completions", `"echo":false,"suffix":null,"best_of":null`},
		{"/v1/completions", `"echo":true,"suffix":null,"best_of":null`},
		{"/v1/completions", `"suffix":"","best_of":1`},
		{"/v1/completions", `"best_of":2,"n":2`},
		{"/v1/chat/completions", `"response_format":{"type":"json_object"}`},
		{"/v1/chat/completions", `"tools":[{"type":"function","function":{"name":"f"}}]`},
		{"/v1/chat/completions", `"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":"auto","parallel_tool_calls":false`},
		{"/v1/chat/completions", `"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{}}}`},
		{"/v1/completions", `"user":"u","metadata":{"a":"b"},"store":false,"service_tier":"auto","stream_options":null`},
		{"/v1/chat/completions", `"response_format":{"type":"text"},"tools":[],"tool_choice":"none","functions":[],"function_call":"auto"`},
		{"/v1/chat/completions", `"response_format":null,"tools":null,"tool_choice":"auto","audio":null,"modalities":["text"],"prediction":null,"function_call":"none"`},
		{"/v1/chat/completions", `"user":"u","metadata":{"a":"b"},"store":true,"service_tier":"default","parallel_tool_calls":true,"reasoning_effort":"low"`},
	}
	for _, c := range accepted {
		t.Run("accepted "+c.fields, func(t *testing.T) {
			base := comp
			if c.path == "/v1/chat/completions" {
				base = chat
			}
			if resp, b := h.do(t, "POST", c.path, base+c.fields+"}"); resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
		})
	}
}

// choiceOut is one choice as a client assembles it from a response or a stream.
type choiceOut struct {
	text    string
	finish  string
	stop    string // stop_reason
	offsets []int
}

// assemble reads a completion response, or the chunks of a stream, into its choices by index,
// and returns them with the usage; stop_reason comes from the raw JSON.
func assemble(t *testing.T, b []byte, stream bool) (map[int]*choiceOut, *usageJSON) {
	t.Helper()
	chunks := responseChunks(t, b, stream)
	out := map[int]*choiceOut{}
	var usage *usageJSON
	for _, c := range chunks {
		var r struct {
			Choices []struct {
				Index   int     `json:"index"`
				Text    *string `json:"text"`
				Message *struct {
					Content string `json:"content"`
				} `json:"message"`
				Delta *struct {
					Content *string `json:"content"`
				} `json:"delta"`
				Logprobs     *completionLogprobs `json:"logprobs"`
				FinishReason *string             `json:"finish_reason"`
				StopReason   *string             `json:"stop_reason"`
			} `json:"choices"`
			Usage *usageJSON `json:"usage"`
		}
		if err := json.Unmarshal([]byte(c), &r); err != nil {
			t.Fatalf("%v: %s", err, c)
		}
		if r.Usage != nil {
			usage = r.Usage
		}
		for _, ch := range r.Choices {
			o := out[ch.Index]
			if o == nil {
				o = &choiceOut{}
				out[ch.Index] = o
			}
			switch {
			case ch.Text != nil:
				o.text += *ch.Text
			case ch.Message != nil:
				o.text += ch.Message.Content
			case ch.Delta != nil:
				o.text += deref(ch.Delta.Content)
			}
			if ch.FinishReason != nil {
				if o.finish != "" {
					t.Errorf("choice %d finishes twice", ch.Index)
				}
				o.finish = *ch.FinishReason
			}
			if ch.StopReason != nil {
				o.stop = *ch.StopReason
			}
			if ch.Logprobs != nil && !strings.HasPrefix(c, `{"id":"chatcmpl`) {
				o.offsets = append(o.offsets, ch.Logprobs.TextOffset...)
			}
		}
	}
	return out, usage
}

// TestMultiplePrompts: a completion with two prompts and n=2 has four choices, choice 2k+i
// being choice i of a request for prompt k alone with the same seed; usage sums over the
// prompts; text_offset starts at each choice's own prompt. Streamed and not.
func TestMultiplePrompts(t *testing.T) {
	h := newHarness(t, Config{})
	prompts := []string{"Once upon a time, there was a little", "The dog"}
	toks, err := h.plainLLM.Tokenizer.Encode(prompts[1], true, true)
	if err != nil {
		t.Fatal(err)
	}
	for _, stream := range []bool{false, true} {
		for _, form := range []string{"text", "tokens"} {
			t.Run(fmt.Sprintf("stream=%v %s", stream, form), func(t *testing.T) {
				base := map[string]any{"model": "stories", "max_tokens": 12, "temperature": 1, "seed": 5, "n": 2, "logprobs": 0, "ignore_eos": true}
				var want []*choiceOut
				var wantUsage usageJSON
				for _, p := range prompts {
					req := map[string]any{"prompt": p}
					for k, v := range base {
						req[k] = v
					}
					resp, b := h.post(t, "/v1/completions", req)
					if resp.StatusCode != 200 {
						t.Fatalf("status %d: %s", resp.StatusCode, b)
					}
					one, u := assemble(t, b, false)
					want = append(want, one[0], one[1])
					wantUsage.PromptTokens += u.PromptTokens
					wantUsage.CompletionTokens += u.CompletionTokens
				}
				wantUsage.TotalTokens = wantUsage.PromptTokens + wantUsage.CompletionTokens
				req := map[string]any{"prompt": prompts, "stream": stream, "stream_options": map[string]any{"include_usage": true}}
				if form == "tokens" {
					toks0, _ := h.plainLLM.Tokenizer.Encode(prompts[0], true, true)
					req["prompt"] = [][]int32{toks0, toks}
				}
				for k, v := range base {
					req[k] = v
				}
				resp, b := h.post(t, "/v1/completions", req)
				if resp.StatusCode != 200 {
					t.Fatalf("status %d: %s", resp.StatusCode, b)
				}
				got, usage := assemble(t, b, stream)
				if len(got) != 4 {
					t.Fatalf("%d choices, want 4: %s", len(got), b)
				}
				for i, w := range want {
					g := got[i]
					if g == nil || g.text != w.text || g.finish != w.finish {
						t.Errorf("choice %d: %+v, want %+v (choice %d of prompt %d alone)", i, g, w, i%2, i/2)
						continue
					}
					if len(g.offsets) == 0 || g.offsets[0] != utf8.RuneCountInString(prompts[i/2]) {
						t.Errorf("choice %d: text_offset %v, want it to start at %d", i, g.offsets, utf8.RuneCountInString(prompts[i/2]))
					}
				}
				if want[0].text == want[1].text || want[0].text == want[2].text {
					t.Errorf("choices alike: %q %q %q: this tests little", want[0].text, want[1].text, want[2].text)
				}
				if usage == nil || *usage != wantUsage {
					t.Errorf("usage %+v, want %+v", usage, wantUsage)
				}
			})
		}
	}
	// Too many choices in all.
	h.expectError(t, "/v1/completions", `{"model":"stories","prompt":["a","b","c"],"n":6,"max_tokens":2}`, "prompt", "")
	h.expectError(t, "/v1/completions", `{"model":"stories","prompt":["a",""],"max_tokens":2}`, "prompt", "")
	h.expectError(t, "/v1/completions", `{"model":"stories","prompt":["a",{"x":1}],"max_tokens":2}`, "prompt", "")
	// One prompt that does not fit refuses the request.
	long := strings.Repeat("Once upon a time ", 90)
	h.expectError(t, "/v1/completions", `{"model":"stories","prompt":["a","`+long+`"],"max_tokens":2}`, "prompt", "context_length_exceeded")
}

// TestMultiplePromptsRejectedWhole: when the scheduler refuses one prompt of a request (its
// queue is full), the request fails with nothing generated, and the prompts already submitted
// are cancelled rather than run.
func TestMultiplePromptsRejectedWhole(t *testing.T) {
	e := openLLM(t, modelPath(t))
	sc, start := newSched(t, e, sched.Config{MaxQueue: 1}, false)
	s, err := New(Config{}, []*Model{llmModel("m", e, sc, testCtx)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	h := &harness{srv: srv, s: s}
	resp, b := h.do(t, "POST", "/v1/completions", `{"model":"m","prompt":["Once","The dog"],"max_tokens":20,"ignore_eos":true}`)
	start() // before any Fatal: the cleanup waits for the loop
	if resp.StatusCode != 429 {
		t.Fatalf("status %d, want 429: %s", resp.StatusCode, b)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st := sc.Stats()
		if st.Queued == 0 && st.Active == 0 {
			if st.GeneratedTokens != 0 {
				t.Fatalf("%d tokens generated for a refused request", st.GeneratedTokens)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still queued or running: %+v", st)
		}
	}
	if resp, b := h.do(t, "POST", "/v1/completions", `{"model":"m","prompt":["Once"],"max_tokens":3}`); resp.StatusCode != 200 {
		t.Fatalf("afterwards: %d %s", resp.StatusCode, b)
	}
}

// TestTimeoutStopReason: a generation cut by the server's time limit finishes with
// finish_reason "length" and stop_reason "timeout"; others carry no stop_reason.
func TestTimeoutStopReason(t *testing.T) {
	h := newHarness(t, Config{RequestTimeout: time.Nanosecond})
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		for _, stream := range []bool{false, true} {
			body := map[string]any{"max_tokens": 200, "ignore_eos": true, "stream": stream, "n": 2}
			if path == "/v1/completions" {
				body["model"], body["prompt"] = "stories", "Once upon a time"
			} else {
				body["model"], body["messages"] = "stories-chat", []map[string]any{{"role": "user", "content": "hi"}}
			}
			resp, b := h.post(t, path, body)
			if resp.StatusCode != 200 {
				t.Fatalf("%s stream=%v: status %d: %s", path, stream, resp.StatusCode, b)
			}
			got, _ := assemble(t, b, stream)
			if len(got) != 2 {
				t.Fatalf("%s stream=%v: %s", path, stream, b)
			}
			for i, c := range got {
				if c.finish != "length" || c.stop != "timeout" {
					t.Errorf("%s stream=%v choice %d: finish_reason %q stop_reason %q, want length, timeout: %s", path, stream, i, c.finish, c.stop, b)
				}
			}
		}
	}
	h2 := newHarness(t, Config{})
	for _, stream := range []bool{false, true} {
		resp, b := h2.post(t, "/v1/completions", map[string]any{"model": "stories", "prompt": "Once", "max_tokens": 3, "stream": stream})
		if resp.StatusCode != 200 || strings.Contains(string(b), "stop_reason") {
			t.Errorf("stream=%v: %d %s", stream, resp.StatusCode, b)
		}
	}
}

// TestMaxTokensOverContext: a max_tokens that fits the context but not with the prompt is
// refused as OpenAI refuses it, naming the field given; without one, chat gets the rest of the
// context and a completion its 16 tokens, shortened to what is left.
func TestMaxTokensOverContext(t *testing.T) {
	h := newHarness(t, Config{})
	e := h.plainLLM
	var ids []int32
	for len(ids) < testCtx-10 {
		more, err := e.Tokenizer.Encode(" Once upon a time there was a dog.", false, false)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, more...)
	}
	ids = ids[:testCtx-10]
	prompt, _ := json.Marshal(ids)
	eb := h.expectError(t, "/v1/completions", `{"model":"stories","prompt":`+string(prompt)+`,"max_tokens":20}`, "max_tokens", "context_length_exceeded")
	want := fmt.Sprintf("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the prompt, 20 in the completion).", testCtx, testCtx+10, testCtx-10)
	if !strings.HasPrefix(eb.Error.Message, want) {
		t.Errorf("message %q, want it to start %q", eb.Error.Message, want)
	}
	// The limit that just fits is accepted.
	if resp, b := h.do(t, "POST", "/v1/completions", `{"model":"stories","prompt":`+string(prompt)+`,"max_tokens":10,"ignore_eos":true}`); resp.StatusCode != 200 {
		t.Fatalf("max_tokens 10: %d %s", resp.StatusCode, b)
	} else if u := decodeResp(t, b).Usage; u.CompletionTokens != 10 {
		t.Errorf("usage %+v", u)
	}
	// No max_tokens: 16 shortened to the 10 positions left.
	resp, b := h.do(t, "POST", "/v1/completions", `{"model":"stories","prompt":`+string(prompt)+`,"ignore_eos":true}`)
	if resp.StatusCode != 200 || decodeResp(t, b).Usage.CompletionTokens != 10 {
		t.Fatalf("no max_tokens: %d %s", resp.StatusCode, b)
	}

	msgs := `[{"role":"user","content":"` + strings.Repeat("Once upon a time there was a dog. ", 20) + `"}]`
	resp, b = h.do(t, "POST", "/v1/chat/completions", `{"model":"stories-chat","messages":`+msgs+`,"max_tokens":1,"temperature":0}`)
	if resp.StatusCode != 200 {
		t.Fatalf("chat: %d %s", resp.StatusCode, b)
	}
	p := decodeResp(t, b).Usage.PromptTokens
	eb = h.expectError(t, "/v1/chat/completions", `{"model":"stories-chat","messages":`+msgs+`,"max_completion_tokens":`+fmt.Sprint(testCtx-p+1)+`}`, "max_completion_tokens", "context_length_exceeded")
	want = fmt.Sprintf("However, you requested %d tokens (%d in the messages, %d in the completion).", testCtx+1, p, testCtx-p+1)
	if !strings.Contains(eb.Error.Message, want) {
		t.Errorf("message %q lacks %q", eb.Error.Message, want)
	}
	resp, b = h.do(t, "POST", "/v1/chat/completions", `{"model":"stories-chat","messages":`+msgs+`,"ignore_eos":true}`)
	if resp.StatusCode != 200 || decodeResp(t, b).Usage.CompletionTokens != testCtx-p {
		t.Fatalf("chat without max_tokens: %d %s", resp.StatusCode, b)
	}
}

// byteToken returns the id of the byte-fallback token for byte c.
func byteToken(t *testing.T, h *harness, c byte) int {
	t.Helper()
	for id := 0; id < 100000; id++ {
		p := h.plainLLM.Tokenizer.Piece(int32(id))
		if len(p) == 1 && p[0] == c {
			return id
		}
		if p == nil && id > 1000 {
			break
		}
	}
	t.Skipf("no byte token for %#x", c)
	return -1
}

// TestLegacyLogprobs: the legacy top_logprobs hold the sampled token as well (logprobs 0: it
// alone), text_offset counts characters from the start of the prompt, and a token that is not
// valid UTF-8 is written "bytes:\xNN".
func TestLegacyLogprobs(t *testing.T) {
	h := newHarness(t, Config{})
	type lpResp struct {
		Choices []struct {
			Text     string             `json:"text"`
			Logprobs completionLogprobs `json:"logprobs"`
		} `json:"choices"`
	}
	get := func(body map[string]any) *completionLogprobs {
		t.Helper()
		body["model"] = "stories"
		resp, b := h.post(t, "/v1/completions", body)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		var r lpResp
		if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) != 1 {
			t.Fatalf("%v: %s", err, b)
		}
		return &r.Choices[0].Logprobs
	}

	// (a) logprobs 0: one entry, the sampled token; logprobs 2: it and up to 2 others.
	for _, k := range []int{0, 2} {
		lp := get(map[string]any{"prompt": "Once upon a time", "max_tokens": 10, "temperature": 1, "seed": 3, "logprobs": k})
		if len(lp.Tokens) == 0 || len(lp.TopLogprobs) != len(lp.Tokens) {
			t.Fatalf("logprobs %d: %+v", k, lp)
		}
		for i, top := range lp.TopLogprobs {
			if v, ok := top[lp.Tokens[i]]; !ok || v != lp.TokenLogprobs[i] || len(top) > k+1 || (k == 0 && len(top) != 1) {
				t.Errorf("logprobs %d, token %d %q (%v): top_logprobs %v", k, i, lp.Tokens[i], lp.TokenLogprobs[i], top)
			}
		}
	}

	// (b) text_offset in characters, from the prompt's end: the text as given, or the
	// detokenized token ids.
	prompt := "Once upon a time, the café"
	lp := get(map[string]any{"prompt": prompt, "max_tokens": 10, "temperature": 0, "logprobs": 0})
	if len(lp.TextOffset) == 0 || lp.TextOffset[0] != utf8.RuneCountInString(prompt) {
		t.Errorf("text_offset %v, want it to start at %d (characters of %q)", lp.TextOffset, utf8.RuneCountInString(prompt), prompt)
	}
	for i := 1; i < len(lp.TextOffset); i++ {
		if want := lp.TextOffset[i-1] + utf8.RuneCountInString(lp.Tokens[i-1]); lp.TextOffset[i] != want {
			t.Errorf("text_offset %v for tokens %q", lp.TextOffset, lp.Tokens)
			break
		}
	}
	ids, _ := h.plainLLM.Tokenizer.Encode("Once upon a time", true, true)
	lp = get(map[string]any{"prompt": ids, "max_tokens": 3, "temperature": 0, "logprobs": 0})
	if len(lp.TextOffset) == 0 || lp.TextOffset[0] != len("Once upon a time") {
		t.Errorf("token prompt: text_offset %v, want it to start at %d", lp.TextOffset, len("Once upon a time"))
	}

	// (c) byte tokens: the model made to emit the bytes E2 and 80 (the start of "…"). The
	// log-probabilities are the model's own, before logit_bias, so the alternatives are words.
	e2, x80 := byteToken(t, h, 0xe2), byteToken(t, h, 0x80)
	lp = get(map[string]any{"prompt": "Once", "max_tokens": 4, "temperature": 0, "logprobs": 2, "logit_bias": map[string]int{fmt.Sprint(e2): 100, fmt.Sprint(x80): 100}})
	if len(lp.Tokens) == 0 {
		t.Fatalf("no tokens: %+v", lp)
	}
	for i, tok := range lp.Tokens {
		if tok != `bytes:\xe2` && tok != `bytes:\x80` {
			t.Errorf("token %d: %q, want bytes:\\xe2 or bytes:\\x80", i, tok)
		}
		if _, ok := lp.TopLogprobs[i][tok]; !ok || len(lp.TopLogprobs[i]) != 3 {
			t.Errorf("top_logprobs %d: %v, want %s and two others", i, lp.TopLogprobs[i], tok)
		}
	}
}

// TestCharOffsets: a token that begins inside a character (a byte-fallback piece) points at
// that character; the next one at the character after.
func TestCharOffsets(t *testing.T) {
	c := charOffsets{n: 3}
	var got []int
	for _, p := range []string{"a", "\xc3", "\xa9", " b", "\xe2\x80", "\xa6", "c", ""} {
		got = append(got, c.next([]byte(p)))
	}
	want := []int{3, 4, 4, 5, 7, 7, 8, 9}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("offsets %v, want %v", got, want)
	}
	for in, want := range map[string]string{"ab": "ab", "\xe2\x80": `bytes:\xe2\x80`, " \xe2": `bytes: \xe2`, "\\\xff\n": `bytes:\\\xff\n`, "é": "é"} {
		if got := tokenString([]byte(in)); got != want {
			t.Errorf("tokenString(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestChatRefusal: a chat completion's message carries refusal: null, and so do its logprobs.
func TestChatRefusal(t *testing.T) {
	h := newHarness(t, Config{})
	for _, logprobs := range []bool{false, true} {
		resp, b := h.post(t, "/v1/chat/completions", map[string]any{"model": "stories-chat", "messages": []map[string]any{{"role": "user", "content": "hi"}}, "max_tokens": 3, "logprobs": logprobs})
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		var r struct {
			Choices []struct {
				Message  map[string]json.RawMessage `json:"message"`
				Logprobs map[string]json.RawMessage `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) != 1 {
			t.Fatalf("%v: %s", err, b)
		}
		if v, ok := r.Choices[0].Message["refusal"]; !ok || string(v) != "null" {
			t.Errorf("message.refusal %q (present %v): %s", v, ok, b)
		}
		if logprobs {
			if v, ok := r.Choices[0].Logprobs["refusal"]; !ok || string(v) != "null" {
				t.Errorf("logprobs.refusal %q (present %v): %s", v, ok, b)
			}
		}
	}
}

// TestNegativeTopK: a negative top_k (vLLM's -1) turns top-k off, as 0 does.
func TestNegativeTopK(t *testing.T) {
	h := newHarness(t, Config{})
	want := ""
	for _, k := range []int{0, -1, -7} {
		resp, b := h.post(t, "/v1/completions", map[string]any{"model": "stories", "prompt": "Once", "max_tokens": 8, "seed": 4, "top_k": k})
		if resp.StatusCode != 200 {
			t.Fatalf("top_k %d: %d %s", k, resp.StatusCode, b)
		}
		text := deref(decodeResp(t, b).Choices[0].Text)
		if k == 0 {
			want = text
		} else if text != want {
			t.Errorf("top_k %d: %q, top_k 0: %q", k, text, want)
		}
	}
	resp, b := h.post(t, "/v1/chat/completions", map[string]any{"model": "stories-chat", "messages": []map[string]any{{"role": "user", "content": "hi"}}, "max_tokens": 2, "top_k": -1})
	if resp.StatusCode != 200 {
		t.Fatalf("chat top_k -1: %d %s", resp.StatusCode, b)
	}
	h.expectError(t, "/v1/completions", `{"model":"stories","prompt":"a","top_k":-1.5}`, "top_k", "")
}

// TestMultiplePromptsDisconnect: a client that leaves a stream of several prompts cancels every
// one of them.
func TestMultiplePromptsDisconnect(t *testing.T) {
	h := newHarnessSched(t, Config{}, slowSteps)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := `{"model":"stories","prompt":["Once","The dog","A cat"],"n":2,"max_tokens":250,"ignore_eos":true,"stream":true}`
	req, _ := http.NewRequestWithContext(ctx, "POST", h.srv.URL+"/v1/completions", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: {") {
		t.Fatalf("first line %q, %v", line, err)
	}
	cancel()
	resp.Body.Close()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st := h.plain.Sched.Stats()
		if st.Active == 0 && st.Queued == 0 {
			if st.GeneratedTokens >= 6*250 {
				t.Errorf("generated %d tokens: not cancelled", st.GeneratedTokens)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sequences still active after disconnect: %+v", st)
		}
	}
}
