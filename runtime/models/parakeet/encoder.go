package parakeet

import (
	"errors"
	"fmt"
	"math"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// The encoder: the convolutional subsampling and the FastConformer blocks, as whisper.cpp's
// parakeet_build_graph_encode computes them (parakeet.cpp:1525-1975), for several clips in one
// call.

// LocalAttentionFrames is the clip length, in encoder frames, above which whisper.cpp's encoder
// attends only to frames at most LocalAttentionWindow away (parakeet.cpp:136-141).
const (
	LocalAttentionFrames = 8192
	LocalAttentionWindow = 128
)

// layerNormEps is the conformer's LayerNorm epsilon.
const layerNormEps = 1e-5

// Encoder runs the encoder on batches of clips: each clip's log-mel frames through the
// subsampling on its own, then all clips' frames together through every block (relative
// attention within each clip, the time convolution within each clip). Its scratch is allocated
// once for clips of up to MaxMelFrames mel frames each and MaxFrames encoder frames together.
// An Encoder is not safe for concurrent use.
type Encoder struct {
	m         *Model
	maxMel    int
	maxFrames int

	// subsampling scratch, for one clip of maxMel frames
	mel backend.Tensor // [maxMel*NMels, 1]
	// cols0 [H1*W1, 9] holds conv0's receptive fields: s2's memory, read as rows of 9, where
	// that holds them (s2 is written only after conv0), else a tensor of its own.
	cols0 backend.Tensor
	// s1 [H1*W1, C] and s2 [H2*W2, C] take the convolutions' outputs in turn: conv0's, conv3's
	// and conv6's in s1, conv2's and conv5's in s2 (each input is dead once its output is made).
	s1, s2        backend.Tensor
	flat          backend.Tensor // [H3, C*F]
	x, ln, tmp    backend.Tensor // [maxFrames, d]
	ff            backend.Tensor // [maxFrames, 4d]
	q, k, v, att  backend.Tensor // [maxFrames, d]
	val, gate, dw backend.Tensor // [maxFrames, d]
	pe            backend.Tensor // [2*maxFrames-1, d] sinusoids of distances maxFrames-1 .. -(maxFrames-1)
	scratch       []backend.Tensor
	clips         []int32
	starts        []int
	views         []backend.Tensor // views made by a call, closed by the next

	// Tap, when set, sees the activations of a call after the subsampling ("pre_encode", layer
	// -1) and after each block ("layer", its index): rows of the clips in order, valid during the
	// call. For tests and analysis.
	Tap func(stage string, layer int, x backend.Tensor)
}

// subsampled is the size of the image after one stride-2 convolution (kernel 3, padding 1).
func subsampled(n int) int { return (n-1)/2 + 1 }

// NewEncoder makes an encoder for clips of up to maxMel mel frames each and maxFrames encoder
// frames together (at least EncoderFrames(maxMel)).
func (m *Model) NewEncoder(maxMel, maxFrames int) (*Encoder, error) {
	h := m.HParams
	if maxMel < 1 || maxFrames < EncoderFrames(maxMel) || maxFrames > math.MaxInt32/8 {
		return nil, fmt.Errorf("parakeet: encoder for clips of %d mel frames, %d encoder frames in all", maxMel, maxFrames)
	}
	e := &Encoder{m: m, maxMel: maxMel, maxFrames: maxFrames}
	d, c, f := h.NAudioState, h.NSubsamplingChannels, h.NMels/Subsampling
	h1, w1 := subsampled(maxMel), subsampled(h.NMels)
	h2, w2 := subsampled(h1), subsampled(w1)
	h3 := subsampled(h2)
	var err error
	alloc := func(rows, cols int) backend.Tensor {
		if err != nil {
			return nil
		}
		var t backend.Tensor
		t, err = m.be.Alloc(tensor.F32, rows, cols)
		if err == nil {
			e.scratch = append(e.scratch, t)
		}
		return t
	}
	e.mel = alloc(maxMel*h.NMels, 1)
	e.s1 = alloc(h1*w1, c)
	e.s2 = alloc(h2*w2, c)
	if colRows(h1*w1, c) > h2*w2 {
		e.cols0 = alloc(h1*w1, 9)
	}
	e.flat = alloc(h3, c*f)
	e.x, e.ln, e.tmp = alloc(maxFrames, d), alloc(maxFrames, d), alloc(maxFrames, d)
	e.ff = alloc(maxFrames, 4*d)
	e.q, e.k, e.v, e.att = alloc(maxFrames, d), alloc(maxFrames, d), alloc(maxFrames, d), alloc(maxFrames, d)
	e.val, e.gate, e.dw = alloc(maxFrames, d), alloc(maxFrames, d), alloc(maxFrames, d)
	e.pe = alloc(2*maxFrames-1, d)
	if err == nil {
		err = m.be.Write(e.pe, 0, positions(maxFrames, d))
	}
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("parakeet: encoder: %w", err)
	}
	return e, nil
}

