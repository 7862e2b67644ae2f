package bert_test

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/modeltest"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/models/bert"
	"github.com/parleyhq/parley/runtime/pooling"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

// ref64 is a plain float64 implementation of the BERT encoder for one sequence, written from the
// equations (BERT's, with llama.cpp's choices: token type 0 for every token, the tanh form of
// GELU, the pooling of package pooling's doc), as the reference the batched model is checked
// against. With actRound, the activations a matrix multiplies are first converted to the
// matrix's dot-product type (F16, Q8_0...) and back, as llama.cpp and Parley's backends do.
type ref64 struct {
	c        bert.Config
	w        map[string][]float64
	types    map[string]tensor.DType
	actRound bool
}

func newRef64(t testing.TB, f *gguf.File) *ref64 {
	t.Helper()
	c, err := bert.ConfigFrom(f)
	if err != nil {
		t.Fatal(err)
	}
	r := &ref64{c: c}
	r.w, r.types = modeltest.Weights64(t, f)
	return r
}

// linear returns W·x + b for the matrix name.weight of rows×len(x) and its bias name.bias.
func (r *ref64) linear(name string, x []float64, rows int) []float64 {
	w, b := r.w[name+".weight"], r.w[name+".bias"]
	if r.actRound {
		x = modeltest.RoundTrip(r.types[name+".weight"], x)
	}
	cols := len(x)
	y := make([]float64, rows)
	for i := range y {
		s := b[i]
		for j, v := range x {
			s += w[i*cols+j] * v
		}
		y[i] = s
	}
	return y
}

// layerNorm returns (x - mean) / sqrt(var + eps) * name.weight + name.bias, var biased.
func (r *ref64) layerNorm(x []float64, name string) []float64 {
	var mean, v float64
	for _, e := range x {
		mean += e
	}
	mean /= float64(len(x))
	for _, e := range x {
		v += (e - mean) * (e - mean)
	}
	v /= float64(len(x))
	s := 1 / math.Sqrt(v+float64(r.c.NormEps))
	w, b := r.w[name+".weight"], r.w[name+".bias"]
	y := make([]float64, len(x))
	for i, e := range x {
		y[i] = (e-mean)*s*w[i] + b[i]
	}
	return y
}

func gelu(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

// hidden returns the final hidden state of every token of one sequence.
func (r *ref64) hidden(toks []int32) [][]float64 {
	c := r.c
	n := len(toks)
	x := make([][]float64, n)
	for p, tk := range toks {
		e := make([]float64, c.Dim)
		for j := range e {
			e[j] = r.w["token_embd.weight"][int(tk)*c.Dim+j] + r.w["token_types.weight"][j] + r.w["position_embd.weight"][p*c.Dim+j]
		}
		x[p] = r.layerNorm(e, "token_embd_norm")
	}
	hd := c.HeadDim
	group := c.Heads / c.KVHeads
	for l := 0; l < c.Layers; l++ {
		b := fmt.Sprintf("blk.%d.", l)
		q, k, v := make([][]float64, n), make([][]float64, n), make([][]float64, n)
		for p := range x {
			q[p] = r.linear(b+"attn_q", x[p], c.Heads*hd)
			k[p] = r.linear(b+"attn_k", x[p], c.KVHeads*hd)
			v[p] = r.linear(b+"attn_v", x[p], c.KVHeads*hd)
		}
		next := make([][]float64, n)
		for p := range x {
			att := make([]float64, c.Heads*hd)
			for h := 0; h < c.Heads; h++ {
				kh := h / group
				scores := make([]float64, n)
				mx := math.Inf(-1)
				for j := range n {
					var s float64
					for d := range hd {
						s += q[p][h*hd+d] * k[j][kh*hd+d]
					}
					scores[j] = s / math.Sqrt(float64(hd))
					mx = math.Max(mx, scores[j])
				}
				var sum float64
				for j := range scores {
					scores[j] = math.Exp(scores[j] - mx)
					sum += scores[j]
				}
				for j := range n {
					for d := range hd {
						att[h*hd+d] += scores[j] / sum * v[j][kh*hd+d]
					}
				}
			}
			o := r.linear(b+"attn_output", att, c.Dim)
			for i := range o {
				o[i] += x[p][i]
			}
			h := r.layerNorm(o, b+"attn_output_norm")
			up := r.linear(b+"ffn_up", h, c.FFN)
			for i := range up {
				up[i] = gelu(up[i])
			}
			down := r.linear(b+"ffn_down", up, c.Dim)
			for i := range down {
				down[i] += h[i]
			}
			next[p] = r.layerNorm(down, b+"layer_output_norm")
		}
		x = next
	}
	return x
}

// embed returns the sequence's embeddings (one, or one per token for None), L2-normalised.
func (r *ref64) embed(toks []int32, pool pooling.Type) [][]float64 {
	h := r.hidden(toks)
	var out [][]float64
	switch pool {
	case pooling.CLS:
		out = h[:1]
	case pooling.Last:
		out = h[len(h)-1:]
	case pooling.Mean:
		m := make([]float64, r.c.Dim)
		for _, row := range h {
			for i, v := range row {
				m[i] += v / float64(len(h))
			}
		}
		out = [][]float64{m}
	default:
		out = h
	}
	for _, row := range out {
		var ss float64
		for _, v := range row {
			ss += v * v
		}
		for i := range row {
			row[i] /= math.Sqrt(ss)
		}
	}
	return out
}

// tinyShape is small enough to build and check against float64 in a test: four heads of 16,
// rows that Q8_0 and Q4_0 blocks divide.
var tinyShape = bert.Shape{Name: "tiny", Dim: 64, Layers: 2, Heads: 4, FFN: 128, Positions: 48, Vocab: 200, TokenTypes: 2, Pooling: pooling.CLS, NormEps: 1e-12}

// testModel is tinyShape in F32 (seed 1) with its matrices, as float32 values, multiplied by
// gain (queries and keys: so that attention picks among tokens rather than averaging them; the
// feed-forward network's up projection: so that GELU is not a straight line) and then stored as
// dt. Random weights of the real scale (0.02) leave both nearly linear, and the test blind.
func testModel(t testing.TB, dt tensor.DType, fileKVs func(w *gguf.Writer)) *gguf.File {
	t.Helper()
	src, err := bert.SynthFile(tinyShape, tensor.F32, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	gain := func(name string) float32 {
		switch {
		case strings.HasSuffix(name, "attn_q.weight"), strings.HasSuffix(name, "attn_k.weight"):
			return 8
		case strings.HasSuffix(name, "ffn_up.weight"):
			return 10
		}
		return 1
	}
	return modeltest.Rebuild(t, src, func(w *gguf.Writer, ti *gguf.TensorInfo) bool {
		if ti == nil {
			if fileKVs != nil {
				fileKVs(w)
			}
			return true
		}
		matrix := len(ti.Shape) == 2 && ti.Name != "position_embd.weight" && ti.Name != "token_types.weight"
		if !matrix {
			return true
		}
		vals := make([]float32, ti.Elements())
		if err := quant.Dequantize(ti.DType, src.TensorData(ti), vals); err != nil {
			t.Fatal(err)
		}
		k := gain(ti.Name)
		for i := range vals {
			vals[i] *= k
		}
		data, err := quant.QuantizeRows(dt, vals, int(ti.Shape[0]))
		if err != nil {
			t.Fatal(err)
		}
		if err := w.AddTensor(ti.Name, dt, ti.Shape, data); err != nil {
			t.Fatal(err)
		}
		return false
	})
}
