package server

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/parleyhq/parley/runtime/backend"
	_ "github.com/parleyhq/parley/runtime/backend/all"
	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/models"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/sched"
	"github.com/parleyhq/parley/runtime/sched/schedtest"
	"github.com/parleyhq/parley/runtime/tensor"
)

const testCtx = 256 // positions per sequence in these tests

// chatML is a ChatML template, as Qwen and many fine-tunes ship it.
const chatML = `{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}`

// strictTemplate refuses a conversation that does not start with a user message.
const strictTemplate = `{% if messages[0]['role'] != 'user' %}{{ raise_exception('first message must come from the user') }}{% endif %}{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content | trim }}{{ eos_token if m.role == 'assistant' else '\n' }}{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}`

func modelPath(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Skip("go.mod not found above the package directory")
		}
		dir = parent
	}
	p := filepath.Join(dir, "..", "shared", "models", "llm", "stories260K-f32.gguf")
	if _, err := os.Stat(p); err != nil {
		t.Skipf("test model not available (%v); these tests need ../shared/models/llm/stories260K-f32.gguf", err)
	}
	return p
}

// withTemplate writes a copy of the model at src with tokenizer.chat_template set to tmpl.
func withTemplate(t testing.TB, src, tmpl string) string {
	t.Helper()
	f, err := gguf.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := gguf.NewWriter()
	w.SetVersion(f.Version)
	for _, kv := range f.KVs {
		w.Set(kv.Key, kv.Value)
	}
	w.SetString("tokenizer.chat_template", tmpl)
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		if err := w.AddTensor(ti.Name, ti.DType, ti.Shape, f.TensorData(ti)); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(t.TempDir(), "chat.gguf")
	if err := w.WriteFile(out); err != nil {
		t.Fatal(err)
	}
	return out
}

