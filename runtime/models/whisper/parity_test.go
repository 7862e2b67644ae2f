package whisper_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	_ "github.com/parleyhq/parley/runtime/backend/all"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/whisper"
)

// backendsUnderTest starts every backend this build has that runs here (see sharedtest.Backends).
func backendsUnderTest(t *testing.T) []backend.Backend { return sharedtest.Backends(t, 2) }

// newEncoder makes an encoder for one window of m and that window's cross-attention storage;
// the caller closes both (before m).
func newEncoder(t testing.TB, m *whisper.Model) (*whisper.Encoder, *whisper.Cross) {
	t.Helper()
	enc, err := m.NewEncoder()
	if err != nil {
		t.Fatal(err)
	}
	cross, err := m.NewCross()
	if err != nil {
		enc.Close()
		t.Fatal(err)
	}
	return enc, cross
}

// readLE reads a raw little-endian array of 32-bit values (float32 or int32).
func readLE[T float32 | int32](t *testing.T, path string) []T {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	v := make([]T, len(b)/4)
	if err := binary.Read(bytes.NewReader(b), binary.LittleEndian, v); err != nil {
		t.Fatal(err)
	}
	return v
}

func openModel(t *testing.T, be backend.Backend, name string) *whisper.Model {
	t.Helper()
	m, err := whisper.Open(be, sharedtest.WhisperRandomModel(t, name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestEncoderMatchesWhisperCpp feeds whisper.cpp's own log-mel window to the encoder and compares
// the output after ln_post with whisper.cpp's (flash attention off).
//
// Tolerance: |Δ| ≤ 1e-2, the reference's own recommendation (README §6): a float64 implementation
// of the same graph lands within 3.9e-3 of it; the residue is F16 rounding of activations,
// keys and values at boundaries that F32 sums in another order cross the other way. Outputs
// have unit scale (layer norm with gain 1).
func TestEncoderMatchesWhisperCpp(t *testing.T) {
	if whisper.RaceEnabled {
		t.Skip("parity over whole windows runs without the race detector (too slow under it)")
	}
	dir := sharedtest.Path(t, "reference/asr/tensors")
	for _, be := range backendsUnderTest(t) {
		t.Run(be.Name(), func(t *testing.T) {
			m := openModel(t, be, "tiny.en")
			enc, cross := newEncoder(t, m)
			defer enc.Close()
			defer cross.Close()
			for _, utt := range []string{"jfk", "psx-cards-001"} {
				mel := readLE[float32](t, filepath.Join(dir, utt, "mel.f32"))
				want := readLE[float32](t, filepath.Join(dir, utt, "enc_out_fa0.f32"))
				got := make([]float32, m.AudioCtx*m.AudioState)
				if err := enc.Encode(mel, cross, got); err != nil {
					t.Fatal(err)
				}
				var maxd, sq float64
				for i := range want {
					d := math.Abs(float64(got[i] - want[i]))
					maxd = max(maxd, d)
					sq += d * d
				}
				rms := math.Sqrt(sq / float64(len(want)))
				t.Logf("%s: encoder output max |Δ| %.2e rms %.2e", utt, maxd, rms)
				if maxd > 1e-2 || math.IsNaN(maxd) {
					t.Errorf("%s: encoder output differs from whisper.cpp by up to %.3g (> 1e-2)", utt, maxd)
				}
			}
		})
	}
}

type forced struct {
	Prompt []int32 `json:"prompt_ids"`
	Forced []int32 `json:"forced_ids"`
}

// TestTeacherForcedLogits decodes whisper.cpp's forced token sequences one token at a time (as
// whisper_full does) over the encoder output of the reference mel, and compares the raw logits:
// all of them at steps 0-7, and the reference's top 10 at every one of the 220 steps.
//
// Tolerance: |Δlogit| ≤ 1e-2 (README §6: a float64 implementation reaches 3.6e-3; logits have
// std ≈ 1). The argmax must agree at every step where the reference's top-2 margin exceeds 1e-2.
func TestTeacherForcedLogits(t *testing.T) {
	if whisper.RaceEnabled {
		t.Skip("parity over whole windows runs without the race detector (too slow under it)")
	}
	ref := sharedtest.Path(t, "reference/asr")
	cases := []struct{ model, utt string }{
		{"tiny.en", "jfk"}, {"tiny.en", "psx-cards-001"}, {"tiny", "jfk"},
	}
	for _, be := range backendsUnderTest(t) {
		for _, c := range cases {
			t.Run(be.Name()+"/"+c.model+"/"+c.utt, func(t *testing.T) {
				tf := filepath.Join(ref, "tf", c.model+"-f16", c.utt)
				if _, err := os.Stat(tf); err != nil {
					t.Skipf("no teacher-forcing reference %s", tf)
				}
				m := openModel(t, be, c.model)
				var fz forced
				b, err := os.ReadFile(filepath.Join(tf, "forced_tokens.json"))
				if err != nil {
					t.Fatal(err)
				}
				if err := json.Unmarshal(b, &fz); err != nil {
					t.Fatal(err)
				}
				mel := readLE[float32](t, filepath.Join(ref, "tensors", c.utt, "mel.f32"))
				first := readLE[float32](t, filepath.Join(tf, "fa0", "logits_first.f32"))
				topIDs := readLE[int32](t, filepath.Join(tf, "fa0", "topk_ids.i32"))
				topLg := readLE[float32](t, filepath.Join(tf, "fa0", "topk_logits.f32"))
				enc, cross := newEncoder(t, m)
				defer enc.Close()
				defer cross.Close()
				if err := enc.Encode(mel, cross, nil); err != nil {
					t.Fatal(err)
				}
				dec, err := m.NewDecoder(whisper.DecoderConfig{StepTokens: 16, MaxSeqs: 1, KVSlots: 448, BlockSize: 1})
				if err != nil {
					t.Fatal(err)
				}
				defer dec.Close()
				seq := dec.Pool().NewSeq(448)
				var bb kvcache.BatchBuilder
				V := m.NVocab
				logits := make([]float32, V)
				nSteps := len(topIDs) / 10
				var maxFirst, maxTop float64
				argmaxMiss := 0
				feed := fz.Prompt
				for s := 0; s < nSteps; s++ {
					if err := seq.Reserve(len(feed)); err != nil {
						t.Fatal(err)
					}
					bb.Reset()
					if err := bb.Add(seq, len(feed)); err != nil {
						t.Fatal(err)
					}
					if err := dec.Forward(feed, bb.Batch(), []*whisper.Cross{cross}, []int32{int32(len(feed) - 1)}, logits); err != nil {
						t.Fatal(err)
					}
					_ = seq.Advance(len(feed))
					if s < 8 {
						for i, w := range first[s*V : (s+1)*V] {
							maxFirst = max(maxFirst, math.Abs(float64(logits[i]-w)))
						}
					}
					for k := 0; k < 10; k++ {
						id, w := topIDs[s*10+k], topLg[s*10+k]
						maxTop = max(maxTop, math.Abs(float64(logits[id]-w)))
					}
					best := 0
					for i, v := range logits {
						if v > logits[best] {
							best = i
						}
					}
					if int32(best) != topIDs[s*10] && topLg[s*10]-topLg[s*10+1] > 1e-2 {
						argmaxMiss++
						t.Errorf("step %d: argmax %d, whisper.cpp %d (margin %.3g)", s, best, topIDs[s*10], topLg[s*10]-topLg[s*10+1])
					}
					if s < len(fz.Forced) {
						feed = fz.Forced[s : s+1]
					}
				}
				t.Logf("%d steps: max |Δlogit| steps 0-7 (all ids) %.2e, top-10 all steps %.2e", nSteps, maxFirst, maxTop)
				if maxFirst > 1e-2 || maxTop > 1e-2 || math.IsNaN(maxFirst+maxTop) {
					t.Errorf("logits differ from whisper.cpp by up to %.3g / %.3g (> 1e-2)", maxFirst, maxTop)
				}
			})
		}
	}
}
