package llama_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/modeltest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
)

// phi3Opts says how phi3Model writes its file.
type phi3Opts struct {
	dt         tensor.DType // of the matrices (F32 when zero)
	splitQKV   bool         // attn_q/k/v.weight instead of attn_qkv.weight
	longRoPE   bool         // rope_factors_short/long.weight, an original context of 16 and an attention factor
	attnFactor float64      // with longRoPE (default 1.19)
	ropeDims   int          // phi3.rope.dimension_count, when not 0
}

// phi3Model turns the tiny synthetic model into a phi3 one as llama.cpp's converter writes
// Phi-3: the query, key and value matrices as one (attn_qkv.weight, their rows in that order),
// the gate and up matrices as one (ffn_up.weight, the gate's rows first), and for LongRoPE
// (Phi-3 128k, Phi-3.5) the short and long frequency factors with the attention factor. The
// queries and keys are scaled up so that attention, and with it the logits, depends on the
// rotation.
func phi3Model(t testing.TB, o phi3Opts) *gguf.File {
	t.Helper()
	if o.dt == 0 {
		o.dt = tensor.F32
	}
	base, err := llama.SynthFile(tinyShape, o.dt, 11)
	if err != nil {
		t.Fatal(err)
	}
	s := tinyShape
	dim := int64(s.Dim)
	qDim, kvDim := int64(s.Dim), int64(s.KVHeads*s.Dim/s.Heads)
	data := func(name string) []byte {
		ti, ok := base.Tensor(name)
		if !ok {
			t.Fatalf("synthetic model lacks %s", name)
		}
		b := append([]byte(nil), base.TensorData(ti)...)
		if o.dt == tensor.F32 && isQK(name) {
			b = scaledF32(b, 20)
		}
		return b
	}
	factors := func(seed uint64) []byte {
		rng := rand.New(rand.NewPCG(seed, 1))
		n := s.Dim / s.Heads / 2
		if o.ropeDims != 0 {
			n = o.ropeDims / 2
		}
		b := make([]byte, 4*n)
		for i := range n {
			// As LongRoPE's: 1 for the fastest pairs, growing towards the slowest.
			v := 1 + float64(i)/float64(n)*(3+4*rng.Float64())
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(float32(v)))
		}
		return b
	}
	add := func(w *gguf.Writer, name string, shape []int64, b []byte) {
		if err := w.AddTensor(name, o.dt, shape, b); err != nil {
			t.Fatal(err)
		}
	}
	return modeltest.Rebuild(t, base, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		if ti == nil {
			setArch(w, base, "phi3")
			w.SetUint32("phi3.attention.sliding_window", 2047)
			if o.ropeDims != 0 {
				w.SetUint32("phi3.rope.dimension_count", uint32(o.ropeDims))
			}
			if o.longRoPE {
				if o.attnFactor == 0 {
					o.attnFactor = 1.19
				}
				w.SetUint32("phi3.rope.scaling.original_context_length", 16)
				w.SetFloat32("phi3.rope.scaling.attn_factor", float32(o.attnFactor))
				n := int64(len(factors(1)) / 4)
				for _, f := range []struct {
					name string
					seed uint64
				}{{"rope_factors_short.weight", 1}, {"rope_factors_long.weight", 2}} {
					if err := w.AddTensor(f.name, tensor.F32, []int64{n}, factors(f.seed)); err != nil {
						t.Fatal(err)
					}
				}
			}
			return true
		}
		p := "" // the layer's prefix, blk.N.
		if i := strings.Index(ti.Name, ".attn_"); i >= 0 {
			p = ti.Name[:i+1]
		} else if i := strings.Index(ti.Name, ".ffn_"); i >= 0 {
			p = ti.Name[:i+1]
		}
		switch {
		case strings.HasSuffix(ti.Name, "attn_q.weight"), strings.HasSuffix(ti.Name, "attn_k.weight"):
			if !o.splitQKV {
				if strings.HasSuffix(ti.Name, "attn_q.weight") {
					b := append(append(data(p+"attn_q.weight"), data(p+"attn_k.weight")...), data(p+"attn_v.weight")...)
					add(w, p+"attn_qkv.weight", []int64{dim, qDim + 2*kvDim}, b)
				}
				return false
			}
			add(w, ti.Name, ti.Shape, data(ti.Name))
			return false
		case strings.HasSuffix(ti.Name, "attn_v.weight"):
			return o.splitQKV
		case strings.HasSuffix(ti.Name, "ffn_gate.weight"):
			add(w, p+"ffn_up.weight", []int64{dim, 2 * int64(s.FFN)}, append(data(p+"ffn_gate.weight"), data(p+"ffn_up.weight")...))
			return false
		case strings.HasSuffix(ti.Name, "ffn_up.weight"):
			return false
		}
		return true
	})
}

