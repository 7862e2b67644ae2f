package parakeet

import (
	"errors"
	"fmt"
	"math"
	"unsafe"

	"github.com/parleyhq/parley/internal/mapfile"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Model is a Parakeet model's weights on a backend, ready for the encoder (NewEncoder), the
// prediction network and the joint (NewDecoder). It computes only: what to run when is the
// scheduler's (runtime/sched/asr). The tensors are read from the File, which must stay open
// while the model is used where the backend keeps the file's bytes (the host backends).
type Model struct {
	HParams   HParams
	Vocab     *Vocab
	Durations []int
	FrontEnd  *FrontEnd

	be      backend.Backend
	file    *File
	pre     preWeights
	layers  []layerWeights
	embed   backend.Tensor // [V+1, P]
	lstm    []lstmWeights
	jPred   backend.Tensor // [P, P]
	jPredB  backend.Tensor // [1, P]
	jEnc    backend.Tensor // [P, d]
	jEncB   backend.Tensor // [1, P]
	jOut    backend.Tensor // [V+1+D, P]
	jOutB   backend.Tensor // [1, V+1+D]
	weights []backend.Tensor
	arena   mapfile.Arena // host copies of the tensors the file does not hold aligned
}

// preWeights are the subsampling's: conv0 [C, 9] (1 → C channels), the depthwise conv2 and conv5
// [C, 9], the pointwise conv3 and conv6 [C, C], their biases [1, C], and the output projection
// [d, C*F] (F = NMels/8 mel bins left) with its bias [1, d].
type preWeights struct {
	w, b  [5]backend.Tensor
	out   backend.Tensor
	outB  backend.Tensor
	freqs int // mel bins left after subsampling
	chans int
}

// layerWeights are one conformer block's. The convolution module's first pointwise
// convolution is split into its two halves (GLU's value and gate), and its batch norm is folded
// into the depthwise kernel and a bias (dw [d, K], dwB [1, d]).
type layerWeights struct {
	ff1N, ff1NB, ff1Up, ff1Down                backend.Tensor
	attN, attNB, q, k, v, out, pos             backend.Tensor
	posU, posV                                 backend.Tensor // [1, d]
	convN, convNB, pwVal, pwGate, dw, dwB, pw2 backend.Tensor
	ff2N, ff2NB, ff2Up, ff2Down                backend.Tensor
	outN, outNB                                backend.Tensor
}

// lstmWeights are one prediction-network layer's: W_ih, W_hh [4P, P] (gate blocks [i, f, o, g])
// and the folded bias [1, 4P].
type lstmWeights struct{ wih, whh, b backend.Tensor }

// Load binds the weights of f, which must have them, to be: the matrices in their file types
// (repacked where the backend has a faster layout), vectors as F32, the batch norms folded into
// the depthwise convolutions as whisper.cpp computes them, without an epsilon:
// w' = w·γ/√var, b' = β - mean·γ/√var (parakeet.cpp:1930-1934; NeMo adds 1e-5 to var).
func Load(f *File, be backend.Backend) (*Model, error) {
	if f.Weights == nil {
		return nil, errors.New("parakeet: the file has no weights")
	}
	fe, err := NewFrontEnd(f)
	if err != nil {
		return nil, err
	}
	h := f.HParams
	m := &Model{HParams: h, Vocab: f.Vocab, Durations: f.Durations, FrontEnd: fe, be: be, file: f}
	if err := m.load(f.Weights); err != nil {
		m.Close()
		return nil, err
	}
	return m, nil
}

// Backend is the backend the weights are on.
func (m *Model) Backend() backend.Backend { return m.be }

// Close releases the weights (not the file). Nothing made from the model may be used after it.
func (m *Model) Close() error {
	var errs []error
	for _, t := range m.weights {
		errs = append(errs, t.Close())
	}
	m.weights = nil
	errs = append(errs, m.arena.Free())
	return errors.Join(errs...)
}

// load uploads every tensor.
func (m *Model) load(w *Weights) error {
	h := m.HParams
	d, c := h.NAudioState, h.NSubsamplingChannels
	var err error
	if _, device := m.be.(backend.MemoryReporter); !device {
		// The host copies (aligned) in one mapping: every tensor of the file at most, and the
		// folded depthwise kernels and biases.
		n := len(w.Layers) * ((d*h.NConvKernel*4+63)&^63 + (d*4+63)&^63)
		for i := range m.file.Tensors {
			n += (len(m.file.Tensors[i].Data) + 63) &^ 63
		}
		if err := m.arena.Reserve(n); err != nil {
			return fmt.Errorf("parakeet: %w", err)
		}
	}
	// matrix loads a weight matrix [rows, cols] of t's type from data (t's, or part of it).
	matrix := func(t *ggml.Tensor, rows, cols int, data []byte) backend.Tensor {
		if err != nil {
			return nil
		}
		var bt backend.Tensor
		bt, err = m.loadBytes(t.Name, t.Type, rows, cols, data, true)
		return bt
	}
	mat := func(t *ggml.Tensor) backend.Tensor {
		rows := 1
		for _, n := range t.Ne[1:] {
			rows *= n
		}
		return matrix(t, rows, t.Ne[0], t.Data)
	}
	// f32 loads values computed here as one F32 tensor [rows, cols].
	f32 := func(name string, rows, cols int, v []float32) backend.Tensor {
		if err != nil {
			return nil
		}
		var bt backend.Tensor
		bt, err = m.loadBytes(name, tensor.F32, rows, cols, unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v)), false)
		return bt
	}
	row := func(t *ggml.Tensor) backend.Tensor {
		if err != nil {
			return nil
		}
		var bt backend.Tensor
		bt, err = m.loadBytes(t.Name, tensor.F32, 1, int(t.Elements()), t.Data, false)
		return bt
	}

	p := &m.pre
	p.freqs, p.chans = h.NMels/Subsampling, c
	for i, cv := range w.PreConv {
		if i == 2 || i == 4 { // pointwise [C, C]
			p.w[i] = matrix(cv.Weight, c, c, cv.Weight.Data)
		} else { // [C, 9]
			p.w[i] = matrix(cv.Weight, c, 9, cv.Weight.Data)
		}
		p.b[i] = row(cv.Bias)
	}
	p.out, p.outB = mat(w.PreOut), row(w.PreOutBias)

	m.layers = make([]layerWeights, h.NAudioLayer)
	for i := range w.Layers {
		src, l := &w.Layers[i], &m.layers[i]
		l.ff1N, l.ff1NB, l.ff1Up, l.ff1Down = row(src.NormFF1), row(src.NormFF1Bias), mat(src.FF1Up), mat(src.FF1Down)
		l.attN, l.attNB = row(src.NormAttn), row(src.NormAttnBias)
		l.q, l.k, l.v, l.out, l.pos = mat(src.Q), mat(src.K), mat(src.V), mat(src.Out), mat(src.Pos)
		l.posU, l.posV = row(src.PosBiasU), row(src.PosBiasV)
		l.convN, l.convNB = row(src.NormConv), row(src.NormConvBias)
		half := len(src.ConvPW1.Data) / 2 // rows [0, d): GLU's value; [d, 2d): its gate
		l.pwVal = matrix(src.ConvPW1, d, d, src.ConvPW1.Data[:half])
		l.pwGate = matrix(src.ConvPW1, d, d, src.ConvPW1.Data[half:])
		dw, dwB, ferr := foldBatchNorm(src, d, h.NConvKernel)
		if ferr != nil && err == nil {
			err = ferr
		}
		if err == nil {
			l.dw, l.dwB = f32(src.ConvDW.Name, d, h.NConvKernel, dw), f32(src.BNBias.Name, 1, d, dwB)
		}
		l.pw2 = mat(src.ConvPW2)
		l.ff2N, l.ff2NB, l.ff2Up, l.ff2Down = row(src.NormFF2), row(src.NormFF2Bias), mat(src.FF2Up), mat(src.FF2Down)
		l.outN, l.outNB = row(src.NormOut), row(src.NormOutBias)
	}

	if err == nil {
		// GetRows reads the embeddings: kept as they are, not repacked.
		e := w.Embed
		m.embed, err = m.loadBytes(e.Name, e.Type, e.Ne[1], e.Ne[0], e.Data, false)
	}
	m.lstm = make([]lstmWeights, h.NPredLayers)
	for i, l := range w.LSTM {
		m.lstm[i] = lstmWeights{wih: mat(l.WIH), whh: mat(l.WHH), b: row(l.Bias)}
	}
	m.jPred, m.jPredB = mat(w.JointPred), row(w.JointPredBias)
	m.jEnc, m.jEncB = mat(w.JointEnc), row(w.JointEncBias)
	m.jOut, m.jOutB = mat(w.JointOut), row(w.JointOutBias)
	return err
}

