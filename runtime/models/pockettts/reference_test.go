package pockettts

import (
	"math"
	"path/filepath"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// Checks of the bound weights against the reference tensors that need no backend: the stages
// that only select or scale rows, computed here in float64. Tolerance: 1e-5 of each tensor's
// largest value (the references are float32 PyTorch; these stages are a few hundred products).
const bindTol = 1e-5

func compareRel(t *testing.T, what string, got []float64, want []float32, tol float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	maxRef, maxDiff, at := 0.0, 0.0, 0
	for i := range want {
		maxRef = max(maxRef, math.Abs(float64(want[i])))
		if d := math.Abs(got[i] - float64(want[i])); d > maxDiff || math.IsNaN(d) {
			maxDiff, at = d, i
		}
	}
	if !(maxDiff <= tol*maxRef) {
		t.Errorf("%s: max |Δ| %.3g at %d (%v vs %v) exceeds %.0e of max |ref| %.3g", what, maxDiff, at, got[at], want[at], tol, maxRef)
	}
}

func f64(x []float32) []float64 {
	out := make([]float64, len(x))
	for i, v := range x {
		out[i] = float64(v)
	}
	return out
}

func TestReferenceBinding(t *testing.T) {
	ck, err := Open(sharedtest.PocketTTSRandomWeights(t))
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	w := ck.Weights
	cfg := &w.Config
	ref := sharedtest.Path(t, "reference/tts")
	d := cfg.Dim

	// Text embedding rows of every run's tokens.
	runs := readRuns(t)
	embed := w.Embed.Float32s()
	for name, run := range runs {
		ids := run.Chunks[0].TokenIDs
		want := readNPY(t, filepath.Join(ref, name, "text_emb.npy"))
		got := make([]float64, 0, len(ids)*d)
		for _, id := range ids {
			got = append(got, f64(embed[int(id)*d:int(id+1)*d])...)
		}
		compareRel(t, name+" text_emb", got, want.F32, 0)
	}

	// Voice conditioning: latentsᵀ · speaker_projᵀ.
	lat := readNPY(t, filepath.Join(ref, "voice/voice_latent.npy")) // [32, T]
	cond := readNPY(t, filepath.Join(ref, "voice/voice_conditioning.npy"))
	sp := w.SpeakerProj.Float32s() // [d, 32]
	e, T := lat.Shape[0], lat.Shape[1]
	got := make([]float64, T*d)
	for ti := range T {
		for o := range d {
			s := 0.0
			for i := range e {
				s += float64(lat.F32[i*T+ti]) * float64(sp[o*e+i])
			}
			got[ti*d+o] = s
		}
	}
	compareRel(t, "voice_conditioning", got, cond.F32, bindTol)

	// Mimi's input, the quantizer projection and the depthwise upsampling of frames 0 and 1,
	// streamed: frame 1 adds the 16-step tail frame 0 left.
	std, mean := w.EmbStd.Float32s(), w.EmbMean.Float32s()
	qw := w.Mimi.QuantizerProj.Float32s() // [m, latent, 1]
	uw := w.Mimi.Upsample.W.Float32s()    // [m, 1, 2·stride]
	m, l, s := cfg.MimiDim, cfg.LatentDim, cfg.UpsampleStride
	for _, run := range []string{"t1-hello", "t2-fox-greedy"} {
		latents := readNPY(t, filepath.Join(ref, run, "latents.npy"))
		tail := make([]float64, m*s)
		for f := range 2 {
			in := make([]float64, l)
			for i := range l {
				in[i] = float64(latents.F32[f*l+i])*float64(std[i]) + float64(mean[i])
			}
			pre := filepath.Join(ref, run, "mimi_frame"+string(rune('0'+f))+"_")
			compareRel(t, run+" mimi_in", in, readNPY(t, pre+"mimi_in.npy").F32, bindTol)
			q := make([]float64, m)
			for o := range m {
				for i := range l {
					q[o] += float64(qw[o*l+i]) * in[i]
				}
			}
			compareRel(t, run+" quantizer", q, readNPY(t, pre+"quantizer.npy").F32, bindTol)
			up := make([]float64, m*s) // [m, stride]: this frame's emitted steps
			for c := range m {
				for k := range s {
					up[c*s+k] = tail[c*s+k] + q[c]*float64(uw[c*2*s+k])
					tail[c*s+k] = q[c] * float64(uw[c*2*s+s+k])
				}
			}
			compareRel(t, run+" upsample", up, readNPY(t, pre+"upsample.npy").F32, bindTol)
		}
	}
}
