package ggml

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"

	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Shape is the size of a Whisper model: the width and head count shared by its encoder and
// decoder, and the layer count of each.
type Shape struct {
	Name        string
	State, Head int
	AudioLayer  int
	TextLayer   int
}

// The released Whisper sizes (the English-only variants have the same shapes).
var (
	Tiny   = Shape{Name: "tiny", State: 384, Head: 6, AudioLayer: 4, TextLayer: 4}
	Base   = Shape{Name: "base", State: 512, Head: 8, AudioLayer: 6, TextLayer: 6}
	Small  = Shape{Name: "small", State: 768, Head: 12, AudioLayer: 12, TextLayer: 12}
	Medium = Shape{Name: "medium", State: 1024, Head: 16, AudioLayer: 24, TextLayer: 24}
	Large  = Shape{Name: "large", State: 1280, Head: 20, AudioLayer: 32, TextLayer: 32}
)

// synthKind says how a synthetic tensor is filled.
type synthKind int

const (
	kindMatrix synthKind = iota // a weight matrix: wtype, random
	kindConv                    // a conv kernel: F16 (F32 in F32 files), random
	kindRandom                  // F32, random (positional embeddings)
	kindOnes                    // F32, ones (layer-norm gains)
	kindZeros                   // F32, zeros (biases)
)

type synthTensor struct {
	name string
	ne   []int
	kind synthKind
}

// synthLayout lists the tensors of a Whisper model in the order whisper.cpp's converter writes
// them, with their shapes in ggml order.
func synthLayout(hp HParams) []synthTensor {
	S, T := hp.NAudioState, hp.NTextState
	var ts []synthTensor
	add := func(name string, kind synthKind, ne ...int) {
		ts = append(ts, synthTensor{name, ne, kind})
	}
	add("encoder.positional_embedding", kindRandom, S, hp.NAudioCtx)
	add("encoder.conv1.weight", kindConv, 3, hp.NMels, S)
	add("encoder.conv1.bias", kindZeros, 1, S)
	add("encoder.conv2.weight", kindConv, 3, S, S)
	add("encoder.conv2.bias", kindZeros, 1, S)
	for i := 0; i < hp.NAudioLayer; i++ {
		p := fmt.Sprintf("encoder.blocks.%d.", i)
		mlp(add, p, S)
		attention(add, p+"attn", S)
	}
	add("encoder.ln_post.weight", kindOnes, S)
	add("encoder.ln_post.bias", kindZeros, S)
	add("decoder.positional_embedding", kindRandom, T, hp.NTextCtx)
	add("decoder.token_embedding.weight", kindMatrix, T, hp.NVocab)
	for i := 0; i < hp.NTextLayer; i++ {
		p := fmt.Sprintf("decoder.blocks.%d.", i)
		mlp(add, p, T)
		attention(add, p+"attn", T)
		attention(add, p+"cross_attn", T)
	}
	add("decoder.ln.weight", kindOnes, T)
	add("decoder.ln.bias", kindZeros, T)
	return ts
}

// attention adds one attention block's layer norm and projections (the key has no bias).
// mlp adds the feed-forward network of a block (prefix p) of width n.
func mlp(add func(string, synthKind, ...int), p string, n int) {
	add(p+"mlp_ln.weight", kindOnes, n)
	add(p+"mlp_ln.bias", kindZeros, n)
	add(p+"mlp.0.weight", kindMatrix, n, 4*n)
	add(p+"mlp.0.bias", kindZeros, 4*n)
	add(p+"mlp.2.weight", kindMatrix, 4*n, n)
	add(p+"mlp.2.bias", kindZeros, n)
}

func attention(add func(string, synthKind, ...int), p string, n int) {
	add(p+"_ln.weight", kindOnes, n)
	add(p+"_ln.bias", kindZeros, n)
	add(p+".query.weight", kindMatrix, n, n)
	add(p+".query.bias", kindZeros, n)
	add(p+".key.weight", kindMatrix, n, n)
	add(p+".value.weight", kindMatrix, n, n)
	add(p+".value.bias", kindZeros, n)
	add(p+".out.weight", kindMatrix, n, n)
	add(p+".out.bias", kindZeros, n)
}

