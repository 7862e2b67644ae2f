package tests

import (
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// TestParakeetTranscribeAndServe transcribes reference clips with the random-weight small
// Parakeet TDT model through `parley transcribe --json` (the file found to be Parakeet's, not
// Whisper's, by its header) and compares text, token ids and probabilities with whisper.cpp's
// (reference/asr-transducer: plog within 2e-2, p within 5e-3); then serves the model and checks
// that /v1/audio/transcriptions answers what the command line printed.
func TestParakeetTranscribeAndServe(t *testing.T) {
	model := sharedtest.ParakeetRandomModel(t, "small", false)
	clips := []string{"psx-cards-001", "jfk"}
	be := asrBackend()
	args := []string{"transcribe", "--backend", be, "-m", model, "--json"}
	for _, c := range clips {
		args = append(args, sharedtest.Path(t, "data/asr/wav/"+c+".wav"))
	}
	res := parley(t, "", args...)
	if res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
	dec := json.NewDecoder(strings.NewReader(res.stdout))
	texts := map[string]string{}
	for _, c := range clips {
		var got struct {
			Text   string
			Tokens []struct {
				ID   int32
				P    float64
				PLog float64
			}
		}
		if err := dec.Decode(&got); err != nil {
			t.Fatalf("%s: %v in %q", c, err, res.stdout)
		}
		b, err := os.ReadFile(sharedtest.Path(t, "reference/asr-transducer/decode/small-f32/"+c+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var want struct {
			Text   string `json:"text"`
			Tokens []struct {
				ID   int32   `json:"id"`
				P    float64 `json:"p"`
				PLog float64 `json:"plog"`
			} `json:"tokens"`
		}
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(got.Text) != want.Text || len(got.Tokens) != len(want.Tokens) {
			t.Fatalf("%s: %q in %d tokens, whisper.cpp %q in %d", c, got.Text, len(got.Tokens), want.Text, len(want.Tokens))
		}
		for i, w := range want.Tokens {
			g := got.Tokens[i]
			if g.ID != w.ID || math.Abs(g.P-w.P) > 5e-3 || math.Abs(g.PLog-w.PLog) > 2e-2 {
				t.Fatalf("%s: token %d: %+v, whisper.cpp %+v", c, i, g, w)
			}
		}
		texts[c] = want.Text
	}

	srv := startServer(t, "--backend", be, "-m", "parakeet="+model, "--asr-parallel", "2")
	wav, err := os.ReadFile(sharedtest.Path(t, "data/asr/wav/jfk.wav"))
	if err != nil {
		t.Fatal(err)
	}
	code, ct, body := postTranscription(t, srv.base, wav, "model", "parakeet", "response_format", "text")
	if code != 200 || !strings.HasPrefix(ct, "text/plain") || body != texts["jfk"]+"\n" {
		t.Errorf("text: %d %s %q, want %q", code, ct, body, texts["jfk"])
	}
	code, _, body = postTranscription(t, srv.base, wav, "model", "parakeet", "response_format", "verbose_json")
	var vj struct {
		Text     string `json:"text"`
		Segments []struct {
			Start, End float64
		} `json:"segments"`
	}
	if err := json.Unmarshal([]byte(body), &vj); code != 200 || err != nil || vj.Text != texts["jfk"] || len(vj.Segments) != 1 || vj.Segments[0].End != 11.01 {
		t.Errorf("verbose_json: %d %v %s", code, err, body)
	}
}

// TestBenchParakeet: `parley bench` measures a Parakeet model on an audio file (real-time
// factor, encoder and decoder time, the tokens of its greedy transcription) and reports it as
// JSON; a Parakeet model needs --audio and takes neither -n nor --parallel.
func TestBenchParakeet(t *testing.T) {
	model := sharedtest.ParakeetRandomModel(t, "small", false)
	wav := sharedtest.Path(t, "data/asr/wav/jfk.wav")
	res := parley(t, "", "bench", "--backend", asrBackend(), "-m", model, "-t", "2", "-r", "1", "--audio", wav, "--json")
	if res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
	var got struct {
		Threads      int     `json:"threads"`
		AudioSeconds float64 `json:"audio_seconds"`
		RTF          float64 `json:"rtf"`
		TotalMS      float64 `json:"total_ms"`
		EncodeMS     float64 `json:"encode_ms"`
		DecodeMS     float64 `json:"decode_ms"`
		Tokens       int     `json:"tokens"`
		PeakRSSMiB   float64 `json:"peak_rss_mib"`
		WeightType   string  `json:"weight_type"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &got); err != nil {
		t.Fatalf("%v: %s", err, res.stdout)
	}
	b, err := os.ReadFile(sharedtest.Path(t, "reference/asr-transducer/decode/small-f32/jfk.json"))
	if err != nil {
		t.Fatal(err)
	}
	var want struct {
		Tokens []json.RawMessage `json:"tokens"`
	}
	if err := json.Unmarshal(b, &want); err != nil {
		t.Fatal(err)
	}
	if got.Threads != 2 || math.Abs(got.AudioSeconds-11) > 0.01 || got.RTF <= 0 || got.EncodeMS <= 0 || got.DecodeMS <= 0 ||
		got.EncodeMS+got.DecodeMS > got.TotalMS || got.Tokens != len(want.Tokens) || got.WeightType != "F32" {
		t.Errorf("bench: %s (whisper.cpp: %d tokens)", res.stdout, len(want.Tokens))
	}
	if math.Abs(got.RTF*got.AudioSeconds*1000-got.TotalMS) > 0.01*got.TotalMS+1 {
		t.Errorf("RTF %v of %v s is not %v ms", got.RTF, got.AudioSeconds, got.TotalMS)
	}
	for _, args := range [][]string{{"-n", "32", "--audio", wav}, {"--parallel", "2", "--audio", wav}, {}} {
		res := parley(t, "", append([]string{"bench", "-m", model}, args...)...)
		if res.code != 2 || !strings.Contains(res.stderr, "Parakeet") {
			t.Errorf("bench %q with a Parakeet model: exit %d: %s", args, res.code, res.stderr)
		}
	}
}

// TestParakeetTranscribeBeam transcribes a clip with `parley transcribe --beam 4` (beam search
// over the transducer) and checks that a beam wider than 8 is refused.
func TestParakeetTranscribeBeam(t *testing.T) {
	model := sharedtest.ParakeetRandomModel(t, "small", false)
	wav := sharedtest.Path(t, "data/asr/wav/jfk.wav")
	res := parley(t, "", "transcribe", "--backend", asrBackend(), "--beam", "4", "-m", model, "--json", wav)
	if res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
	var got struct {
		Text   string
		Tokens []struct{ ID int32 }
	}
	if err := json.Unmarshal([]byte(res.stdout), &got); err != nil {
		t.Fatalf("%v in %q", err, res.stdout)
	}
	if strings.TrimSpace(got.Text) == "" || len(got.Tokens) == 0 {
		t.Fatalf("no transcript: %q", res.stdout)
	}
	res = parley(t, "", "transcribe", "--backend", asrBackend(), "--beam", "9", "-m", model, wav)
	if res.code == 0 || !strings.Contains(res.stderr, "beam") {
		t.Fatalf("--beam 9: exit %d: %s", res.code, res.stderr)
	}
}
