package pockettts

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"sync"
	"sync/atomic"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Model is a checkpoint's weights on a backend: what the forward steps compute with. The steps
// and their state live in the runners made from it: FlowLM (the backbone over text and latent
// frames, the EOS head and the flow head, with its KV cache shared by many syntheses), Decoder
// (the streaming Mimi decoder, with per-synthesis state in slots) and CloneVoice (the Mimi
// encoder and the voice prompt pass).
//
// Matrices are loaded in the checkpoint's type where the backend multiplies it (F32, F16, BF16,
// Q8_0, Q4_K), else converted to F32; vectors (norms, biases, gains) are F32. Convolution weights are
// laid out for Im2Col1D and MatMul at load.
type Model struct {
	be      backend.Backend
	cfg     Config
	owned   []backend.Tensor
	release func([]byte) // the weights' (Weights.release)

	// Trace, when set, is called with intermediate tensors of the steps (rows of the stages
	// upstream's reference records: "text_emb", "text_layer0", "text_backbone", "step_layer0",
	// "backbone", "enc_seanet", "enc_transformer", "latent", "conditioning", "mimi_in",
	// "quantizer", "upsample", "dec_transformer", "audio"), before the step goes on. It is for
	// tests: a step that traces computes what it would otherwise skip.
	Trace func(stage string, x backend.Tensor) error

	// FlowLM.
	embed       backend.Tensor // [vocab+1, d]
	inputLinear backend.Tensor // [d, latent]
	layers      []lmLayer
	outNorm     norm
	eosW        backend.Tensor // [1, d]
	eosB        float32
	bosEmb      []float32      // [latent]: the input of a chunk's first frame step
	bosVoice    []float32      // [d] or nil: the voice prompt's first row
	speakerProj backend.Tensor // loaded with the Mimi encoder (loadClone)

	flow flowWeights
	mimi mimiWeights

	// The voice-cloning weights (the Mimi encoder, the speaker projection) are loaded by the
	// first clone, not by New: a model that never clones keeps none of them resident.
	cloneMu     sync.Mutex
	cloneSrc    *Weights // the checkpoint the cloning weights load from, until they are loaded
	cloneLoaded bool
	cloneData   [][]byte     // the file data of the cloning weights, given back after each clone
	loaded      atomic.Int64 // bytes of weights loaded onto the backend
}

// norm is a LayerNorm's gain and bias, [1, width] F32 each.
type norm struct{ w, b backend.Tensor }

// linear is y = x·wᵀ + b: w [out, in], b [1, out] F32 or nil.
type linear struct{ w, b backend.Tensor }

// lmLayer is one FlowLM layer: q, k, v are the rows of in_proj.
type lmLayer struct {
	norm1, norm2     norm
	q, k, v, o       backend.Tensor   // [d, d]
	linear1, linear2 backend.Tensor   // [ff, d], [d, ff]
	qkv              []backend.Tensor // q, k, v: one MatMuls
}

// New loads w onto be. The weights must stay valid (their file open) while the model lives:
// host backends compute from the checkpoint's bytes in place.
func New(be backend.Backend, w *Weights) (*Model, error) {
	m := &Model{be: be, cfg: w.Config, release: w.release}
	if err := m.load(w); err != nil {
		m.Close()
		return nil, err
	}
	// Loading converts and lays out weights through temporary copies on the Go heap, several
	// times the size of what it keeps there: give their pages back now rather than keep them
	// resident until the runtime's scavenger does.
	debug.FreeOSMemory()
	return m, nil
}

// Config is the model's shape.
func (m *Model) Config() Config { return m.cfg }

// Backend is the backend the model computes on.
func (m *Model) Backend() backend.Backend { return m.be }

// LoadedBytes is the size of the weights the model has loaded onto its backend, as it loaded them
// (before a backend's repacking): without the voice-cloning weights until the first clone.
func (m *Model) LoadedBytes() int64 { return m.loaded.Load() }

// CloneLoaded reports whether the voice-cloning weights (the Mimi encoder, the speaker
// projection) are loaded: they are by the first VoicePrompt or CloneVoice.
func (m *Model) CloneLoaded() bool {
	m.cloneMu.Lock()
	defer m.cloneMu.Unlock()
	return m.cloneLoaded
}

// Close releases the model's tensors. Runners made from it must be closed first.
func (m *Model) Close() error {
	m.cloneMu.Lock()
	defer m.cloneMu.Unlock()
	m.cloneSrc = nil
	var errs []error
	for i := len(m.owned) - 1; i >= 0; i-- {
		errs = append(errs, m.owned[i].Close())
	}
	m.owned = nil
	return errors.Join(errs...)
}

func (m *Model) trace(stage string, x backend.Tensor) error {
	if m.Trace == nil {
		return nil
	}
	return m.Trace(stage, x)
}

func (m *Model) keep(t backend.Tensor) backend.Tensor {
	m.owned = append(m.owned, t)
	return t
}

