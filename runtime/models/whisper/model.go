// Package whisper computes OpenAI's Whisper speech recognition models (whisper.cpp's ggml files,
// or GGUF) on Parley's backends: the audio encoder over 30-second log-mel windows, the
// cross-attention keys and values computed once per window, the text decoder stepping many
// sequences (transcriptions and beams) in one batched forward over a shared block KV cache, the
// vocabulary with its special tokens, and the alignment heads' cross-attention for word timing.
// It schedules nothing: Whisper's jobs (windows, batched decoding, beam search, temperature
// fallback, language detection) are runtime/sched/asr's.
//
// The arithmetic follows whisper.cpp with flash attention off: F16 weights multiply F16-rounded
// activations, attention keys and values are kept in F16 (the encoder's, the decoder's cache and
// the cross-attention's), GELU is the tanh form, layer norms use eps 1e-5.
package whisper

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Window geometry fixed by the Whisper architecture.
const (
	SampleRate   = 16000
	HopLength    = 160
	WindowFrames = 3000 // mel frames in one 30 s window
	ChunkSamples = SampleRate * 30
)

// HParams are the model's hyper-parameters as stored in the file.
type HParams struct { // JSON: whisper.cpp's names
	NVocab     int `json:"n_vocab"`
	AudioCtx   int `json:"n_audio_ctx"` // encoder positions (1500)
	AudioState int `json:"n_audio_state"`
	AudioHead  int `json:"n_audio_head"`
	AudioLayer int `json:"n_audio_layer"`
	TextCtx    int `json:"n_text_ctx"` // decoder positions (448)
	TextState  int `json:"n_text_state"`
	TextHead   int `json:"n_text_head"`
	TextLayer  int `json:"n_text_layer"`
	Mels       int `json:"n_mels"`
	FType      int `json:"ftype"`
}

const normEps = 1e-5

type attnW struct {
	lnW, lnB backend.Tensor // [1, d]
	q, qb    backend.Tensor // [d, d], [1, d]
	k        backend.Tensor // [d, d] (no bias)
	v, vb    backend.Tensor
	o, ob    backend.Tensor
}

type mlpW struct {
	lnW, lnB backend.Tensor
	w0, b0   backend.Tensor // [4d, d], [1, 4d]
	w2, b2   backend.Tensor // [d, 4d], [1, d]
}

type encLayer struct {
	attn attnW
	mlp  mlpW
}

type decLayer struct {
	attn, cross attnW
	mlp         mlpW
}

// Model holds a Whisper model's weights on a backend. It is safe for concurrent use by several
// Encoders and Decoders; each of those is used by one goroutine at a time.
type Model struct {
	HParams
	be backend.Backend

	// FilterMels × FilterFFT mel filter bank from the file, row = mel bin.
	FilterMels, FilterFFT int
	Filters               []float32
	// Tokens holds the bytes of the file's tokens, by id.
	Tokens [][]byte

	conv1w, conv1b backend.Tensor // [S, 3*mels], [1, S]
	conv2w, conv2b backend.Tensor // [S, 3*S], [1, S]
	encPE          backend.Tensor // [AudioCtx, S] F32
	enc            []encLayer
	encLnW, encLnB backend.Tensor

	decPE          backend.Tensor // [TextCtx, T] F32
	tokEmbd        backend.Tensor // [Vocab, T], also the output projection
	dec            []decLayer
	decLnW, decLnB backend.Tensor

	weights []backend.Tensor
	file    interface{ Close() error }
}

// source is what a model file holds, whichever container it came in: whisper.cpp's ggml file or
// GGUF.
type source struct {
	hp      HParams
	filters ggml.Filters
	vocab   [][]byte
	tensors []ggml.Tensor // Data aliases the file
	index   map[string]int
	release func([]byte) // the file's pages holding b need not stay resident
	file    interface{ Close() error }
}

func (s *source) tensor(name string) (*ggml.Tensor, bool) {
	i, ok := s.index[name]
	if !ok {
		return nil, false
	}
	return &s.tensors[i], true
}

// Backend is the backend the model computes on.
func (m *Model) Backend() backend.Backend { return m.be }