func openLLM(t testing.TB, path string) *models.LLM {
	t.Helper()
	be, _, err := backend.New("go", backend.Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	e, err := models.OpenLLM(path, be)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// llmModel serves e, run by s, as name with ctx positions per sequence.
func llmModel(name string, e *models.LLM, s Scheduler, ctx int) *Model {
	return &Model{Name: name, Tokenizer: e.Text(), ChatTemplate: e.ChatTemplate(), Sched: s, Ctx: ctx}
}

// newSched builds a scheduler over e; run says whether its loop starts now.
func newSched(t testing.TB, e *models.LLM, cfg sched.Config, run bool) (*sched.Scheduler, func()) {
	t.Helper()
	c, err := e.Model.NewContext(llama.ContextConfig{StepTokens: 64, MaxSeqs: 8, KVSlots: 4 * testCtx, KVType: tensor.F32})
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxContext = testCtx
	sc, err := sched.New(sched.NewLlamaModel(c), e.Text(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	start := func() {
		go func() {
			defer close(done)
			sc.Run(context.Background())
		}()
	}
	if run {
		start()
	}
	t.Cleanup(func() {
		sc.Close()
		<-done
		c.Close()
	})
	return sc, start
}

type harness struct {
	srv               *httptest.Server
	s                 *Server
	plain             *Model      // stories260K as shipped: no chat template
	chat              *Model      // the same weights with chatML
	plainLLM, chatLLM *models.LLM // their files
}

func newHarness(t testing.TB, cfg Config) *harness {
	t.Helper()
	return newHarnessSched(t, cfg, sched.Config{})
}

// slowSteps makes every step of a scheduler take at least 10 ms, so that a disconnect or a
// cancellation reaches it long before 250 tokens are generated, however loaded the machine.
var slowSteps = sched.Config{OnStep: func(time.Duration, int, int) { time.Sleep(10 * time.Millisecond) }}

// newHarnessSched is newHarness with the schedulers configured as sc.
func newHarnessSched(t testing.TB, cfg Config, sc sched.Config) *harness {
	t.Helper()
	p := modelPath(t)
	e1 := openLLM(t, p)
	e2 := openLLM(t, withTemplate(t, p, chatML))
	s1, _ := newSched(t, e1, sc, true)
	s2, _ := newSched(t, e2, sc, true)
	h := &harness{
		plain:    llmModel("stories", e1, s1, testCtx),
		chat:     llmModel("stories-chat", e2, s2, testCtx),
		plainLLM: e1, chatLLM: e2,
	}
	var err error
	if h.s, err = New(cfg, []*Model{h.plain, h.chat}); err != nil {
		t.Fatal(err)
	}
	h.s.SetReady(true)
	h.srv = httptest.NewServer(h.s.Handler())
	t.Cleanup(h.srv.Close)
	return h
}

func (h *harness) do(t *testing.T, method, path, body string, hdr ...string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, h.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

func (h *harness) post(t *testing.T, path string, body any) (*http.Response, []byte) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return h.do(t, "POST", path, string(b))
}

// responseChunks returns a response's JSON documents: the body, or the data of each event of a
// stream, checked to end with [DONE] (left out).
func responseChunks(t *testing.T, b []byte, stream bool) []string {
	t.Helper()
	if !stream {
		return []string{string(b)}
	}
	chunks := sse(t, strings.NewReader(string(b)))
	if len(chunks) == 0 || chunks[len(chunks)-1] != "[DONE]" {
		t.Fatalf("stream %q", chunks)
	}
	return chunks[:len(chunks)-1]
}

// reference generates greedily from prompt one sequence at a time (schedtest.Generate): the
// text the server must match.
func reference(t *testing.T, e *models.LLM, prompt []int32, maxTokens int) *schedtest.Result {
	t.Helper()
	c, err := e.Model.NewContext(llama.ContextConfig{StepTokens: testCtx, MaxSeqs: 1, KVSlots: testCtx, KVType: tensor.F32})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := decode.DefaultParams()
	p.Temperature = 0
	res, err := schedtest.Generate(c, e.Text(), prompt, maxTokens, p)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

type completionResp struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int     `json:"index"`
		Text    *string `json:"text"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Logprobs     json.RawMessage `json:"logprobs"`
		FinishReason *string         `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		TotalTokens      int `json:"total_tokens"`
	} `json:"usage"`
}

func decodeResp(t *testing.T, b []byte) *completionResp {
	t.Helper()
	var r completionResp
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("response %s: %v", b, err)
	}
	return &r
}

const storyPrompt = "Once upon a time, there was a little"

func TestCompletionGreedyMatchesReference(t *testing.T) {
	h := newHarness(t, Config{})
	e := h.plainLLM
	toks, err := e.Tokenizer.Encode(storyPrompt, true, true)
	if err != nil {
		t.Fatal(err)
	}
	want := reference(t, e, toks, 40)
	resp, b := h.post(t, "/v1/completions", map[string]any{"model": "stories", "prompt": storyPrompt, "max_tokens": 40, "temperature": 0})
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if resp.Header.Get("X-Request-Id") == "" {
		t.Error("no X-Request-Id")
	}
	r := decodeResp(t, b)
	if r.Object != "text_completion" || !strings.HasPrefix(r.ID, "cmpl-") || r.Model != "stories" || r.Created == 0 || len(r.Choices) != 1 {
		t.Fatalf("bad envelope: %s", b)
	}
	c := r.Choices[0]
	if c.Text == nil || *c.Text != want.Text {
		t.Errorf("text %q, reference %q", deref(c.Text), want.Text)
	}
	wantReason := map[decode.StopReason]string{decode.StopEOS: "stop", decode.StopLength: "length", decode.StopString: "stop"}[want.Reason]
	if c.FinishReason == nil || *c.FinishReason != wantReason {
		t.Errorf("finish_reason %v, reference %s", c.FinishReason, want.Reason)
	}
	if string(c.Logprobs) != "null" {
		t.Errorf("logprobs %s, want null", c.Logprobs)
	}
	if r.Usage == nil || r.Usage.PromptTokens != len(toks) || r.Usage.TotalTokens != r.Usage.PromptTokens+r.Usage.CompletionTokens || r.Usage.CompletionTokens < len(want.Tokens) {
		t.Errorf("usage %+v, prompt %d tokens, reference generated %d", r.Usage, len(toks), len(want.Tokens))
	}

	// The same prompt as token ids.
	resp, b = h.post(t, "/v1/completions", map[string]any{"model": "stories", "prompt": toks, "max_tokens": 40, "temperature": 0})
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if got := deref(decodeResp(t, b).Choices[0].Text); got != want.Text {
		t.Errorf("token prompt: text %q, reference %q", got, want.Text)
	}

	// A stop string taken from the output ends the text just before it.
	if len(want.Text) > 20 {
		stop := want.Text[10:14]
		cut := want.Text[:strings.Index(want.Text, stop)]
		_, b = h.post(t, "/v1/completions", map[string]any{"model": "stories", "prompt": storyPrompt, "max_tokens": 40, "temperature": 0, "stop": []string{stop}})
		r = decodeResp(t, b)
		if got := deref(r.Choices[0].Text); got != cut || deref(r.Choices[0].FinishReason) != "stop" {
			t.Errorf("stop %q: text %q (%s), want %q", stop, got, deref(r.Choices[0].FinishReason), cut)
		}
	}

	// n=2 with logprobs: two choices, each token with its 3 alternatives and itself.
	resp, b = h.post(t, "/v1/completions", map[string]any{"model": "stories", "prompt": storyPrompt, "max_tokens": 8, "temperature": 0.8, "seed": 7, "n": 2, "logprobs": 3, "ignore_eos": true})
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	r = decodeResp(t, b)
	if len(r.Choices) != 2 || r.Choices[1].Index != 1 {
		t.Fatalf("n=2: %s", b)
	}
	var lp completionLogprobs
	if err := json.Unmarshal(r.Choices[0].Logprobs, &lp); err != nil {
		t.Fatal(err)
	}
	if len(lp.Tokens) != 8 || len(lp.TokenLogprobs) != 8 || len(lp.TopLogprobs) != 8 || len(lp.TopLogprobs[0]) == 0 || len(lp.TopLogprobs[0]) > 4 {
		t.Errorf("logprobs: %s", r.Choices[0].Logprobs)
	}
	if strings.Join(lp.Tokens, "") != deref(r.Choices[0].Text) {
		t.Errorf("logprob tokens %q do not spell the text %q", lp.Tokens, deref(r.Choices[0].Text))
	}
	if deref(r.Choices[0].FinishReason) != "length" || r.Usage.CompletionTokens != 16 {
		t.Errorf("finish %s usage %+v", deref(r.Choices[0].FinishReason), r.Usage)
	}
}

func deref[T any](p *T) T {
	var z T
	if p == nil {
		return z
	}
	return *p
}

// sse reads a server-sent-event body: the data lines, in order.
func sse(t *testing.T, body io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(body)
	blank := true
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			if blank {
				t.Errorf("empty event")
			}
			blank = true
			continue
		}
		if !blank {
			t.Errorf("event with several lines: %q", line)
		}
		blank = false
		d, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("line %q is not a data line", line)
		}
		out = append(out, d)
	}
	return out
}