// loadBytes loads one tensor, repacking a quantised matrix where the backend has a faster
// layout (float matrices are multiplied as they are). Data not aligned to 64 bytes is copied
// first, as the native kernels read rows aligned.
func (m *Model) loadBytes(name string, dt tensor.DType, rows, cols int, data []byte, repack bool) (backend.Tensor, error) {
	if repack && dt.Quantized() {
		bt, err := m.be.Load(dt, rows, cols, data)
		if err != nil {
			return nil, fmt.Errorf("parakeet: tensor %q: %w", name, err)
		}
		ok, err := backend.Repack(m.be, bt)
		if err != nil {
			bt.Close()
			return nil, fmt.Errorf("parakeet: tensor %q: %w", name, err)
		}
		if ok {
			m.file.Release(data)
			m.weights = append(m.weights, bt)
			return bt, nil
		}
		bt.Close()
	}
	al, err := m.aligned(data)
	if err != nil {
		return nil, fmt.Errorf("parakeet: tensor %q: %w", name, err)
	}
	bt, err := m.be.Load(dt, rows, cols, al)
	if err != nil {
		return nil, fmt.Errorf("parakeet: tensor %q: %w", name, err)
	}
	m.weights = append(m.weights, bt)
	return bt, nil
}

// aligned returns b, or a copy of it at a 64-byte boundary. A host backend keeps the copy (it
// computes from the bytes it is given): it is read from the file into the model's arena, which
// spares the page faults of reading it through the file's mapping and of writing it to small
// pages of the Go heap, and the mapping's pages stay out of the resident set. A device backend
// copies what it loads: the copy is then a short-lived one of the Go heap.
func (m *Model) aligned(b []byte) ([]byte, error) {
	if len(b) == 0 || uintptr(unsafe.Pointer(&b[0]))%64 == 0 {
		return b, nil
	}
	if _, device := m.be.(backend.MemoryReporter); device {
		w := make([]uint64, (len(b)+63)/8+8)
		off := 0
		for uintptr(unsafe.Pointer(&w[off]))%64 != 0 {
			off++
		}
		c := unsafe.Slice((*byte)(unsafe.Pointer(&w[off])), len(b))
		copy(c, b)
		m.file.Release(b)
		return c, nil
	}
	c, err := m.arena.Alloc(len(b))
	if err != nil {
		return nil, err
	}
	if !m.file.ReadInto(c, b) {
		copy(c, b)
	}
	// Copied: the file's pages need not stay resident as well (a backend's Load may have read
	// them before the copy was made, to try repacking).
	m.file.Release(b)
	return c, nil
}

