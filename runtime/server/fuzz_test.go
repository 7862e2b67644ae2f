package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// checkRefusal fails t unless e is a client error with a message.
func checkRefusal(t *testing.T, what string, e *apiError) {
	t.Helper()
	if e.Status < 400 || e.Status > 499 || e.Message == "" || e.Type == "" {
		t.Fatalf("%s: refusal %+v is not a 4xx with a message", what, e)
	}
}

// FuzzRequest: any body sent to /v1/completions or /v1/chat/completions is either accepted, with
// sampling parameters the sampler takes, or refused with a 4xx that says why; accepted chat
// messages render through chat templates, or fail with the template's own error. Nothing panics.
func FuzzRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hi","max_tokens":5}`,
		`{"prompt":[1,2,3],"n":2,"temperature":0.5,"top_p":0.9,"seed":1,"stop":["a","b"]}`,
		`{"prompt":[[1,2]],"logit_bias":{"3":-100,"7":5},"logprobs":3,"stop":"x"}`,
		`{"prompt":"x","stream":true,"stream_options":{"include_usage":true},"top_k":5,"min_p":0.1}`,
		`{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}],"logprobs":true,"top_logprobs":2}`,
		`{"messages":[{"role":"assistant","content":null}],"max_completion_tokens":3,"presence_penalty":1,"frequency_penalty":-1}`,
		`{"prompt":["a",[1,2]],"n":2,"best_of":2,"echo":false,"suffix":""}`,
		`{"messages":[{"role":"user","content":"hi"}],"tools":[],"tool_choice":"auto","response_format":{"type":"text"},"modalities":["text"]}`,
		`{"prompt":"x","max_tokens":-1}`, `{"prompt":"x","n":1e99}`, `[]`, `null`, "\xff", `{"prompt":`,
	} {
		f.Add([]byte(s))
	}
	var templates []*chatTemplate
	for _, src := range []string{chatML, strictTemplate} {
		tm, err := parseChatTemplate(src, "<s>", "</s>")
		if err != nil {
			f.Fatal(err)
		}
		templates = append(templates, tm)
	}
	const vocab, ctx = 512, 256
	seed := func() uint64 { return 7 }
	f.Fuzz(func(t *testing.T, body []byte) {
		checkCommon := func(c *commonRequest) {
			g, e := parseCommon(c, vocab, ctx, seed)
			if e != nil {
				checkRefusal(t, "parameters", e)
				return
			}
			if err := g.sampling.Validate(vocab); err != nil {
				t.Fatalf("accepted parameters the sampler refuses: %v", err)
			}
			if g.n < 1 || g.n > maxN || g.maxTokens < 0 || g.maxTokens > ctx {
				t.Fatalf("accepted n=%d max_tokens=%d", g.n, g.maxTokens)
			}
		}
		var c completionRequest
		if e := decodeBody(body, &c); e != nil {
			checkRefusal(t, "completion body", e)
		} else {
			checkCommon(&c.commonRequest)
			if e := c.checkUnsupported(1); e != nil {
				checkRefusal(t, "unsupported", e)
			}
			if ps, e := parsePrompt(c.Prompt, vocab); e != nil {
				checkRefusal(t, "prompt", e)
			} else {
				if len(ps) == 0 {
					t.Fatal("accepted no prompt")
				}
				for _, p := range ps {
					if p.isText == (p.text == "") || p.isText == (len(p.tokens) > 0) {
						t.Fatalf("accepted an empty prompt %+v", p)
					}
					for _, id := range p.tokens {
						if id < 0 || id >= vocab {
							t.Fatalf("accepted token %d outside the vocabulary", id)
						}
					}
				}
			}
		}
		var ch chatRequest
		if e := decodeBody(body, &ch); e != nil {
			checkRefusal(t, "chat body", e)
			return
		}
		checkCommon(&ch.commonRequest)
		if e := ch.checkUnsupported(); e != nil {
			checkRefusal(t, "unsupported", e)
		}
		msgs, e := parseMessages(ch.Messages)
		if e != nil {
			checkRefusal(t, "messages", e)
			return
		}
		for _, tm := range templates {
			_, _ = tm.render(msgs, nil) // a template may refuse messages (answered as a 400), never panic
		}
	})
}

// FuzzRealtimeMessage: any message a live-transcription client sends is either audio, a known
// event, or refused with a close code and an error event; nothing panics.
func FuzzRealtimeMessage(f *testing.F) {
	for _, s := range []string{`{"type":"audio","audio":"AAABAA=="}`, `{"type":"commit"}`, `{"type":"close"}`, `{"type":"x"}`, `{"type":"audio","audio":"AAA="}`, `not json`} {
		f.Add(false, []byte(s))
	}
	f.Add(true, []byte{1, 0, 255, 127})
	f.Add(true, []byte{1})
	f.Fuzz(func(t *testing.T, binary bool, b []byte) {
		typ := websocket.MessageText
		if binary {
			typ = websocket.MessageBinary
		}
		it, code, ev := parseMessage(typ, b)
		if ev != nil {
			if code == 0 || ev.Code == "" || ev.Message == "" {
				t.Fatalf("refusal without a close code or reason: %d %+v", code, ev)
			}
			return
		}
		if it.op == "" && it.pcm == nil && len(b) > 0 && binary {
			t.Fatalf("binary message of %d bytes gave no audio", len(b))
		}
		for _, v := range it.pcm {
			if v < -1 || v > 1 {
				t.Fatalf("sample %v outside [-1, 1]", v)
			}
		}
	})
}