// positions returns the sinusoidal embeddings [2L-1, d] of the relative distances L-1 down to
// -(L-1) as whisper.cpp builds them (parakeet.cpp:2070-2090): pe[2k] = sin(θ), pe[2k+1] = cos(θ),
// θ = pos·f_k with f_k = e^(-2k·ln(10000)/d), both in float32.
func positions(L, d int) []float32 {
	out := make([]float32, (2*L-1)*d)
	ln := float32(math.Log(10000))
	for r := 0; r < 2*L-1; r++ {
		pos := float32(L - 1 - r)
		row := out[r*d : (r+1)*d]
		for k := 0; k < d/2; k++ {
			f := float32(math.Exp(float64(-(float32(2*k) * ln / float32(d)))))
			th := float64(pos * f)
			row[2*k], row[2*k+1] = float32(math.Sin(th)), float32(math.Cos(th))
		}
	}
	return out
}

// colRows is the number of rows of C values that hold n rows of 9 (conv0's receptive fields)
// exactly as a whole: the fewest that hold 9n values and whose values make whole rows of 9.
func colRows(n, c int) int {
	r := (9*n + c - 1) / c
	for r*c%9 != 0 {
		r++
	}
	return r
}

// MaxMelFrames is the longest clip, in mel frames, a call takes.
func (e *Encoder) MaxMelFrames() int { return e.maxMel }

// MaxFrames is the most encoder frames a call produces.
func (e *Encoder) MaxFrames() int { return e.maxFrames }

// Close releases the scratch.
func (e *Encoder) Close() error {
	var errs []error
	e.closeViews()
	for _, t := range e.scratch {
		errs = append(errs, t.Close())
	}
	e.scratch = nil
	return errors.Join(errs...)
}

func (e *Encoder) closeViews() {
	for _, v := range e.views {
		v.Close()
	}
	clear(e.views)
	e.views = e.views[:0]
}

// view returns rows [row0, row0+rows) of t, closed by the next call.
func (e *Encoder) view(t backend.Tensor, row0, rows int) (backend.Tensor, error) {
	v, err := e.m.be.View(t, row0, rows)
	if err != nil {
		return nil, err
	}
	e.views = append(e.views, v)
	return v, nil
}

// Encode runs the encoder on mels, each a clip's log-mel spectrogram (FrontEnd.LogMel: T rows of
// NMels, T at most MaxMelFrames), and returns its output [n, d]: the clips' EncoderFrames(T)
// frames one clip after another, valid until the next call.
func (e *Encoder) Encode(mels [][]float32) (backend.Tensor, error) {
	h := e.m.HParams
	e.closeViews()
	e.clips, e.starts = e.clips[:0], e.starts[:0]
	n, longest := 0, 0
	for i, mel := range mels {
		if len(mel) == 0 || len(mel)%h.NMels != 0 || len(mel)/h.NMels > e.maxMel {
			return nil, fmt.Errorf("parakeet: encoder: clip %d has %d values, not 1 to %d frames of %d mel bins", i, len(mel), e.maxMel, h.NMels)
		}
		t := EncoderFrames(len(mel) / h.NMels)
		e.starts = append(e.starts, n)
		e.clips = append(e.clips, int32(t))
		n += t
		longest = max(longest, t)
	}
	if n == 0 {
		return nil, errors.New("parakeet: encoder: no clips")
	}
	if n > e.maxFrames {
		return nil, fmt.Errorf("parakeet: encoder: %d frames in one call, more than %d", n, e.maxFrames)
	}
	x, err := e.view(e.x, 0, n)
	if err != nil {
		return nil, err
	}
	for i, mel := range mels {
		dst, err := e.view(e.x, e.starts[i], int(e.clips[i]))
		if err != nil {
			return nil, err
		}
		if err := e.subsample(dst, mel); err != nil {
			return nil, fmt.Errorf("parakeet: encoder: %w", err)
		}
	}
	if e.Tap != nil {
		e.Tap("pre_encode", -1, x)
	}
	if err := e.blocks(x, n, longest); err != nil {
		return nil, fmt.Errorf("parakeet: encoder: %w", err)
	}
	return x, nil
}

