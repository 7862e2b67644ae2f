package backendtest

import (
	"errors"
	"fmt"
	"slices"

	"github.com/parleyhq/parley/runtime/backend"
)

// Recorder is a backend.Recorder over another backend that behaves as a recording GPU backend
// does, for testing the models' use of recording without a GPU: while recording, every
// operation is queued (its host arguments copied, as a recording backend copies them when the
// call is recorded) and Replay runs the queue; Read fails. FailOp names an operation it cannot
// record (the call fails while recording); FailReplay makes Replay refuse (nothing runs); Off
// makes Record answer backend.ErrNotRecording. The counters say what happened. It hides the
// other backend's optional interfaces (MultiMatMuler, Argmaxer, ...).
type Recorder struct {
	backend.Backend
	FailOp     string
	FailReplay bool
	Off        bool

	Records, Replays, Discards int

	recording bool
	queue     []func() error
}

var _ backend.Recorder = (*Recorder)(nil)

func (r *Recorder) Record() error {
	if r.recording {
		return errors.New("already recording")
	}
	r.Records++
	if r.Off {
		return backend.ErrNotRecording
	}
	r.recording, r.queue = true, r.queue[:0]
	return nil
}

func (r *Recorder) Replay() error {
	if !r.recording {
		return errors.New("not recording")
	}
	r.recording = false
	if r.FailReplay {
		return errors.New("replay refused")
	}
	for _, f := range r.queue {
		if err := f(); err != nil {
			return err
		}
	}
	r.Replays++
	return nil
}

func (r *Recorder) Discard() {
	if r.recording {
		r.recording = false
		r.Discards++
	}
}

// do runs f now, or queues it while recording.
func (r *Recorder) do(op string, f func() error) error {
	if !r.recording {
		return f()
	}
	if op == r.FailOp {
		return fmt.Errorf("%s cannot be recorded", op)
	}
	r.queue = append(r.queue, f)
	return nil
}

func cloneBatch(b *backend.Batch) *backend.Batch {
	c := *b
	c.Pos, c.Slot = slices.Clone(b.Pos), slices.Clone(b.Slot)
	c.Seqs = slices.Clone(b.Seqs)
	for i := range c.Seqs {
		c.Seqs[i].Blocks = slices.Clone(c.Seqs[i].Blocks)
	}
	return &c
}

func (r *Recorder) Read(src backend.Tensor, row0 int, dst []float32) error {
	if r.recording {
		return errors.New("read while recording")
	}
	return r.Backend.Read(src, row0, dst)
}

func (r *Recorder) Write(dst backend.Tensor, row0 int, src []float32) error {
	if r.recording {
		return errors.New("write while recording")
	}
	return r.Backend.Write(dst, row0, src)
}

