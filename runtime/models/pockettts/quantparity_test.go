package pockettts

import (
	"math"
	"os"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/tensor"
)

// rmsRel is the RMS of got-want over the RMS of want.
func rmsRel(got, want []float32) float64 {
	var d, s float64
	for i := range want {
		e := float64(got[i]) - float64(want[i])
		d += e * e
		s += float64(want[i]) * float64(want[i])
	}
	return math.Sqrt(d / s)
}

// quantRun is what one quantisation of the random-weight checkpoint computes on the t5-stream
// run (146 frames): the frame steps teacher-forced (the recorded latent of the step before as
// input, the recorded noise), the decoder over the recorded latents, each against the float32
// reference recording.
type quantRun struct {
	latents  float64 // teacher-forced latents: RMS of the difference over the reference's RMS
	eosFlips int     // teacher-forced steps whose stop decision differs from the reference's
	audio    float64 // the decoder's waveform from the recorded latents, as latents
}

func runQuantized(t *testing.T, target func(string) tensor.DType) quantRun {
	t.Helper()
	be := sharedtest.Backend(t, "cpu", 2)
	ck, err := Open(sharedtest.PocketTTSRandomWeights(t))
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if target != nil {
		if _, err := ck.Weights.quantize(target); err != nil {
			t.Fatal(err)
		}
	}
	m, err := New(be, ck.Weights)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	f, err := m.NewFlowLM(FlowLMConfig{StepTokens: 64, MaxSeqs: 1, KVSlots: 512})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec, err := m.NewDecoder(1)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	r := readRunRef(t, "t5-stream")
	L, F := m.cfg.LatentDim, m.cfg.FrameSamples()
	s := f.Pool().NewSeq(512)
	defer s.Release()
	if err := f.SetVoice(s, refVoice(t, &m.cfg)); err != nil {
		t.Fatal(err)
	}
	if err := f.Text([]*kvcache.Seq{s}, [][]int32{r.meta.Chunks[0].TokenIDs}); err != nil {
		t.Fatal(err)
	}
	var q quantRun
	in, out, e := make([]float32, L), make([]float32, L), make([]float32, 1)
	lat := make([]float32, 0, r.nFrames*L)
	for i := range r.nFrames {
		if i == 0 {
			for j := range in {
				in[j] = float32(math.NaN())
			}
		} else {
			copy(in, r.latents[(i-1)*L:i*L])
		}
		if err := f.Step([]*kvcache.Seq{s}, in, r.noise[i*L:(i+1)*L], out, e); err != nil {
			t.Fatal(err)
		}
		lat = append(lat, out...)
		if (e[0] > EOSThreshold) != (r.eos[i] > EOSThreshold) {
			q.eosFlips++
		}
	}
	q.latents = rmsRel(lat, r.latents[:r.nFrames*L])
	audio := make([]float32, r.nFrames*F)
	for i := range r.nFrames {
		if err := dec.Step([]int{0}, r.latents[i*L:(i+1)*L], audio[i*F:(i+1)*F]); err != nil {
			t.Fatal(err)
		}
	}
	q.audio = rmsRel(audio, r.audio[:r.nFrames*F])
	return q
}

// TestQuantizedParity: the checkpoint quantised by Quantize, on the native CPU backend, against
// the float32 reference recording of t5-stream (146 frames), each stage fed the recorded inputs
// so that errors do not compound: the frame steps' latents, the stop decision of every step, and
// the decoder's waveform. F32 itself stays within 1e-4 of the recording (TestParityTextAndFrames);
// each quantised type's bound is a few times the error it was measured at (written beside it),
// so that a mistake in the quantised path (a wrong matrix, a wrong block layout) fails while the
// rounding of the type passes. Free running, the quantised latents feed back and drift from
// the recording, so the stop frame may differ there: tests/TestConvertPocketTTS checks the
// whole synthesis of a short text through the binary. PARLEY_POCKET_QUANT_SPLIT=1 logs the error
// of each quantised component alone.
func TestQuantizedParity(t *testing.T) {
	if raceEnabled {
		t.Skip("146 frame steps of the full-size model per type: without the race detector")
	}
	if testing.Short() {
		t.Skip("the full-size model, 146 frames per type")
	}
	both := func(lm tensor.DType) func(string) tensor.DType {
		return func(n string) tensor.DType {
			switch {
			case flowLMMatrix(n):
				return lm
			case stepMatrix(n):
				return tensor.Q8_0
			}
			return 0
		}
	}
	for _, c := range []struct {
		name           string
		target         func(string) tensor.DType
		latents, audio float64
	}{
		// measured: latents 0.021, audio 0.0008
		{"q8_0", both(tensor.Q8_0), 0.05, 0.004},
		// measured: latents 0.10, audio 0.0008
		{"q4_k", both(tensor.Q4_K), 0.25, 0.004},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := runQuantized(t, c.target)
			t.Logf("teacher-forced latents %.4f, EOS decisions differing %d, decoder audio %.4f (relative RMS)", q.latents, q.eosFlips, q.audio)
			if !(q.latents <= c.latents) || !(q.audio <= c.audio) || q.eosFlips != 0 {
				t.Errorf("latents %.4f (bound %v), audio %.4f (bound %v), %d stop decisions differ (want 0)", q.latents, c.latents, q.audio, c.audio, q.eosFlips)
			}
		})
	}
	if os.Getenv("PARLEY_POCKET_QUANT_SPLIT") == "" {
		return
	}
	only := func(pred func(string) bool, dt tensor.DType) func(string) tensor.DType {
		return func(n string) tensor.DType {
			if pred(n) {
				return dt
			}
			return 0
		}
	}
	isFlow := func(n string) bool { return stepMatrix(n) && !isMimi(n) }
	for _, c := range []struct {
		name   string
		target func(string) tensor.DType
	}{
		{"f32", nil},
		{"flowlm q8_0", only(flowLMMatrix, tensor.Q8_0)},
		{"flowlm q4_k", only(flowLMMatrix, tensor.Q4_K)},
		{"flow head q8_0", only(isFlow, tensor.Q8_0)},
		{"mimi decoder transformer q8_0", only(isMimi, tensor.Q8_0)},
	} {
		q := runQuantized(t, c.target)
		t.Logf("%s: teacher-forced latents %.4f, EOS decisions differing %d, decoder audio %.4f", c.name, q.latents, q.eosFlips, q.audio)
	}
}

func isMimi(n string) bool { return stepMatrix(n) && len(n) > 5 && n[:5] == "mimi." }
