package server

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/parleyhq/parley/runtime/sched/asr"
)

func pcmBytes(samples []float32) []byte {
	b := make([]byte, 2*len(samples))
	for i, v := range samples {
		binary.LittleEndian.PutUint16(b[2*i:], uint16(int16(max(-32768, min(32767, math.Round(float64(v)*32768))))))
	}
	return b
}

type wsEvent struct {
	Type     string  `json:"type"`
	Text     string  `json:"text"`
	Start    float64 `json:"start"`
	End      float64 `json:"end"`
	Code     string  `json:"code"`
	Message  string  `json:"message"`
	Model    string  `json:"model"`
	Segments []struct {
		Text  string  `json:"text"`
		Start float64 `json:"start"`
		End   float64 `json:"end"`
	} `json:"segments"`
}

func dial(t *testing.T, h *speechHarness, query string) *websocket.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(h.srv.URL, "http")+"/v1/audio/stream"+query, nil)
	if err != nil {
		code := 0
		if resp != nil {
			code = resp.StatusCode
		}
		t.Fatalf("dial: %v (HTTP %d)", err, code)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c
}

// waitIdle waits until the server holds no session: a session is released just after its close
// reaches the client, and the session limit counts it until then.
func waitIdle(h *speechHarness) {
	for deadline := time.Now().Add(5 * time.Second); h.s.streams.Load() > 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
}

// readAll reads events until the server closes the connection; it returns them and the close
// status.
func readAll(t *testing.T, c *websocket.Conn, timeout time.Duration) ([]wsEvent, websocket.StatusCode, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var evs []wsEvent
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				return evs, ce.Code, ce.Reason
			}
			t.Fatalf("read: %v (events so far %+v)", err, evs)
		}
		var ev wsEvent
		if err := json.Unmarshal(b, &ev); err != nil {
			t.Fatalf("event %s is not JSON: %v", b, err)
		}
		evs = append(evs, ev)
	}
}