func (r *Recorder) GetRows(dst, table backend.Tensor, ids []int32) error {
	ids = slices.Clone(ids)
	return r.do("GetRows", func() error { return r.Backend.GetRows(dst, table, ids) })
}
func (r *Recorder) MatMul(dst, x, w backend.Tensor) error {
	return r.do("MatMul", func() error { return r.Backend.MatMul(dst, x, w) })
}
func (r *Recorder) AddRows(dst, a, b backend.Tensor) error {
	return r.do("AddRows", func() error { return r.Backend.AddRows(dst, a, b) })
}
func (r *Recorder) RMSNorm(dst, x, w backend.Tensor, eps float32) error {
	return r.do("RMSNorm", func() error { return r.Backend.RMSNorm(dst, x, w, eps) })
}
func (r *Recorder) Unary(dst, x backend.Tensor, f backend.Func) error {
	return r.do("Unary", func() error { return r.Backend.Unary(dst, x, f) })
}
func (r *Recorder) GLU(dst, gate, up backend.Tensor, f backend.Func) error {
	return r.do("GLU", func() error { return r.Backend.GLU(dst, gate, up, f) })
}
func (r *Recorder) GeGLU(dst, gate, up backend.Tensor) error {
	return r.do("GeGLU", func() error { return r.Backend.GeGLU(dst, gate, up) })
}
func (r *Recorder) Scale(dst, x backend.Tensor, s float32) error {
	return r.do("Scale", func() error { return r.Backend.Scale(dst, x, s) })
}
func (r *Recorder) SwiGLU(dst, gate, up backend.Tensor) error {
	return r.do("SwiGLU", func() error { return r.Backend.SwiGLU(dst, gate, up) })
}
func (r *Recorder) Rope(x backend.Tensor, nHead int, rp backend.RoPE, b *backend.Batch) error {
	b = cloneBatch(b)
	return r.do("Rope", func() error { return r.Backend.Rope(x, nHead, rp, b) })
}
func (r *Recorder) StoreKV(kv backend.KV, layer int, k, v backend.Tensor, b *backend.Batch) error {
	b = cloneBatch(b)
	return r.do("StoreKV", func() error { return r.Backend.StoreKV(kv, layer, k, v, b) })
}
func (r *Recorder) Attention(dst, q backend.Tensor, kv backend.KV, layer int, a backend.Attn, b *backend.Batch) error {
	b = cloneBatch(b)
	return r.do("Attention", func() error { return r.Backend.Attention(dst, q, kv, layer, a, b) })
}
func (r *Recorder) Copy(dst, src backend.Tensor) error {
	return r.do("Copy", func() error { return r.Backend.Copy(dst, src) })
}
func (r *Recorder) LayerNorm(dst, x, w, b backend.Tensor, eps float32) error {
	return r.do("LayerNorm", func() error { return r.Backend.LayerNorm(dst, x, w, b, eps) })
}
func (r *Recorder) GELU(dst, x backend.Tensor) error {
	return r.do("GELU", func() error { return r.Backend.GELU(dst, x) })
}
func (r *Recorder) Im2Col1D(dst, x backend.Tensor, kernel, stride, pad int) error {
	return r.do("Im2Col1D", func() error { return r.Backend.Im2Col1D(dst, x, kernel, stride, pad) })
}
func (r *Recorder) FullAttention(dst, q, k, v backend.Tensor, a backend.Attn) error {
	return r.do("FullAttention", func() error { return r.Backend.FullAttention(dst, q, k, v, a) })
}

// Drawing is a backend.Drawer over another backend, for testing the models' and the engine's use
// of drawing without a GPU: Draw reads the logits and applies backend.DrawRows, counting its
// calls. It hides the other backend's optional interfaces (backend.Argmaxer among them).
type Drawing struct {
	backend.Backend
	Calls int
}

var _ backend.Drawer = (*Drawing)(nil)

func (d *Drawing) Draw(logits backend.Tensor, row0 int, draws []backend.Draw, ids []int32) error {
	d.Calls++
	lg := make([]float32, len(ids)*logits.Cols())
	if err := d.Read(logits, row0, lg); err != nil {
		return err
	}
	return backend.DrawRows(lg, logits.Cols(), draws, ids)
}

// Choosing is a backend.Chooser over another backend, for testing the models' and the engines'
// use of choosing without a GPU: Choose reads the logits and applies backend.ChooseRows,
// counting its calls. It hides the other backend's optional interfaces.
type Choosing struct {
	backend.Backend
	Calls int
}

var _ backend.Chooser = (*Choosing)(nil)

func (c *Choosing) Choose(logits backend.Tensor, row0 int, choices []backend.Choice, drop []int32, k int, rows []backend.Chosen, ids []int32, logp []float32) error {
	c.Calls++
	lg := make([]float32, len(choices)*logits.Cols())
	if err := c.Read(logits, row0, lg); err != nil {
		return err
	}
	return backend.ChooseRows(lg, logits.Cols(), choices, drop, k, rows, ids, logp)
}
