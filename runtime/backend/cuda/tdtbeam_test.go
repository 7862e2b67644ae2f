//go:build cuda && cgo && !nocgo

package cuda

import (
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// TestBeamDecodingGraphs runs the same rounds of a beam decoding (its gathers, masked copies,
// rounds and state gathers) recorded as CUDA graphs and one operation at a time: every round but
// the first is a graph run, and the reports, best hypotheses and gathered rows are the same.
func TestBeamDecodingGraphs(t *testing.T) {
	gpu(t)
	const streams, width, blank, cols, rounds = 3, 4, 9, 6, 10
	durs := []int{0, 1, 2}
	jw := blank + 1 + len(durs)
	rows := streams * width
	type result struct {
		rep  backend.BeamReport
		best []backend.BeamResult
		out  []float32
	}
	run := func(graphs bool) (result, int64) {
		be, err := New(Options{Graphs: graphs, ExactF32: true})
		if err != nil {
			t.Fatal(err)
		}
		defer be.Close()
		d, err := be.NewBeamDecoding(backend.BeamDecodingConfig{Streams: streams, Width: width, Blank: blank, Durations: durs,
			MaxSymbols: 2, Nodes: 200})
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
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
		enc := make([]backend.Tensor, streams)
		for i := range streams {
			enc[i] = mk(2+2*i, cols, vals((2+2*i)*cols))
			if err := d.Start(i, 2+2*i, width-i); err != nil {
				t.Fatal(err)
			}
		}
		table, logits := mk(blank+1, cols, vals((blank+1)*cols)), mk(rows, jw, nil)
		emb, fr, kept, tmp := mk(rows, cols, nil), mk(rows, cols, nil), mk(rows, cols, vals(rows*cols)), mk(rows, cols, nil)
		var rec backend.Recording
		for range rounds {
			if err := be.Write(logits, 0, vals(rows*jw)); err != nil {
				t.Fatal(err)
			}
			if err := rec.Run(be, func() error {
				if err := d.Tokens(emb, table); err != nil {
					return err
				}
				if err := d.Keep(kept, emb); err != nil {
					return err
				}
				if err := d.Frames(fr, enc); err != nil {
					return err
				}
				if err := d.Round(logits); err != nil {
					return err
				}
				if err := d.Gather(tmp, kept); err != nil {
					return err
				}
				return be.Copy(kept, tmp)
			}); err != nil {
				t.Fatal(err)
			}
		}
		var res result
		if err := d.Read(&res.rep); err != nil {
			t.Fatal(err)
		}
		for s := range streams {
			var b backend.BeamResult
			if res.rep.Done[s] {
				if err := d.Result(s, &b); err != nil {
					t.Fatal(err)
				}
			}
			res.best = append(res.best, b)
		}
		res.out = make([]float32, 2*rows*cols)
		if err := be.Read(kept, 0, res.out[:rows*cols]); err != nil {
			t.Fatal(err)
		}
		if err := be.Read(fr, 0, res.out[rows*cols:]); err != nil {
			t.Fatal(err)
		}
		st, err := be.GraphStats()
		if err != nil {
			t.Fatal(err)
		}
		return res, st.Runs
	}
	r0, _ := run(false)
	r1, runs := run(true)
	if runs != rounds-1 {
		t.Errorf("%d graph runs for %d rounds, want %d", runs, rounds, rounds-1)
	}
	if !reflect.DeepEqual(r0, r1) {
		t.Errorf("recorded rounds differ:\n%+v\n%+v", r0, r1)
	}
	n := 0
	for s, b := range r0.best {
		if !r0.rep.Done[s] {
			t.Errorf("stream %d not done after %d rounds", s, rounds)
		}
		n += len(b.Token)
	}
	if n == 0 {
		t.Error("no token emitted: the test searches nothing")
	}
}