func TestCompletionStream(t *testing.T) {
	h := newHarness(t, Config{})
	_, b := h.post(t, "/v1/completions", map[string]any{"model": "stories", "prompt": storyPrompt, "max_tokens": 30, "temperature": 0})
	want := deref(decodeResp(t, b).Choices[0].Text)

	body, _ := json.Marshal(map[string]any{"model": "stories", "prompt": storyPrompt, "max_tokens": 30, "temperature": 0, "stream": true, "stream_options": map[string]any{"include_usage": true}})
	resp, err := http.Post(h.srv.URL+"/v1/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events := sse(t, resp.Body)
	if len(events) < 4 || events[len(events)-1] != "[DONE]" {
		t.Fatalf("events %q", events)
	}
	var text strings.Builder
	finishes := 0
	for i, ev := range events[:len(events)-2] {
		r := decodeResp(t, []byte(ev))
		if r.Object != "text_completion" || len(r.Choices) != 1 || !strings.HasPrefix(r.ID, "cmpl-") {
			t.Fatalf("chunk %d: %s", i, ev)
		}
		if !strings.Contains(ev, `"usage":null`) {
			t.Errorf("chunk %d lacks usage:null: %s", i, ev)
		}
		text.WriteString(deref(r.Choices[0].Text))
		if r.Choices[0].FinishReason != nil {
			finishes++
			if i != len(events)-3 {
				t.Errorf("finish_reason on chunk %d of %d", i, len(events)-2)
			}
		}
	}
	if finishes != 1 {
		t.Errorf("%d chunks with finish_reason", finishes)
	}
	if text.String() != want {
		t.Errorf("streamed %q, non-streamed %q", text.String(), want)
	}
	u := decodeResp(t, []byte(events[len(events)-2]))
	if len(u.Choices) != 0 || u.Usage == nil || u.Usage.CompletionTokens == 0 || u.Usage.TotalTokens != u.Usage.PromptTokens+u.Usage.CompletionTokens {
		t.Errorf("usage chunk %s", events[len(events)-2])
	}

	// Without include_usage there is no usage anywhere.
	body, _ = json.Marshal(map[string]any{"model": "stories", "prompt": storyPrompt, "max_tokens": 5, "stream": true})
	resp2, err := http.Post(h.srv.URL+"/v1/completions", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp2.Body.Close()
	events = sse(t, resp2.Body)
	if events[len(events)-1] != "[DONE]" {
		t.Fatalf("events %q", events)
	}
	for _, ev := range events[:len(events)-1] {
		if strings.Contains(ev, "usage") {
			t.Errorf("usage without include_usage: %s", ev)
		}
	}
}
