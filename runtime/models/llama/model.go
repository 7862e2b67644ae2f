package llama

import (
	"errors"
	"fmt"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/gguf"
)

// Model is a loaded model: its hyper-parameters and its weights on one backend. It holds no
// per-sequence state; a Context does.
type Model struct {
	Config
	be      backend.Backend
	tokEmbd backend.Tensor // [vocab, dim]
	outNorm backend.Tensor // [1, dim]
	output  backend.Tensor // [vocab, dim]; tokEmbd when tied
	outBias backend.Tensor // [1, vocab] output.bias, where the file has one; nil otherwise
	layers  []layer
	used    map[string]bool // the file's tensors Load bound (or read: rope_freqs.weight)
	owned   []backend.Tensor
	data    map[backend.Tensor][]byte // each loaded tensor's bytes in the file
}

type layer struct {
	attnNorm   backend.Tensor // [1, dim]; post_attention_norm.weight with PostNorm
	wq         backend.Tensor // [heads*headDim, dim]
	wk, wv     backend.Tensor // [kvHeads*headDim, dim]
	bq, bk, bv backend.Tensor // [1, ...] biases (qwen2; llama files may have them too); nil otherwise
	qNorm      backend.Tensor // [1, headDim] attn_q_norm.weight (qwen3; [1, qDim] olmo2), or nil
	kNorm      backend.Tensor // [1, headDim] attn_k_norm.weight (qwen3; [1, kvDim] olmo2), or nil
	wo         backend.Tensor // [dim, heads*headDim]
	bo         backend.Tensor // [1, dim] attn_output.bias, or nil
	ffnNorm    backend.Tensor // [1, dim]; post_ffw_norm.weight with PostNorm
	wGate, wUp backend.Tensor // [ffn, dim]
	wDown      backend.Tensor // [dim, ffn]
	bGate, bUp backend.Tensor // [1, ffn] ffn_gate.bias, ffn_up.bias, or nil
	bDown      backend.Tensor // [1, dim] ffn_down.bias, or nil

	qkv    [3]backend.Tensor // wq, wk, wv: multiplied by one x in one call (backend.MatMuls)
	gateUp [2]backend.Tensor // wGate, wUp: likewise
}

