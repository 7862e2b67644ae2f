package tests

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/gguf"
)

// chatTemplate is a ChatML-style template for the test copy of stories260K, which has none.
const chatTemplate = `{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}`

// withChatTemplate writes a copy of the model at src with tokenizer.chat_template set.
func withChatTemplate(t *testing.T, src, dst string) {
	t.Helper()
	rewriteGGUF(t, src, dst, func(w *gguf.Writer) { w.SetString("tokenizer.chat_template", chatTemplate) })
}

// rewriteGGUF writes a copy of the GGUF file at src to dst, its metadata changed by edit.
func rewriteGGUF(t *testing.T, src, dst string, edit func(w *gguf.Writer)) {
	t.Helper()
	f, err := gguf.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := gguf.NewWriter()
	for _, kv := range f.KVs {
		w.Set(kv.Key, kv.Value)
	}
	edit(w)
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		if err := w.AddTensor(ti.Name, ti.DType, ti.Shape, f.TensorData(ti)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.WriteFile(dst); err != nil {
		t.Fatal(err)
	}
}

// serverProc is a running `parley serve`.
type serverProc struct {
	cmd    *exec.Cmd
	base   string
	stderr *syncBuffer
	done   chan error
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var (
	listenRE     = regexp.MustCompile(`listening on (http://[0-9.:\[\]]+)`)
	jsonListenRE = regexp.MustCompile(`"msg":"listening".*"url":"(http://[0-9.:\[\]]+)"`) // --log-format json
)

func startServer(t testing.TB, args ...string) *serverProc {
	t.Helper()
	return startServerEnv(t, nil, args...)
}

// startServerEnv starts `parley serve` with extra environment variables.
func startServerEnv(t testing.TB, env []string, args ...string) *serverProc {
	t.Helper()
	cmd := exec.Command(parleyBin, append([]string{"serve", "--host", "127.0.0.1", "--port", "0"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	sb := &syncBuffer{}
	cmd.Stderr = sb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &serverProc{cmd: cmd, stderr: sb, done: make(chan error, 1)}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-p.done
		if strings.Contains(sb.String(), raceReport) {
			t.Errorf("the server reported a data race")
		}
		if t.Failed() {
			t.Logf("server log:\n%s", sb.String())
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if m := listenRE.FindStringSubmatch(sb.String()); m != nil && p.base == "" {
			p.base = m[1]
		} else if m := jsonListenRE.FindStringSubmatch(sb.String()); m != nil && p.base == "" {
			p.base = m[1]
		}
		if p.base != "" {
			resp, err := http.Get(p.base + "/health")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					return p
				}
			}
		}
		select {
		case err := <-p.done:
			t.Fatalf("server exited: %v\n%s", err, sb.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("server not ready in 30s:\n%s", sb.String())
	return nil
}

func postJSON(t *testing.T, url, body string) (int, []byte, http.Header) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header
}

func TestServe(t *testing.T) {
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	chat := filepath.Join(t.TempDir(), "chat.gguf")
	withChatTemplate(t, model, chat)
	srv := startServer(t, "--backend", "go", "-m", "stories="+model, "-m", "chat="+chat, "--parallel", "8", "--ctx", "256")

	// The greedy output of the server equals `parley generate` for the same prompt.
	gen := parley(t, "", "generate", "--backend", "go", "-m", model, "-p", "Once upon a time", "-n", "32", "--temp", "0", "--json")
	var want struct {
		Text string `json:"text"`
	}
	if err := json.Unmarshal([]byte(gen.stdout), &want); err != nil {
		t.Fatal(err, gen.stdout, gen.stderr)
	}

	t.Run("curl completion", func(t *testing.T) {
		if _, err := exec.LookPath("curl"); err != nil {
			t.Skip("curl is not installed")
		}
		out, err := exec.Command("curl", "-sS", "--fail-with-body", srv.base+"/v1/completions", "-H", "Content-Type: application/json",
			"-d", `{"model":"stories","prompt":"Once upon a time","max_tokens":32,"temperature":0}`).Output()
		if err != nil {
			t.Fatalf("curl: %v %s", err, out)
		}
		var r struct {
			Object  string `json:"object"`
			Choices []struct {
				Text         string `json:"text"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage struct {
				PromptTokens, CompletionTokens, TotalTokens int
			} `json:"usage"`
		}
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatal(err, string(out))
		}
		if r.Object != "text_completion" || len(r.Choices) != 1 || r.Choices[0].Text != want.Text || r.Choices[0].FinishReason != "length" {
			t.Fatalf("completion %s; parley generate gave %q", out, want.Text)
		}
	})

	t.Run("SSE framing", func(t *testing.T) {
		resp, err := http.Post(srv.base+"/v1/completions", "application/json", strings.NewReader(
			`{"model":"stories","prompt":"Once upon a time","max_tokens":16,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
			t.Fatalf("content type %q", ct)
		}
		raw, _ := io.ReadAll(resp.Body)
		events := strings.Split(strings.TrimSuffix(string(raw), "\n\n"), "\n\n")
		if events[len(events)-1] != "data: [DONE]" {
			t.Fatalf("stream does not end with [DONE]: %q", raw)
		}
		var text string
		var sawUsage, sawFinish bool
		for _, ev := range events[:len(events)-1] {
			if !strings.HasPrefix(ev, "data: ") {
				t.Fatalf("event %q is not a data line", ev)
			}
			var c struct {
				Choices []struct {
					Text         string  `json:"text"`
					FinishReason *string `json:"finish_reason"`
				} `json:"choices"`
				Usage *struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(ev, "data: ")), &c); err != nil {
				t.Fatalf("chunk %q: %v", ev, err)
			}
			for _, ch := range c.Choices {
				text += ch.Text
				if ch.FinishReason != nil && *ch.FinishReason != "" {
					sawFinish = true
				}
			}
			if c.Usage != nil {
				sawUsage = c.Usage.CompletionTokens == 16
			}
		}
		if !strings.HasPrefix(want.Text, text) || len(text) == 0 || !sawFinish || !sawUsage {
			t.Fatalf("streamed %q (finish %v, usage %v); want a prefix of %q", text, sawFinish, sawUsage, want.Text)
		}
	})

	t.Run("openai node client", func(t *testing.T) {
		node := openAINode(t, "")
		out, err := exec.Command(node, "node/client.mjs", srv.base+"/v1", "stories", "chat").CombinedOutput()
		if err != nil {
			t.Fatalf("client: %v\n%s", err, out)
		}
		var r struct {
			Models     []string `json:"models"`
			Completion struct {
				Text, FinishReason string
			} `json:"completion"`
			CompletionStream struct {
				Text  string `json:"text"`
				Usage *struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			} `json:"completion_stream"`
			Chat struct {
				Content, Role string
			} `json:"chat"`
			ChatStream struct {
				Content string `json:"content"`
			} `json:"chat_stream"`
			NoTemplate *clientError `json:"no_template_error"`
			Unknown    *clientError `json:"unknown_model_error"`
		}
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if strings.Join(r.Models, ",") != "chat,stories" {
			t.Errorf("models %v", r.Models)
		}
		if r.Completion.Text != want.Text || r.CompletionStream.Text != want.Text {
			t.Errorf("openai client: completion %q, streamed %q; parley generate %q", r.Completion.Text, r.CompletionStream.Text, want.Text)
		}
		if r.CompletionStream.Usage == nil || r.CompletionStream.Usage.CompletionTokens != 32 {
			t.Errorf("stream usage %+v", r.CompletionStream.Usage)
		}
		if r.Chat.Role != "assistant" || r.Chat.Content == "" || r.Chat.Content != r.ChatStream.Content {
			t.Errorf("chat %+v, streamed %q", r.Chat, r.ChatStream.Content)
		}
		if r.NoTemplate == nil || r.NoTemplate.Status != 400 {
			t.Errorf("chat without a template: %+v", r.NoTemplate)
		}
		if r.Unknown == nil || r.Unknown.Status != 404 {
			t.Errorf("unknown model: %+v", r.Unknown)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		url := srv.base + "/v1/completions"
		huge := `{"model":"stories","prompt":"` + strings.Repeat("a", 5<<20) + `"}`
		long := `{"model":"stories","prompt":"` + strings.Repeat("Once upon a time ", 200) + `"}`
		for _, c := range []struct {
			name, url, body string
			status          int
		}{
			{"malformed json", url, `{"model":`, 400},
			{"wrong type", url, `{"model":"stories","prompt":"x","max_tokens":"many"}`, 400},
			{"unknown model", url, `{"model":"nope","prompt":"x"}`, 404},
			{"empty prompt", url, `{"model":"stories","prompt":""}`, 400},
			{"negative max_tokens", url, `{"model":"stories","prompt":"x","max_tokens":-1}`, 400},
			{"huge max_tokens", url, `{"model":"stories","prompt":"x","max_tokens":100000000}`, 400},
			{"prompt over context", url, long, 400},
			{"oversized body", url, huge, 413},
			{"invalid utf-8", url, "{\"model\":\"stories\",\"prompt\":\"\xff\xfe\"}", 400},
			{"bad temperature", url, `{"model":"stories","prompt":"x","temperature":-5}`, 400},
			{"empty messages", srv.base + "/v1/chat/completions", `{"model":"chat","messages":[]}`, 400},
			{"chat without template", srv.base + "/v1/chat/completions", `{"model":"stories","messages":[{"role":"user","content":"hi"}]}`, 400},
		} {
			status, body, _ := postJSON(t, c.url, c.body)
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
				} `json:"error"`
			}
			if status != c.status || json.Unmarshal(body, &e) != nil || e.Error.Message == "" {
				t.Errorf("%s: status %d, body %.200s; want %d with an error object", c.name, status, body, c.status)
			}
		}
	})

	t.Run("client disconnects mid-stream", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.base+"/v1/completions", strings.NewReader(
			`{"model":"stories","prompt":"Once upon a time","max_tokens":100,"stream":true,"ignore_eos":true}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		br := bufio.NewReader(resp.Body)
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		cancel()
		resp.Body.Close()
	})

	t.Run("slow body", func(t *testing.T) {
		pr, pw := io.Pipe()
		done := make(chan int, 1)
		go func() {
			resp, err := http.Post(srv.base+"/v1/completions", "application/json", pr)
			if err != nil {
				done <- 0
				return
			}
			resp.Body.Close()
			done <- resp.StatusCode
		}()
		body := `{"model":"stories","prompt":"Once upon a time","max_tokens":4,"temperature":0}`
		for i := 0; i < len(body); i += 8 {
			pw.Write([]byte(body[i:min(i+8, len(body))]))
			// Meanwhile the server keeps serving others.
			if i == 16 {
				if status, b, _ := postJSON(t, srv.base+"/v1/completions", `{"model":"stories","prompt":"Hi","max_tokens":2}`); status != 200 {
					t.Fatalf("a request during a slow upload: %d %s", status, b)
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
		pw.Close()
		if s := <-done; s != 200 {
			t.Fatalf("slow body: status %d", s)
		}
	})

	// After all of that, the server still answers.
	if status, b, _ := postJSON(t, srv.base+"/v1/completions", `{"model":"stories","prompt":"Once upon a time","max_tokens":32,"temperature":0}`); status != 200 || !bytes.Contains(b, []byte(jsonString(want.Text))) {
		t.Fatalf("after the bad input: %d %s", status, b)
	}
	if resp, err := http.Get(srv.base + "/metrics"); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Contains(b, []byte("parley_step_seconds_count")) || !bytes.Contains(b, []byte("parley_time_to_first_token_seconds")) {
			t.Fatalf("metrics: %d %.300s", resp.StatusCode, b)
		}
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return strings.Trim(string(b), `"`)
}

// TestServeLoad runs 64 concurrent streaming clients against one model for a bounded time
// ($PARLEY_LOAD_SECONDS, default 30) and reports time-to-first-token and inter-token latency;
// every request must succeed (or be refused with 429 when over budget).
func TestServeLoad(t *testing.T) {
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	secs := 30
	if v, err := fmt.Sscan(os.Getenv("PARLEY_LOAD_SECONDS"), &secs); v != 1 || err != nil {
		secs = 30
	}
	srv := startServer(t, "-m", "stories="+model, "--parallel", "16", "--ctx", "256", "--queue", "128", "-t", "2")
	if status, b, _ := postJSON(t, srv.base+"/v1/completions", `{"model":"stories","prompt":"Once","max_tokens":8}`); status != 200 {
		t.Fatalf("warm-up: %d %s", status, b)
	}
	goroutines0, rss0 := serverGauges(t, srv.base)
	const clients = 64
	var ttft, itl []time.Duration
	var mu sync.Mutex
	var ok, refused, failed atomic.Int64
	stop := time.Now().Add(time.Duration(secs) * time.Second)
	var wg sync.WaitGroup
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			for i := 0; time.Now().Before(stop); i++ {
				body := fmt.Sprintf(`{"model":"stories","prompt":"Once upon a time %d","max_tokens":24,"stream":true,"seed":%d}`, c, i)
				t0 := time.Now()
				resp, err := http.Post(srv.base+"/v1/completions", "application/json", strings.NewReader(body))
				if err != nil {
					failed.Add(1)
					continue
				}
				if resp.StatusCode == 429 {
					refused.Add(1)
					resp.Body.Close()
					time.Sleep(10 * time.Millisecond)
					continue
				}
				if resp.StatusCode != 200 {
					failed.Add(1)
					resp.Body.Close()
					continue
				}
				br := bufio.NewReader(resp.Body)
				var first time.Duration
				last := t0
				var gaps []time.Duration
				good := false
				for {
					line, err := br.ReadString('\n')
					if err != nil {
						break
					}
					if !strings.HasPrefix(line, "data: ") {
						continue
					}
					now := time.Now()
					if strings.HasPrefix(line, "data: [DONE]") {
						good = true
						break
					}
					if first == 0 {
						first = now.Sub(t0)
					} else {
						gaps = append(gaps, now.Sub(last))
					}
					last = now
				}
				resp.Body.Close()
				if !good {
					failed.Add(1)
					continue
				}
				ok.Add(1)
				mu.Lock()
				ttft = append(ttft, first)
				itl = append(itl, gaps...)
				mu.Unlock()
			}
		}(c)
	}
	wg.Wait()
	if failed.Load() != 0 || ok.Load() == 0 {
		t.Fatalf("%d requests succeeded, %d refused with 429, %d failed", ok.Load(), refused.Load(), failed.Load())
	}
	pct := func(d []time.Duration, p float64) time.Duration {
		if len(d) == 0 {
			return 0
		}
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return d[int(p*float64(len(d)-1))]
	}
	t.Logf("%d clients, %d s: %d streams completed, %d refused (429); time to first token p50 %v p99 %v; inter-token p50 %v p99 %v",
		clients, secs, ok.Load(), refused.Load(), pct(ttft, .5), pct(ttft, .99), pct(itl, .5), pct(itl, .99))

	// Afterwards nothing is left behind: goroutines return to where they were (connections close
	// within the client's idle timeout) and resident memory stays bounded.
	http.DefaultClient.CloseIdleConnections()
	var goroutines1, rss1 float64
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		goroutines1, rss1 = serverGauges(t, srv.base)
		if goroutines1 <= goroutines0+4 || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("server goroutines %v before, %v after; resident memory %.1f MiB before, %.1f MiB after", goroutines0, goroutines1, rss0/(1<<20), rss1/(1<<20))
	if goroutines1 > goroutines0+4 {
		t.Errorf("goroutines grew from %v to %v", goroutines0, goroutines1)
	}
	if rss1 > rss0+256<<20 {
		t.Errorf("resident memory grew from %.1f to %.1f MiB", rss0/(1<<20), rss1/(1<<20))
	}
}

// serverGauges scrapes the server's goroutine count and resident memory from /metrics.
func serverGauges(t *testing.T, base string) (goroutines, rss float64) {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var v float64
		line := sc.Text()
		if _, err := fmt.Sscanf(line, "go_goroutines %g", &v); err == nil {
			goroutines = v
		}
		if _, err := fmt.Sscanf(line, "process_resident_memory_bytes %g", &v); err == nil {
			rss = v
		}
	}
	if goroutines == 0 {
		t.Fatal("/metrics has no go_goroutines")
	}
	return goroutines, rss
}

// TestServeGracefulShutdown: SIGTERM lets an in-flight stream finish, then the server exits 0.
// The model is a synthetic one in the stories15M shape, slow enough (hundreds of tokens/s) that
// the stream is still running when the signal arrives.
func TestServeGracefulShutdown(t *testing.T) {
	model := filepath.Join(t.TempDir(), "s15M.gguf")
	if res := parley(t, "", "synth", "--shape", "15M", "--type", "f32", "-o", model); res.code != 0 {
		t.Fatalf("synth: %s", res.stderr)
	}
	srv := startServer(t, "-m", "stories="+model, "--backend", "go", "-t", "1")
	resp, err := http.Post(srv.base+"/v1/completions", "application/json", strings.NewReader(
		`{"model":"stories","prompt":"Once upon a time","max_tokens":200,"stream":true,"ignore_eos":true}`))
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	if _, err := br.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if err := srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// While the stream finishes, /health tells a load balancer that the instance drains.
	health := make(chan string, 1)
	go func() {
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			r, err := http.Get(srv.base + "/health")
			if err != nil {
				health <- "GET /health: " + err.Error()
				return
			}
			b, _ := io.ReadAll(r.Body)
			r.Body.Close()
			if r.StatusCode != 200 {
				health <- fmt.Sprintf("%d %s", r.StatusCode, strings.TrimSpace(string(b)))
				return
			}
		}
		health <- "still 200 after SIGTERM"
	}()
	rest, _ := io.ReadAll(br)
	resp.Body.Close()
	if h := <-health; h != `503 {"status":"draining"}` {
		t.Errorf("/health during the shutdown grace: %s; want 503 {\"status\":\"draining\"}", h)
	}
	if !bytes.Contains(rest, []byte("data: [DONE]")) {
		t.Fatalf("the in-flight stream was cut off: %.300s", rest)
	}
	if n := bytes.Count(rest, []byte("data: ")); n < 50 {
		t.Fatalf("only %d chunks arrived after SIGTERM: the stream had ended before it, so this tested nothing", n)
	}
	waitExit(t, srv)
}

// TestServeShutdownPastGrace: streams still running or queued when the grace period
// ($PARLEY_SHUTDOWN_GRACE, 1 s here) runs out each end with the cancellation's error event and
// [DONE], not a cut connection, and the server exits.
func TestServeShutdownPastGrace(t *testing.T) {
	model := filepath.Join(t.TempDir(), "s15M.gguf")
	if res := parley(t, "", "synth", "--shape", "15M", "--type", "f32", "-o", model); res.code != 0 {
		t.Fatalf("synth: %s", res.stderr)
	}
	srv := startServerEnv(t, []string{"PARLEY_SHUTDOWN_GRACE=1s"}, "-m", "stories="+model, "--backend", "go", "-t", "1", "--parallel", "1")
	// Four requests of 240 tokens, one at a time: seconds of work against a second of grace. (The
	// prompt takes 13 of the model's 256 positions: a max_tokens that does not fit with it is a 400.)
	const n = 4
	bodies := make([]chan []byte, n)
	submitted := make(chan struct{}, n) // a stream's headers arrive once it is in the scheduler
	for i := range bodies {
		bodies[i] = make(chan []byte, 1)
		go func(i int) {
			resp, err := http.Post(srv.base+"/v1/completions", "application/json", strings.NewReader(
				`{"model":"stories","prompt":"Once upon a time","max_tokens":240,"stream":true,"ignore_eos":true}`))
			submitted <- struct{}{}
			if err != nil {
				bodies[i] <- []byte("POST: " + err.Error())
				return
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				b = append(b, "\nREAD: "+err.Error()...)
			}
			bodies[i] <- b
		}(i)
	}
	timeout := time.After(30 * time.Second)
	for range n { // one running, three queued
		select {
		case <-submitted:
		case <-timeout:
			t.Fatal("the requests were not all submitted")
		}
	}
	if err := srv.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	cut := 0
	for i, ch := range bodies {
		var b []byte
		select {
		case b = <-ch:
		case <-time.After(30 * time.Second):
			t.Fatalf("stream %d did not end", i)
		}
		if !bytes.HasSuffix(b, []byte("data: [DONE]\n\n")) {
			t.Fatalf("stream %d did not end with [DONE]: ...%s", i, b[max(0, len(b)-300):])
		}
		if !bytes.Contains(b, []byte(`"finish_reason":"length"`)) {
			if !bytes.Contains(b, []byte(`"error":`)) {
				t.Fatalf("stream %d stopped early without an error event: ...%s", i, b[max(0, len(b)-300):])
			}
			cut++
		}
	}
	if cut == 0 {
		t.Fatal("every stream finished within the grace period, so this tested nothing")
	}
	waitExit(t, srv)
}

// waitExit waits for srv, signalled to stop, to exit with status 0.
func waitExit(t *testing.T, srv *serverProc) {
	t.Helper()
	select {
	case err := <-srv.done:
		if err != nil {
			t.Fatalf("server exit: %v\n%s", err, srv.stderr.String())
		}
		srv.done <- nil // for the cleanup's wait
	case <-time.After(20 * time.Second):
		t.Fatal("server did not exit after SIGTERM")
	}
}

// fakeHub serves data at path as the Hugging Face hub serves a file (its SHA-256 as the ETag,
// ranges), counting the requests; it closes at the end of the test.
func fakeHub(t *testing.T, path string, data []byte) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	sum := sha256.Sum256(data)
	hits := new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != path {
			http.NotFound(w, r)
			return
		}
		hits.Add(1)
		w.Header().Set("ETag", `"`+hex.EncodeToString(sum[:])+`"`)
		http.ServeContent(w, r, filepath.Base(path), time.Time{}, bytes.NewReader(data))
	}))
	t.Cleanup(srv.Close)
	return srv, hits
}

