package bert

import (
	"errors"
	"fmt"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Model is a loaded encoder: its hyper-parameters and its weights on one backend. It holds no
// per-batch state; a Context does.
type Model struct {
	Config
	be       backend.Backend
	tokEmbd  backend.Tensor // [vocab, dim]
	posEmbd  backend.Tensor // [positions, dim]
	typeRow  backend.Tensor // [1, dim] F32: row 0 of token_types.weight, every token's type
	embNorm  backend.Tensor // [1, dim] token_embd_norm.weight
	embNormB backend.Tensor // [1, dim] token_embd_norm.bias
	layers   []layer
	used     map[string]bool
	owned    []backend.Tensor
	data     map[backend.Tensor][]byte // each loaded tensor's bytes in the file
}

type layer struct {
	wq         backend.Tensor // [heads*headDim, dim]
	wk, wv     backend.Tensor // [kvHeads*headDim, dim]
	bq, bk, bv backend.Tensor // [1, ...]
	wo         backend.Tensor // [dim, heads*headDim]
	bo         backend.Tensor // [1, dim]
	attnNorm   backend.Tensor // [1, dim] attn_output_norm.weight
	attnNormB  backend.Tensor // [1, dim] attn_output_norm.bias
	wUp        backend.Tensor // [ffn, dim]
	bUp        backend.Tensor // [1, ffn]
	wDown      backend.Tensor // [dim, ffn]
	bDown      backend.Tensor // [1, dim]
	outNorm    backend.Tensor // [1, dim] layer_output_norm.weight
	outNormB   backend.Tensor // [1, dim] layer_output_norm.bias

	qkv [3]backend.Tensor // wq, wk, wv: multiplied by one x in one call (backend.MatMuls)
}

// ignored are tensors llama.cpp reads for bert files but uses only for rank pooling, which
// ConfigFrom refuses: a reranker's classification head.
var ignored = []string{"cls.weight", "cls.bias", "cls.output.weight", "cls.output.bias"}

// Load binds the weights of f to be. The tensors' bytes stay in f's memory map (host backends use
// them in place), so f must stay open while the model is in use.
func Load(f *gguf.File, be backend.Backend) (*Model, error) {
	c, err := ConfigFrom(f)
	if err != nil {
		return nil, err
	}
	m := &Model{Config: c, be: be, layers: make([]layer, c.Layers), used: map[string]bool{}, data: map[backend.Tensor][]byte{}}
	for _, n := range ignored {
		m.used[n] = true
	}
	ok := false
	defer func() {
		if !ok {
			m.Close()
		}
	}()
	qDim, kvDim := c.Heads*c.HeadDim, c.KVHeads*c.HeadDim
	type bind struct {
		dst        *backend.Tensor
		name       string
		rows, cols int
		vector     bool
	}
	binds := []bind{
		{&m.tokEmbd, "token_embd.weight", c.Vocab, c.Dim, false},
		{&m.posEmbd, "position_embd.weight", c.Positions, c.Dim, false},
		{&m.embNorm, "token_embd_norm.weight", 1, c.Dim, true},
		{&m.embNormB, "token_embd_norm.bias", 1, c.Dim, true},
	}
	for i := range m.layers {
		l := &m.layers[i]
		p := fmt.Sprintf("blk.%d.", i)
		if _, fused := f.Tensor(p + "attn_qkv.weight"); fused {
			return nil, fmt.Errorf("bert: tensor %sattn_qkv.weight: a fused query/key/value matrix is not part of the bert architecture as llama.cpp c392e509 reads it (separate attn_q, attn_k and attn_v)", p)
		}
		binds = append(binds,
			bind{&l.wq, p + "attn_q.weight", qDim, c.Dim, false}, bind{&l.bq, p + "attn_q.bias", 1, qDim, true},
			bind{&l.wk, p + "attn_k.weight", kvDim, c.Dim, false}, bind{&l.bk, p + "attn_k.bias", 1, kvDim, true},
			bind{&l.wv, p + "attn_v.weight", kvDim, c.Dim, false}, bind{&l.bv, p + "attn_v.bias", 1, kvDim, true},
			bind{&l.wo, p + "attn_output.weight", c.Dim, qDim, false}, bind{&l.bo, p + "attn_output.bias", 1, c.Dim, true},
			bind{&l.attnNorm, p + "attn_output_norm.weight", 1, c.Dim, true}, bind{&l.attnNormB, p + "attn_output_norm.bias", 1, c.Dim, true},
			bind{&l.wUp, p + "ffn_up.weight", c.FFN, c.Dim, false}, bind{&l.bUp, p + "ffn_up.bias", 1, c.FFN, true},
			bind{&l.wDown, p + "ffn_down.weight", c.Dim, c.FFN, false}, bind{&l.bDown, p + "ffn_down.bias", 1, c.Dim, true},
			bind{&l.outNorm, p + "layer_output_norm.weight", 1, c.Dim, true}, bind{&l.outNormB, p + "layer_output_norm.bias", 1, c.Dim, true},
		)
	}
	for _, b := range binds {
		if *b.dst, err = m.load(f, b.name, b.rows, b.cols, b.vector); err != nil {
			return nil, err
		}
	}
	for i := range m.layers {
		l := &m.layers[i]
		l.qkv = [3]backend.Tensor{l.wq, l.wk, l.wv}
	}
	if err := m.loadTypeRow(f); err != nil {
		return nil, err
	}
	for i := range f.Tensors {
		if n := f.Tensors[i].Name; !m.used[n] {
			return nil, fmt.Errorf("bert: tensor %s is not part of the bert architecture as Parley runs it", n)
		}
	}
	if err := m.repack(f); err != nil {
		return nil, err
	}
	ok = true
	return m, nil
}

// loadTypeRow makes the token-type embedding every token gets: row 0 of token_types.weight
// ("sentence A"; llama.cpp does not take token types as input), as an F32 [1, dim] tensor.
func (m *Model) loadTypeRow(f *gguf.File) error {
	const name = "token_types.weight"
	ti, err := m.check(f, name, m.TokenTypes, m.Dim, false)
	if err != nil {
		return err
	}
	rs, err := ti.DType.RowSize(int64(m.Dim))
	if err != nil {
		return fmt.Errorf("bert: tensor %s: %w", name, err)
	}
	data := f.TensorData(ti)
	if int64(len(data)) < rs {
		return fmt.Errorf("bert: tensor %s lies outside the file's data", name)
	}
	row := make([]float32, m.Dim)
	if err := quant.Dequantize(ti.DType, data[:rs], row); err != nil {
		return fmt.Errorf("bert: tensor %s: %w", name, err)
	}
	t, err := m.be.Alloc(tensor.F32, 1, m.Dim)
	if err != nil {
		return fmt.Errorf("bert: tensor %s: %w", name, err)
	}
	m.owned = append(m.owned, t)
	m.typeRow = t
	return m.be.Write(t, 0, row)
}

// repack hands the matrices the model multiplies to the backend's own layout where it has one
// (backend.Repacker); the file's pages of a repacked matrix are then never read again.
func (m *Model) repack(f *gguf.File) error {
	for i := range m.layers {
		l := &m.layers[i]
		for _, t := range []backend.Tensor{l.wq, l.wk, l.wv, l.wo, l.wUp, l.wDown} {
			ok, err := backend.Repack(m.be, t)
			if err != nil {
				return fmt.Errorf("bert: repack: %w", err)
			}
			if ok {
				f.Release(m.data[t])
			}
		}
	}
	m.data = nil
	return nil
}

// load binds one tensor, checking its shape and dtype. Vectors (norm weights, biases) must be
// F32, as llama.cpp's converter writes them, and are copied out of the file.
func (m *Model) load(f *gguf.File, name string, rows, cols int, vector bool) (backend.Tensor, error) {
	ti, err := m.check(f, name, rows, cols, vector)
	if err != nil {
		return nil, err
	}
	data := f.TensorData(ti)
	if rs, err := ti.DType.RowSize(int64(cols)); err != nil || int64(len(data)) != rs*int64(rows) {
		return nil, fmt.Errorf("bert: tensor %s lies outside the file's data", name)
	}
	if vector {
		data = append([]byte(nil), data...)
		f.Release(f.TensorData(ti))
	}
	t, err := m.be.Load(ti.DType, rows, cols, data)
	if err != nil {
		return nil, fmt.Errorf("bert: tensor %s: %w", name, err)
	}
	m.owned = append(m.owned, t)
	m.data[t] = data
	return t, nil
}

// check finds tensor name, marks it used, and checks its dtype and shape (gguf.File.Weight) and
// that its rows are whole blocks of its dtype.
func (m *Model) check(f *gguf.File, name string, rows, cols int, vector bool) (*gguf.TensorInfo, error) {
	m.used[name] = true
	ti, err := f.Weight(name, rows, cols, vector)
	if err != nil {
		return nil, fmt.Errorf("bert: %w", err)
	}
	if _, err := ti.DType.RowSize(int64(cols)); err != nil {
		return nil, fmt.Errorf("bert: tensor %s: %w", name, err)
	}
	return ti, nil
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