// f32Data returns x as little-endian bytes (a new slice, which a host backend keeps).
func f32Data(x []float32) []byte {
	b := make([]byte, 4*len(x))
	for i, v := range x {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

// loadF32 loads x as an F32 [rows, cols] tensor.
func (m *Model) loadF32(x []float32, rows, cols int) (backend.Tensor, error) {
	t, err := m.be.Load(tensor.F32, rows, cols, f32Data(x))
	if err != nil {
		return nil, err
	}
	m.loaded.Add(4 * int64(len(x)))
	return m.keep(t), nil
}

// matrix loads rows [row0, row0+rows) of t, a checkpoint matrix of cols columns per row, in t's
// type where the backend multiplies it and as F32 otherwise, and repacks it where the backend
// has a faster layout.
func (m *Model) matrix(t *Tensor, row0, rows, cols int) (backend.Tensor, error) {
	if t.Elements()%cols != 0 || row0 < 0 || rows < 0 || (row0+rows)*cols > t.Elements() {
		return nil, fmt.Errorf("pockettts: %s: rows [%d, %d) of %d columns outside its shape %v", t.Name, row0, row0+rows, cols, t.Shape)
	}
	rs, err := t.DType.RowSize(int64(cols))
	if err != nil {
		return nil, fmt.Errorf("pockettts: %s: %w", t.Name, err)
	}
	data := t.Data[int64(row0)*rs : int64(row0+rows)*rs]
	var x backend.Tensor
	if m.be.Capabilities().Weights.Has(t.DType) {
		x, err = m.be.Load(t.DType, rows, cols, data)
	} else {
		part := Tensor{Name: t.Name, Shape: []int{rows, cols}, DType: t.DType, Data: data}
		x, err = m.be.Load(tensor.F32, rows, cols, f32Data(part.Float32s()))
		if err == nil && m.release != nil {
			m.release(data) // converted: the file's rows are not read again
		}
	}
	if err != nil {
		return nil, fmt.Errorf("pockettts: %s: %w", t.Name, err)
	}
	m.keep(x)
	m.loaded.Add(int64(len(data)))
	repacked, err := backend.Repack(m.be, x)
	if err != nil {
		return nil, fmt.Errorf("pockettts: %s: %w", t.Name, err)
	}
	if repacked && m.release != nil {
		// The backend multiplies its own layout now: the file's rows are read again only where
		// it falls back to them (they fault back in from the file), so they need not stay
		// resident beside it.
		m.release(data)
	}
	return x, nil
}

// copied gives back the resident file pages of t, whose values the model has copied (in another
// layout or type) and does not read from the file.
func (m *Model) copied(t *Tensor) {
	if m.release != nil && t != nil {
		m.release(t.Data)
	}
}

// whole loads all of t as a matrix of cols columns.
func (m *Model) whole(t *Tensor, cols int) (backend.Tensor, error) {
	return m.matrix(t, 0, t.Elements()/cols, cols)
}

// row loads t's values as one F32 row, plus add to each (0 for none).
func (m *Model) row(t *Tensor, add float32) (backend.Tensor, error) {
	v := t.Float32s()
	if add != 0 {
		for i := range v {
			v[i] += add
		}
	}
	x, err := m.loadF32(v, 1, len(v))
	if err != nil {
		return nil, fmt.Errorf("pockettts: %s: %w", t.Name, err)
	}
	return x, nil
}

// rowPart loads values [off, off+n) of t as one F32 row, plus add to each.
func (m *Model) rowPart(t *Tensor, off, n int, add float32) (backend.Tensor, error) {
	v := t.Float32s()[off : off+n]
	for i := range v {
		v[i] += add
	}
	x, err := m.loadF32(v, 1, n)
	if err != nil {
		return nil, fmt.Errorf("pockettts: %s: %w", t.Name, err)
	}
	return x, nil
}

// loader collects the first error of a sequence of loads.
type loader struct {
	m   *Model
	err error
}

func (l *loader) matrix(t *Tensor, row0, rows, cols int) backend.Tensor {
	if l.err != nil {
		return nil
	}
	x, err := l.m.matrix(t, row0, rows, cols)
	l.err = err
	return x
}

func (l *loader) whole(t *Tensor, cols int) backend.Tensor {
	if l.err != nil {
		return nil
	}
	x, err := l.m.whole(t, cols)
	l.err = err
	return x
}

func (l *loader) row(t *Tensor, add float32) backend.Tensor {
	if l.err != nil || t == nil {
		return nil
	}
	x, err := l.m.row(t, add)
	l.err = err
	return x
}

func (l *loader) rowPart(t *Tensor, off, n int, add float32) backend.Tensor {
	if l.err != nil {
		return nil
	}
	x, err := l.m.rowPart(t, off, n, add)
	l.err = err
	return x
}

func (l *loader) f32(x []float32, rows, cols int) backend.Tensor {
	if l.err != nil {
		return nil
	}
	t, err := l.m.loadF32(x, rows, cols)
	l.err = err
	return t
}

func (l *loader) norm(n Norm) norm { return norm{l.row(n.W, 0), l.row(n.B, 0)} }

func (l *loader) linear(ln Linear) linear {
	return linear{l.whole(ln.W, ln.W.Shape[len(ln.W.Shape)-1]), l.row(ln.B, 0)}
}

func (m *Model) load(w *Weights) error {
	c := &m.cfg
	l := &loader{m: m}
	d := c.Dim
	m.embed = l.whole(w.Embed, d)
	m.inputLinear = l.whole(w.InputLinear, c.LatentDim)
	for _, ly := range w.Layers {
		m.layers = append(m.layers, lmLayer{
			norm1: l.norm(ly.Norm1), norm2: l.norm(ly.Norm2),
			q: l.matrix(ly.InProj, 0, d, d), k: l.matrix(ly.InProj, d, d, d), v: l.matrix(ly.InProj, 2*d, d, d),
			o: l.whole(ly.OutProj, d), linear1: l.whole(ly.Linear1, d), linear2: l.whole(ly.Linear2, c.FFDim),
		})
		L := &m.layers[len(m.layers)-1]
		L.qkv = []backend.Tensor{L.q, L.k, L.v}
	}
	m.outNorm = l.norm(w.OutNorm)
	m.eosW = l.whole(w.OutEOS.W, d)
	m.eosB = w.OutEOS.B.Float32s()[0]
	m.bosEmb = w.BOSEmb.Float32s()
	if w.BOSBeforeVoice != nil {
		m.bosVoice = w.BOSBeforeVoice.Float32s()
	}
	if c.Encoder {
		m.cloneSrc = w
	}
	if l.err != nil {
		return l.err
	}
	if err := m.loadFlow(l, &w.Flow); err != nil {
		return err
	}
	return m.loadMimi(l, w)
}

// loadClone loads the voice-cloning weights, once: the Mimi encoder and the speaker projection.
// A load that fails (the backend out of memory, say) leaves nothing of them loaded, and the next
// clone tries again.
func (m *Model) loadClone() error {
	m.cloneMu.Lock()
	defer m.cloneMu.Unlock()
	if m.cloneLoaded {
		return nil
	}
	w := m.cloneSrc
	if w == nil {
		return fmt.Errorf("pockettts: the model is closed")
	}
	c := &m.cfg
	l := &loader{m: m}
	owned, loaded := len(m.owned), m.loaded.Load()
	m.speakerProj = l.whole(w.SpeakerProj, c.EncoderLatentDim)
	mw, mm := &m.mimi, &w.Mimi
	mw.encIn = l.conv(mm.EncoderIn)
	for _, st := range mm.Encoder {
		mw.enc = append(mw.enc, encStageW{res: resW{l.conv(st.Res.Conv1), l.conv(st.Res.Conv2)}, down: l.conv(st.Down)})
	}
	mw.encOut = l.conv(mm.EncoderOut)
	mw.encLayers = l.mimiLayers(mm.EncoderLayers, c.MimiDim)
	mw.downsample = l.conv(mm.Downsample)
	if l.err != nil {
		for i := len(m.owned) - 1; i >= owned; i-- {
			m.owned[i].Close() // the load's error is the one to report
		}
		clear(m.owned[owned:])
		m.owned = m.owned[:owned]
		m.loaded.Store(loaded)
		m.speakerProj = nil
		mw.encIn, mw.enc, mw.encOut, mw.encLayers, mw.downsample = convW{}, nil, convW{}, nil, convW{}
		return fmt.Errorf("pockettts: loading the voice encoder: %w", l.err)
	}
	for _, t := range cloneTensors(w) {
		m.cloneData = append(m.cloneData, t.Data)
	}
	m.cloneLoaded, m.cloneSrc = true, nil
	return nil
}

// releaseClone gives back the resident file pages of the cloning weights, which only a clone
// reads (the next one faults them back in from the file): a model that cloned a voice once does
// not keep the Mimi encoder resident. A no-op where the backend holds its own copies.
func (m *Model) releaseClone() {
	if m.release == nil {
		return
	}
	m.cloneMu.Lock()
	defer m.cloneMu.Unlock()
	for _, b := range m.cloneData {
		m.release(b)
	}
}

// cloneTensors are the voice-cloning weights of w: the speaker projection and the Mimi encoder.
func cloneTensors(w *Weights) []*Tensor {
	e := &Weights{SpeakerProj: w.SpeakerProj, Mimi: Mimi{EncoderIn: w.Mimi.EncoderIn, Encoder: w.Mimi.Encoder,
		EncoderOut: w.Mimi.EncoderOut, EncoderLayers: w.Mimi.EncoderLayers, Downsample: w.Mimi.Downsample}}
	return e.All()
}
