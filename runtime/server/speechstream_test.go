package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// speakMsg is one message from a live synthesis session: an event, or audio (Type "audio").
type speakMsg struct {
	Type    string `json:"type"`
	Text    string `json:"text"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Voice   string `json:"voice"`
	Rate    int    `json:"sample_rate"`
	Format  string `json:"format"`
	// ResponseFormat is "ready"'s and "configured"'s.
	ResponseFormat string `json:"response_format"`
	audio          []byte
}

func newSpeakServer(t *testing.T, sp Speaker, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	cfg.TTSModels = []*TTSModel{{Name: "pocket-tts", Synth: sp}}
	s, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.SetReady(true)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return s, srv
}

func dialSpeak(t *testing.T, srv *httptest.Server, query string, hdr http.Header) (*websocket.Conn, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+"/v1/audio/speech/stream"+query, &websocket.DialOptions{HTTPHeader: hdr})
	if err != nil {
		if resp == nil {
			t.Fatalf("dial: %v", err)
		}
		return nil, resp.StatusCode
	}
	t.Cleanup(func() { c.CloseNow() })
	return c, http.StatusSwitchingProtocols
}

func sendJSON(t *testing.T, c *websocket.Conn, v string) {
	t.Helper()
	if err := c.Write(context.Background(), websocket.MessageText, []byte(v)); err != nil {
		t.Fatal(err)
	}
}

// readSpeak reads one message.
func readSpeak(t *testing.T, c *websocket.Conn) (speakMsg, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	typ, b, err := c.Read(ctx)
	if err != nil {
		return speakMsg{}, err
	}
	if typ == websocket.MessageBinary {
		return speakMsg{Type: "audio", audio: b}, nil
	}
	var m speakMsg
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	return m, nil
}

// readUntilClose reads messages until the server closes; it returns them (audio messages as
// "audio") and the close status.
func readUntilClose(t *testing.T, c *websocket.Conn) ([]speakMsg, websocket.StatusCode) {
	t.Helper()
	var ms []speakMsg
	for {
		m, err := readSpeak(t, c)
		if err != nil {
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				return ms, ce.Code
			}
			t.Fatalf("read: %v (so far %v)", err, ms)
		}
		ms = append(ms, m)
	}
}

// summary writes messages as "type" or "segment:text", runs of audio as "audio×n".
func summary(ms []speakMsg) string {
	var parts []string
	run := 0
	for i, m := range ms {
		if m.Type == "audio" {
			run++
			if i+1 == len(ms) || ms[i+1].Type != "audio" {
				parts = append(parts, "audio×"+string(rune('0'+run)))
				run = 0
			}
			continue
		}
		s := m.Type
		if m.Text != "" {
			s += ":" + m.Text
		}
		if m.Code != "" {
			s += ":" + m.Code
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// TestSpeechStreamSentences: text arriving in pieces is spoken a sentence at a time as soon as
// each sentence's end is followed by more text; flush speaks the rest and says so; close
// speaks what is left, says done and closes with 1000. Every frame is a binary message of the
// synthesiser's samples as 16-bit PCM.
func TestSpeechStreamSentences(t *testing.T) {
	sp := &fakeSpeaker{frames: 2}
	_, srv := newSpeakServer(t, sp, Config{})
	c, code := dialSpeak(t, srv, "?voice=alba", nil)
	if c == nil {
		t.Fatalf("dial: %d", code)
	}
	ready, err := readSpeak(t, c)
	if err != nil || ready.Type != "ready" || ready.Voice != "alba" || ready.Rate != 24000 || ready.Format != "pcm_s16le" {
		t.Fatalf("first message %+v, %v", ready, err)
	}
	for _, p := range []string{"Hello the", "re. How are", " you? I am fi", "ne"} {
		sendJSON(t, c, `{"type":"text","text":"`+p+`"}`)
	}
	sendJSON(t, c, `{"type":"flush"}`)
	sendJSON(t, c, `{"type":"text","text":"Bye, now"}`)
	sendJSON(t, c, `{"type":"close"}`)
	sendJSON(t, c, `{"type":"text","text":"ignored after close."}`)
	ms, status := readUntilClose(t, c)
	want := "segment:Hello there. audio×2 segment:How are you? audio×2 segment:I am fine audio×2 flushed segment:Bye, now audio×2 done"
	if got := summary(ms); got != want || status != websocket.StatusNormalClosure {
		t.Fatalf("got %s (close %d)\nwant %s", got, status, want)
	}
	frames := fakePCM(2)
	for _, m := range ms {
		if m.Type == "audio" && !bytes.Equal(m.audio, frames[:3840]) && !bytes.Equal(m.audio, frames[3840:]) {
			t.Fatalf("an audio message of %d bytes that is no frame of the synthesiser's", len(m.audio))
		}
	}
	if got := strings.Join(sp.texts, "|"); got != "Hello there.|How are you?|I am fine|Bye, now" {
		t.Errorf("the synthesiser spoke %q", got)
	}
	_, metrics := authGet(t, srv.URL+"/metrics", "")
	var sec float64
	for _, line := range strings.Split(string(metrics), "\n") {
		if v, ok := strings.CutPrefix(line, `parley_speech_seconds_total{kind="stream",model="pocket-tts"} `); ok {
			sec, _ = strconv.ParseFloat(v, 64)
		}
	}
	if math.Abs(sec-8*0.08) > 1e-9 {
		t.Errorf("parley_speech_seconds_total of the stream: %v, want 8 frames of 80 ms", sec)
	}
}

// TestSpeechStreamCancel: cancel stops the synthesis in flight and drops the text queued and
// buffered; "cancelled" follows the last audio of it, and text after it is spoken.
func TestSpeechStreamCancel(t *testing.T) {
	sp := &fakeSpeaker{frames: 3, gate: make(chan struct{})}
	_, srv := newSpeakServer(t, sp, Config{})
	c, _ := dialSpeak(t, srv, "?voice=alba&model=pocket-tts", nil)
	if m, err := readSpeak(t, c); err != nil || m.Type != "ready" {
		t.Fatal(m, err)
	}
	sendJSON(t, c, `{"type":"text","text":"One. Two. Three"}`)
	for _, want := range []string{"segment", "audio"} {
		if m, err := readSpeak(t, c); err != nil || m.Type != want {
			t.Fatalf("%+v %v; want %s", m, err, want)
		}
	}
	// the synthesiser holds the second frame of "One. Two."; "Three" is buffered
	sendJSON(t, c, `{"type":"text","text":" four. Five"}`)
	sendJSON(t, c, `{"type":"cancel"}`)
	if m, err := readSpeak(t, c); err != nil || m.Type != "cancelled" {
		t.Fatalf("%+v %v; want cancelled", m, err)
	}
	close(sp.gate)
	sendJSON(t, c, `{"type":"text","text":"Six."}`)
	sendJSON(t, c, `{"type":"close"}`)
	ms, status := readUntilClose(t, c)
	if got := summary(ms); got != "segment:Six. audio×3 done" || status != websocket.StatusNormalClosure {
		t.Errorf("after cancel: %s (close %d)", got, status)
	}
	if got := strings.Join(sp.texts, "|"); got != "One. Two.|Six." && got != "One. Two.|Three four.|Six." {
		t.Errorf("the synthesiser spoke %q", got)
	}
}

// TestSpeechStreamBadInput: requests refused before the upgrade get HTTP errors; bad messages
// and broken limits get an error event and a close code; the server goes on serving.
func TestSpeechStreamBadInput(t *testing.T) {
	sp := &fakeSpeaker{frames: 1}
	s, srv := newSpeakServer(t, sp, Config{AllowedOrigins: []string{"https://app.example"},
		SpeechStream: SpeechStreamConfig{MaxText: 50, IdleTimeout: time.Second, MaxSessions: 2}})
	for _, c := range []struct {
		query string
		hdr   http.Header
		code  int
	}{
		{"", nil, 400},
		{"?voice=nobody", nil, 400},
		{"?voice=alba&model=tts-1", nil, 404},
		{"?voice=alba", http.Header{"Origin": {"https://evil.example"}}, 403},
	} {
		if conn, code := dialSpeak(t, srv, c.query, c.hdr); conn != nil || code != c.code {
			t.Errorf("%s %v: %d, want %d", c.query, c.hdr, code, c.code)
		}
	}
	if code, b := authGet(t, srv.URL+"/v1/audio/speech/stream?voice=alba", ""); code != http.StatusUpgradeRequired {
		t.Errorf("no upgrade: %d %s", code, b)
	}
	if conn, code := dialSpeak(t, srv, "?voice=alba", http.Header{"Origin": {"https://app.example"}}); conn == nil {
		t.Errorf("an allowed origin: %d", code)
	} else {
		conn.CloseNow()
	}
	for _, c := range []struct {
		name   string
		send   func(c *websocket.Conn)
		status websocket.StatusCode
		code   string
	}{
		{"binary", func(c *websocket.Conn) { c.Write(context.Background(), websocket.MessageBinary, []byte{1, 2}) }, websocket.StatusUnsupportedData, "unsupported_data"},
		{"not JSON", func(c *websocket.Conn) { sendJSON(t, c, `hello`) }, websocket.StatusInvalidFramePayloadData, "invalid_json"},
		{"unknown type", func(c *websocket.Conn) { sendJSON(t, c, `{"type":"shout"}`) }, websocket.StatusUnsupportedData, "unknown_event"},
		{"text on flush", func(c *websocket.Conn) { sendJSON(t, c, `{"type":"flush","text":"x"}`) }, websocket.StatusPolicyViolation, "invalid_event"},
		{"too much text", func(c *websocket.Conn) {
			sendJSON(t, c, `{"type":"text","text":"`+strings.Repeat("a ", 20)+`"}`)
			sendJSON(t, c, `{"type":"text","text":"`+strings.Repeat("b ", 20)+`"}`)
		}, websocket.StatusPolicyViolation, "text_overflow"},
		{"idle", func(*websocket.Conn) {}, websocket.StatusPolicyViolation, "idle_timeout"},
	} {
		conn, code := dialSpeak(t, srv, "?voice=alba", nil)
		if conn == nil {
			t.Fatalf("%s: dial %d", c.name, code)
		}
		if m, err := readSpeak(t, conn); err != nil || m.Type != "ready" {
			t.Fatalf("%s: %+v %v", c.name, m, err)
		}
		c.send(conn)
		ms, status := readUntilClose(t, conn)
		if len(ms) == 0 || ms[len(ms)-1].Type != "error" || ms[len(ms)-1].Code != c.code || ms[len(ms)-1].Message == "" || status != c.status {
			t.Errorf("%s: %s, close %d; want error %s, close %d", c.name, summary(ms), status, c.code, c.status)
		}
	}
	// a third session beyond MaxSessions 2 is refused before the upgrade
	for deadline := time.Now().Add(5 * time.Second); s.speakers.Load() > 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	a, _ := dialSpeak(t, srv, "?voice=alba", nil)
	b, _ := dialSpeak(t, srv, "?voice=alba", nil)
	if a == nil || b == nil {
		t.Fatal("two sessions refused")
	}
	if conn, code := dialSpeak(t, srv, "?voice=alba", nil); conn != nil || code != http.StatusTooManyRequests {
		t.Errorf("a third session: %d, want 429", code)
	}
}

// TestSpeechStreamShutdown: a server shutdown speaks the text a session has buffered, then
// closes it with 1001 and "shutting_down"; new sessions are refused.
func TestSpeechStreamShutdown(t *testing.T) {
	sp := &fakeSpeaker{frames: 2}
	s, srv := newSpeakServer(t, sp, Config{})
	c, _ := dialSpeak(t, srv, "?voice=marius", nil)
	if m, err := readSpeak(t, c); err != nil || m.Type != "ready" {
		t.Fatal(m, err)
	}
	sendJSON(t, c, `{"type":"text","text":"Almost said"}`)
	time.Sleep(50 * time.Millisecond) // the text reaches the session before the shutdown
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(ctx) }() // the close handshake needs the client reading
	ms, status := readUntilClose(t, c)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := summary(ms); got != "segment:Almost said audio×2 error:shutting_down" || status != websocket.StatusGoingAway {
		t.Errorf("%s (close %d)", got, status)
	}
	if conn, code := dialSpeak(t, srv, "?voice=marius", nil); conn != nil || code != http.StatusServiceUnavailable {
		t.Errorf("after shutdown: %d, want 503", code)
	}
}

// TestSplitSpeakable: text is cut after the last sentence end that white space follows
// (closing quotes kept with it), else, when long, after the last clause boundary.
func TestSplitSpeakable(t *testing.T) {
	for _, c := range []struct{ in, head, rest string }{
		{"Hello there", "", "Hello there"},
		{"Hello there.", "", "Hello there."},
		{"Hello there. ", "Hello there.", " "},
		{"Pi is 3.14 or so", "", "Pi is 3.14 or so"},
		{`He said "stop." And`, `He said "stop."`, " And"},
		{"One! Two? Three… four", "One! Two? Three…", " four"},
		{"你好。 世界", "你好。", " 世界"},
		{"a, b, c, " + strings.Repeat("d", 20), "a, b, c,", " " + strings.Repeat("d", 20)},
		{"a, b", "", "a, b"},
	} {
		head, rest := splitSpeakable(c.in, 20)
		if head != c.head || rest != c.rest {
			t.Errorf("%q: %q + %q, want %q + %q", c.in, head, rest, c.head, c.rest)
		}
	}
}

// TestSpeechStreamStalledClient: a client that takes no audio loses its session once a frame
// has waited WriteTimeout to be written.
func TestSpeechStreamStalledClient(t *testing.T) {
	sp := &fakeSpeaker{frames: 20000} // 77 MB of audio: more than the connection buffers
	s, srv := newSpeakServer(t, sp, Config{SpeechStream: SpeechStreamConfig{WriteTimeout: 300 * time.Millisecond}})
	c, _ := dialSpeak(t, srv, "?voice=alba", nil)
	if m, err := readSpeak(t, c); err != nil || m.Type != "ready" {
		t.Fatal(m, err)
	}
	sendJSON(t, c, `{"type":"flush"}`)
	sendJSON(t, c, `{"type":"text","text":"Speak at length."}`)
	sendJSON(t, c, `{"type":"flush"}`)
	// the client reads nothing more
	deadline := time.Now().Add(20 * time.Second)
	for s.speakers.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := s.speakers.Load(); n != 0 {
		t.Fatalf("%d sessions still open", n)
	}
}

// TestSpeechStreamKeyAsSubprotocol: a browser's session, its key sent as a subprotocol, is
// accepted, with one of the other subprotocols it offered chosen; a wrong key is a 401.
func TestSpeechStreamKeyAsSubprotocol(t *testing.T) {
	_, srv := newSpeakServer(t, &fakeSpeaker{frames: 1}, Config{APIKey: "sekrit"})
	url := "ws" + strings.TrimPrefix(srv.URL, "http") + "/v1/audio/speech/stream?voice=alba"
	for _, c := range []struct {
		key  string
		code int
	}{{"sekrit", 101}, {"nope", 401}} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		conn, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{Subprotocols: []string{"realtime", "openai-insecure-api-key." + c.key}})
		cancel()
		if c.code != 101 {
			if err == nil || resp == nil || resp.StatusCode != c.code {
				t.Errorf("key %s: %v, want %d", c.key, err, c.code)
			}
			continue
		}
		if err != nil {
			t.Fatalf("key %s: %v", c.key, err)
		}
		if conn.Subprotocol() != "realtime" {
			t.Errorf("subprotocol %q, want realtime", conn.Subprotocol())
		}
		if m, err := readSpeak(t, conn); err != nil || m.Type != "ready" {
			t.Errorf("%+v %v", m, err)
		}
		conn.CloseNow()
	}
}
