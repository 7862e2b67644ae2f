package tests

import (
	"errors"
	"net/http"
	"os"
	"strings"
	"testing"

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
