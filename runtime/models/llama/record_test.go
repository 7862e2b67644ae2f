package llama_test

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
)

// recBackend is a backend.Recorder over another backend, as the CUDA backend's graphs behave:
// while recording, the operations a step calls are queued, not run, and Replay runs the queue.
// failOp names an operation it cannot record (the call fails while recording); failReplay makes
// Replay refuse (nothing runs); off makes Record answer backend.ErrNotRecording.
type recBackend struct {
	backend.Backend
	failOp     string
	failReplay bool
	off        bool

	recording                  bool
	queue                      []func() error
	records, replays, discards int
}

func (r *recBackend) Record() error {
	if r.recording {
		return errors.New("already recording")
	}
	r.records++
	if r.off {
		return backend.ErrNotRecording
	}
	r.recording, r.queue = true, r.queue[:0]
	return nil
}

func (r *recBackend) Replay() error {
	if !r.recording {
		return errors.New("not recording")
	}
	r.recording = false
	if r.failReplay {
		return errors.New("replay refused")
	}
	for _, f := range r.queue {
		if err := f(); err != nil {
			return err
		}
	}
	r.replays++
	return nil
}

func (r *recBackend) Discard() {
	if r.recording {
		r.recording = false
		r.discards++
	}
}

// do runs f now, or queues it while recording.
func (r *recBackend) do(op string, f func() error) error {
	if !r.recording {
		return f()
	}
	if op == r.failOp {
		return fmt.Errorf("%s cannot be recorded", op)
	}
	r.queue = append(r.queue, f)
	return nil
}

// Arguments read at call time (ids, the batch's tables) are copied, as a recording backend
// copies them when the call is recorded.
func cloneBatch(b *backend.Batch) *backend.Batch {
	c := *b
	c.Pos, c.Slot = slices.Clone(b.Pos), slices.Clone(b.Slot)
	c.Seqs = slices.Clone(b.Seqs)
	for i := range c.Seqs {
		c.Seqs[i].Blocks = slices.Clone(c.Seqs[i].Blocks)
	}
	return &c
}

func (r *recBackend) GetRows(dst, table backend.Tensor, ids []int32) error {
	ids = slices.Clone(ids)
	return r.do("GetRows", func() error { return r.Backend.GetRows(dst, table, ids) })
}
func (r *recBackend) MatMul(dst, x, w backend.Tensor) error {
	return r.do("MatMul", func() error { return r.Backend.MatMul(dst, x, w) })
}
func (r *recBackend) AddRows(dst, a, b backend.Tensor) error {
	return r.do("AddRows", func() error { return r.Backend.AddRows(dst, a, b) })
}
func (r *recBackend) RMSNorm(dst, x, w backend.Tensor, eps float32) error {
	return r.do("RMSNorm", func() error { return r.Backend.RMSNorm(dst, x, w, eps) })
}
func (r *recBackend) SwiGLU(dst, gate, up backend.Tensor) error {
	return r.do("SwiGLU", func() error { return r.Backend.SwiGLU(dst, gate, up) })
}
func (r *recBackend) Rope(x backend.Tensor, nHead int, rp backend.RoPE, b *backend.Batch) error {
	b = cloneBatch(b)
	return r.do("Rope", func() error { return r.Backend.Rope(x, nHead, rp, b) })
}
func (r *recBackend) StoreKV(kv backend.KV, layer int, k, v backend.Tensor, b *backend.Batch) error {
	b = cloneBatch(b)
	return r.do("StoreKV", func() error { return r.Backend.StoreKV(kv, layer, k, v, b) })
}
func (r *recBackend) Attention(dst, q backend.Tensor, kv backend.KV, layer int, a backend.Attn, b *backend.Batch) error {
	b = cloneBatch(b)
	return r.do("Attention", func() error { return r.Backend.Attention(dst, q, kv, layer, a, b) })
}
func (r *recBackend) Read(src backend.Tensor, row0 int, dst []float32) error {
	if r.recording {
		return errors.New("read while recording")
	}
	return r.Backend.Read(src, row0, dst)
}