// foldBatchNorm returns layer l's depthwise kernel [d, K] and a bias [d] with its batch norm
// folded in, as whisper.cpp applies it: (conv(x) - mean)/√var·γ + β.
func foldBatchNorm(l *Layer, d, k int) (w, b []float32, err error) {
	vals := func(t *ggml.Tensor) []float32 {
		out := make([]float32, t.Elements())
		for i := range out {
			out[i] = math.Float32frombits(uint32(t.Data[4*i]) | uint32(t.Data[4*i+1])<<8 | uint32(t.Data[4*i+2])<<16 | uint32(t.Data[4*i+3])<<24)
		}
		return out
	}
	kw, gamma, beta, mean, vr := vals(l.ConvDW), vals(l.BNWeight), vals(l.BNBias), vals(l.BNMean), vals(l.BNVar)
	w, b = make([]float32, d*k), make([]float32, d)
	for c := 0; c < d; c++ {
		if !(vr[c] > 0) || math.IsInf(float64(vr[c]), 0) {
			return nil, nil, formatErr("tensor %q: running variance %v of channel %d is not a positive number", l.BNVar.Name, vr[c], c)
		}
		s := float64(gamma[c]) / math.Sqrt(float64(vr[c]))
		for j := 0; j < k; j++ {
			w[c*k+j] = float32(float64(kw[c*k+j]) * s)
		}
		b[c] = float32(float64(beta[c]) - float64(mean[c])*s)
	}
	return w, b, nil
}
