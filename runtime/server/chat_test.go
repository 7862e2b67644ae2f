package server

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "github.com/parleyhq/parley/runtime/backend/all"
	"github.com/parleyhq/parley/runtime/models"
	"github.com/parleyhq/parley/runtime/sched"
)

func TestChat(t *testing.T) {
	h := newHarness(t, Config{})
	msgs := []map[string]any{{"role": "system", "content": "You tell stories."}, {"role": "user", "content": "Tell me about a cat."}}
	rendered := "<|im_start|>system\nYou tell stories.<|im_end|>\n<|im_start|>user\nTell me about a cat.<|im_end|>\n<|im_start|>assistant\n"
	e := h.chatLLM
	toks, err := e.Tokenizer.Encode(rendered, true, true)
	if err != nil {
		t.Fatal(err)
	}
	want := reference(t, e, toks, 30)

	resp, b := h.post(t, "/v1/chat/completions", map[string]any{"model": "stories-chat", "messages": msgs, "max_completion_tokens": 30, "temperature": 0, "logprobs": true, "top_logprobs": 2})
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	r := decodeResp(t, b)
	if r.Object != "chat.completion" || !strings.HasPrefix(r.ID, "chatcmpl-") || len(r.Choices) != 1 || r.Choices[0].Message == nil {
		t.Fatalf("bad envelope: %s", b)
	}
	if m := r.Choices[0].Message; m.Role != "assistant" || m.Content != want.Text {
		t.Errorf("message %+v, reference %q", m, want.Text)
	}
	if r.Usage.PromptTokens != len(toks) {
		t.Errorf("prompt tokens %d, want %d", r.Usage.PromptTokens, len(toks))
	}
	var lp chatLogprobs
	if err := json.Unmarshal(r.Choices[0].Logprobs, &lp); err != nil {
		t.Fatal(err)
	}
	if len(lp.Content) == 0 || len(lp.Content[0].TopLogprobs) != 2 || len(lp.Content[0].Bytes) != len(lp.Content[0].Token) {
		t.Errorf("logprobs %s", r.Choices[0].Logprobs)
	}

	// Content given as text parts is the same conversation.
	parts := []map[string]any{msgs[0], {"role": "user", "content": []map[string]any{{"type": "text", "text": "Tell me about "}, {"type": "text", "text": "a cat."}}}}
	_, b = h.post(t, "/v1/chat/completions", map[string]any{"model": "stories-chat", "messages": parts, "max_tokens": 30, "temperature": 0})
	if got := decodeResp(t, b).Choices[0].Message; got == nil || got.Content != want.Text {
		t.Errorf("content parts: %s", b)
	}

	// Streaming: role first, then content deltas, a finish chunk, [DONE].
	body, _ := json.Marshal(map[string]any{"model": "stories-chat", "messages": msgs, "max_tokens": 30, "temperature": 0, "stream": true})
	sresp, err := http.Post(h.srv.URL+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer sresp.Body.Close()
	events := sse(t, sresp.Body)
	if len(events) < 3 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("events %q", events)
	}
	var text strings.Builder
	for i, ev := range events[:len(events)-1] {
		c := decodeResp(t, []byte(ev))
		if c.Object != "chat.completion.chunk" || len(c.Choices) != 1 || c.Choices[0].Delta == nil {
			t.Fatalf("chunk %d: %s", i, ev)
		}
		d := c.Choices[0].Delta
		if (i == 0) != (d.Role == "assistant") {
			t.Errorf("chunk %d role %q", i, d.Role)
		}
		last := i == len(events)-2
		if last != (c.Choices[0].FinishReason != nil) {
			t.Errorf("chunk %d finish_reason %v", i, c.Choices[0].FinishReason)
		}
		text.WriteString(deref(d.Content))
	}
	if text.String() != want.Text {
		t.Errorf("streamed %q, reference %q", text.String(), want.Text)
	}
}