// waitStreams waits until the server holds no session and its goroutines are back to base.
func waitStreams(t *testing.T, h *speechHarness, base int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		http.DefaultClient.CloseIdleConnections()
		if h.s.streams.Load() == 0 && runtime.NumGoroutine() <= base {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	buf := make([]byte, 1<<20)
	t.Fatalf("%d sessions, %d goroutines (base %d)\n%s", h.s.streams.Load(), runtime.NumGoroutine(), base, buf[:runtime.Stack(buf, true)])
}

// TestStream streams jfk.wav at about 8 times real time, binary frames and JSON audio events
// mixed, and gets partial and final events with times inside the audio, then a normal close.
func TestStream(t *testing.T) {
	h := newSpeechHarness(t, Config{Stream: StreamConfig{MaxBacklog: time.Minute}})
	base := runtime.NumGoroutine()
	c := dial(t, h, "?model=whisper-tiny&language=en")
	pcm := jfk(t, 11)
	ctx := context.Background()
	const chunk = 1600 // 100 ms
	for i, k := 0, 0; i < len(pcm); i, k = i+chunk, k+1 {
		b := pcmBytes(pcm[i:min(i+chunk, len(pcm))])
		var err error
		if k%2 == 0 {
			err = c.Write(ctx, websocket.MessageBinary, b)
		} else {
			msg, _ := json.Marshal(map[string]string{"type": "audio", "audio": base64.StdEncoding.EncodeToString(b)})
			err = c.Write(ctx, websocket.MessageText, msg)
		}
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(12 * time.Millisecond)
	}
	c.Write(ctx, websocket.MessageText, []byte(`{"type":"commit"}`))
	c.Write(ctx, websocket.MessageText, []byte(`{"type":"close"}`))
	evs, code, _ := readAll(t, c, 60*time.Second)
	if code != websocket.StatusNormalClosure {
		t.Errorf("closed with %v", code)
	}
	if len(evs) == 0 || evs[0].Type != "ready" || evs[0].Model != "whisper-tiny" {
		t.Fatalf("first event %+v, want ready", evs)
	}
	var partial, final int
	last := 0.0
	ms := func(v float64) bool { return v == math.Round(v*1000)/1000 }
	for _, e := range evs[1:] {
		if !ms(e.Start) || !ms(e.End) {
			t.Errorf("%s times %v-%v not to the millisecond", e.Type, e.Start, e.End)
		}
		for _, sg := range e.Segments {
			if !ms(sg.Start) || !ms(sg.End) {
				t.Errorf("segment times %v-%v not to the millisecond", sg.Start, sg.End)
			}
		}
		switch e.Type {
		case "partial":
			partial++
		case "final":
			final++
			if e.Start < last-1e-6 || e.End < e.Start || e.End > 11.01 {
				t.Errorf("final times %.2f-%.2f after %.2f", e.Start, e.End, last)
			}
			last = e.End
			if e.Text != "" && len(e.Segments) == 0 {
				t.Errorf("final %q without segments", e.Text)
			}
		default:
			t.Errorf("unexpected event %+v", e)
		}
	}
	t.Logf("%d events: %d partial, %d final", len(evs), partial, final)
	if partial == 0 || final == 0 {
		t.Errorf("%d partials, %d finals; want both", partial, final)
	}
	waitStreams(t, h, base)
}

// TestWireEventRounded: events go out with their times to the millisecond, not as float64 sums
// print; the session's own event is not changed.
func TestWireEventRounded(t *testing.T) {
	a, b := 0.1, 0.2
	ev := asr.Event{Type: "final", Text: "hi there", Start: a + b, End: 59.040000000000006,
		Segments: []asr.LiveSegment{{Text: "hi", Start: a + b, End: 0.7600000000000001}, {Text: "there", Start: 0.7600000000000001, End: 59.040000000000006}}}
	got, err := json.Marshal(wireEvent(ev))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"type":"final","text":"hi there","start":0.3,"end":59.04,"segments":[{"text":"hi","start":0.3,"end":0.76},{"text":"there","start":0.76,"end":59.04}]}`
	if string(got) != want {
		t.Errorf("sent %s\nwant %s", got, want)
	}
	if ev.Start != a+b || ev.Segments[0].End != 0.7600000000000001 {
		t.Error("wireEvent changed the session's event")
	}
	if got, _ := json.Marshal(wireEvent(asr.Event{Type: "partial", Text: "x", Start: a + b, End: a + b})); string(got) != `{"type":"partial","text":"x","start":0.3,"end":0.3}` {
		t.Errorf("partial sent as %s", got)
	}
}

// TestStreamBadInput: garbage gets an error event and the matching close code; a stalled client
// is closed; a client that vanishes mid-utterance leaves nothing behind; refused upgrades are
// plain HTTP errors.
func TestStreamBadInput(t *testing.T) {
	h := newSpeechHarness(t, Config{Stream: StreamConfig{IdleTimeout: time.Second, MaxBacklog: time.Second, MaxSessions: 2, MaxMessageBytes: 64 << 10}})
	base := runtime.NumGoroutine()
	ctx := context.Background()
	cases := []struct {
		name  string
		typ   websocket.MessageType
		msg   string
		code  websocket.StatusCode
		event string
	}{
		{"odd-length binary", websocket.MessageBinary, "abc", websocket.StatusInvalidFramePayloadData, "invalid_audio"},
		{"not JSON", websocket.MessageText, "hello", websocket.StatusInvalidFramePayloadData, "invalid_json"},
		{"bad base64", websocket.MessageText, `{"type":"audio","audio":"@@@"}`, websocket.StatusInvalidFramePayloadData, "invalid_audio"},
		{"unknown event", websocket.MessageText, `{"type":"dance"}`, websocket.StatusUnsupportedData, "unknown_event"},
		{"stall", 0, "", websocket.StatusPolicyViolation, "idle_timeout"},
		{"too big", websocket.MessageBinary, strings.Repeat("x", 100<<10), websocket.StatusMessageTooBig, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			waitIdle(h)
			waitIdle(h)
			conn := dial(t, h, "")
			if c.typ != 0 {
				conn.Write(ctx, c.typ, []byte(c.msg))
			}
			evs, code, reason := readAll(t, conn, 10*time.Second)
			if code != c.code {
				t.Errorf("close %v %q, want %v", code, reason, c.code)
			}
			if c.event != "" && (len(evs) < 2 || evs[len(evs)-1].Type != "error" || evs[len(evs)-1].Code != c.event || evs[len(evs)-1].Message == "") {
				t.Errorf("events %+v, want an error event %s", evs, c.event)
			}
		})
	}

	t.Run("backlog", func(t *testing.T) {
		waitIdle(h)
		conn := dial(t, h, "")
		pcm := jfk(t, 11)
		for i := 0; i < len(pcm); i += 1600 {
			if conn.Write(ctx, websocket.MessageBinary, pcmBytes(pcm[i:min(i+1600, len(pcm))])) != nil {
				break
			}
		}
		evs, code, _ := readAll(t, conn, 20*time.Second)
		if code != websocket.StatusPolicyViolation || evs[len(evs)-1].Code != "backlog" {
			t.Errorf("close %v, events %+v; want 1008 after a backlog error", code, evs)
		}
	})

	t.Run("disconnect mid-utterance", func(t *testing.T) {
		waitIdle(h)
		conn := dial(t, h, "")
		pcm := jfk(t, 3)
		for i := 0; i < len(pcm); i += 1600 {
			conn.Write(ctx, websocket.MessageBinary, pcmBytes(pcm[i:min(i+1600, len(pcm))]))
			time.Sleep(20 * time.Millisecond)
		}
		conn.CloseNow()
		waitStreams(t, h, base+1) // +1: this subtest's goroutine
	})

	t.Run("session limit", func(t *testing.T) {
		waitIdle(h)
		a, b := dial(t, h, ""), dial(t, h, "")
		_, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(h.srv.URL, "http")+"/v1/audio/stream", nil)
		if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
			t.Errorf("third session: %v %+v", err, resp)
		}
		a.CloseNow()
		b.CloseNow()
	})

	t.Run("refused before upgrade", func(t *testing.T) {
		for q, want := range map[string]int{"?model=nope": 404, "?language=de": 400} {
			_, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(h.srv.URL, "http")+"/v1/audio/stream"+q, nil)
			if err == nil || resp == nil || resp.StatusCode != want {
				t.Errorf("%s: %v %+v, want HTTP %d", q, err, resp, want)
			}
		}
		resp, err := http.Get(h.srv.URL + "/v1/audio/stream")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUpgradeRequired {
			t.Errorf("plain GET: %d", resp.StatusCode)
		}
	})
	waitStreams(t, h, base)
}

// TestStreamSlowerThanIdle: a client that sends audio faster than the machine transcribes it and
// then waits for the results is not idle. With an idle timeout shorter than one pass of the
// model, the final text still arrives; only then does the silent client time out.
func TestStreamSlowerThanIdle(t *testing.T) {
	// Every pass takes longer than the idle timeout, whatever the machine: the recogniser waits
	// 1.5 s before each. The timeout is long enough for the client to send its audio after
	// "ready" on a loaded machine.
	eng := speechEngine(t)
	p := asrParams()
	s, err := New(Config{Stream: StreamConfig{MaxBacklog: time.Minute, IdleTimeout: time.Second},
		SpeechModels: []*SpeechModel{{Name: "whisper-tiny", Recognizer: slowRecognizer{eng, 1500 * time.Millisecond}, Params: &p}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.SetReady(true)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	h := &speechHarness{srv: srv, s: s, eng: eng}
	c := dial(t, h, "?model=whisper-tiny&language=en")
	ctx := context.Background()
	if err := c.Write(ctx, websocket.MessageBinary, pcmBytes(jfk(t, 2))); err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, websocket.MessageText, []byte(`{"type":"commit"}`)); err != nil {
		t.Fatal(err)
	}
	evs, code, _ := readAll(t, c, 60*time.Second)
	final := -1
	for i, e := range evs {
		if e.Type == "final" && final < 0 {
			final = i
		}
		if e.Type == "error" && final < 0 {
			t.Fatalf("event %d: %s (%s) before the final text; events %+v", i, e.Code, e.Message, evs)
		}
	}
	if final < 0 {
		t.Fatalf("no final text: %+v", evs)
	}
	if last := evs[len(evs)-1]; code != websocket.StatusPolicyViolation || last.Code != "idle_timeout" {
		t.Errorf("closed with %v after %+v, want the idle timeout once the results were out", code, last)
	}
	waitIdle(h)
}

// slowRecognizer is a recogniser whose transcriptions start d late.
type slowRecognizer struct {
	asr.Recognizer
	d time.Duration
}

func (r slowRecognizer) Transcribe(ctx context.Context, pcm []float32, p asr.Params, f func(asr.Segment)) (*asr.Result, error) {
	select {
	case <-time.After(r.d):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return r.Recognizer.Transcribe(ctx, pcm, p, f)
}

// TestStreamShutdown: Shutdown lets an open session transcribe the audio it has received: its
// final text arrives, then the shutting_down event and close 1001; new sessions get 503. A
// session still open when Shutdown's context ends is closed at once with 1001.
func TestStreamShutdown(t *testing.T) {
	h := newSpeechHarness(t, Config{Stream: StreamConfig{MaxBacklog: time.Minute}})
	ctx := context.Background()

	c := dial(t, h, "?model=whisper-tiny&language=en")
	if err := c.Write(ctx, websocket.MessageBinary, pcmBytes(jfk(t, 4))); err != nil {
		t.Fatal(err)
	}
	var evs []wsEvent
	for len(evs) == 0 || evs[len(evs)-1].Type != "partial" { // the audio is in the session
		rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		_, b, err := c.Read(rctx)
		cancel()
		if err != nil {
			t.Fatalf("no partial: %v (events %+v)", err, evs)
		}
		var ev wsEvent
		json.Unmarshal(b, &ev)
		evs = append(evs, ev)
	}
	shut := make(chan error, 1)
	go func() { shut <- h.s.Shutdown(ctx) }()
	rest, code, _ := readAll(t, c, 60*time.Second)
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	evs = append(evs, rest...)
	final := -1
	for i, e := range evs {
		if e.Type == "final" {
			final = i
		}
	}
	if final < 0 {
		t.Errorf("no final text for the audio received before the shutdown: %+v", evs)
	}
	if last := evs[len(evs)-1]; code != websocket.StatusGoingAway || last.Type != "error" || last.Code != "shutting_down" || final > len(evs)-2 {
		t.Errorf("closed with %v after %+v, want shutting_down and 1001 after the final text", code, evs)
	}
	_, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(h.srv.URL, "http")+"/v1/audio/stream", nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("a session after the shutdown: %v %+v, want 503", err, resp)
	}

	// Past the deadline: a fresh server, a session in the middle of a long pass.
	h = newSpeechHarness(t, Config{Stream: StreamConfig{MaxBacklog: time.Minute}})
	c = dial(t, h, "?model=whisper-tiny&language=en")
	if err := c.Write(ctx, websocket.MessageBinary, pcmBytes(jfk(t, 11))); err != nil {
		t.Fatal(err)
	}
	codes := make(chan websocket.StatusCode, 1)
	go func() {
		_, code, _ := readAll(t, c, 60*time.Second)
		codes <- code
	}()
	for deadline := time.Now().Add(10 * time.Second); h.s.streams.Load() != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the session did not open")
		}
	}
	dctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := h.s.Shutdown(dctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Shutdown past its deadline: %v, want context.Canceled", err)
	}
	if code := <-codes; code != websocket.StatusGoingAway {
		t.Errorf("cut session closed with %v, want 1001", code)
	}
	waitIdle(h)
	if n := h.s.streams.Load(); n != 0 {
		t.Errorf("%d sessions left after Shutdown", n)
	}
}

// TestStreamUnmaskedFrame: a client frame without a mask breaks the protocol (RFC 6455 5.1): the
// server closes with 1002, not 1000.
func TestStreamUnmaskedFrame(t *testing.T) {
	h := newSpeechHarness(t, Config{})
	conn, err := net.Dial("tcp", strings.TrimPrefix(h.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(conn, "GET /v1/audio/stream HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %+v", err, resp)
	}
	if _, err := conn.Write([]byte("\x82\x04abcd")); err != nil { // binary, unmasked
		t.Fatal(err)
	}
	for { // server frames: the ready event, then the close
		var hdr [2]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			t.Fatalf("no close frame: %v", err)
		}
		n := int(hdr[1] & 0x7f)
		if n == 126 {
			var ext [2]byte
			io.ReadFull(br, ext[:])
			n = int(binary.BigEndian.Uint16(ext[:]))
		}
		payload := make([]byte, n)
		if _, err := io.ReadFull(br, payload); err != nil {
			t.Fatal(err)
		}
		if hdr[0]&0x0f == 0x8 {
			if len(payload) < 2 || binary.BigEndian.Uint16(payload) != uint16(websocket.StatusProtocolError) {
				t.Fatalf("close frame %q, want code 1002", payload)
			}
			return
		}
	}
}