// TestFloorLogprob: a -Inf log-probability (a model's -Inf logit) is reported as OpenAI reports
// tokens of no probability, since JSON cannot hold it; finite ones pass unchanged.
func TestFloorLogprob(t *testing.T) {
	for _, c := range []struct{ in, want float64 }{
		{math.Inf(-1), -9999}, {math.NaN(), -9999}, {-1e300, -9999}, {-9999, -9999}, {-2.5, -2.5}, {0, 0},
	} {
		got := floorLogprob(c.in)
		if got != c.want {
			t.Errorf("floorLogprob(%v) = %v, want %v", c.in, got, c.want)
		}
		if _, err := json.Marshal(chatTopLogprob{Logprob: got}); err != nil {
			t.Errorf("%v: %v", c.in, err)
		}
	}
}

// FuzzServer sends fuzzer-chosen bodies to the generation endpoints of a real server (the 260K
// model, without and with a chat template): every answer is a 200 or a 4xx in OpenAI's error
// shape, never a 5xx, and every next request is answered too.
func FuzzServer(f *testing.F) {
	h := newHarness(f, Config{MaxBodyBytes: 1 << 16})
	for _, s := range []string{
		`{"model":"stories","prompt":"Once upon","max_tokens":4}`,
		`{"model":"stories","prompt":[1,2,3],"max_tokens":3,"n":2,"temperature":0.7,"seed":3,"logprobs":2}`,
		`{"model":"stories","prompt":"a","max_tokens":3,"stream":true,"stream_options":{"include_usage":true},"stop":["the"]}`,
		`{"model":"stories-chat","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"logprobs":true,"top_logprobs":3}`,
		`{"model":"stories-chat","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true,"logit_bias":{"5":-100}}`,
		`{"model":"stories","prompt":"x","max_tokens":2,"temperature":1e-40,"top_k":3,"min_p":0.2}`,
		`{"model":"nope","prompt":"x"}`, `{"model":"stories","prompt":""}`, `{`, ``,
	} {
		f.Add(uint8(0), []byte(s))
		f.Add(uint8(1), []byte(s))
	}
	client := &http.Client{Timeout: 30 * time.Second}
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		path := [...]string{"/v1/completions", "/v1/chat/completions"}[which%2]
		resp, err := client.Post(h.srv.URL+path, "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		checkAnswer(t, resp, fmt.Sprintf("%s %q", path, body))
	})
}

// FuzzTranscription uploads fuzzer-chosen files and form fields to the transcription and
// translation endpoints of a real server (random-weight tiny.en, 24 tokens a window): every
// answer is a 200 or a 4xx in OpenAI's error shape, never a 5xx.
func FuzzTranscription(f *testing.F) {
	h := newSpeechHarness(f, Config{MaxBodyBytes: 1 << 20})
	wav := wavBytes(make([]float32, 8000))
	for i, s := range [][]byte{wav, wav[:40], []byte("RIFF\x00\x00\x00\x00WAVE"), []byte("fLaC"), []byte("ID3"), []byte("OggS"), nil} {
		f.Add(uint8(i), s, "en", "0", "a prompt")
	}
	f.Add(uint8(7), wav, "de", "0.4", "")
	f.Add(uint8(9), wav, "", "x", "\xff")
	formats := [...]string{"json", "text", "srt", "vtt", "verbose_json", "docx"}
	client := &http.Client{Timeout: 60 * time.Second}
	f.Fuzz(func(t *testing.T, which uint8, file []byte, lang, temp, prompt string) {
		path := "/v1/audio/transcriptions"
		if which&1 == 1 {
			path = "/v1/audio/translations"
		}
		fields := []field{{"model", "whisper-tiny"}, {"response_format", formats[int(which/2)%len(formats)]}}
		if lang != "" {
			fields = append(fields, field{"language", lang})
		}
		if temp != "" {
			fields = append(fields, field{"temperature", temp})
		}
		if prompt != "" {
			fields = append(fields, field{"prompt", prompt})
		}
		if which&64 != 0 {
			fields = append(fields, field{"timestamp_granularities[]", "word"})
		}
		ctype, body := form(file, "", fields...)
		resp, err := client.Post(h.srv.URL+path, ctype, bytes.NewReader(body))
		if err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
		checkAnswer(t, resp, fmt.Sprintf("%s (%d-byte file, fields %q)", path, len(file), fields))
	})
}

// checkAnswer reads resp and fails t unless it is a 200, or a 4xx whose body is an OpenAI-shaped
// error object; what names the request.
func checkAnswer(t *testing.T, resp *http.Response, what string) {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("%s: reading the answer: %v", what, err)
	}
	switch {
	case resp.StatusCode == http.StatusOK:
	case resp.StatusCode >= 400 && resp.StatusCode < 500:
		var e struct {
			Error *apiError `json:"error"`
		}
		if err := json.Unmarshal(b, &e); err != nil || e.Error == nil || e.Error.Message == "" {
			t.Fatalf("%s: %d answer is not an error object: %q", what, resp.StatusCode, b)
		}
	default:
		t.Fatalf("%s: status %d: %s", what, resp.StatusCode, b)
	}
}
