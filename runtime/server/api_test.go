package server

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// logprobRun is one greedy generation with log-probabilities, as the client sees it.
type logprobRun struct {
	text    string
	tokens  []string
	offsets []int // text_offset of /v1/completions; nil for chat
}

// logprobPrompt is the completion prompt of runLogprobs: ASCII, so its length in bytes is its
// length in characters.
const logprobPrompt = "Once upon a time"

// runLogprobs generates up to 30 tokens greedily with log-probabilities from the completion or
// the chat endpoint, streamed or not, joining the chunks of a stream. In a stream it checks that
// no chunk reports a token starting past the text sent so far.
func runLogprobs(t *testing.T, h *harness, chat, stream bool, stop []string) *logprobRun {
	t.Helper()
	req := map[string]any{"max_tokens": 30, "temperature": 0, "stream": stream}
	path := "/v1/completions"
	if chat {
		path = "/v1/chat/completions"
		req["model"], req["logprobs"] = "stories-chat", true
		req["messages"] = []map[string]any{{"role": "user", "content": "Tell me about a cat."}}
	} else {
		req["model"], req["logprobs"], req["prompt"] = "stories", 0, logprobPrompt
	}
	if stop != nil {
		req["stop"] = stop
	}
	resp, b := h.post(t, path, req)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	chunks := responseChunks(t, b, stream)
	run := &logprobRun{tokens: []string{}}
	for _, c := range chunks {
		r := decodeResp(t, []byte(c))
		if len(r.Choices) != 1 {
			t.Fatalf("choices: %s", c)
		}
		ch := r.Choices[0]
		switch {
		case ch.Text != nil:
			run.text += *ch.Text
		case ch.Message != nil:
			run.text += ch.Message.Content
		case ch.Delta != nil:
			run.text += deref(ch.Delta.Content)
		}
		if string(ch.Logprobs) == "null" {
			continue
		}
		if chat {
			var lp chatLogprobs
			if err := json.Unmarshal(ch.Logprobs, &lp); err != nil {
				t.Fatalf("%v: %s", err, c)
			}
			for _, e := range lp.Content {
				run.tokens = append(run.tokens, e.Token)
			}
			continue
		}
		var lp completionLogprobs
		if err := json.Unmarshal(ch.Logprobs, &lp); err != nil {
			t.Fatalf("%v: %s", err, c)
		}
		for _, o := range lp.TextOffset { // offsets count the prompt's characters too
			if o < len(logprobPrompt) || o-len(logprobPrompt) > utf8.RuneCountInString(run.text) {
				t.Errorf("text_offset %d outside the prompt's %d characters and the %d of text sent: %s", o, len(logprobPrompt), utf8.RuneCountInString(run.text), c)
			}
		}
		run.tokens = append(run.tokens, lp.Tokens...)
		run.offsets = append(run.offsets, lp.TextOffset...)
	}
	return run
}

// TestLogprobsStopCut checks that logprobs cover exactly the tokens whose whole text is
// returned when a stop string cuts the output: at a token boundary, inside a token (the token
// is dropped with the stop) or across tokens.
func TestLogprobsStopCut(t *testing.T) {
	h := newHarness(t, Config{})
	cases := []struct {
		name string
		chat bool
		stop string
	}{
		{"completion inside a token", false, "Lily"}, // " Lily": its space is kept
		{"completion across tokens", false, "irl na"},
		{"completion at a boundary", false, " named"},
		{"chat inside a token", true, "k."}, // "ck"
		{"chat at a boundary", true, "nack"},
	}
	full := map[bool]*logprobRun{}
	for _, chat := range []bool{false, true} {
		full[chat] = runLogprobs(t, h, chat, false, nil)
		if got := strings.Join(full[chat].tokens, ""); got != full[chat].text {
			t.Fatalf("chat %v without stop: tokens %q do not spell the text %q", chat, full[chat].tokens, full[chat].text)
		}
	}
	for _, c := range cases {
		f := full[c.chat]
		cut := strings.Index(f.text, c.stop)
		if cut < 0 {
			t.Fatalf("%s: stop %q is not in the greedy text %q", c.name, c.stop, f.text)
		}
		wantText := f.text[:cut]
		var wantTokens []string
		var wantOffsets []int
		end := 0
		for _, tok := range f.tokens {
			if end+len(tok) > len(wantText) {
				break
			}
			wantTokens = append(wantTokens, tok)
			wantOffsets = append(wantOffsets, len(logprobPrompt)+end) // the text is ASCII
			end += len(tok)
		}
		for _, stream := range []bool{false, true} {
			name := c.name
			if stream {
				name += " streamed"
			}
			t.Run(name, func(t *testing.T) {
				got := runLogprobs(t, h, c.chat, stream, []string{c.stop})
				if got.text != wantText {
					t.Errorf("text %q, want %q", got.text, wantText)
				}
				if !slices.Equal(got.tokens, wantTokens) {
					t.Errorf("tokens %q, want %q (text %q)", got.tokens, wantTokens, got.text)
				}
				if !c.chat && !slices.Equal(got.offsets, wantOffsets) {
					t.Errorf("text_offset %v, want %v", got.offsets, wantOffsets)
				}
			})
		}
	}
}

