package tests

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/audio"
)

// TestParakeetBeamSizeServed serves the random-weight small Parakeet TDT model greedily (the
// --asr-beam default) and asks for beams per request: a transcription with beam_size 4 gives
// the text of `parley transcribe --beam 4`, beam_size 1 the greedy text; beam sizes outside 1..8
// are refused with 400 naming beam_size, on the transcription endpoint and on the live one's
// query; a live stream with beam_size 4 reports partials and finals and closes normally.
func TestParakeetBeamSizeServed(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.ParakeetRandomModel(t, "small", false)
	path := sharedtest.Path(t, "data/asr/wav/jfk.wav")
	be := asrBackend()
	want := map[string]string{}
	for _, beam := range []string{"1", "4"} {
		res := parley(t, "", "transcribe", "--backend", be, "--beam", beam, "-m", model, path)
		if res.code != 0 || strings.TrimSpace(res.stdout) == "" {
			t.Fatalf("transcribe --beam %s: exit %d: %q %s", beam, res.code, res.stdout, res.stderr)
		}
		want[beam] = strings.TrimSpace(res.stdout)
	}
	if want["1"] == want["4"] {
		t.Fatalf("beams of 1 and 4 give the same text %q: the test cannot tell whether beam_size is honoured", want["1"])
	}
	srv := startServer(t, "--backend", be, "-m", "parakeet="+model, "--stream-chunk", "800ms", "--stream-right-context", "240ms")
	wav, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, beam := range []string{"1", "4"} {
		code, _, body := postTranscription(t, srv.base, wav, "model", "parakeet", "response_format", "text", "beam_size", beam)
		if code != 200 || strings.TrimSpace(body) != want[beam] {
			t.Errorf("beam_size %s: %d %q, want %q", beam, code, body, want[beam])
		}
	}
	for _, bad := range []string{"0", "9", "four", "2.5", ""} {
		code, _, body := postTranscription(t, srv.base, wav, "model", "parakeet", "beam_size", bad)
		if code != 400 || !strings.Contains(body, `"param":"beam_size"`) || !strings.Contains(body, "1 (greedy) to 8") {
			t.Errorf("beam_size %q: %d %s, want 400 naming beam_size", bad, code, body)
		}
	}
	resp, err := http.Get(srv.base + "/v1/audio/stream?model=parakeet&beam_size=9")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("a live stream with beam_size 9: %d, want 400", resp.StatusCode)
	}

	pcm, _, err := audio.Decode(wav)
	if err != nil {
		t.Fatal(err)
	}
	got, err := streamPCM(t, srv.base, "parakeet&beam_size=4", pcm16(pcm[:6*16000]))
	var ce websocket.CloseError
	if !errors.As(err, &ce) || ce.Code != websocket.StatusNormalClosure {
		t.Errorf("beam stream ended with %v", err)
	}
	n := map[string]int{}
	for _, ev := range got {
		n[ev.Type]++
		if ev.Type == "final" && (ev.End < ev.Start || ev.Start < 0 || ev.End > 6.01) {
			t.Errorf("final %+v: want times inside the 6 s sent", ev)
		}
	}
	t.Logf("beam stream events: %v", n)
	if n["ready"] != 1 || n["partial"] == 0 || n["final"] == 0 || n["error"] != 0 || got[len(got)-1].Type != "final" {
		t.Errorf("beam stream events %+v: want ready, partials and finals", got)
	}
}

// TestParakeetRealtimeBeam: a Realtime session (GA dialect) whose transcription settings ask for
// beam_size 4, with turn detection off and 16 kHz audio, on a server whose context covers the
// whole recording, transcribes the committed audio as `parley transcribe --beam 4` does; with
// beam_size 1, as greedy `parley transcribe` does.
func TestParakeetRealtimeBeam(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.ParakeetRandomModel(t, "small", false)
	path := sharedtest.Path(t, "data/asr/wav/jfk.wav")
	be := asrBackend()
	srv := startServer(t, "--backend", be, "-m", "parakeet="+model, "--stream-left-context", "60s", "--stream-right-context", "60s")
	wav, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pcm, _, err := audio.Decode(wav)
	if err != nil {
		t.Fatal(err)
	}
	for _, beam := range []string{"1", "4"} {
		res := parley(t, "", "transcribe", "--backend", be, "--beam", beam, "-m", model, path)
		if res.code != 0 {
			t.Fatalf("transcribe --beam %s: exit %d: %s", beam, res.code, res.stderr)
		}
		want := strings.TrimSpace(res.stdout)
		if got := realtimeTranscript(t, srv.base, beam, pcm16(pcm)); got != want {
			t.Errorf("beam_size %s: transcript %q, want %q", beam, got, want)
		}
	}
}

// realtimeTranscript sends pcm (PCM16, 16 kHz) to a Realtime session of the model "parakeet"
// with the given beam_size and no turn detection, commits it and returns its transcript.
func realtimeTranscript(t *testing.T, base, beam string, pcm []byte) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/v1/realtime?model=parakeet", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	send := func(v any) {
		b, _ := json.Marshal(v)
		if err := c.Write(ctx, websocket.MessageText, b); err != nil {
			t.Fatal(err)
		}
	}
	until := func(typ string) map[string]any {
		for {
			_, b, err := c.Read(ctx)
			if err != nil {
				t.Fatalf("waiting for %s: %v", typ, err)
			}
			var ev map[string]any
			json.Unmarshal(b, &ev)
			if ev["type"] == "error" {
				t.Fatalf("waiting for %s: %s", typ, b)
			}
			if ev["type"] == typ {
				return ev
			}
		}
	}
	n, _ := strconv.Atoi(beam)
	send(map[string]any{"type": "session.update", "session": map[string]any{"type": "transcription", "audio": map[string]any{"input": map[string]any{
		"format": map[string]any{"type": "audio/pcm", "rate": 16000}, "turn_detection": nil,
		"transcription": map[string]any{"model": "parakeet", "beam_size": n}}}}})
	until("session.updated")
	for i := 0; i < len(pcm); i += 32000 {
		send(map[string]any{"type": "input_audio_buffer.append", "audio": base64.StdEncoding.EncodeToString(pcm[i:min(i+32000, len(pcm))])})
	}
	send(map[string]any{"type": "input_audio_buffer.commit"})
	ev := until("conversation.item.input_audio_transcription.completed")
	s, _ := ev["transcript"].(string)
	return s
}
