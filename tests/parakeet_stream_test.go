package tests

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/audio"
)

// liveEvent is an event of /v1/audio/stream.
type liveEvent struct {
	Type       string
	Text       string
	Start, End float64
	Segments   []struct {
		Text       string
		Start, End float64
	}
}

// pcm16 is pcm as 16-bit little-endian samples.
func pcm16(pcm []float32) []byte {
	buf := make([]byte, 2*len(pcm))
	for k, v := range pcm {
		binary.LittleEndian.PutUint16(buf[2*k:], uint16(int16(max(-32768, min(32767, v*32768)))))
	}
	return buf
}

// streamPCM sends pcm (PCM16) to a live session of model at base in messages of 200 ms, then
// commits and closes, and returns every event the server sent and how the connection ended.
func streamPCM(t *testing.T, base, model string, pcm []byte) ([]liveEvent, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/v1/audio/stream?model="+model, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	done := make(chan error, 1)
	var got []liveEvent
	go func() {
		for {
			_, msg, err := c.Read(ctx)
			if err != nil {
				done <- err
				return
			}
			var ev liveEvent
			if err := json.Unmarshal(msg, &ev); err != nil {
				done <- err
				return
			}
			got = append(got, ev)
		}
	}()
	const step = 6400
	for i := 0; i < len(pcm); i += step {
		if err := c.Write(ctx, websocket.MessageBinary, pcm[i:min(i+step, len(pcm))]); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.Write(ctx, websocket.MessageText, []byte(`{"type":"commit"}`))
	c.Write(ctx, websocket.MessageText, []byte(`{"type":"close"}`))
	err = <-done
	return got, err
}

// TestParakeetLiveStream serves the random-weight small Parakeet TDT model and streams jfk.wav
// (6 s) to /v1/audio/stream as PCM16. With chunks of 800 ms and 240 ms of look-ahead the
// session decodes as the audio arrives: partials, then finals inside the audio sent, a normal
// close, and chunk times in the metrics. A second server whose context covers the whole
// recording (every chunk decoded at the commit) gives the text `parley transcribe` gives, split
// into finals at the endpoints.
func TestParakeetLiveStream(t *testing.T) {
	model := sharedtest.ParakeetRandomModel(t, "small", false)
	wav := sharedtest.Path(t, "data/asr/wav/jfk.wav")
	b, err := os.ReadFile(wav)
	if err != nil {
		t.Fatal(err)
	}
	pcm, _, err := audio.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	pcm16 := pcm16(pcm[:6*16000])
	be := asrBackend()

	srv := startServer(t, "--backend", be, "-m", "parakeet="+model, "--stream-chunk", "800ms", "--stream-right-context", "240ms")
	got, err := streamPCM(t, srv.base, "parakeet", pcm16)
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusNormalClosure {
		t.Errorf("stream ended with %v", err)
	}
	n := map[string]int{}
	for _, ev := range got {
		n[ev.Type]++
		if ev.Type == "final" && (ev.End < ev.Start || ev.Start < 0 || ev.End > 6.01 || (ev.Text != "") != (len(ev.Segments) == 1)) {
			t.Errorf("final %+v: want times inside the 6 s sent, its text in one segment", ev)
		}
	}
	t.Logf("events: %v", n)
	if n["ready"] != 1 || n["partial"] == 0 || n["final"] == 0 || n["error"] != 0 || got[len(got)-1].Type != "final" {
		t.Errorf("events %+v: want ready, partials and finals", got)
	}
	resp, err := http.Get(srv.base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := regexp.MustCompile(`parley_transcription_duration_seconds_count\{kind="stream",model="parakeet"\} (\d+)`).FindSubmatch(metrics)
	// 6 s in chunks of 800 ms: 7 decoded as the look-ahead arrives, the last at the commit.
	if m == nil {
		t.Errorf("no stream timing in the metrics:\n%s", metrics)
	} else if k, _ := strconv.Atoi(string(m[1])); k != 8 {
		t.Errorf("%d chunks timed, want 8", k)
	}

	hdr, err := audio.WAVHeader(int64(len(pcm16)/2), 16000)
	if err != nil {
		t.Fatal(err)
	}
	six := filepath.Join(t.TempDir(), "six.wav")
	if err := os.WriteFile(six, append(hdr, pcm16...), 0o644); err != nil {
		t.Fatal(err)
	}
	cli := parley(t, "", "transcribe", "--backend", be, "-m", model, six)
	if cli.code != 0 || strings.TrimSpace(cli.stdout) == "" {
		t.Fatalf("parley transcribe: %d %q %s", cli.code, cli.stdout, cli.stderr)
	}
	whole := startServer(t, "--backend", be, "-m", "parakeet="+model, "--stream-left-context", "60s", "--stream-right-context", "60s")
	got, err = streamPCM(t, whole.base, "parakeet", pcm16)
	if !errors.As(err, &ce) || ce.Code != websocket.StatusNormalClosure {
		t.Errorf("stream ended with %v", err)
	}
	var finals []string
	for _, ev := range got {
		switch ev.Type {
		case "final":
			finals = append(finals, ev.Text)
		case "ready":
		default:
			t.Errorf("event %+v: with whole context, want finals only", ev)
		}
	}
	// Finals end at endpoints, where a word may go on: compare the letters.
	letters := func(s string) string { return strings.Join(strings.Fields(s), "") }
	if g, w := letters(strings.Join(finals, " ")), letters(cli.stdout); len(finals) == 0 || g != w {
		t.Errorf("finals %q, want the text of `parley transcribe`, %q", finals, strings.TrimSpace(cli.stdout))
	}
}