// subsample runs one clip's log-mel [T, NMels] through the three stride-2 convolutions
// (parakeet.cpp:1550-1600) into dst [EncoderFrames(T), d]: the mel as an image of T rows
// (time) and NMels columns (frequency), one channel; conv0 (3×3, 1 → C) + ReLU, the depthwise
// conv2 and the pointwise conv3 + ReLU, the depthwise conv5 and the pointwise conv6 + ReLU;
// then each frame's C×F values taken channel by channel (c·F + f) into pre_encode.out.
func (e *Encoder) subsample(dst backend.Tensor, mel []float32) error {
	be, h, p := e.m.be, e.m.HParams, &e.m.pre
	T := len(mel) / h.NMels
	g0 := backend.ConvGeom{H: T, W: h.NMels, KH: 3, KW: 3, SH: 2, SW: 2, PH: 1, PW: 1}
	h1, w1 := g0.Out()
	g2 := backend.ConvGeom{H: h1, W: w1, KH: 3, KW: 3, SH: 2, SW: 2, PH: 1, PW: 1}
	h2, w2 := g2.Out()
	g5 := backend.ConvGeom{H: h2, W: w2, KH: 3, KW: 3, SH: 2, SW: 2, PH: 1, PW: 1}
	h3, w3 := g5.Out()
	var err error
	v := func(t backend.Tensor, rows int) backend.Tensor {
		if err != nil {
			return nil
		}
		var r backend.Tensor
		r, err = e.view(t, 0, rows)
		return r
	}
	melT, s1 := v(e.mel, T*h.NMels), v(e.s1, h1*w1)
	var cols0 backend.Tensor
	if e.cols0 != nil {
		cols0 = v(e.cols0, h1*w1)
	} else if r := colRows(h1*w1, h.NSubsamplingChannels); err == nil {
		var all backend.Tensor
		if all, err = be.Reshape(v(e.s2, r), r*h.NSubsamplingChannels/9, 9); err == nil {
			e.views = append(e.views, all)
			cols0, err = e.view(all, 0, h1*w1)
		}
	}
	s2, s3, s4, s5 := v(e.s2, h2*w2), v(e.s1, h2*w2), v(e.s2, h3*w3), v(e.s1, h3*w3)
	flat := v(e.flat, h3)
	if err != nil {
		return err
	}
	steps := []func() error{
		func() error { return be.Write(melT, 0, mel) },
		func() error { return be.Im2Col2D(cols0, melT, g0) },
		func() error { return be.MatMul(s1, cols0, p.w[0]) },
		func() error { return be.AddRows(s1, s1, p.b[0]) },
		func() error { return be.Unary(s1, s1, tensor.ReLU) },
		func() error { return be.DepthwiseConv2D(s2, s1, p.w[1], p.b[1], g2) },
		func() error { return be.MatMul(s3, s2, p.w[2]) },
		func() error { return be.AddRows(s3, s3, p.b[2]) },
		func() error { return be.Unary(s3, s3, tensor.ReLU) },
		func() error { return be.DepthwiseConv2D(s4, s3, p.w[3], p.b[3], g5) },
		func() error { return be.MatMul(s5, s4, p.w[4]) },
		func() error { return be.AddRows(s5, s5, p.b[4]) },
		func() error { return be.Unary(s5, s5, tensor.ReLU) },
		// [h3*w3, C] → [h3, C*w3]: row t holds channel c's w3 bins at c*w3 (Im2Col1D with a
		// kernel and stride of w3 is exactly that transposition).
		func() error { return be.Im2Col1D(flat, s5, w3, w3, 0) },
		func() error { return be.MatMul(dst, flat, p.out) },
		func() error { return be.AddRows(dst, dst, p.outB) },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return err
		}
	}
	return nil
}

