package llama_test

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/backend/backendtest"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
)

// plainBackend hides every optional interface of a backend (backend.Argmaxer among them), so
// that ForwardPick reads the picked rows and searches them itself.
type plainBackend struct{ backend.Backend }

// TestForwardPick runs the same steps through Forward (every row's logits) and ForwardPick (some
// rows' logits, the others' argmax): the logits handed over are bit for bit Forward's, and every
// picked id is the argmax of Forward's row, on every backend and on one without an Argmaxer.
func TestForwardPick(t *testing.T) {
	f, err := gguf.Open(sharedtest.Path(t, "models/llm/stories260K-f32.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	prompts := [][]int32{{1, 403, 407, 261, 378}, {1, 346, 306, 414}, {1, 299, 300, 301, 302, 303}}
	bes := backendsUnderTest(t)
	bes = append(bes, plainBackend{bes[0]})
	for _, be := range bes {
		name := be.Name()
		if _, ok := be.(plainBackend); ok {
			name += "-without-argmaxer"
		}
		t.Run(name, func(t *testing.T) {
			m, err := llama.Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			V := m.Vocab
			type run struct {
				c    *llama.Context
				seqs []*kvcache.Seq
				bb   kvcache.BatchBuilder
			}
			runs := make([]*run, 2) // 0: Forward, 1: ForwardPick
			for i := range runs {
				c, err := m.NewContext(llama.ContextConfig{StepTokens: 32, MaxSeqs: 3, KVSlots: 128, BlockSize: 4, KVType: tensor.F16})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				runs[i] = &run{c: c}
				for range prompts {
					runs[i].seqs = append(runs[i].seqs, c.Pool().NewSeq(64))
				}
			}
			next := make([][]int32, len(prompts)) // each sequence's tokens for the step
			copy(next, prompts)
			all := make([]float32, len(prompts)*V)
			for step := range 5 {
				// The step's output rows: sequence 0's logits handed over on even steps, the
				// others always picked.
				var toks, rows []int32
				for i := range runs {
					runs[i].bb.Reset()
				}
				for i, tk := range next {
					for _, r := range runs {
						if err := r.seqs[i].Reserve(len(tk)); err != nil {
							t.Fatal(err)
						}
						if err := r.bb.Add(r.seqs[i], len(tk)); err != nil {
							t.Fatal(err)
						}
					}
					toks = append(toks, tk...)
					rows = append(rows, int32(len(toks)-1))
				}
				if err := runs[0].c.Forward(toks, runs[0].bb.Batch(), rows, all); err != nil {
					t.Fatal(err)
				}
				out, pick := rows[:1], rows[1:]
				if step%2 == 1 {
					out, pick = nil, rows
				}
				lg := make([]float32, len(out)*V)
				ids := make([]int32, len(pick))
				if err := runs[1].c.ForwardPick(toks, runs[1].bb.Batch(), out, lg, pick, ids); err != nil {
					t.Fatal(err)
				}
				if len(out) > 0 && !slices.EqualFunc(lg, all[:V], func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) }) {
					t.Errorf("step %d: the logits handed over differ from Forward's", step)
				}
				want := make([]int32, len(rows))
				if err := backend.ArgmaxRows(all, V, want); err != nil {
					t.Fatal(err)
				}
				if got := ids; !slices.Equal(got, want[len(out):]) {
					t.Errorf("step %d: picked %v, Forward's argmax %v", step, got, want[len(out):])
				}
				for i, tk := range next {
					for _, r := range runs {
						if err := r.seqs[i].Advance(len(tk)); err != nil {
							t.Fatal(err)
						}
					}
					next[i] = []int32{want[i]}
				}
			}
			c := runs[1].c
			one := []int32{5}
			var bb kvcache.BatchBuilder
			s := c.Pool().NewSeq(8)
			if err := s.Reserve(1); err != nil {
				t.Fatal(err)
			}
			if err := bb.Add(s, 1); err != nil {
				t.Fatal(err)
			}
			for _, bad := range []struct {
				what      string
				out, pick []int32
				ids       []int32
			}{
				{"ids missing", nil, []int32{0}, nil},
				{"picked row outside the batch", nil, []int32{1}, make([]int32, 1)},
				{"more rows than MaxSeqs", []int32{0, 0}, []int32{0, 0}, make([]int32, 2)},
			} {
				if err := c.ForwardPick(one, bb.Batch(), bad.out, make([]float32, len(bad.out)*V), bad.pick, bad.ids); err == nil {
					t.Errorf("%s: no error", bad.what)
				}
			}
		})
	}
}