// TestPhi3MatchesFloat64: the phi3 architecture (fused query/key/value and gate/up matrices,
// NeoX rotation; LongRoPE's short factors in a context within the original one and its long
// factors beyond it, the rotated values multiplied by the attention factor) runs on every
// backend as the float64 reference computes it, where each fused matrix is split by rows.
func TestPhi3MatchesFloat64(t *testing.T) {
	toks := []int32{1, 17, 250, 3, 99, 42, 7, 7, 7, 180, 5, 64}
	for _, tc := range []struct {
		name   string
		o      phi3Opts
		seqCtx int  // the context's SeqContext
		long   bool // the reference uses the long factors
	}{
		{"fused", phi3Opts{}, 0, false},
		{"separate qkv", phi3Opts{splitQKV: true}, 0, false},
		{"longrope short", phi3Opts{longRoPE: true}, 16, false},
		{"longrope long", phi3Opts{longRoPE: true}, 0, true}, // SeqContext = KVSlots = 32 > 16
		{"longrope long Q8_0", phi3Opts{longRoPE: true, dt: tensor.Q8_0}, 17, true},
		// Phi-4-mini's layout: LongRoPE on part of each head.
		{"longrope partial", phi3Opts{longRoPE: true, ropeDims: 8}, 0, true},
	} {
		f := phi3Model(t, tc.o)
		cfg, err := llama.ConfigFrom(f)
		if err != nil || cfg.Arch != "phi3" || !cfg.Fused || cfg.RoPE.Mode != backend.RoPENeoX || cfg.QKVBias || cfg.QKNorm {
			t.Fatalf("%s: phi3 config %+v, %v", tc.name, cfg, err)
		}
		if tc.o.longRoPE != (cfg.LongFactors != nil) || tc.o.longRoPE && (cfg.OrigContext != 16 || cfg.AttnFactor != float32(1.19)) {
			t.Fatalf("%s: LongRoPE config %+v", tc.name, cfg)
		}
		for _, be := range backendsUnderTest(t) {
			t.Run(tc.name+"/"+be.Name(), func(t *testing.T) {
				ref := newRef64(t, f)
				if tc.o.longRoPE {
					ref.mscale = float64(cfg.AttnFactor)
					if tc.long {
						ref.factors = cfg.LongFactors
					}
				}
				tol := 1e-3
				if tc.o.dt == tensor.Q8_0 {
					ref.actRound, tol = true, 2e-3
				}
				got := oneByOneIn(t, be, f, toks, llama.ContextConfig{StepTokens: 4, MaxSeqs: 1, KVSlots: 32, KVType: tensor.F32, SeqContext: tc.seqCtx})
				for i, logits := range got {
					want := ref.step(toks[i])
					for j := range want {
						if d := math.Abs(float64(logits[j]) - want[j]); d > tol*math.Max(1, math.Abs(want[j])) {
							t.Fatalf("position %d: logit %d = %v, float64 reference %v", i, j, logits[j], want[j])
						}
					}
				}
			})
		}
	}
	// What the test tells apart: the long factors, the short ones and the attention factor each
	// give other logits.
	f := phi3Model(t, phi3Opts{longRoPE: true})
	cfg, _ := llama.ConfigFrom(f)
	short, long, plain := newRef64(t, f), newRef64(t, f), newRef64(t, f)
	short.mscale, long.mscale, long.factors = float64(cfg.AttnFactor), float64(cfg.AttnFactor), cfg.LongFactors
	var dLong, dFactor float64
	for _, tk := range toks[:8] {
		x, y, z := short.step(tk), long.step(tk), plain.step(tk)
		for j := range x {
			dLong = math.Max(dLong, math.Abs(x[j]-y[j]))
			dFactor = math.Max(dFactor, math.Abs(x[j]-z[j]))
		}
	}
	if dLong < 1e-2 || dFactor < 1e-2 {
		t.Fatalf("logits differ by at most %g between the long and short factors, %g with the attention factor and without", dLong, dFactor)
	}
}