func TestPreflightEchoesHeaders(t *testing.T) {
	h := newHarness(t, Config{APIKey: "sekrit", AllowedOrigins: []string{"https://app.example"}})
	resp, b := h.do(t, "OPTIONS", "/v1/chat/completions", "", "Origin", "https://app.example", "Access-Control-Request-Method", "POST",
		"Access-Control-Request-Headers", "authorization,content-type,x-stainless-os,x-stainless-lang,x-stainless-retry-count")
	if resp.StatusCode != 204 {
		t.Fatalf("preflight: %d %s", resp.StatusCode, b)
	}
	allowed := strings.ToLower(resp.Header.Get("Access-Control-Allow-Headers"))
	for _, want := range []string{"authorization", "content-type", "x-request-id", "x-stainless-os", "x-stainless-lang", "x-stainless-retry-count"} {
		if !slices.Contains(strings.Split(allowed, ", "), want) {
			t.Errorf("Access-Control-Allow-Headers %q lacks %s", allowed, want)
		}
	}
	vary := strings.Join(resp.Header.Values("Vary"), ", ")
	for _, want := range []string{"Origin", "Access-Control-Request-Headers"} {
		if !strings.Contains(vary, want) {
			t.Errorf("Vary %q lacks %s", vary, want)
		}
	}
	// A refused origin gets no CORS headers, but the answer still varies with the origin.
	resp, _ = h.do(t, "OPTIONS", "/v1/chat/completions", "", "Origin", "https://evil.example", "Access-Control-Request-Method", "POST",
		"Access-Control-Request-Headers", "x-stainless-os")
	if resp.StatusCode != 403 || resp.Header.Get("Access-Control-Allow-Headers") != "" || !strings.Contains(resp.Header.Get("Vary"), "Origin") {
		t.Errorf("refused preflight: %d %v", resp.StatusCode, resp.Header)
	}
}