// TestForwardDraw: ForwardDraw hands over the logits of the rows in out as Forward gives them and
// chooses the picked rows' tokens as backend.DrawRows chooses them from Forward's logits (an
// argmax and draws at several settings), on every backend, on one that is a backend.Drawer
// (which it then calls) and on one without; draws out of range are refused.
func TestForwardDraw(t *testing.T) {
	f, err := llama.SynthFile(llama.Shape{Name: "tiny", Dim: 64, Layers: 2, Heads: 4, KVHeads: 2, FFN: 96, Ctx: 128, Vocab: 512}, tensor.Q8_0, 9)
	if err != nil {
		t.Fatal(err)
	}
	bes := backendsUnderTest(t)
	wrap := &backendtest.Drawing{Backend: bes[0]}
	bes = append(bes, plainBackend{bes[0]}, wrap)
	prompts := [][]int32{{1, 40, 41, 42}, {1, 300, 7}, {1, 99, 98, 97, 96}, {1, 5}}
	ends := []int32{3, 6, 11, 13} // each prompt's last row
	draws := []backend.Draw{{}, {Temperature: 0.9, TopK: 5, TopP: 0.9, MinP: 0.02, Random: 0x9e3779b97f4a7c15},
		{Temperature: 1.5, TopP: 1, Random: 0x7f4a7c159e3779b9}}
	for i, be := range bes {
		t.Run(fmt.Sprintf("%s-%d", be.Name(), i), func(t *testing.T) {
			m, err := llama.Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			V := m.Vocab
			// run feeds the prompts to a fresh context in one step through do.
			run := func(do func(c *llama.Context, toks []int32, b *backend.Batch) error) error {
				c, err := m.NewContext(llama.ContextConfig{StepTokens: 32, MaxSeqs: 4, KVSlots: 256, KVType: tensor.F16})
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				toks, b := promptBatch(t, c, prompts, 64)
				return do(c, toks, b)
			}
			all := make([]float32, len(ends)*V)
			if err := run(func(c *llama.Context, toks []int32, b *backend.Batch) error {
				return c.Forward(toks, b, ends, all)
			}); err != nil {
				t.Fatal(err)
			}
			want := make([]int32, len(draws))
			if err := backend.DrawRows(all[V:], V, draws, want); err != nil {
				t.Fatal(err)
			}
			lg, ids := make([]float32, V), make([]int32, len(draws))
			calls := wrap.Calls
			if err := run(func(c *llama.Context, toks []int32, b *backend.Batch) error {
				return c.ForwardDraw(toks, b, ends[:1], lg, ends[1:], draws, ids)
			}); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(lg, all[:V]) {
				t.Error("the logits handed over differ from Forward's")
			}
			if !slices.Equal(ids, want) {
				t.Errorf("drawn %v, want %v", ids, want)
			}
			if be == backend.Backend(wrap) && wrap.Calls != calls+1 {
				t.Errorf("a backend.Drawer was called %d times, want once", wrap.Calls-calls)
			}
			bad := slices.Clone(draws)
			bad[1].TopP = 0
			if err := run(func(c *llama.Context, toks []int32, b *backend.Batch) error {
				return c.ForwardDraw(toks, b, ends[:1], lg, ends[1:], bad, ids)
			}); err == nil {
				t.Error("a draw with top-p 0 was accepted")
			}
			if err := run(func(c *llama.Context, toks []int32, b *backend.Batch) error {
				return c.ForwardDraw(toks, b, ends[:1], lg, ends[1:], draws[:2], ids)
			}); err == nil {
				t.Error("two draws for three picked rows were accepted")
			}
		})
	}
}

// promptBatch gives each prompt a fresh sequence of c (seqCap tokens) and returns the prompts'
// tokens, concatenated, and the batch that feeds them in one step.
func promptBatch(t testing.TB, c *llama.Context, prompts [][]int32, seqCap int) ([]int32, *backend.Batch) {
	t.Helper()
	var bb kvcache.BatchBuilder
	var toks []int32
	for _, p := range prompts {
		s := c.Pool().NewSeq(seqCap)
		if err := s.Reserve(len(p)); err != nil {
			t.Fatal(err)
		}
		if err := bb.Add(s, len(p)); err != nil {
			t.Fatal(err)
		}
		toks = append(toks, p...)
	}
	return toks, bb.Batch()
}
