package llama_test

import (
	"fmt"
	"math"
	"testing"

	"github.com/parleyhq/parley/internal/modeltest"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
)

// ref64 is a plain float64 implementation of the LLaMA forward pass for one sequence, written
// straight from the equations, as the reference the batched model is checked against. It rounds
// keys and values to kvRound (e.g. F16) when set, as the KV cache does.
type ref64 struct {
	c       llama.Config
	w       map[string][]float64
	k, v    [][][]float64 // [layer][pos][kvDim]
	kvRound func(float64) float64
	// actRound, when set, converts the activations of a product with weights of the given name
	// as llama.cpp does before the dot product (to F16, Q8_0 or Q8_K).
	actRound bool
	types    map[string]tensor.DType
	// factors divide the rotary angles (the config's RoPE.Factors unless a test sets them);
	// mscale multiplies the rotated values, as ggml's rope does with its attention factor.
	factors []float32
	mscale  float64
	// hidden is the last step's final hidden state, after the output norm.
	hidden []float64
}

func newRef64(t *testing.T, f *gguf.File) *ref64 {
	c, err := llama.ConfigFrom(f)
	if err != nil {
		t.Fatal(err)
	}
	r := &ref64{c: c, k: make([][][]float64, c.Layers), v: make([][][]float64, c.Layers)}
	r.w, r.types = modeltest.Weights64(t, f)
	if c.TiedEmbed {
		r.w["output.weight"] = r.w["token_embd.weight"]
		r.types["output.weight"] = r.types["token_embd.weight"]
	}
	// Fused projections (phi3), split by rows: queries, keys and values; gate, then up.
	qDim, kvDim := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	for l := 0; l < c.Layers; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		split := func(name string, parts []string, rows []int) {
			w, ok := r.w[p+name]
			if !ok {
				return
			}
			for i, part := range parts {
				r.w[p+part], w = w[:rows[i]*c.Dim], w[rows[i]*c.Dim:]
				r.types[p+part] = r.types[p+name]
			}
		}
		split("attn_qkv.weight", []string{"attn_q.weight", "attn_k.weight", "attn_v.weight"}, []int{qDim, kvDim, kvDim})
		if c.Fused {
			split("ffn_up.weight", []string{"ffn_gate.weight", "ffn_up.weight"}, []int{c.FFN, c.FFN})
		}
	}
	r.factors, r.mscale = c.RoPE.Factors, 1
	return r
}

func (r *ref64) matvec(name string, x []float64, rows int) []float64 {
	w := r.w[name]
	cols := len(x)
	if r.actRound {
		x = modeltest.RoundTrip(r.types[name], x)
	}
	y := make([]float64, rows)
	for i := range y {
		var s float64
		for j := 0; j < cols; j++ {
			s += w[i*cols+j] * x[j]
		}
		y[i] = s
	}
	return y
}

func (r *ref64) rmsnorm(x []float64, name string) []float64 {
	var ss float64
	for _, v := range x {
		ss += v * v
	}
	s := 1 / math.Sqrt(ss/float64(len(x))+float64(r.c.NormEps))
	w := r.w[name]
	y := make([]float64, len(x))
	for i := range x {
		y[i] = x[i] * s * w[i]
	}
	return y
}

func (r *ref64) rope(x []float64, heads, pos int) {
	hd, dims := r.c.HeadDim, r.c.RoPE.Dims
	fs := float64(r.c.RoPE.FreqScale)
	// YaRN (as llama.cpp runs it: full extrapolation, rotation counts 32 and 1): pairs from
	// lo to hi move from the unscaled angle to the scaled one, and magnitudes grow.
	var lo, hi float64
	mscale := r.mscale
	if r.c.RoPE.ExtFactor != 0 {
		corr := func(rot float64) float64 {
			return float64(dims) * math.Log(float64(r.c.OrigContext)/(rot*2*math.Pi)) / (2 * math.Log(float64(r.c.RoPE.Base)))
		}
		lo, hi = math.Max(0, math.Floor(corr(32))), math.Min(float64(dims-1), math.Ceil(corr(1)))
		mscale *= 1 + 0.1*math.Log(1/fs)
	}
	for h := 0; h < heads; h++ {
		v := x[h*hd : (h+1)*hd]
		for i := 0; i < dims/2; i++ {
			extrap := float64(pos) * math.Pow(float64(r.c.RoPE.Base), -2*float64(i)/float64(dims))
			if r.factors != nil {
				extrap /= float64(r.factors[i])
			}
			theta := extrap * fs
			if r.c.RoPE.ExtFactor != 0 {
				mix := 1 - math.Min(1, math.Max(0, (float64(i)-lo)/math.Max(0.001, hi-lo)))
				theta = theta*(1-mix) + extrap*mix
			}
			cs, sn := mscale*math.Cos(theta), mscale*math.Sin(theta)
			a, b := 2*i, 2*i+1
			if r.c.RoPE.Mode == 1 {
				a, b = i, i+dims/2
			}
			v[a], v[b] = v[a]*cs-v[b]*sn, v[a]*sn+v[b]*cs
		}
	}
}

