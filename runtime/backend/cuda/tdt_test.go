//go:build cuda && cgo && !nocgo

package cuda

import (
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// TestGreedyDecodingGraphs runs the same steps of a greedy decoding (its gathers, masked copy and
// decisions) recorded as CUDA graphs and one operation at a time: every step but the first is a
// graph run, and the reports and gathered rows are the same.
func TestGreedyDecodingGraphs(t *testing.T) {
	gpu(t)
	const rows, blank, cols, steps = 3, 9, 6, 8
	durs := []int{0, 1, 2}
	width := blank + 1 + len(durs)
	run := func(graphs bool) (backend.GreedyReport, []float32, int64) {
		be, err := New(Options{Graphs: graphs, ExactF32: true})
		if err != nil {
			t.Fatal(err)
		}
		defer be.Close()
		g, err := be.NewGreedyDecoding(backend.GreedyDecodingConfig{Rows: rows, Blank: blank, Durations: durs, MaxSymbols: 2, Ring: steps})
		if err != nil {
			t.Fatal(err)
		}
		defer g.Close()
		r := rand.New(rand.NewPCG(1, 2))
		vals := func(n int) []float32 {
			v := make([]float32, n)
			for i := range v {
				v[i] = float32(r.NormFloat64())
			}
			return v
		}
		mk := func(n, c int, v []float32) backend.Tensor {
			x, err := be.Alloc(tensor.F32, n, c)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { x.Close() })
			if v != nil {
				if err := be.Write(x, 0, v); err != nil {
					t.Fatal(err)
				}
			}
			return x
		}
		enc := make([]backend.Tensor, rows)
		for i := range rows {
			enc[i] = mk(4+5*i, cols, vals((4+5*i)*cols))
			if err := g.Start(i, 4+5*i); err != nil {
				t.Fatal(err)
			}
		}
		table, logits := mk(blank+1, cols, vals((blank+1)*cols)), mk(rows, width, nil)
		emb, fr, kept := mk(rows, cols, nil), mk(rows, cols, nil), mk(rows, cols, vals(rows*cols))
		var rec backend.Recording
		for range steps {
			if err := be.Write(logits, 0, vals(rows*width)); err != nil {
				t.Fatal(err)
			}
			if err := rec.Run(be, func() error {
				if err := g.Tokens(emb, table); err != nil {
					return err
				}
				if err := g.Keep(kept, emb); err != nil {
					return err
				}
				if err := g.Decide(logits); err != nil {
					return err
				}
				return g.Frames(fr, enc)
			}); err != nil {
				t.Fatal(err)
			}
		}
		var rep backend.GreedyReport
		if err := g.Read(&rep); err != nil {
			t.Fatal(err)
		}
		out := make([]float32, 2*rows*cols)
		if err := be.Read(kept, 0, out[:rows*cols]); err != nil {
			t.Fatal(err)
		}
		if err := be.Read(fr, 0, out[rows*cols:]); err != nil {
			t.Fatal(err)
		}
		st, err := be.GraphStats()
		if err != nil {
			t.Fatal(err)
		}
		return rep, out, st.Runs
	}
	rep0, out0, _ := run(false)
	rep1, out1, runs := run(true)
	// The first step runs unrecorded: the context's table arena is made then, which a
	// recording cannot do (backend.Recording runs the step again without recording).
	if runs != steps-1 {
		t.Errorf("%d graph runs for %d steps, want %d", runs, steps, steps-1)
	}
	if !reflect.DeepEqual(rep0, rep1) || !reflect.DeepEqual(out0, out1) {
		t.Errorf("recorded steps differ:\n%+v\n%+v", rep0, rep1)
	}
	n := 0
	for _, c := range rep0.Count {
		n += int(c)
	}
	if n == 0 {
		t.Error("no token emitted: the test decides nothing")
	}
}