// TestPhi3Refused: phi3 files Parley cannot run as written are refused at load with the reason:
// an up matrix of the wrong height, an attention factor out of range, and LongRoPE factors in a
// llama file.
func TestPhi3Refused(t *testing.T) {
	be := backendsUnderTest(t)[0]
	good := phi3Model(t, phi3Opts{longRoPE: true})
	if m, err := llama.Load(good, be); err != nil {
		t.Fatalf("the phi3 model does not load: %v", err)
	} else {
		m.Close()
	}
	cases := []struct {
		name string
		f    *gguf.File
		want string
	}{
		{"up matrix of one half", modeltest.Rebuild(t, good, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti != nil && ti.Name == "blk.1.ffn_up.weight" {
				b := good.TensorData(ti)
				if err := w.AddTensor(ti.Name, ti.DType, []int64{ti.Shape[0], ti.Shape[1] / 2}, b[:len(b)/2]); err != nil {
					t.Fatal(err)
				}
				return false
			}
			return true
		}), "blk.1.ffn_up.weight has shape"},
		{"attention factor below 0", phi3Model(t, phi3Opts{longRoPE: true, attnFactor: -1}), "attention factor"},
		{"factors in llama", modeltest.Rebuild(t, good, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
			if ti == nil {
				w.SetString("general.architecture", "llama")
				for _, kv := range good.KVs {
					if strings.HasPrefix(kv.Key, "phi3.") {
						w.Set("llama."+strings.TrimPrefix(kv.Key, "phi3."), kv.Value)
					}
				}
			}
			return true
		}), "LongRoPE"},
	}
	for _, tc := range cases {
		m, err := llama.Load(tc.f, be)
		if err == nil {
			m.Close()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error with %q", tc.name, err, tc.want)
		}
	}
}

// TestSynthPhi3: Synth's phi3 model holds the llama model's weights of the same seed, each fused
// matrix the rows of its parts in order, and loads and runs.
func TestSynthPhi3(t *testing.T) {
	s := tinyShape
	a, err := llama.SynthFile(s, tensor.Q8_0, 5)
	if err != nil {
		t.Fatal(err)
	}
	s.Arch = "phi3"
	b, err := llama.SynthFile(s, tensor.Q8_0, 5)
	if err != nil {
		t.Fatal(err)
	}
	data := func(f *gguf.File, name string) []byte {
		ti, ok := f.Tensor(name)
		if !ok {
			t.Fatalf("no %s", name)
		}
		return f.TensorData(ti)
	}
	for l := range s.Layers {
		p := fmt.Sprintf("blk.%d.", l)
		for fused, parts := range map[string][]string{"attn_qkv.weight": {"attn_q.weight", "attn_k.weight", "attn_v.weight"}, "ffn_up.weight": {"ffn_gate.weight", "ffn_up.weight"}} {
			var want []byte
			for _, part := range parts {
				want = append(want, data(a, p+part)...)
			}
			if !bytes.Equal(data(b, p+fused), want) {
				t.Fatalf("%s%s is not the rows of %v", p, fused, parts)
			}
		}
	}
	if cfg, err := llama.ConfigFrom(b); err != nil || cfg.Arch != "phi3" || !cfg.Fused {
		t.Fatalf("config %+v, %v", cfg, err)
	}
	// An original context of 0 is the training context's, as llama.cpp reads it.
	zero := modeltest.Rebuild(t, b, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		if ti == nil {
			w.SetUint32("phi3.rope.scaling.original_context_length", 0)
		}
		return true
	})
	if cfg, err := llama.ConfigFrom(zero); err != nil || cfg.OrigContext != s.Ctx {
		t.Fatalf("original context 0: %d, %v", cfg.OrigContext, err)
	}
	if _, err := llama.SynthFile(llama.Shape{Name: "x", Dim: 64, Layers: 1, Heads: 4, KVHeads: 4, FFN: 64, Ctx: 8, Vocab: 300, Arch: "rwkv6"}, tensor.F32, 1); err == nil {
		t.Fatal("an unknown architecture was written")
	}
	for _, be := range backendsUnderTest(t) {
		if got := oneByOne(t, be, b, []int32{1, 2, 3}); len(got) != 3 {
			t.Fatalf("%s: %d steps", be.Name(), len(got))
		}
	}
}