// step feeds one token at the next position and returns the logits.
func (r *ref64) step(tok int32) []float64 {
	c := r.c
	pos := len(r.k[0])
	x := append([]float64(nil), r.w["token_embd.weight"][int(tok)*c.Dim:(int(tok)+1)*c.Dim]...)
	res := 1.0 // granite's multipliers
	if c.EmbedScale != 0 {
		for i := range x {
			x[i] *= float64(c.EmbedScale)
		}
	}
	if c.ResidualScale != 0 {
		res = float64(c.ResidualScale)
	}
	qDim, kvDim := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	for l := 0; l < c.Layers; l++ {
		p := fmt.Sprintf("blk.%d.", l)
		xn := x // olmo2 (PostNorm): no norm before the block
		if !c.PostNorm {
			xn = r.rmsnorm(x, p+"attn_norm.weight")
		}
		q := r.matvec(p+"attn_q.weight", xn, qDim)
		k := r.matvec(p+"attn_k.weight", xn, kvDim)
		v := r.matvec(p+"attn_v.weight", xn, kvDim)
		for _, bv := range []struct {
			x    []float64
			name string
		}{{q, "attn_q.bias"}, {k, "attn_k.bias"}, {v, "attn_v.bias"}} {
			if b, ok := r.w[p+bv.name]; ok {
				for i := range bv.x {
					bv.x[i] += b[i]
				}
			}
		}
		if c.QKNorm && c.PostNorm { // olmo2: all heads at once
			q, k = r.rmsnorm(q, p+"attn_q_norm.weight"), r.rmsnorm(k, p+"attn_k_norm.weight")
		} else if c.QKNorm { // per head, before the rotation
			for h := 0; h < c.Heads; h++ {
				copy(q[h*c.HeadDim:], r.rmsnorm(q[h*c.HeadDim:(h+1)*c.HeadDim], p+"attn_q_norm.weight"))
			}
			for h := 0; h < c.KVHeads; h++ {
				copy(k[h*c.HeadDim:], r.rmsnorm(k[h*c.HeadDim:(h+1)*c.HeadDim], p+"attn_k_norm.weight"))
			}
		}
		if c.NoRoPE == 0 || (l+1)%c.NoRoPE != 0 { // smollm3: every fourth layer unrotated
			r.rope(q, c.Heads, pos)
			r.rope(k, c.KVHeads, pos)
		}
		if r.kvRound != nil {
			for i := range k {
				k[i], v[i] = r.kvRound(k[i]), r.kvRound(v[i])
			}
		}
		r.k[l] = append(r.k[l], k)
		r.v[l] = append(r.v[l], v)
		att := make([]float64, qDim)
		group := c.Heads / c.KVHeads
		for h := 0; h < c.Heads; h++ {
			kh := h / group
			qh := append([]float64(nil), q[h*c.HeadDim:(h+1)*c.HeadDim]...)
			if r.kvRound != nil {
				for d := range qh {
					qh[d] = r.kvRound(qh[d])
				}
			}
			scores := make([]float64, pos+1)
			mx := math.Inf(-1)
			for j := 0; j <= pos; j++ {
				var s float64
				for d := 0; d < c.HeadDim; d++ {
					s += qh[d] * r.k[l][j][kh*c.HeadDim+d]
				}
				scores[j] = s / math.Sqrt(float64(c.HeadDim))
				if c.AttnScale != 0 {
					scores[j] = s * float64(c.AttnScale)
				}
				mx = math.Max(mx, scores[j])
			}
			var sum float64
			for j := range scores {
				scores[j] = math.Exp(scores[j] - mx)
				sum += scores[j]
			}
			for j := range scores {
				pj := scores[j] / sum
				if r.kvRound != nil {
					pj = r.kvRound(pj)
				}
				for d := 0; d < c.HeadDim; d++ {
					att[h*c.HeadDim+d] += pj * r.v[l][j][kh*c.HeadDim+d]
				}
			}
		}
		o := r.matvec(p+"attn_output.weight", att, c.Dim)
		r.bias(o, p+"attn_output.bias")
		if c.PostNorm {
			o = r.rmsnorm(o, p+"post_attention_norm.weight")
		}
		for i := range x {
			x[i] += res * o[i]
		}
		if c.PostNorm {
			xn = append([]float64(nil), x...)
		} else {
			xn = r.rmsnorm(x, p+"ffn_norm.weight")
		}
		g := r.matvec(p+"ffn_gate.weight", xn, c.FFN)
		u := r.matvec(p+"ffn_up.weight", xn, c.FFN)
		r.bias(g, p+"ffn_gate.bias")
		r.bias(u, p+"ffn_up.bias")
		for i := range g {
			if c.GeGLU { // gemma: the tanh form of GELU
				g[i] = 0.5 * g[i] * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(g[i]+0.044715*g[i]*g[i]*g[i]))) * u[i]
			} else {
				g[i] = g[i] / (1 + math.Exp(-g[i])) * u[i]
			}
		}
		d := r.matvec(p+"ffn_down.weight", g, c.Dim)
		r.bias(d, p+"ffn_down.bias")
		if c.PostNorm {
			d = r.rmsnorm(d, p+"post_ffw_norm.weight")
		}
		for i := range x {
			x[i] += res * d[i]
		}
	}
	x = r.rmsnorm(x, "output_norm.weight")
	r.hidden = x
	out := r.matvec("output.weight", x, c.Vocab)
	r.bias(out, "output.bias")
	if c.LogitScale != 0 {
		for i := range out {
			out[i] /= float64(c.LogitScale)
		}
	}
	return out
}

// bias adds the bias named name to x, when the model has one.
func (r *ref64) bias(x []float64, name string) {
	if b, ok := r.w[name]; ok {
		for i := range x {
			x[i] += b[i]
		}
	}
}