// TestServeDownloadsHFModel: a model named hf://owner/repo/file.gguf is downloaded once into the
// cache (from a local stand-in for the hub, checksum verified) and served.
func TestServeDownloadsHFModel(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	data, err := os.ReadFile(model)
	if err != nil {
		t.Fatal(err)
	}
	hubSrv, hits := fakeHub(t, "/tinyllamas/stories/resolve/main/stories260K.gguf", data)
	cache := t.TempDir()
	env := []string{"PARLEY_HF_ENDPOINT=" + hubSrv.URL, "PARLEY_CACHE=" + cache}
	for round := 0; round < 2; round++ {
		srv := startServerEnv(t, env, "--backend", "go", "-m", "stories=hf://tinyllamas/stories/stories260K.gguf")
		status, b, _ := postJSON(t, srv.base+"/v1/completions", `{"model":"stories","prompt":"Once upon a time","max_tokens":8,"temperature":0}`)
		if status != 200 {
			t.Fatalf("round %d: %d %s", round, status, b)
		}
		if log := srv.stderr.String(); strings.Contains(log, "\r") { // not a terminal: no progress bar in the log
			t.Fatalf("round %d: a progress bar in the log:\n%q", round, log)
		}
		_ = srv.cmd.Process.Kill()
	}
	if hits.Load() != 1 {
		t.Fatalf("the hub was asked %d times for the file; want once (then the cache)", hits.Load())
	}
}