// Load binds the weights of f to be. The tensors' bytes stay in f's memory map (host backends use
// them in place), so f must stay open while the model is in use.
func Load(f *gguf.File, be backend.Backend) (*Model, error) {
	c, err := ConfigFrom(f)
	if err != nil {
		return nil, err
	}
	m := &Model{Config: c, be: be, layers: make([]layer, c.Layers), data: map[backend.Tensor][]byte{}, used: map[string]bool{"rope_freqs.weight": true, "rope_factors_short.weight": true, "rope_factors_long.weight": true}}
	ok := false
	defer func() {
		if !ok {
			m.Close()
		}
	}()
	qDim, kvDim := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	if m.tokEmbd, err = m.load(f, "token_embd.weight", c.Vocab, c.Dim, false); err != nil {
		return nil, err
	}
	if m.outNorm, err = m.load(f, "output_norm.weight", 1, c.Dim, true); err != nil {
		return nil, err
	}
	if c.TiedEmbed {
		m.output = m.tokEmbd
	} else if m.output, err = m.load(f, "output.weight", c.Vocab, c.Dim, false); err != nil {
		return nil, err
	}
	if m.outBias, err = m.optional(f, "output.bias", c.Vocab); err != nil {
		return nil, err
	}
	for i := range m.layers {
		l := &m.layers[i]
		name := func(s string) string { return fmt.Sprintf("blk.%d.%s", i, s) }
		type bind struct {
			dst        *backend.Tensor
			name       string
			rows, cols int
			norm       bool
		}
		attnNorm, ffnNorm := "attn_norm.weight", "ffn_norm.weight"
		if c.PostNorm {
			attnNorm, ffnNorm = "post_attention_norm.weight", "post_ffw_norm.weight"
		}
		binds := []bind{
			{&l.attnNorm, attnNorm, 1, c.Dim, true},
			{&l.wo, "attn_output.weight", c.Dim, qDim, false},
			{&l.ffnNorm, ffnNorm, 1, c.Dim, true},
			{&l.wDown, "ffn_down.weight", c.Dim, c.FFN, false},
		}
		_, fusedQKV := f.Tensor(name("attn_qkv.weight"))
		if fusedQKV = fusedQKV && c.Fused; fusedQKV {
			// Phi-3: the rows of one matrix are the queries', then the keys', then the values'.
			if err := m.loadSplit(f, name("attn_qkv.weight"), c.Dim, []int{qDim, kvDim, kvDim}, []*backend.Tensor{&l.wq, &l.wk, &l.wv}); err != nil {
				return nil, err
			}
		} else {
			binds = append(binds, bind{&l.wq, "attn_q.weight", qDim, c.Dim, false},
				bind{&l.wk, "attn_k.weight", kvDim, c.Dim, false}, bind{&l.wv, "attn_v.weight", kvDim, c.Dim, false})
		}
		if c.Fused {
			// Phi-3: the gate's rows, then the up projection's (ggml_swiglu's halves).
			if err := m.loadSplit(f, name("ffn_up.weight"), c.Dim, []int{c.FFN, c.FFN}, []*backend.Tensor{&l.wGate, &l.wUp}); err != nil {
				return nil, err
			}
		} else {
			binds = append(binds, bind{&l.wGate, "ffn_gate.weight", c.FFN, c.Dim, false}, bind{&l.wUp, "ffn_up.weight", c.FFN, c.Dim, false})
		}
		for _, w := range binds {
			if *w.dst, err = m.load(f, name(w.name), w.rows, w.cols, w.norm); err != nil {
				return nil, err
			}
		}
		if c.QKNorm {
			qn, kn := c.HeadDim, c.HeadDim
			if c.PostNorm { // olmo2: all heads at once
				qn, kn = qDim, kvDim
			}
			if l.qNorm, err = m.load(f, name("attn_q_norm.weight"), 1, qn, true); err != nil {
				return nil, err
			}
			if l.kNorm, err = m.load(f, name("attn_k_norm.weight"), 1, kn, true); err != nil {
				return nil, err
			}
		}
		l.qkv = [3]backend.Tensor{l.wq, l.wk, l.wv}
		l.gateUp = [2]backend.Tensor{l.wGate, l.wUp}
		// Biases: qwen2's query, key and value biases are required; every other bias is
		// optional, as llama.cpp reads them (Hugging Face Llama checkpoints with attention_bias
		// or mlp_bias). A fused matrix has none.
		type biasBind struct {
			dst      *backend.Tensor
			name     string
			n        int
			required bool
		}
		biases := []biasBind{{&l.bo, "attn_output.bias", c.Dim, false}, {&l.bDown, "ffn_down.bias", c.Dim, false}}
		if !fusedQKV {
			biases = append(biases, biasBind{&l.bq, "attn_q.bias", qDim, c.QKVBias}, biasBind{&l.bk, "attn_k.bias", kvDim, c.QKVBias}, biasBind{&l.bv, "attn_v.bias", kvDim, c.QKVBias})
		}
		if !c.Fused {
			biases = append(biases, biasBind{&l.bGate, "ffn_gate.bias", c.FFN, false}, biasBind{&l.bUp, "ffn_up.bias", c.FFN, false})
		}
		for _, w := range biases {
			if w.required {
				*w.dst, err = m.load(f, name(w.name), 1, w.n, true)
			} else {
				*w.dst, err = m.optional(f, name(w.name), w.n)
			}
			if err != nil {
				return nil, err
			}
		}
	}
	// A tensor the model does not use means a layout this package does not know: running
	// without it would compute something else than the file's model, silently.
	for i := range f.Tensors {
		if n := f.Tensors[i].Name; !m.used[n] {
			return nil, fmt.Errorf("tensor %s is not part of the %s architecture as Parley runs it", n, c.Arch)
		}
	}
	if err := m.repack(f); err != nil {
		return nil, err
	}
	ok = true
	return m, nil
}