// TestRecordedSteps runs the same steps on a backend and on recording forms of it: decode steps
// (at most 64 tokens) are recorded and replayed, larger ones run as called, and the logits are
// bit for bit the same. A step whose recording fails (an operation the backend cannot record,
// or a refused replay) runs again unrecorded with the same result; after three such steps in a
// row the context stops recording, as it does at once when the backend's recording is off.
func TestRecordedSteps(t *testing.T) {
	w, err := llama.Synth(llama.Shape{Name: "tiny", Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, FFN: 96, Ctx: 128, Vocab: 512}, tensor.Q8_0, 7)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	newBE := func() backend.Backend {
		be, _, err := backend.New("go", backend.Options{Threads: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { be.Close() })
		return be
	}
	// steps runs a 70-token prompt (not recorded), a 5-token prompt, then six decode steps of
	// both sequences, and returns every step's logits.
	steps := func(t *testing.T, be backend.Backend) [][]float32 {
		m, err := llama.Load(f, be)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		c, err := m.NewContext(llama.ContextConfig{MaxTokens: 80, MaxSeqs: 2, KVSlots: 256, BlockSize: 8, KVType: tensor.F16})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		seqs := []*kvcache.Seq{c.Pool().NewSeq(128), c.Pool().NewSeq(128)}
		var bb kvcache.BatchBuilder
		var got [][]float32
		run := func(toks [][]int32) {
			t.Helper()
			bb.Reset()
			var all, out []int32
			for i, tk := range toks {
				if len(tk) == 0 {
					continue
				}
				if err := seqs[i].Reserve(len(tk)); err != nil {
					t.Fatal(err)
				}
				if err := bb.Add(seqs[i], len(tk)); err != nil {
					t.Fatal(err)
				}
				all = append(all, tk...)
				out = append(out, int32(len(all)-1))
			}
			lg := make([]float32, len(out)*m.Vocab)
			if err := c.Forward(all, bb.Batch(), out, lg); err != nil {
				t.Fatal(err)
			}
			for i, tk := range toks {
				if len(tk) > 0 {
					if err := seqs[i].Advance(len(tk)); err != nil {
						t.Fatal(err)
					}
				}
			}
			got = append(got, lg)
		}
		long := make([]int32, 70)
		for i := range long {
			long[i] = int32(3 + i*7%500)
		}
		run([][]int32{long, nil})
		run([][]int32{nil, {1, 300, 301, 302, 303}})
		for s := range 6 {
			run([][]int32{{int32(10 + s)}, {int32(400 + s)}})
		}
		return got
	}
	want := steps(t, newBE())

	for _, tc := range []struct {
		name                                   string
		rb                                     *recBackend
		records, replays, discards, replayFail int
	}{
		// 7 steps of at most 64 tokens, each recorded and replayed.
		{name: "recorded", rb: &recBackend{}, records: 7, replays: 7},
		// Three steps fail to record (and run unrecorded); the context then stops trying.
		{name: "op not recordable", rb: &recBackend{failOp: "Attention"}, records: 3, discards: 3},
		{name: "replay refused", rb: &recBackend{failReplay: true}, records: 3},
		{name: "recording off", rb: &recBackend{off: true}, records: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.rb.Backend = newBE()
			got := steps(t, tc.rb)
			for i := range want {
				if !slices.Equal(got[i], want[i]) {
					t.Fatalf("step %d: logits differ from the unrecorded run's", i)
				}
			}
			if tc.rb.records != tc.records || tc.rb.replays != tc.replays || tc.rb.discards != tc.discards {
				t.Fatalf("records/replays/discards = %d/%d/%d, want %d/%d/%d", tc.rb.records, tc.rb.replays, tc.rb.discards, tc.records, tc.replays, tc.discards)
			}
		})
	}
}