// SynthHParams returns from's hyperparameters resized to s, with the weight type wtype.
func SynthHParams(from HParams, s Shape, wtype tensor.DType) (HParams, error) {
	ft, ok := FTypeOf(wtype)
	if !ok {
		return HParams{}, fmt.Errorf("ggml: synthetic model: weight type %v is not one whisper.cpp loads", wtype)
	}
	if s.State <= 0 || s.Head <= 0 || s.AudioLayer <= 0 || s.TextLayer <= 0 || s.State%s.Head != 0 {
		return HParams{}, fmt.Errorf("ggml: synthetic model: bad shape %+v", s)
	}
	if s.State%wtype.BlockSize() != 0 {
		return HParams{}, fmt.Errorf("ggml: synthetic model: width %d is not a multiple of the %v block size %d",
			s.State, wtype, wtype.BlockSize())
	}
	hp := from
	hp.NAudioState, hp.NTextState = s.State, s.State
	hp.NAudioHead, hp.NTextHead = s.Head, s.Head
	hp.NAudioLayer, hp.NTextLayer = s.AudioLayer, s.TextLayer
	hp.FType = ft
	if wtype.Quantized() {
		hp.FType += 2 * QuantVersionFactor // GGML_QNT_VERSION 2, as whisper.cpp's quantizer writes
	}
	if i, why := hp.check(); i >= 0 {
		return HParams{}, fmt.Errorf("ggml: synthetic model: hyperparameter %s: %s", hparamNames[i], why)
	}
	return hp, nil
}

// maxSynthTensor bounds the bytes of one synthetic tensor (large's token embedding in F32 takes
// 265 MB), so that absurd hyperparameters fail instead of exhausting memory.
const maxSynthTensor = 1 << 32

// Synth writes a Whisper model with seeded random weights in real shapes to w, for benchmarks:
// hyperparameters, filters and vocabulary come from from (a file such as whisper.cpp's
// for-tests-ggml-tiny.bin, which carries no weights), resized to s. Tensor names, shapes, order
// and types are those of whisper.cpp's files: weight matrices (token embedding included) are
// wtype, conv kernels F16 (F32 when wtype is F32), everything else F32. Matrices, conv kernels
// and positional embeddings are normal with standard deviation 1/sqrt(fan-in), layer-norm gains
// are one and biases zero. The output depends only on its arguments; it does not reproduce the
// values of any other generator.
func Synth(w io.Writer, from *File, s Shape, wtype tensor.DType, seed uint64) error {
	if from == nil {
		return fmt.Errorf("ggml: synthetic model: no file to take the header from")
	}
	hp, err := SynthHParams(from.HParams, s, wtype)
	if err != nil {
		return err
	}
	convType := tensor.F16
	if wtype == tensor.F32 {
		convType = tensor.F32
	}
	// Check every tensor's size before writing anything.
	layout := synthLayout(hp)
	types := make([]tensor.DType, len(layout))
	sizes := make([]int64, len(layout))
	for i, t := range layout {
		types[i] = tensor.F32
		switch t.kind {
		case kindMatrix:
			types[i] = wtype
		case kindConv:
			types[i] = convType
		}
		ne := make([]int64, len(t.ne))
		for j, n := range t.ne {
			ne[j] = int64(n)
		}
		size, err := dataSize(types[i], ne)
		if err != nil || size > maxSynthTensor {
			return fmt.Errorf("ggml: synthetic tensor %q: shape %v of %v is too large", t.name, t.ne, types[i])
		}
		sizes[i] = size
	}

	wr, err := NewWriter(w, hp, from.Filters, from.Vocab)
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	var data []byte
	chunk := make([]float32, 0, 1<<16)
	for k, t := range layout {
		dt, size := types[k], sizes[k]
		if int64(cap(data)) < size {
			data = make([]byte, size)
		}
		data = data[:size]

		n := 1
		for _, d := range t.ne {
			n *= d
		}
		scale := 1 / math.Sqrt(float64(t.ne[0]))
		if len(t.ne) == 3 {
			scale = 1 / math.Sqrt(float64(t.ne[0]*t.ne[1]))
		}
		// Fill whole rows per chunk so that quantised blocks never straddle two chunks.
		rowsPer := max(1, cap(chunk)/t.ne[0])
		rowBytes := int(size) / max(1, n/t.ne[0])
		for r0, out := 0, 0; r0*t.ne[0] < n; r0 += rowsPer {
			m := min(rowsPer*t.ne[0], n-r0*t.ne[0])
			if cap(chunk) < m {
				chunk = make([]float32, m)
			}
			chunk = chunk[:m]
			for i := range chunk {
				switch t.kind {
				case kindOnes:
					chunk[i] = 1
				case kindZeros:
					chunk[i] = 0
				default:
					chunk[i] = float32(rng.NormFloat64() * scale)
				}
			}
			nb := m / t.ne[0] * rowBytes
			if err := quant.Quantize(dt, chunk, data[out:out+nb]); err != nil {
				return fmt.Errorf("ggml: synthetic tensor %q: %v", t.name, err)
			}
			out += nb
		}
		if err := wr.WriteTensor(t.name, dt, t.ne, data); err != nil {
			return err
		}
	}
	return wr.Flush()
}