// repack hands the matrices the model multiplies to the backend's own layout where it has one
// (backend.Repacker). A repacked matrix's rows in the file are then read again only by GetRows
// (tied token embeddings), a row at a time, so their pages leave the resident set: they stay
// readable, and a lookup maps back only what it reads.
func (m *Model) repack(f *gguf.File) error {
	mats := []backend.Tensor{m.output}
	for i := range m.layers {
		l := &m.layers[i]
		mats = append(mats, l.wq, l.wk, l.wv, l.wo, l.wGate, l.wUp, l.wDown)
	}
	for _, t := range mats {
		ok, err := backend.Repack(m.be, t)
		if err != nil {
			return fmt.Errorf("repack: %w", err)
		}
		if ok {
			f.Release(m.data[t])
		}
	}
	m.data = nil
	return nil
}

// loadSplit binds the matrix name of cols columns as several matrices of consecutive rows,
// rows[i] rows for dsts[i] (a fused projection, whose parts are multiplied apart). Rows of every
// dtype are independent, so each part is the file's bytes for its rows.
func (m *Model) loadSplit(f *gguf.File, name string, cols int, rows []int, dsts []*backend.Tensor) error {
	total := 0
	for _, r := range rows {
		total += r
	}
	ti, err := m.check(f, name, total, cols, false)
	if err != nil {
		return err
	}
	rs, err := ti.DType.RowSize(int64(cols))
	if err != nil {
		return fmt.Errorf("tensor %s: %w", name, err)
	}
	data := f.TensorData(ti)
	if int64(len(data)) != rs*int64(total) {
		return fmt.Errorf("tensor %s lies outside the file's data", name)
	}
	for i, r := range rows {
		part := data[:rs*int64(r)]
		data = data[len(part):]
		t, err := m.be.Load(ti.DType, r, cols, part)
		if err != nil {
			return fmt.Errorf("tensor %s: %w", name, err)
		}
		m.owned = append(m.owned, t)
		m.data[t] = part
		*dsts[i] = t
	}
	return nil
}

// optional binds the vector (a bias) name of n elements when f has it, and returns nil when not.
func (m *Model) optional(f *gguf.File, name string, n int) (backend.Tensor, error) {
	if _, ok := f.Tensor(name); !ok {
		return nil, nil
	}
	return m.load(f, name, 1, n, true)
}

// load binds one tensor, checking its shape ([cols, rows] in ggml order, or [cols] for vectors)
// and dtype. Vectors (norm weights, biases) must be F32, as llama.cpp writes them.
func (m *Model) load(f *gguf.File, name string, rows, cols int, vector bool) (backend.Tensor, error) {
	ti, err := m.check(f, name, rows, cols, vector)
	if err != nil {
		return nil, err
	}
	data := f.TensorData(ti)
	if vector {
		// Norm weights and biases are small and read every step: a copy keeps the step from
		// touching the file's pages between the matrices, which the system then maps in whole
		// large pages around them (tens of MiB of weights that a repacked model never reads).
		data = append([]byte(nil), data...)
		f.Release(f.TensorData(ti))
	}
	t, err := m.be.Load(ti.DType, rows, cols, data)
	if err != nil {
		return nil, fmt.Errorf("tensor %s: %w", name, err)
	}
	m.owned = append(m.owned, t)
	m.data[t] = data
	return t, nil
}

// check finds tensor name, marks it used, and checks its dtype and shape (gguf.File.Weight).
func (m *Model) check(f *gguf.File, name string, rows, cols int, vector bool) (*gguf.TensorInfo, error) {
	m.used[name] = true
	return f.Weight(name, rows, cols, vector)
}

// Backend is the backend the model computes on.
func (m *Model) Backend() backend.Backend { return m.be }

// Close releases the model's tensors.
func (m *Model) Close() error {
	var errs []error
	for _, t := range m.owned {
		errs = append(errs, t.Close())
	}
	m.owned = nil
	return errors.Join(errs...)
}