// templateHarness serves the test model with tokenizer.chat_template set to tmpl, as the one
// model name, and returns the harness and the model.
func templateHarness(t *testing.T, name, tmpl string) (*harness, *models.LLM) {
	t.Helper()
	e := openLLM(t, withTemplate(t, modelPath(t), tmpl))
	sc, _ := newSched(t, e, sched.Config{}, true)
	s, err := New(Config{}, []*Model{llmModel(name, e, sc, testCtx)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return &harness{srv: srv, s: s}, e
}

func TestChatTemplateErrors(t *testing.T) {
	h, _ := templateHarness(t, "strict", strictTemplate)
	resp, b := h.post(t, "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "assistant", "content": "hi"}}, "max_tokens": 4})
	if resp.StatusCode != 400 || !strings.Contains(string(b), "first message must come from the user") {
		t.Errorf("raise_exception: %d %s", resp.StatusCode, b)
	}
	resp, b = h.post(t, "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": " hi "}}, "max_tokens": 4})
	if resp.StatusCode != 200 {
		t.Errorf("status %d: %s", resp.StatusCode, b)
	}
	if u := decodeResp(t, b).Usage; u == nil || u.PromptTokens == 0 {
		t.Errorf("usage %s", b)
	}
}

type errorBody struct {
	Error *struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

func TestErrors(t *testing.T) {
	h := newHarness(t, Config{MaxBodyBytes: 64 << 10})
	long := make([]int, testCtx+10)
	for i := range long {
		long[i] = 100
	}
	longJSON, _ := json.Marshal(long)
	cases := []struct {
		name   string
		method string
		path   string
		body   string
		status int
		param  string
		code   string
	}{
		{"malformed json", "POST", "/v1/completions", `{"model":"stories",`, 400, "", ""},
		{"not an object", "POST", "/v1/completions", `[1,2]`, 400, "", ""},
		{"trailing garbage", "POST", "/v1/completions", `{"model":"stories","prompt":"a"} x`, 400, "", ""},
		{"wrong type", "POST", "/v1/completions", `{"model":"stories","prompt":"a","max_tokens":"ten"}`, 400, "max_tokens", ""},
		{"fractional max_tokens", "POST", "/v1/completions", `{"model":"stories","prompt":"a","max_tokens":1.5}`, 400, "max_tokens", ""},
		{"missing prompt", "POST", "/v1/completions", `{"model":"stories"}`, 400, "prompt", ""},
		{"empty prompt", "POST", "/v1/completions", `{"model":"stories","prompt":""}`, 400, "prompt", ""},
		{"empty token prompt", "POST", "/v1/completions", `{"model":"stories","prompt":[]}`, 400, "prompt", ""},
		{"token out of vocab", "POST", "/v1/completions", `{"model":"stories","prompt":[1,999999]}`, 400, "prompt", ""},
		{"prompt of objects", "POST", "/v1/completions", `{"model":"stories","prompt":{"a":1}}`, 400, "prompt", ""},
		{"negative max_tokens", "POST", "/v1/completions", `{"model":"stories","prompt":"a","max_tokens":-5}`, 400, "max_tokens", ""},
		{"zero max_tokens", "POST", "/v1/completions", `{"model":"stories","prompt":"a","max_tokens":0}`, 400, "max_tokens", ""},
		{"absurd max_tokens", "POST", "/v1/completions", `{"model":"stories","prompt":"a","max_tokens":100000000}`, 400, "max_tokens", "context_length_exceeded"},
		{"max_tokens over the context", "POST", "/v1/completions", `{"model":"stories","prompt":"a","max_tokens":` + strconv.Itoa(testCtx+1) + `}`, 400, "max_tokens", "context_length_exceeded"},
		{"max_completion_tokens over the context", "POST", "/v1/chat/completions", `{"model":"stories-chat","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":` + strconv.Itoa(testCtx+1) + `}`, 400, "max_completion_tokens", "context_length_exceeded"},
		{"overflowing max_tokens", "POST", "/v1/completions", `{"model":"stories","prompt":"a","max_tokens":1e40}`, 400, "max_tokens", ""},
		{"temperature", "POST", "/v1/completions", `{"model":"stories","prompt":"a","temperature":3}`, 400, "temperature", ""},
		{"top_p zero", "POST", "/v1/completions", `{"model":"stories","prompt":"a","top_p":0}`, 400, "top_p", ""},
		{"top_k", "POST", "/v1/completions", `{"model":"stories","prompt":"a","top_k":1.5}`, 400, "top_k", ""},
		{"min_p", "POST", "/v1/completions", `{"model":"stories","prompt":"a","min_p":1.5}`, 400, "min_p", ""},
		{"presence_penalty", "POST", "/v1/completions", `{"model":"stories","prompt":"a","presence_penalty":9}`, 400, "presence_penalty", ""},
		{"frequency_penalty", "POST", "/v1/completions", `{"model":"stories","prompt":"a","frequency_penalty":-9}`, 400, "frequency_penalty", ""},
		{"logit_bias key", "POST", "/v1/completions", `{"model":"stories","prompt":"a","logit_bias":{"x":1}}`, 400, "logit_bias", ""},
		{"logit_bias id", "POST", "/v1/completions", `{"model":"stories","prompt":"a","logit_bias":{"99999":1}}`, 400, "logit_bias", ""},
		{"logit_bias value", "POST", "/v1/completions", `{"model":"stories","prompt":"a","logit_bias":{"5":500}}`, 400, "logit_bias", ""},
		{"logit_bias type", "POST", "/v1/completions", `{"model":"stories","prompt":"a","logit_bias":{"5":"x"}}`, 400, "logit_bias", ""},
		{"n", "POST", "/v1/completions", `{"model":"stories","prompt":"a","n":0}`, 400, "n", ""},
		{"logprobs", "POST", "/v1/completions", `{"model":"stories","prompt":"a","logprobs":50}`, 400, "logprobs", ""},
		{"stop type", "POST", "/v1/completions", `{"model":"stories","prompt":"a","stop":5}`, 400, "stop", ""},
		{"empty stop", "POST", "/v1/completions", `{"model":"stories","prompt":"a","stop":[""]}`, 400, "stop", ""},
		{"invalid utf-8", "POST", "/v1/completions", "{\"model\":\"stories\",\"prompt\":\"a\xff\xfe\"}", 400, "", ""},
		{"prompt over context", "POST", "/v1/completions", `{"model":"stories","prompt":` + string(longJSON) + `}`, 400, "prompt", "context_length_exceeded"},
		{"unknown model", "POST", "/v1/completions", `{"model":"gpt-9","prompt":"a"}`, 404, "model", "model_not_found"},
		{"unknown model get", "GET", "/v1/models/gpt-9", ``, 404, "model", "model_not_found"},
		{"body too large", "POST", "/v1/completions", `{"model":"stories","prompt":"` + strings.Repeat("a", 70<<10) + `"}`, 413, "", "request_too_large"},
		{"no chat template", "POST", "/v1/chat/completions", `{"model":"stories","messages":[{"role":"user","content":"hi"}]}`, 400, "model", "no_chat_template"},
		{"missing messages", "POST", "/v1/chat/completions", `{"model":"stories-chat"}`, 400, "messages", ""},
		{"empty messages", "POST", "/v1/chat/completions", `{"model":"stories-chat","messages":[]}`, 400, "messages", ""},
		{"bad role", "POST", "/v1/chat/completions", `{"model":"stories-chat","messages":[{"role":"robot","content":"hi"}]}`, 400, "messages[0].role", ""},
		{"bad content", "POST", "/v1/chat/completions", `{"model":"stories-chat","messages":[{"role":"user","content":5}]}`, 400, "messages[0].content", ""},
		{"image part", "POST", "/v1/chat/completions", `{"model":"stories-chat","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "messages[0].content[0]", ""},
		{"top_logprobs without logprobs", "POST", "/v1/chat/completions", `{"model":"stories-chat","messages":[{"role":"user","content":"hi"}],"top_logprobs":2}`, 400, "top_logprobs", ""},
		{"chat logprobs type", "POST", "/v1/chat/completions", `{"model":"stories-chat","messages":[{"role":"user","content":"hi"}],"logprobs":3}`, 400, "logprobs", ""},
		{"chat over context", "POST", "/v1/chat/completions", `{"model":"stories-chat","messages":[{"role":"user","content":"` + strings.Repeat("cat ", 400) + `"}]}`, 400, "messages", "context_length_exceeded"},
		{"unknown path", "GET", "/v1/nothing", ``, 404, "", "unknown_url"},
		{"wrong method", "GET", "/v1/completions", ``, 405, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, b := h.do(t, c.method, c.path, c.body)
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, b)
			}
			if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
				t.Errorf("content type %q", ct)
			}
			var eb errorBody
			if err := json.Unmarshal(b, &eb); err != nil || eb.Error == nil || eb.Error.Message == "" || eb.Error.Type == "" {
				t.Fatalf("error body %s (%v)", b, err)
			}
			if !strings.Contains(string(b), `"param":`) || !strings.Contains(string(b), `"code":`) {
				t.Errorf("param or code missing: %s", b)
			}
			if deref(eb.Error.Param) != c.param {
				t.Errorf("param %q, want %q", deref(eb.Error.Param), c.param)
			}
			if deref(eb.Error.Code) != c.code {
				t.Errorf("code %q, want %q", deref(eb.Error.Code), c.code)
			}
			if c.status == 400 && eb.Error.Type != "invalid_request_error" {
				t.Errorf("type %q", eb.Error.Type)
			}
		})
	}
	// Still serving.
	resp, b := h.post(t, "/v1/completions", map[string]any{"model": "stories", "prompt": "a", "max_tokens": 3})
	if resp.StatusCode != 200 {
		t.Fatalf("after errors: %d %s", resp.StatusCode, b)
	}
}

func TestQueueFull(t *testing.T) {
	p := modelPath(t)
	e := openLLM(t, p)
	// The step loop starts late, so requests stay queued and the second one overflows.
	sc, start := newSched(t, e, sched.Config{MaxQueue: 1}, false)
	s, err := New(Config{}, []*Model{llmModel("m", e, sc, testCtx)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := `{"model":"m","prompt":"a","max_tokens":4,"stream":true}`
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/completions", strings.NewReader(body))
	first, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Body.Close()
	if first.StatusCode != 200 {
		t.Fatalf("first: %d", first.StatusCode)
	}
	h := &harness{srv: srv, s: s}
	resp, b := h.do(t, "POST", "/v1/completions", body)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), `"type":"rate_limit_error"`) {
		t.Errorf("second: %d %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	start()
	events := sse(t, first.Body)
	if len(events) == 0 || events[len(events)-1] != "[DONE]" {
		t.Errorf("first stream: %q", events)
	}
}

func TestClientDisconnectCancels(t *testing.T) {
	h := newHarnessSched(t, Config{}, slowSteps)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := `{"model":"stories","prompt":"Once","max_tokens":250,"ignore_eos":true,"stream":true}`
	req, _ := http.NewRequestWithContext(ctx, "POST", h.srv.URL+"/v1/completions", strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(resp.Body)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: {") {
		t.Fatalf("first line %q, %v", line, err)
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := h.plain.Sched.Stats()
		if st.Active == 0 && st.Queued == 0 {
			if st.GeneratedTokens >= 250 {
				t.Errorf("generated %d tokens: not cancelled", st.GeneratedTokens)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sequence still active after disconnect: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Still serving.
	resp2, b := h.post(t, "/v1/completions", map[string]any{"model": "stories", "prompt": "a", "max_tokens": 3})
	if resp2.StatusCode != 200 {
		t.Fatalf("after disconnect: %d %s", resp2.StatusCode, b)
	}
}

func TestAuthHealthCORS(t *testing.T) {
	h := newHarness(t, Config{APIKey: "sekrit", AllowedOrigins: []string{"https://app.example"}})
	h.s.SetReady(false)
	if resp, b := h.do(t, "GET", "/health", ""); resp.StatusCode != 503 {
		t.Errorf("health before ready: %d %s", resp.StatusCode, b)
	}
	h.s.SetReady(true)
	if resp, b := h.do(t, "GET", "/health", ""); resp.StatusCode != 200 || !strings.Contains(string(b), `"status":"ok"`) {
		t.Errorf("health: %d %s", resp.StatusCode, b)
	}
	for _, hdr := range [][]string{nil, {"Authorization", "Bearer wrong"}, {"Authorization", "sekrit"}, {"Authorization", "Bearer sekrit2"}} {
		resp, b := h.do(t, "GET", "/v1/models", "", hdr...)
		if resp.StatusCode != 401 || !strings.Contains(string(b), `"code":"invalid_api_key"`) {
			t.Errorf("%v: %d %s", hdr, resp.StatusCode, b)
		}
	}
	resp, b := h.do(t, "GET", "/v1/models", "", "Authorization", "Bearer sekrit")
	if resp.StatusCode != 200 {
		t.Fatalf("models: %d %s", resp.StatusCode, b)
	}
	var list struct {
		Object string        `json:"object"`
		Data   []modelObject `json:"data"`
	}
	if err := json.Unmarshal(b, &list); err != nil || list.Object != "list" || len(list.Data) != 2 || list.Data[0].ID != "stories" || list.Data[0].Object != "model" {
		t.Errorf("models: %s", b)
	}
	if resp, b := h.do(t, "GET", "/v1/models/stories-chat", "", "Authorization", "Bearer sekrit"); resp.StatusCode != 200 || !strings.Contains(string(b), `"id":"stories-chat"`) {
		t.Errorf("model: %d %s", resp.StatusCode, b)
	}

	// Preflight: allowed origin without credentials; another origin refused.
	resp, _ = h.do(t, "OPTIONS", "/v1/chat/completions", "", "Origin", "https://app.example", "Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "authorization, content-type")
	if resp.StatusCode != 204 || resp.Header.Get("Access-Control-Allow-Origin") != "https://app.example" ||
		!strings.Contains(resp.Header.Get("Access-Control-Allow-Methods"), "POST") || !strings.Contains(resp.Header.Get("Access-Control-Allow-Headers"), "Authorization") {
		t.Errorf("preflight: %d %v", resp.StatusCode, resp.Header)
	}
	resp, _ = h.do(t, "OPTIONS", "/v1/chat/completions", "", "Origin", "https://evil.example", "Access-Control-Request-Method", "POST")
	if resp.StatusCode != 403 || resp.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Errorf("preflight from another origin: %d %v", resp.StatusCode, resp.Header)
	}
	resp, _ = h.do(t, "GET", "/v1/models", "", "Origin", "https://app.example", "Authorization", "Bearer sekrit")
	if resp.Header.Get("Access-Control-Allow-Origin") != "https://app.example" {
		t.Errorf("CORS on GET: %v", resp.Header)
	}
	resp, _ = h.do(t, "GET", "/v1/models", "", "X-Request-Id", "abc-123", "Authorization", "Bearer sekrit")
	if resp.Header.Get("X-Request-Id") != "abc-123" {
		t.Errorf("request id %q", resp.Header.Get("X-Request-Id"))
	}
}

func TestMetrics(t *testing.T) {
	h := newHarness(t, Config{})
	h.post(t, "/v1/completions", map[string]any{"model": "stories", "prompt": storyPrompt, "max_tokens": 5})
	h.post(t, "/v1/completions", map[string]any{"model": "nope", "prompt": "a"})
	names := []string{
		`parley_http_requests_total{code="200",endpoint="/v1/completions"} 1`,
		`parley_http_requests_total{code="404",endpoint="/v1/completions"} 1`,
		"parley_http_request_duration_seconds_bucket",
		`parley_queue_depth{model="stories"} 0`,
		`parley_active_sequences{model="stories"} 0`,
		`parley_kv_blocks_used{model="stories"}`,
		`parley_kv_blocks_free{model="stories-chat"}`,
		`parley_prompt_tokens_total{model="stories"}`,
		`parley_generated_tokens_total{model="stories"} 5`,
		`parley_time_to_first_token_seconds_count{model="stories"} 1`,
		`parley_inter_token_latency_seconds_count{model="stories"} 4`,
		"parley_step_duration_seconds", "parley_batch_size", "parley_batch_tokens", "parley_steps_total",
	}
	// The scheduler publishes its statistics at the end of a step, which may come just after the
	// response: scrape until they have caught up (or give up after 30 seconds).
	var text string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		resp, b := h.do(t, "GET", "/metrics", "")
		if resp.StatusCode != 200 {
			t.Fatalf("metrics: %d", resp.StatusCode)
		}
		text = string(b)
		missing := 0
		for _, name := range names {
			if !strings.Contains(text, name) {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, name := range names {
		if !strings.Contains(text, name) {
			t.Errorf("metrics lack %s", name)
		}
	}
	if t.Failed() {
		t.Log(text)
	}
}

func TestNewRejects(t *testing.T) {
	if _, err := New(Config{}, nil); err == nil {
		t.Error("no models accepted")
	}
	if _, err := New(Config{}, []*Model{{Name: "x"}}); err == nil {
		t.Error("model without tokenizer and scheduler accepted")
	}
}

// thinkingTemplate ends the prompt with an empty think block when the request says
// enable_thinking false, as Qwen3's template does.
const thinkingTemplate = `{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% endif %}{% if style is defined %}[{{ style.tone }} {{ style.n + 1 }}]{% endif %}`

// TestChatTemplateKwargs: chat_template_kwargs reach the template as variables (the prompt is
// the one rendered with them, and the answer the reference gives for it); anything but an object, or a
// variable the server sets itself, is a 400 naming the parameter.
func TestChatTemplateKwargs(t *testing.T) {
	h, e := templateHarness(t, "think", thinkingTemplate)
	msgs := []map[string]any{{"role": "user", "content": "Tell me about a cat."}}
	base := "<|im_start|>user\nTell me about a cat.<|im_end|>\n<|im_start|>assistant\n"
	for _, c := range []struct {
		name     string
		kwargs   any
		rendered string
	}{
		{"none", nil, base},
		{"thinking on", map[string]any{"enable_thinking": true}, base},
		{"thinking off", map[string]any{"enable_thinking": false}, base + "<think>\n\n</think>\n\n"},
		{"nested values", map[string]any{"style": map[string]any{"tone": "calm", "n": 2}}, base + "[calm 3]"},
	} {
		toks, err := e.Tokenizer.Encode(c.rendered, true, true)
		if err != nil {
			t.Fatal(err)
		}
		want := reference(t, e, toks, 12)
		body := map[string]any{"messages": msgs, "max_tokens": 12, "temperature": 0}
		if c.kwargs != nil {
			body["chat_template_kwargs"] = c.kwargs
		}
		resp, b := h.post(t, "/v1/chat/completions", body)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d: %s", c.name, resp.StatusCode, b)
		}
		r := decodeResp(t, b)
		if r.Usage.PromptTokens != len(toks) || r.Choices[0].Message == nil || r.Choices[0].Message.Content != want.Text {
			t.Errorf("%s: prompt tokens %d (want %d), answer %s, reference %q", c.name, r.Usage.PromptTokens, len(toks), b, want.Text)
		}
	}
	for _, kw := range []string{`[1]`, `"x"`, `3`, `{"messages": []}`, `{"add_generation_prompt": false}`} {
		resp, b := h.do(t, "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2,"chat_template_kwargs":`+kw+`}`)
		var eb errorBody
		_ = json.Unmarshal(b, &eb)
		if resp.StatusCode != 400 || eb.Error == nil || eb.Error.Param == nil || *eb.Error.Param != "chat_template_kwargs" {
			t.Errorf("chat_template_kwargs %s: %d %s", kw, resp.StatusCode, b)
		}
	}
}