func TestAllowHeaders(t *testing.T) {
	many := make([]string, 3*maxAllowHeaders)
	for i := range many {
		many[i] = "x-h" + strings.Repeat("a", i)
	}
	cases := []struct {
		name      string
		requested []string
		want      string
	}{
		{"none", nil, "Authorization, Content-Type, X-Request-Id"},
		{"duplicates of the base", []string{"authorization, CONTENT-TYPE"}, "Authorization, Content-Type, X-Request-Id"},
		{"stainless", []string{"x-stainless-os, x-stainless-arch", "x-stainless-os"}, "Authorization, Content-Type, X-Request-Id, x-stainless-os, x-stainless-arch"},
		{"not header names", []string{"a b, c:d, , é, ok"}, "Authorization, Content-Type, X-Request-Id, ok"},
		{"too many", []string{strings.Join(many, ",")}, strings.Join(append(slices.Clone(baseHeaders), many[:maxAllowHeaders]...), ", ")},
	}
	for _, c := range cases {
		if got := allowHeaders(c.requested); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// TestFloat32AndLimitParams checks that values valid as float64 but not as the float32 the
// sampler gets, and n above the scheduler's limit, are refused naming their parameter.
func TestFloat32AndLimitParams(t *testing.T) {
	h := newHarness(t, Config{})
	cases := []struct {
		name   string
		body   string
		status int
		param  string
	}{
		{"n over the scheduler's limit", `{"n":12}`, 400, "n"}, // newSched: MaxSeqs 8
		{"top_p underflows", `{"top_p":1e-300}`, 400, "top_p"},
		{"top_p least float32", `{"top_p":1.5e-45}`, 200, ""},
		{"temperature overflows", `{"temperature":1e300}`, 400, "temperature"},
		{"temperature underflows to greedy", `{"temperature":1e-300}`, 200, ""},
		{"min_p overflows", `{"min_p":1e300}`, 400, "min_p"},
		{"min_p negative underflow", `{"min_p":-1e-300}`, 400, "min_p"},
		{"presence_penalty overflows", `{"presence_penalty":-1e300}`, 400, "presence_penalty"},
		{"frequency_penalty overflows", `{"frequency_penalty":1e300}`, 400, "frequency_penalty"},
		{"frequency_penalty underflows", `{"frequency_penalty":1e-300}`, 200, ""},
		{"logit_bias overflows", `{"logit_bias":{"5":1e300}}`, 400, "logit_bias"},
	}
	for _, c := range cases {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
			t.Run(c.name+" "+path, func(t *testing.T) {
				var req map[string]any
				if err := json.Unmarshal([]byte(c.body), &req); err != nil {
					t.Fatal(err)
				}
				req["max_tokens"] = 2
				if path == "/v1/completions" {
					req["model"], req["prompt"] = "stories", "a"
				} else {
					req["model"], req["messages"] = "stories-chat", []map[string]any{{"role": "user", "content": "hi"}}
				}
				resp, b := h.post(t, path, req)
				if resp.StatusCode != c.status {
					t.Fatalf("status %d, want %d: %s", resp.StatusCode, c.status, b)
				}
				if c.status == 200 {
					return
				}
				var eb errorBody
				if err := json.Unmarshal(b, &eb); err != nil || eb.Error == nil {
					t.Fatalf("error body %s (%v)", b, err)
				}
				if deref(eb.Error.Param) != c.param || eb.Error.Type != typeInvalidRequest {
					t.Errorf("param %q type %q, want %q: %s", deref(eb.Error.Param), eb.Error.Type, c.param, b)
				}
			})
		}
	}
}

func TestAuthSchemeCaseInsensitive(t *testing.T) {
	h := newHarness(t, Config{APIKey: "sekrit"})
	cases := []struct {
		auth   string
		status int
	}{
		{"Bearer sekrit", 200},
		{"bearer sekrit", 200},
		{"BEARER sekrit", 200},
		{"bEaReR   sekrit ", 200},
		{"bearer wrong", 401},
		{"bearersekrit", 401},
		{"Basic sekrit", 401},
		{"Bearer", 401},
		{"sekrit", 401},
		{"Bearer Sekrit", 401}, // the key itself is case-sensitive
	}
	for _, c := range cases {
		resp, b := h.do(t, "GET", "/v1/models", "", "Authorization", c.auth)
		if resp.StatusCode != c.status {
			t.Errorf("Authorization %q: %d, want %d: %s", c.auth, resp.StatusCode, c.status, b)
		}
	}
}

// TestResponseIDUnique checks that two requests sending the same X-Request-Id get it back in
// the header but different response ids.
func TestResponseIDUnique(t *testing.T) {
	h := newHarness(t, Config{})
	cases := []struct {
		name   string
		path   string
		body   string
		prefix string
	}{
		{"completion", "/v1/completions", `{"model":"stories","prompt":"a","max_tokens":2}`, "cmpl-"},
		{"completion stream", "/v1/completions", `{"model":"stories","prompt":"a","max_tokens":2,"stream":true}`, "cmpl-"},
		{"chat", "/v1/chat/completions", `{"model":"stories-chat","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`, "chatcmpl-"},
		{"chat stream", "/v1/chat/completions", `{"model":"stories-chat","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true}`, "chatcmpl-"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var ids []string
			for range 2 {
				resp, b := h.do(t, "POST", c.path, c.body, "X-Request-Id", "same-id")
				if resp.StatusCode != 200 {
					t.Fatalf("status %d: %s", resp.StatusCode, b)
				}
				if got := resp.Header.Get("X-Request-Id"); got != "same-id" {
					t.Errorf("X-Request-Id %q, want same-id", got)
				}
				chunks := []string{string(b)}
				if strings.Contains(c.body, `"stream":true`) {
					chunks = sse(t, strings.NewReader(string(b)))
					chunks = chunks[:len(chunks)-1]
				}
				id := decodeResp(t, []byte(chunks[0])).ID
				for _, ch := range chunks[1:] {
					if got := decodeResp(t, []byte(ch)).ID; got != id {
						t.Errorf("chunk id %q, first chunk %q", got, id)
					}
				}
				if !strings.HasPrefix(id, c.prefix) || strings.Contains(id, "same-id") {
					t.Errorf("id %q", id)
				}
				ids = append(ids, id)
			}
			if ids[0] == ids[1] {
				t.Errorf("both requests got id %q", ids[0])
			}
		})
	}
	// Without X-Request-Id the server's own request id is the response id.
	resp, b := h.do(t, "POST", "/v1/completions", `{"model":"stories","prompt":"a","max_tokens":2}`)
	if id := decodeResp(t, b).ID; id != "cmpl-"+resp.Header.Get("X-Request-Id") {
		t.Errorf("id %q, X-Request-Id %q", id, resp.Header.Get("X-Request-Id"))
	}
}

