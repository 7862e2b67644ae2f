package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// request sends method path to srv with the given Host (empty: the server's address) and
// headers (name, value pairs), and returns the status and body.
func request(t *testing.T, srv *serverProc, method, path, host, body string, hdr ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, srv.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestServeBrowserGuards: what a web page can make a default server (127.0.0.1, no key) do.
// DNS rebinding: a request that names another host is refused (421), loopback names and
// --allowed-hosts pass. Cross-site "simple" requests, which a browser sends without a preflight,
// are refused (403) whatever their content type, while curl's -d (a form type, no Origin)
// works. With --api-key, a browser's WebSocket passes the key as a subprotocol, and a missing
// key is called missing.
func TestServeBrowserGuards(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	whisper := sharedtest.WhisperRandomModel(t, "tiny.en")
	srv := startServer(t, "--backend", "go", "-m", "stories="+model, "--allowed-hosts", "parley.test")
	port := srv.base[strings.LastIndexByte(srv.base, ':')+1:]
	body := `{"model":"stories","prompt":"Once upon a time","max_tokens":4,"temperature":0}`
	for _, c := range []struct {
		name, method, path, host, body string
		hdr                            []string
		status                         int
		want                           string
	}{
		{"rebound host", "GET", "/v1/models", "attacker.example:" + port, "", nil, 421, "host_not_allowed"},
		{"rebound host, completion", "POST", "/v1/completions", "attacker.example:" + port, body, []string{"Content-Type", "application/json"}, 421, "host_not_allowed"},
		{"localhost", "GET", "/v1/models", "localhost:" + port, "", nil, 200, `"id":"stories"`},
		{"allowed host", "GET", "/v1/models", "parley.test:" + port, "", nil, 200, `"id":"stories"`},
		{"cross-site text/plain", "POST", "/v1/completions", "", body, []string{"Content-Type", "text/plain", "Origin", "https://attacker.example"}, 403, "origin_not_allowed"},
		{"cross-site form", "POST", "/v1/completions", "", body, []string{"Content-Type", "application/x-www-form-urlencoded", "Origin", "https://attacker.example"}, 403, "origin_not_allowed"},
		{"cross-site read", "GET", "/v1/models", "", "", []string{"Origin", "https://attacker.example"}, 403, "origin_not_allowed"},
		{"no origin, form type (curl -d)", "POST", "/v1/completions", "", body, []string{"Content-Type", "application/x-www-form-urlencoded"}, 200, `"text_completion"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			if code, b := request(t, srv, c.method, c.path, c.host, c.body, c.hdr...); code != c.status || !strings.Contains(b, c.want) {
				t.Errorf("%d %s; want %d with %q", code, b, c.status, c.want)
			}
		})
	}
	t.Run("curl -d", func(t *testing.T) {
		if _, err := exec.LookPath("curl"); err != nil {
			t.Skip("curl is not installed")
		}
		out, err := exec.Command("curl", "-sS", "--fail-with-body", srv.base+"/v1/completions", "-d", body).CombinedOutput()
		if err != nil || !strings.Contains(string(out), `"text_completion"`) {
			t.Errorf("curl -d: %v %s", err, out)
		}
	})

	keyed := startServer(t, "--backend", "go", "-m", "whisper="+whisper, "--api-key", "sekrit")
	if code, b := request(t, keyed, "GET", "/v1/models", "", ""); code != 401 || !strings.Contains(b, "Missing API key") {
		t.Errorf("no key: %d %s", code, b)
	}
	if code, b := request(t, keyed, "GET", "/v1/models", "", "", "Authorization", "Bearer nope"); code != 401 || !strings.Contains(b, "Incorrect API key provided.") {
		t.Errorf("wrong key: %d %s", code, b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	url := "ws" + strings.TrimPrefix(keyed.base, "http") + "/v1/audio/stream?model=whisper"
	c, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{"realtime", "openai-insecure-api-key.sekrit"}})
	if err != nil {
		code := 0
		if resp != nil {
			code = resp.StatusCode
		}
		t.Fatalf("WebSocket with the key as a subprotocol: %v (HTTP %d)", err, code)
	}
	if c.Subprotocol() != "realtime" {
		t.Errorf("subprotocol %q, want realtime", c.Subprotocol())
	}
	c.Close(websocket.StatusNormalClosure, "")
	if _, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{"openai-insecure-api-key.nope"}}); err == nil || resp == nil || resp.StatusCode != 401 {
		t.Errorf("WebSocket with a wrong key: %v", err)
	}
}

// TestServeNonLoopbackWarning: a server on every address without --api-key says so.
func TestServeNonLoopbackWarning(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	cmd := exec.Command(parleyBin, "serve", "--backend", "go", "-m", model, "--host", "0.0.0.0", "--port", "0")
	sb := &syncBuffer{}
	cmd.Stderr = sb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if strings.Contains(sb.String(), "listening on") {
			break
		}
	}
	if !strings.Contains(sb.String(), "non-loopback address without --api-key") {
		t.Errorf("no warning:\n%s", sb.String())
	}
}

// TestServeJSONLogs: with --log-format json every line the server writes is a JSON record, the
// address it listens on included, and durations are seconds.
func TestServeJSONLogs(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	srv := startServer(t, "--backend", "auto", "-m", "stories="+model, "--log-format", "json")
	postJSON(t, srv.base+"/v1/completions", `{"model":"stories","prompt":"Once","max_tokens":2}`)
	if err := srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitExit(t, srv)
	seen := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(srv.stderr.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("not a JSON record: %q", line)
			continue
		}
		seen[fmt.Sprint(rec["msg"])] = true
		for _, k := range []string{"took", "duration", "grace"} {
			v, ok := rec[k]
			if !ok {
				continue
			}
			if s, isNum := v.(float64); !isNum || s < 0 || s > 3600 {
				t.Errorf("%s of %q is %v, want seconds: %s", k, rec["msg"], v, line)
			}
		}
		if rec["msg"] == "shutting down" && rec["grace"] != 30.0 {
			t.Errorf("grace %v, want 30 (seconds): %s", rec["grace"], line)
		}
	}
	for _, m := range []string{"listening", "model loaded", "request", "shutting down"} {
		if !seen[m] {
			t.Errorf("no %q record:\n%s", m, srv.stderr.String())
		}
	}
}

// TestServeCtxPastTraining: --ctx above the model's training context is honoured, with a
// warning, as generate -c is: stories260K was trained on 128 positions, and with --ctx 512 a
// prompt of 222 tokens is completed.
func TestServeCtxPastTraining(t *testing.T) {
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	srv := startServer(t, "--backend", "go", "-m", "stories="+model, "--ctx", "512")
	ids := make([]string, 222)
	for i := range ids {
		ids[i] = fmt.Sprint(100 + i%50)
	}
	code, b, _ := postJSON(t, srv.base+"/v1/completions", `{"model":"stories","prompt":[`+strings.Join(ids, ",")+`],"max_tokens":4,"temperature":0}`)
	if code != 200 {
		t.Errorf("a 222-token prompt with --ctx 512: %d %s", code, b)
	}
	log := srv.stderr.String()
	if !strings.Contains(log, "ctx=512") || !strings.Contains(log, "beyond the model's training context") {
		t.Errorf("log:\n%s", log)
	}
}

// TestServePrefixCacheOff: PARLEY_PREFIX_CACHE=0 turns the prefix cache off, as
// --prefix-cache=false does: the same prompt sent twice is processed twice in full, where the
// cache would serve most of the second from the first.
func TestServePrefixCacheOff(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	ids := make([]string, 64)
	for i := range ids {
		ids[i] = fmt.Sprint(100 + i)
	}
	body := `{"model":"stories","prompt":[` + strings.Join(ids, ",") + `],"max_tokens":1}`
	processed := func(env ...string) float64 {
		srv := startServerEnv(t, env, "--backend", "go", "-m", "stories="+model)
		for range 2 {
			if code, b, _ := postJSON(t, srv.base+"/v1/completions", body); code != 200 {
				t.Fatalf("%d %s", code, b)
			}
		}
		_, b := request(t, srv, "GET", "/metrics", "", "")
		m := regexp.MustCompile(`(?m)^parley_sched_prompt_tokens_total\{model="stories"\} (\S+)$`).FindStringSubmatch(b)
		if m == nil {
			t.Fatalf("no parley_sched_prompt_tokens_total:\n%s", b)
		}
		var v float64
		fmt.Sscan(m[1], &v)
		return v
	}
	if on := processed(); on >= 128 {
		t.Fatalf("with the prefix cache on, %v prompt tokens processed for two requests of 64: the test cannot tell it off", on)
	}
	for _, env := range []string{"PARLEY_PREFIX_CACHE=0", "PARLEY_PREFIX_CACHE=false"} {
		if off := processed(env); off != 128 {
			t.Errorf("%s: %v prompt tokens processed for two requests of 64; want 128 (no cache)", env, off)
		}
	}
}

// TestServeCorruptModelBeforeListening: every -m file's header is read before the server
// listens: a truncated file ends it with status 1 before it says "listening on".
func TestServeCorruptModelBeforeListening(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	b, err := os.ReadFile(model)
	if err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(t.TempDir(), "cut.gguf")
	if err := os.WriteFile(cut, b[:len(b)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	res := parley(t, "", "serve", "--backend", "go", "--port", "0", "-m", "good="+model, "-m", "bad="+cut)
	if res.code != 1 || strings.Contains(res.stderr, "listening") || !strings.Contains(res.stderr, "bad:") {
		t.Errorf("exit %d:\n%s", res.code, res.stderr)
	}
}

// TestServeChatTemplate: --chat-template gives a model without one (stories260K) a chat
// template, built in by name or from a file, and chat completions work.
func TestServeChatTemplate(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	file := filepath.Join(t.TempDir(), "turns.jinja")
	if err := os.WriteFile(file, []byte(chatTemplate), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tmpl := range []string{"chatml", "llama3", file} {
		srv := startServer(t, "--backend", "go", "-m", "stories="+model, "--chat-template", tmpl)
		code, b, _ := postJSON(t, srv.base+"/v1/chat/completions", `{"model":"stories","messages":[{"role":"user","content":"Hi"}],"max_tokens":4}`)
		if code != 200 || !strings.Contains(string(b), `"chat.completion"`) {
			t.Errorf("--chat-template %s: %d %s", tmpl, code, b)
		}
	}
	bad := filepath.Join(t.TempDir(), "bad.jinja")
	if err := os.WriteFile(bad, []byte("{% for %}"), 0o644); err != nil {
		t.Fatal(err)
	}
	if res := parley(t, "", "serve", "--port", "0", "-m", model, "--chat-template", bad); res.code != 1 || strings.Contains(res.stderr, "listening") {
		t.Errorf("a template that does not parse: exit %d\n%s", res.code, res.stderr)
	}
}