// TestServePhi3: a phi3 file (fused query/key/value and gate/up matrices, written by `parley
// synth --arch phi3`) is served: its greedy completion over HTTP equals `parley generate`'s, and
// the model list names it.
func TestServePhi3(t *testing.T) {
	model := filepath.Join(t.TempDir(), "phi3.gguf")
	if res := parley(t, "", "synth", "--shape", "15M", "--type", "q8_0", "--arch", "phi3", "-o", model); res.code != 0 {
		t.Fatalf("synth: %s", res.stderr)
	}
	gen := parley(t, "", "generate", "-m", model, "-p", "Once upon a time", "-n", "16", "--temp", "0", "--ignore-eos", "--json")
	var want struct {
		Tokens []int32 `json:"tokens"`
		Text   string  `json:"text"`
	}
	if err := json.Unmarshal([]byte(gen.stdout), &want); err != nil || len(want.Tokens) != 16 {
		t.Fatalf("generate: %v %s %s", err, gen.stdout, gen.stderr)
	}
	srv := startServer(t, "-m", "phi="+model, "--ctx", "256")
	code, b, _ := postJSON(t, srv.base+"/v1/completions", `{"model":"phi","prompt":"Once upon a time","max_tokens":16,"temperature":0,"ignore_eos":true}`)
	var r struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &r); code != 200 || err != nil || len(r.Choices) != 1 || r.Choices[0].Text != want.Text {
		t.Fatalf("completion %d %s; parley generate gave %q", code, b, want.Text)
	}
}

// clientError is what the client scripts report of a request the server refused: its HTTP
// status and the error's code.
type clientError struct {
	Status int    `json:"status"`
	Code   string `json:"code"`
}
