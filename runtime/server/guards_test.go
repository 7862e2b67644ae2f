package server

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// TestBrowserGuards: what a web page can reach on a server. On a loopback address (CheckHost) a
// request must name a loopback host or an allowed one (a page that rebinds its own name to
// 127.0.0.1 still sends its name); a request from an origin --cors does not list is refused
// before any work, whatever its content type; requests without an Origin are not affected; a
// missing key is told apart from a wrong one.
func TestBrowserGuards(t *testing.T) {
	h := newHarness(t, Config{CheckHost: true, AllowedHosts: []string{"parley.internal", ".corp.example"}, APIKey: "sekrit", AllowedOrigins: []string{"https://app.example"}})
	body := `{"model":"stories","prompt":"a","max_tokens":2}`
	key := []string{"Authorization", "Bearer sekrit"}
	for _, c := range []struct {
		name, method, path, host, ctype, body string
		hdr                                   []string
		status                                int
		want                                  string // in the body
	}{
		{"rebound host", "GET", "/v1/models", "attacker.example:8080", "", "", key, 421, `"code":"host_not_allowed"`},
		{"rebound host, health", "GET", "/health", "attacker.example", "", "", nil, 421, "host_not_allowed"},
		{"rebound host, preflight", "OPTIONS", "/v1/completions", "attacker.example:8080", "", "", []string{"Origin", "https://app.example", "Access-Control-Request-Method", "POST"}, 421, "host_not_allowed"},
		{"rebound host, websocket", "GET", "/v1/audio/stream", "attacker.example:8080", "", "", []string{"Upgrade", "websocket", "Connection", "Upgrade", "Sec-WebSocket-Protocol", "openai-insecure-api-key.sekrit"}, 421, "host_not_allowed"},
		{"a name like a subdomain of another", "GET", "/v1/models", "evil-corp.example", "", "", key, 421, "host_not_allowed"},
		{"localhost", "GET", "/v1/models", "localhost:8080", "", "", key, 200, `"object":"list"`},
		{"name under .localhost", "GET", "/v1/models", "app.localhost:8080", "", "", key, 200, `"object":"list"`},
		{"loopback address", "GET", "/v1/models", "127.0.0.1:8080", "", "", key, 200, `"object":"list"`},
		{"other loopback address", "GET", "/v1/models", "127.1.2.3", "", "", key, 200, `"object":"list"`},
		{"IPv6 loopback", "GET", "/v1/models", "[::1]:8080", "", "", key, 200, `"object":"list"`},
		{"allowed host", "GET", "/v1/models", "PARLEY.internal.", "", "", key, 200, `"object":"list"`},
		{"allowed domain", "GET", "/v1/models", "gpu1.corp.example:443", "", "", key, 200, `"object":"list"`},
		{"allowed domain itself", "GET", "/v1/models", "corp.example", "", "", key, 200, `"object":"list"`},
		{"cross-site text/plain", "POST", "/v1/completions", "", "text/plain", body, append([]string{"Origin", "https://evil.example"}, key...), 403, `"code":"origin_not_allowed"`},
		{"cross-site form", "POST", "/v1/completions", "", "application/x-www-form-urlencoded", body, []string{"Origin", "https://evil.example"}, 403, "origin_not_allowed"},
		{"cross-site multipart", "POST", "/v1/audio/transcriptions", "", "multipart/form-data; boundary=x", "--x--", []string{"Origin", "https://evil.example"}, 403, "origin_not_allowed"},
		{"cross-site GET", "GET", "/v1/models", "", "", "", append([]string{"Origin", "https://evil.example"}, key...), 403, "origin_not_allowed"},
		{"null origin", "POST", "/v1/completions", "", "text/plain", body, append([]string{"Origin", "null"}, key...), 403, "origin_not_allowed"},
		{"cross-site websocket", "GET", "/v1/audio/stream", "", "", "", []string{"Origin", "https://evil.example", "Upgrade", "websocket", "Connection", "Upgrade", "Sec-WebSocket-Protocol", "openai-insecure-api-key.sekrit"}, 403, "origin_not_allowed"},
		{"allowed origin, text/plain", "POST", "/v1/completions", "", "text/plain", body, append([]string{"Origin", "https://app.example"}, key...), 200, `"object":"text_completion"`},
		{"curl -d: no origin, form type", "POST", "/v1/completions", "", "application/x-www-form-urlencoded", body, key, 200, `"object":"text_completion"`},
		{"missing key", "GET", "/v1/models", "", "", "", nil, 401, "Missing API key"},
		{"empty bearer", "GET", "/v1/models", "", "", "", []string{"Authorization", "Bearer "}, 401, "Incorrect API key provided."},
		{"wrong key", "GET", "/v1/models", "", "", "", []string{"Authorization", "Bearer nope"}, 401, "Incorrect API key provided."},
		{"key as a subprotocol outside a websocket", "GET", "/v1/models", "", "", "", []string{"Sec-WebSocket-Protocol", "openai-insecure-api-key.sekrit"}, 401, "Missing API key"},
		{"wrong key as a subprotocol", "GET", "/v1/audio/stream", "", "", "", []string{"Upgrade", "websocket", "Connection", "Upgrade", "Sec-WebSocket-Protocol", "realtime, openai-insecure-api-key.nope"}, 401, "Incorrect API key provided."},
		// Past authentication, to the endpoint: this server has no speech model.
		{"key as a subprotocol", "GET", "/v1/audio/stream?model=x", "", "", "", []string{"Upgrade", "websocket", "Connection", "Upgrade", "Sec-WebSocket-Protocol", "realtime, openai-insecure-api-key.sekrit"}, 404, "model_not_found"},
	} {
		t.Run(c.name, func(t *testing.T) {
			req, err := http.NewRequest(c.method, h.srv.URL+c.path, strings.NewReader(c.body))
			if err != nil {
				t.Fatal(err)
			}
			if c.host != "" {
				req.Host = c.host
			}
			if c.ctype != "" {
				req.Header.Set("Content-Type", c.ctype)
			}
			for i := 0; i+1 < len(c.hdr); i += 2 {
				req.Header.Set(c.hdr[i], c.hdr[i+1])
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var b strings.Builder
			buf := make([]byte, 4096)
			for {
				n, err := resp.Body.Read(buf)
				b.Write(buf[:n])
				if err != nil {
					break
				}
			}
			if resp.StatusCode != c.status || !strings.Contains(b.String(), c.want) {
				t.Errorf("%d %s; want %d with %q", resp.StatusCode, b.String(), c.status, c.want)
			}
		})
	}
	// Nothing refused above reached a scheduler: the only completions generated are the two
	// requests let through, two tokens each.
	_, m := h.do(t, "GET", "/metrics", "", key...)
	if !strings.Contains(string(m), `parley_generated_tokens_total{model="stories"} 4`) {
		t.Errorf("generated tokens:\n%s", grepLines(string(m), "parley_generated_tokens_total"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestHostUnchecked: without CheckHost (a server on a public address) any Host is served.
func TestHostUnchecked(t *testing.T) {
	h := newHarness(t, Config{})
	req, _ := http.NewRequest("GET", h.srv.URL+"/v1/models", nil)
	req.Host = "parley.example.com"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("status %d", resp.StatusCode)
	}
}

// TestStreamKeyAsSubprotocol: a browser's WebSocket, which cannot set Authorization, sends the
// key as the subprotocol openai-insecure-api-key.<key>; the handshake answers with one of the
// subprotocols offered (a browser fails it otherwise), the key's only when nothing else was.
func TestStreamKeyAsSubprotocol(t *testing.T) {
	h := newSpeechHarness(t, Config{APIKey: "sekrit"})
	url := "ws" + strings.TrimPrefix(h.srv.URL, "http") + "/v1/audio/stream?model=whisper-tiny"
	for _, c := range []struct {
		offer []string
		chose string
	}{
		{[]string{"realtime", "openai-insecure-api-key.sekrit"}, "realtime"},
		{[]string{"openai-insecure-api-key.sekrit"}, "openai-insecure-api-key.sekrit"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: c.offer})
		cancel()
		if err != nil {
			code := 0
			if resp != nil {
				code = resp.StatusCode
			}
			t.Fatalf("%v: %v (HTTP %d)", c.offer, err, code)
		}
		if conn.Subprotocol() != c.chose {
			t.Errorf("%v: subprotocol %q, want %q", c.offer, conn.Subprotocol(), c.chose)
		}
		conn.Close(websocket.StatusNormalClosure, "")
		waitIdle(h)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{"openai-insecure-api-key.wrong"}})
	if err == nil || resp == nil || resp.StatusCode != 401 {
		t.Errorf("wrong key: %v %v", err, resp)
	}
}

// TestDrain: once draining, /health answers 503 "draining" and new requests 503, while a
// request in flight finishes; Drain returns when it has.
func TestDrain(t *testing.T) {
	h := newHarnessSched(t, Config{}, slowSteps)
	done := make(chan int, 1)
	go func() {
		resp, err := http.Post(h.srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"stories","prompt":"a","max_tokens":30,"ignore_eos":true}`))
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	for deadline := time.Now().Add(5 * time.Second); h.s.inflight.Load() == 0; {
		if time.Now().After(deadline) {
			t.Fatal("the request never started")
		}
		time.Sleep(time.Millisecond)
	}
	drained := make(chan error, 1)
	go func() { drained <- h.s.Drain(context.Background()) }()
	for deadline := time.Now().Add(5 * time.Second); !h.s.draining.Load(); {
		if time.Now().After(deadline) {
			t.Fatal("not draining")
		}
		time.Sleep(time.Millisecond)
	}
	if resp, b := h.do(t, "GET", "/health", ""); resp.StatusCode != 503 || strings.TrimSpace(string(b)) != `{"status":"draining"}` {
		t.Errorf("health while draining: %d %s", resp.StatusCode, b)
	}
	if resp, b := h.post(t, "/v1/completions", map[string]any{"model": "stories", "prompt": "a", "max_tokens": 2}); resp.StatusCode != 503 || !strings.Contains(string(b), "shutting_down") {
		t.Errorf("new request while draining: %d %s", resp.StatusCode, b)
	}
	select {
	case err := <-drained:
		t.Fatalf("Drain returned (%v) with a request in flight", err)
	default:
	}
	if code := <-done; code != 200 {
		t.Errorf("the request in flight: %d", code)
	}
	select {
	case err := <-drained:
		if err != nil {
			t.Error(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Drain did not return once the request had finished")
	}
	// Drain gives up when its context ends.
	ctx, cancel := context.WithCancel(context.Background())
	h.s.inflight.Add(1)
	cancel()
	if err := h.s.Drain(ctx); err == nil {
		t.Error("Drain with a request in flight and its context done returned nil")
	}
	h.s.inflight.Add(-1)
}