// blocks runs the conformer blocks over x [n, d] (the clips' frames), the longest clip of
// longest frames (parakeet.cpp:1640-1970):
//
//	x += ½·FF1(LN(x)); x += MHSA(LN(x)); x += Conv(LN(x)); x += ½·FF2(LN(x)); x = LN(x)
//
// with FF = linear2(SiLU(linear1)), MHSA the relative-position attention (RelPosAttention, its
// position embeddings projected by linear_pos), and Conv = pointwise_conv2(SiLU(BN(depthwise(
// GLU(pointwise_conv1))))), the batch norm folded into the depthwise kernel.
func (e *Encoder) blocks(x backend.Tensor, n, longest int) error {
	be, h := e.m.be, e.m.HParams
	d, heads := h.NAudioState, h.NAudioHead
	ra := backend.RelPos{NHead: heads, HeadDim: d / heads, Scale: float32(1 / math.Sqrt(float64(d/heads)))}
	L := longest
	if longest > LocalAttentionFrames {
		ra.Window = LocalAttentionWindow
		L = LocalAttentionWindow + 1
	}
	var err error
	v := func(t backend.Tensor, row0, rows int) backend.Tensor {
		if err != nil {
			return nil
		}
		var r backend.Tensor
		r, err = e.view(t, row0, rows)
		return r
	}
	ln, tmp, ff := v(e.ln, 0, n), v(e.tmp, 0, n), v(e.ff, 0, n)
	q, k, vv, att := v(e.q, 0, n), v(e.k, 0, n), v(e.v, 0, n), v(e.att, 0, n)
	val, gate, dw := v(e.val, 0, n), v(e.gate, 0, n), v(e.dw, 0, n)
	// A layer's projected position embeddings [2L-1, d] live in ff's memory (read as [4n, d]),
	// which the feed-forward modules leave free during the attention.
	pe := v(e.pe, e.maxFrames-L, 2*L-1)
	var pos backend.Tensor
	if err == nil {
		var all backend.Tensor
		if all, err = be.Reshape(ff, 4*n, d); err == nil {
			e.views = append(e.views, all)
			pos, err = e.view(all, 0, 2*L-1)
		}
	}
	// the time convolution of each clip, over its own frames
	K := h.NConvKernel
	var dwIn, dwOut []backend.Tensor
	for i, c := range e.clips {
		dwIn = append(dwIn, v(e.val, e.starts[i], int(c)))
		dwOut = append(dwOut, v(e.dw, e.starts[i], int(c)))
	}
	if err != nil {
		return err
	}
	for li := range e.m.layers {
		l := &e.m.layers[li]
		if err := e.feedForward(x, ln, ff, tmp, l.ff1N, l.ff1NB, l.ff1Up, l.ff1Down); err != nil {
			return err
		}
		steps := []func() error{
			func() error { return be.LayerNorm(ln, x, l.attN, l.attNB, layerNormEps) },
			func() error {
				return backend.MatMuls(be, []backend.Tensor{q, k, vv}, ln, []backend.Tensor{l.q, l.k, l.v})
			},
			func() error { return be.MatMul(pos, pe, l.pos) },
			func() error { return be.RelPosAttention(att, q, k, vv, pos, l.posU, l.posV, ra, e.clips) },
			func() error { return be.MatMul(tmp, att, l.out) },
			func() error { return be.AddRows(x, x, tmp) },
			func() error { return be.LayerNorm(ln, x, l.convN, l.convNB, layerNormEps) },
			func() error {
				return backend.MatMuls(be, []backend.Tensor{val, gate}, ln, []backend.Tensor{l.pwVal, l.pwGate})
			},
			func() error { return be.GLU(val, gate, val, tensor.Sigmoid) },
			func() error {
				for i, c := range e.clips {
					g := backend.ConvGeom{H: int(c), W: 1, KH: K, KW: 1, SH: 1, SW: 1, PH: (K - 1) / 2}
					if err := be.DepthwiseConv2D(dwOut[i], dwIn[i], l.dw, l.dwB, g); err != nil {
						return err
					}
				}
				return nil
			},
			func() error { return be.Unary(dw, dw, tensor.SiLU) },
			func() error { return be.MatMul(tmp, dw, l.pw2) },
			func() error { return be.AddRows(x, x, tmp) },
		}
		for _, s := range steps {
			if err := s(); err != nil {
				return fmt.Errorf("layer %d: %w", li, err)
			}
		}
		if err := e.feedForward(x, ln, ff, tmp, l.ff2N, l.ff2NB, l.ff2Up, l.ff2Down); err != nil {
			return err
		}
		if err := be.LayerNorm(x, x, l.outN, l.outNB, layerNormEps); err != nil {
			return err
		}
		if e.Tap != nil {
			e.Tap("layer", li, x)
		}
	}
	return nil
}

// feedForward adds ½·linear2(SiLU(linear1(LN(x)))) to x (whisper.cpp scales the half after the
// product, parakeet.cpp:1664, as here).
func (e *Encoder) feedForward(x, ln, ff, tmp, norm, normB, up, down backend.Tensor) error {
	be := e.m.be
	if err := be.LayerNorm(ln, x, norm, normB, layerNormEps); err != nil {
		return err
	}
	if err := be.MatMul(ff, ln, up); err != nil {
		return err
	}
	if err := be.Unary(ff, ff, tensor.SiLU); err != nil {
		return err
	}
	if err := be.MatMul(tmp, ff, down); err != nil {
		return err
	}
	if err := be.Scale(tmp, tmp, 0.5); err != nil {
		return err
	}
	return be.AddRows(x, x, tmp)
}

// ProjectEncoder writes the joint's encoder projection of enc [n, d] (encoder output rows) into
// dst [n, P]: joint.enc·enc + bias, once per frame, for the joint to read (Decoder.Joint).
func (m *Model) ProjectEncoder(dst, enc backend.Tensor) error {
	if err := m.be.MatMul(dst, enc, m.jEnc); err != nil {
		return fmt.Errorf("parakeet: encoder projection: %w", err)
	}
	return m.be.AddRows(dst, dst, m.jEncB)
}
