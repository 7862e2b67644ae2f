package tests

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// TestBenchTTS: `parley bench` measures two syntheses of a Pocket TTS model at once and reports
// each one's first chunk, frames and real-time factor, and the aggregate, as JSON; each
// synthesis speaks as many frames as `parley speak` does with the same text and seed (its
// audio's length), and the figures agree with one another. Flags of other models are refused.
func TestBenchTTS(t *testing.T) {
	sameInBothBuilds(t)
	ref := sharedtest.Path(t, "reference/tts")
	weights := sharedtest.PocketTTSRandomWeights(t)
	tok := filepath.Join(ref, "tokenizer", "random-unigram-4000.model")
	voice := filepath.Join(ref, "voice", "voice_state.safetensors")
	base := []string{"bench", "-m", weights, "--tokenizer", tok, "--voice", voice, "-t", "2"}
	res := parley(t, "", append(base, "-r", "1", "-c", "2", "--text", "Hello world.", "--json")...)
	if res.code != 0 {
		t.Fatalf("exit %d: %s", res.code, res.stderr)
	}
	var got struct {
		Threads      int     `json:"threads"`
		SampleRate   int     `json:"sample_rate"`
		ChunkSize    int     `json:"first_chunk_samples"`
		Concurrency  int     `json:"concurrency"`
		LoadMS       float64 `json:"load_ms"`
		FirstChunkMS float64 `json:"first_chunk_ms"`
		RTF          float64 `json:"rtf"`
		FramesPerSec float64 `json:"frames_per_s"`
		AudioSeconds float64 `json:"audio_seconds"`
		PeakRSSMiB   float64 `json:"peak_rss_mib"`
		Syntheses    []struct {
			FirstChunkMS float64 `json:"first_chunk_ms"`
			Frames       int     `json:"frames"`
			AudioSeconds float64 `json:"audio_seconds"`
			TotalMS      float64 `json:"total_ms"`
			RTF          float64 `json:"rtf"`
		} `json:"syntheses"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &got); err != nil {
		t.Fatalf("%v: %s", err, res.stdout)
	}
	if got.Threads != 2 || got.SampleRate != 24000 || got.ChunkSize != 1920 || got.Concurrency != 2 || len(got.Syntheses) != 2 ||
		got.LoadMS <= 0 || got.PeakRSSMiB <= 0 {
		t.Fatalf("bench: %s", res.stdout)
	}
	// each synthesis as `parley speak` makes it with its seed: the same number of frames
	secs, frames, wall := 0.0, 0, 0.0
	for i, s := range got.Syntheses {
		out := filepath.Join(t.TempDir(), "s.wav")
		sp := parley(t, "", "speak", "-m", weights, "--tokenizer", tok, "--voice", voice, "-t", "2", "--seed", []string{"1", "2"}[i], "-o", out, "Hello world.")
		if sp.code != 0 {
			t.Fatalf("speak: exit %d: %s", sp.code, sp.stderr)
		}
		fi, err := os.Stat(out)
		if err != nil {
			t.Fatal(err)
		}
		if want := int(fi.Size()-44) / (2 * 1920); s.Frames != want {
			t.Errorf("synthesis %d: %d frames, `parley speak` %d", i+1, s.Frames, want)
		}
		if math.Abs(s.AudioSeconds-float64(s.Frames)*0.08) > 1e-9 || s.FirstChunkMS <= 0 || s.FirstChunkMS > s.TotalMS ||
			math.Abs(s.RTF*s.AudioSeconds*1000-s.TotalMS) > 0.01*s.TotalMS {
			t.Errorf("synthesis %d: %+v", i+1, s)
		}
		secs += s.AudioSeconds
		frames += s.Frames
		wall = math.Max(wall, s.TotalMS)
	}
	if math.Abs(got.AudioSeconds-secs) > 1e-9 || math.Abs(got.RTF*secs*1000-wall) > 0.05*wall+1 ||
		math.Abs(got.FramesPerSec*wall/1000-float64(frames)) > 0.05*float64(frames) ||
		got.FirstChunkMS < math.Min(got.Syntheses[0].FirstChunkMS, got.Syntheses[1].FirstChunkMS) ||
		got.FirstChunkMS > math.Max(got.Syntheses[0].FirstChunkMS, got.Syntheses[1].FirstChunkMS) {
		t.Errorf("aggregate: %s", res.stdout)
	}
	// the table
	res = parley(t, "", append(base, "-r", "1", "--text", "Hi.")...)
	if res.code != 0 || !strings.Contains(res.stdout, "first chunk") || !strings.Contains(res.stdout, "aggregate RTF") {
		t.Errorf("table: exit %d: %s%s", res.code, res.stdout, res.stderr)
	}
	for _, args := range [][]string{{"-n", "32"}, {"-p", "8"}, {"-c", "0"}, {"--text", "a", "--text-file", "b"}} {
		res := parley(t, "", append(base, args...)...)
		if res.code != 2 {
			t.Errorf("bench %q with a Pocket TTS model: exit %d: %s", args, res.code, res.stderr)
		}
	}
}