// Multilingual reports whether the vocabulary has language tokens (n_vocab ≥ 51865).
func (m *Model) Multilingual() bool { return m.NVocab >= 51865 }

// Load uploads the weights of f to be. The file must stay open while the model is used (host
// backends keep pointing into its memory); Close closes both.
func Load(be backend.Backend, f *ggml.File) (*Model, error) {
	hp := f.HParams
	src := &source{
		hp: HParams{
			NVocab: hp.NVocab, AudioCtx: hp.NAudioCtx, AudioState: hp.NAudioState,
			AudioHead: hp.NAudioHead, AudioLayer: hp.NAudioLayer, TextCtx: hp.NTextCtx,
			TextState: hp.NTextState, TextHead: hp.NTextHead, TextLayer: hp.NTextLayer,
			Mels: hp.NMels, FType: hp.FType,
		},
		filters: f.Filters, vocab: f.Vocab, tensors: f.Tensors, index: map[string]int{},
		release: f.Release, file: f,
	}
	for i, t := range f.Tensors {
		src.index[t.Name] = i
	}
	return load(be, src)
}

// load builds a model from src. On error the file stays open: the caller closes it.
func load(be backend.Backend, src *source) (*Model, error) {
	m := &Model{be: be, file: src.file, HParams: src.hp}
	if err := m.checkShape(); err != nil {
		return nil, err
	}
	m.FilterMels, m.FilterFFT, m.Filters = src.filters.NMel, src.filters.NFFT, src.filters.Data
	if m.FilterMels != m.Mels {
		return nil, fmt.Errorf("whisper: the file has %d mel filters for a model of %d mels", m.FilterMels, m.Mels)
	}
	if m.FilterFFT != audio.FreqBins || len(m.Filters) != m.FilterMels*m.FilterFFT {
		return nil, fmt.Errorf("whisper: the mel filter bank is %d × %d, want %d × %d", m.FilterMels, m.FilterFFT, m.Mels, audio.FreqBins)
	}
	m.Tokens = src.vocab
	if len(src.tensors) == 0 {
		return nil, errors.New("whisper: the file has no weights (a vocabulary-only file?)")
	}
	if err := m.load(src); err != nil {
		m.file = nil
		m.Close()
		return nil, err
	}
	return m, nil
}

func (m *Model) checkShape() error {
	h := m.HParams
	for _, c := range []struct {
		name string
		v    int
	}{{"n_vocab", h.NVocab}, {"n_audio_ctx", h.AudioCtx}, {"n_audio_state", h.AudioState}, {"n_audio_head", h.AudioHead},
		{"n_audio_layer", h.AudioLayer}, {"n_text_ctx", h.TextCtx}, {"n_text_state", h.TextState}, {"n_text_head", h.TextHead},
		{"n_text_layer", h.TextLayer}, {"n_mels", h.Mels}} {
		if c.v <= 0 || c.v > 1<<20 {
			return fmt.Errorf("whisper: hyper-parameter %s = %d is out of range", c.name, c.v)
		}
	}
	if h.AudioState%h.AudioHead != 0 || h.TextState%h.TextHead != 0 {
		return fmt.Errorf("whisper: state sizes %d/%d are not multiples of the head counts %d/%d", h.AudioState, h.TextState, h.AudioHead, h.TextHead)
	}
	if h.AudioState != h.TextState {
		return fmt.Errorf("whisper: encoder width %d differs from decoder width %d", h.AudioState, h.TextState)
	}
	if 2*h.AudioCtx != WindowFrames {
		return fmt.Errorf("whisper: n_audio_ctx %d: only 30-second windows (1500 positions) are supported", h.AudioCtx)
	}
	return nil
}

