package asr_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/models/whisper"
	"github.com/parleyhq/parley/runtime/sched/asr"
	"github.com/parleyhq/parley/runtime/tensor"
)

// mini128 is a small shape with 64-wide heads, as every Whisper model has.
var mini128 = ggml.Shape{Name: "mini", State: 128, Head: 2, AudioLayer: 2, TextLayer: 2}

// TestNonFiniteModel: a model whose weights are not numbers ends its transcription with an error
// that says so, and the scheduler goes on serving.
func TestNonFiniteModel(t *testing.T) {
	for _, vocab := range []string{"tiny.en", "tiny"} { // "tiny": language detection first
		t.Run(vocab, func(t *testing.T) {
			gf, err := ggml.Open(synthModelType(t, mini128, vocab, tensor.F16))
			if err != nil {
				t.Fatal(err)
			}
			defer gf.Close()
			tensors := slices.Clone(gf.Tensors)
			for i, tn := range tensors {
				if tn.Name == "decoder.ln.bias" {
					nan := make([]byte, len(tn.Data))
					for k := 0; k < len(nan); k += 4 {
						copy(nan[k:], []byte{0x00, 0x00, 0xc0, 0x7f}) // float32 NaN
					}
					tensors[i].Data = nan
				}
			}
			path := filepath.Join(t.TempDir(), "nan.bin")
			out, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := ggml.Write(out, gf.HParams, gf.Filters, gf.Vocab, tensors); err != nil {
				t.Fatal(err)
			}
			out.Close()
			be := sharedtest.Backend(t, "go", 2)
			m, err := whisper.Open(be, path)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			eng := newWhisper(t, m)
			defer eng.Close()
			samples := asr.LoadWAV(t, "jfk")[:16000]
			for range 2 {
				_, err := eng.Transcribe(context.Background(), samples, asr.DefaultParams(), nil)
				if err == nil || !strings.Contains(err.Error(), "not finite") {
					t.Fatalf("transcribing with NaN weights: %v", err)
				}
			}
			if m.Multilingual() {
				if lp, err := eng.DetectLanguage(context.Background(), samples); err == nil || !strings.Contains(err.Error(), "not finite") {
					t.Fatalf("detecting the language with NaN weights: %v (%d probabilities)", err, len(lp))
				}
			}
		})
	}
}

// TestTinyTemperature: a temperature so small that the scaled logits would leave the float32
// range transcribes as any temperature small enough to leave all the probability on the most
// likely token does (not greedy decoding: the timestamp rule compares the probabilities), instead
// of failing on an infinite logit.
func TestTinyTemperature(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: one transcription at a time, checked for its numbers; the recogniser's goroutines run in the concurrency tests")
	}
	gf, err := ggml.Open(synthModelType(t, mini128, "tiny.en", tensor.F16))
	if err != nil {
		t.Fatal(err)
	}
	defer gf.Close()
	m, err := whisper.Load(sharedtest.Backend(t, "go", 1), gf)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	eng := newWhisper(t, m)
	defer eng.Close()
	samples := asr.LoadWAV(t, "jfk")[:16000]
	p := asr.DefaultParams()
	p.TemperatureInc = 0
	var texts []string
	for _, temp := range []float32{1e-20, 1e-37, 1e-45} {
		p.Temperature = temp
		res, err := eng.Transcribe(context.Background(), samples, p, nil)
		if err != nil {
			t.Fatalf("temperature %g: %v", temp, err)
		}
		texts = append(texts, res.Text)
	}
	if texts[0] != texts[1] || texts[0] != texts[2] || texts[0] == "" {
		t.Errorf("temperatures 1e-20, 1e-37, 1e-45 gave %q", texts)
	}
}