// TestBodyTimeout: a body that stalls after its headers is answered 408 once BodyTimeout has
// passed, and the server goes on serving; a whole body's deadline does not carry over to its
// response, however long that takes.
func TestBodyTimeout(t *testing.T) {
	h := newHarness(t, Config{BodyTimeout: 40 * time.Millisecond})
	pr, pw := io.Pipe()
	defer pw.Close()
	go pw.Write([]byte(`{"model":"stories","prompt":"Once upon`)) // and nothing more
	t0 := time.Now()
	resp, err := http.Post(h.srv.URL+"/v1/completions", "application/json", pr)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(b), "request_timeout") {
		t.Fatalf("stalled body: %d %s", resp.StatusCode, b)
	}
	if d := time.Since(t0); d > 10*time.Second {
		t.Fatalf("answered after %v", d)
	}
	// A stream that outlasts the body's deadline is not cut.
	t0 = time.Now()
	resp, b = h.do(t, "POST", "/v1/completions", `{"model":"stories","prompt":"Once upon a time","max_tokens":200,"ignore_eos":true,"stream":true,"n":4,"logprobs":5}`)
	if resp.StatusCode != 200 || !strings.HasSuffix(string(b), "data: [DONE]\n\n") || strings.Count(string(b), `"finish_reason":"length"`) != 4 {
		t.Fatalf("stream: %d ...%s", resp.StatusCode, b[max(0, len(b)-200):])
	}
	if d := time.Since(t0); d < 2*h.s.cfg.BodyTimeout {
		t.Fatalf("the stream took %v, not longer than the body's deadline: this tested nothing", d)
	}
}

// TestLoading: while the models load, every request is answered 503 with Retry-After, with the
// request id and the CORS headers a browser needs to read that answer; a preflight is answered
// as the server will answer it.
func TestLoading(t *testing.T) {
	srv := httptest.NewServer(Loading(Config{AllowedOrigins: []string{"http://ok.example"}}))
	defer srv.Close()
	for _, c := range []struct{ method, path string }{{"GET", "/health"}, {"POST", "/v1/completions"}, {"GET", "/v1/models"}} {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, strings.NewReader(`{}`))
		req.Header.Set("Origin", "http://ok.example")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(b), `"code":"loading"`) ||
			resp.Header.Get("Access-Control-Allow-Origin") != "http://ok.example" || resp.Header.Get("X-Request-Id") == "" {
			t.Errorf("%s %s: %d %v %s", c.method, c.path, resp.StatusCode, resp.Header, b)
		}
	}
	req, _ := http.NewRequest("OPTIONS", srv.URL+"/v1/chat/completions", nil)
	req.Header.Set("Origin", "http://ok.example")
	req.Header.Set("Access-Control-Request-Method", "POST")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Methods") == "" {
		t.Errorf("preflight: %d %v", resp.StatusCode, resp.Header)
	}
}

// TestBodyTimeoutReachesClient: a client that announced more body than it sends gets its 408,
// and the connection closes, while it still waits to send the rest: the server does not first
// wait for the rest of the body.
func TestBodyTimeoutReachesClient(t *testing.T) {
	h := newHarness(t, Config{BodyTimeout: 200 * time.Millisecond})
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprint(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer while the client waits: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("the connection stays open after the 408: %v", err)
	}
}