// load uploads every tensor, checking names, shapes and types against the architecture.
func (m *Model) load(f *source) error {
	S, T, V := m.AudioState, m.TextState, m.NVocab
	used := map[string]bool{}
	get := func(dst *backend.Tensor, name string, ne ...int) error {
		t, ok := f.tensor(name)
		if !ok {
			return fmt.Errorf("whisper: tensor %q is missing", name)
		}
		used[name] = true
		n := 1
		for _, d := range ne {
			n *= d
		}
		tn := 1
		for _, d := range t.Ne {
			tn *= d
		}
		vector := len(ne) == 1 || (len(ne) == 2 && ne[0] == 1)
		// A vector may be stored as [n], [1, n] or [n, 1] (whisper.cpp writes the convolutions'
		// biases as [1, n], converters from other checkpoints as [n]).
		if tn != n || (t.Ne[0] != ne[0] && !(vector && t.Rows() == 1 || vector && int64(t.Ne[0]) == 1)) {
			return fmt.Errorf("whisper: tensor %q has shape %v, want %v", name, t.Ne, ne)
		}
		rows, cols := n/ne[0], ne[0]
		if vector { // biases and norm weights are used as one row
			rows, cols = 1, n
			if t.Type != tensor.F32 {
				return fmt.Errorf("whisper: tensor %q is %v, want F32", name, t.Type)
			}
		}
		if len(ne) == 3 { // conv kernels [K, C, Cout] become [Cout, C*K]
			rows, cols = ne[2], ne[0]*ne[1]
		}
		switch t.Type {
		case tensor.F32, tensor.F16, tensor.Q4_0, tensor.Q4_1, tensor.Q5_0, tensor.Q5_1, tensor.Q8_0:
		default:
			return fmt.Errorf("whisper: tensor %q has unsupported type %v", name, t.Type)
		}
		if !vector && len(ne) == 2 {
			// A matrix the backend rearranges for its own kernels is read from the file once,
			// wherever it lies; its pages then leave the resident set (the token embeddings stay
			// readable for GetRows, which maps back only the rows it reads).
			bt, err := m.be.Load(t.Type, rows, cols, t.Data)
			if err != nil {
				return fmt.Errorf("whisper: tensor %q: %w", name, err)
			}
			ok, err := backend.Repack(m.be, bt)
			if err != nil {
				bt.Close()
				return fmt.Errorf("whisper: tensor %q: %w", name, err)
			}
			if ok {
				f.release(t.Data)
				m.weights = append(m.weights, bt)
				*dst = bt
				return nil
			}
			bt.Close()
		}
		data := aligned(t.Data)
		if len(data) > 0 && len(t.Data) > 0 && &data[0] != &t.Data[0] {
			f.release(t.Data) // copied: the file's pages need not stay resident as well
		}
		bt, err := m.be.Load(t.Type, rows, cols, data)
		if err != nil {
			return fmt.Errorf("whisper: tensor %q: %w", name, err)
		}
		m.weights = append(m.weights, bt)
		*dst = bt
		return nil
	}
	attn := func(a *attnW, p string, d int) error {
		for _, g := range []struct {
			dst  *backend.Tensor
			name string
			ne   []int
		}{
			{&a.lnW, p + "_ln.weight", []int{d}}, {&a.lnB, p + "_ln.bias", []int{d}},
			{&a.q, p + ".query.weight", []int{d, d}}, {&a.qb, p + ".query.bias", []int{d}},
			{&a.k, p + ".key.weight", []int{d, d}},
			{&a.v, p + ".value.weight", []int{d, d}}, {&a.vb, p + ".value.bias", []int{d}},
			{&a.o, p + ".out.weight", []int{d, d}}, {&a.ob, p + ".out.bias", []int{d}},
		} {
			if err := get(g.dst, g.name, g.ne...); err != nil {
				return err
			}
		}
		return nil
	}
	mlp := func(w *mlpW, p string, d int) error {
		for _, g := range []struct {
			dst  *backend.Tensor
			name string
			ne   []int
		}{
			{&w.lnW, p + "mlp_ln.weight", []int{d}}, {&w.lnB, p + "mlp_ln.bias", []int{d}},
			{&w.w0, p + "mlp.0.weight", []int{d, 4 * d}}, {&w.b0, p + "mlp.0.bias", []int{4 * d}},
			{&w.w2, p + "mlp.2.weight", []int{4 * d, d}}, {&w.b2, p + "mlp.2.bias", []int{d}},
		} {
			if err := get(g.dst, g.name, g.ne...); err != nil {
				return err
			}
		}
		return nil
	}
	for _, g := range []struct {
		dst  *backend.Tensor
		name string
		ne   []int
	}{
		{&m.encPE, "encoder.positional_embedding", []int{S, m.AudioCtx}},
		{&m.conv1w, "encoder.conv1.weight", []int{3, m.Mels, S}}, {&m.conv1b, "encoder.conv1.bias", []int{1, S}},
		{&m.conv2w, "encoder.conv2.weight", []int{3, S, S}}, {&m.conv2b, "encoder.conv2.bias", []int{1, S}},
		{&m.encLnW, "encoder.ln_post.weight", []int{S}}, {&m.encLnB, "encoder.ln_post.bias", []int{S}},
		{&m.decPE, "decoder.positional_embedding", []int{T, m.TextCtx}},
		{&m.tokEmbd, "decoder.token_embedding.weight", []int{T, V}},
		{&m.decLnW, "decoder.ln.weight", []int{T}}, {&m.decLnB, "decoder.ln.bias", []int{T}},
	} {
		if err := get(g.dst, g.name, g.ne...); err != nil {
			return err
		}
	}
	if m.encPE.DType() != tensor.F32 || m.decPE.DType() != tensor.F32 {
		return errors.New("whisper: positional embeddings must be F32")
	}
	m.enc = make([]encLayer, m.AudioLayer)
	for i := range m.enc {
		p := fmt.Sprintf("encoder.blocks.%d.", i)
		if err := attn(&m.enc[i].attn, p+"attn", S); err != nil {
			return err
		}
		if err := mlp(&m.enc[i].mlp, p, S); err != nil {
			return err
		}
	}
	m.dec = make([]decLayer, m.TextLayer)
	for i := range m.dec {
		p := fmt.Sprintf("decoder.blocks.%d.", i)
		if err := attn(&m.dec[i].attn, p+"attn", T); err != nil {
			return err
		}
		if err := attn(&m.dec[i].cross, p+"cross_attn", T); err != nil {
			return err
		}
		if err := mlp(&m.dec[i].mlp, p, T); err != nil {
			return err
		}
	}
	for _, t := range f.tensors {
		if !used[t.Name] && t.Name != melFiltersTensor {
			return fmt.Errorf("whisper: unexpected tensor %q", t.Name)
		}
	}
	return nil
}

// aligned returns b, or a copy of b starting on a 64-byte boundary when b does not (tensor data in
// whisper.cpp's files follows variable-length names and vocabularies, so it is rarely aligned,
// and kernels read rows as float32/uint16 vectors).
func aligned(b []byte) []byte {
	if len(b) == 0 || uintptr(unsafe.Pointer(&b[0]))%64 == 0 {
		return b
	}
	w := make([]uint64, (len(b)+63)/8+8)
	off := 0
	for uintptr(unsafe.Pointer(&w[off]))%64 != 0 {
		off++
	}
	c := unsafe.Slice((*byte)(unsafe.Pointer(&w[off])), len(b))
	copy(c, b)
	return c
}

// Close releases the weights and the file.
func (m *Model) Close() error {
	var errs []error
	for _, t := range m.weights {
		errs = append(errs, t.Close())
	}
	m.weights = nil
	if m.file != nil {
		errs = append(errs, m.file.Close())
		m.file = nil
	}
	return errors.Join(errs...)
}

// Open opens a Whisper model file, whisper.cpp's ggml format or GGUF (see LoadGGUF), and loads it
// onto be.
func Open(be backend.Backend, path string) (*Model, error) {
	if isGGML, err := ggml.IsFile(path); err != nil {
		return nil, fmt.Errorf("whisper: %w", err)
	} else if !isGGML {
		if isGGUF, err := gguf.IsFile(path); err != nil {
			return nil, fmt.Errorf("whisper: %w", err)
		} else if !isGGUF {
			return nil, fmt.Errorf("%s: whisper: not a model file: neither whisper.cpp's ggml format nor GGUF", path)
		}
		return openGGUF(be, path)
	}
	f, err := ggml.Open(path)
	if err != nil {
		return nil, err
	}
	m, err := Load(be, f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return m, nil
}
