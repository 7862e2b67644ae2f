package backendtest

import (
	"fmt"
	"math"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
)

// greedyRow is one row of the reference greedy rule, computed here in float64.
type greedyRow struct {
	frame, run, end int
	done, bad, emit bool
	tok             int32
	toks            []greedyTok
}

type greedyTok struct {
	id, frame, dur int32
	p, plog        float64
}

// firstMaxRef is the first index of the largest value of x, NaN never counting; -1 if none.
func firstMaxRef(x []float32) int {
	bi := -1
	for j, v := range x {
		if v == v && (bi < 0 || v > x[bi]) {
			bi = j
		}
	}
	return bi
}

// decideRef applies the greedy transducer rule (GreedyDecoding.Decide) to r and row.
func decideRef(r *greedyRow, row []float32, nTok int, durs []int, maxSym int) {
	if r.done {
		r.emit = false
		return
	}
	blank := int32(nTok - 1)
	k, d := firstMaxRef(row[:nTok]), 0
	if len(durs) > 0 {
		d = firstMaxRef(row[nTok:])
	}
	if k < 0 || d < 0 {
		r.bad, r.done, r.emit = true, true, false
		return
	}
	dur := 0
	if len(durs) > 0 {
		dur = durs[d]
	}
	if int32(k) == blank {
		r.frame += max(dur, 1)
		r.run, r.emit, r.tok = 0, false, blank
	} else {
		var st, mx float64
		for _, v := range row[:nTok] {
			st += math.Exp(float64(v) - float64(row[k]))
		}
		mx = math.Inf(-1)
		for _, v := range row {
			mx = max(mx, float64(v))
		}
		var sa float64
		for _, v := range row {
			sa += math.Exp(float64(v) - mx)
		}
		r.toks = append(r.toks, greedyTok{id: int32(k), frame: int32(r.frame), dur: int32(d), p: 1 / st, plog: float64(row[k]) - mx - math.Log(sa)})
		r.emit, r.tok = true, int32(k)
		if dur > 0 {
			r.frame += dur
			r.run = 0
		} else if r.run++; r.run >= maxSym {
			r.frame++
			r.run = 0
		}
	}
	if r.frame >= r.end {
		r.done = true
	}
}

// testGreedyDecoding checks a backend's greedy transducer decoding (where it is a
// backend.GreedyTransducer) against decideRef over several steps of random logits with planted
// ties, NaNs and an all-NaN row, for a TDT rule and an RNN-T one (no durations), and its
// gathers (Frames, Tokens) and masked copy (Keep) against the reference state.
func testGreedyDecoding(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	gt, ok := b.(backend.GreedyTransducer)
	if !ok {
		t.Skipf("%s is not a backend.GreedyTransducer", b.Name())
	}
	const rows, steps, maxSym, cols = 6, 5, 2, 9
	for _, c := range []struct {
		nTok int
		durs []int
	}{{5, []int{0, 1, 2, 3}}, {1030, []int{0, 1, 2, 3, 4}}, {7, nil}, {300, nil}} {
		name := fmt.Sprintf("%d tokens, %d durations", c.nTok, len(c.durs))
		r := rng("greedy " + name)
		width := c.nTok + len(c.durs)
		g, err := gt.NewGreedyDecoding(backend.GreedyDecodingConfig{Rows: rows, Blank: int32(c.nTok - 1), Durations: c.durs, MaxSymbols: maxSym, Ring: steps})
		must(t, err, "%s: NewGreedyDecoding", name)
		ref := make([]greedyRow, rows)
		for i := range rows - 1 { // the last row is never started: done
			ref[i] = greedyRow{end: 2 + 3*i, emit: true, tok: int32(c.nTok - 1)}
			must(t, g.Start(i, ref[i].end), "%s: Start", name)
		}
		// Row 1 goes on from a token decided before its clip, at frame 1; row 2 from a blank
		// (nothing for the prediction network to take) at frame 2.
		ref[1] = greedyRow{frame: 1, end: ref[1].end, emit: true, tok: int32(c.nTok / 3)}
		must(t, g.Resume(1, 1, ref[1].end, ref[1].tok, true), "%s: Resume", name)
		ref[2] = greedyRow{frame: 2, end: ref[2].end, tok: int32(c.nTok - 1)}
		must(t, g.Resume(2, 2, ref[2].end, ref[2].tok, false), "%s: Resume", name)
		ref[rows-1] = greedyRow{done: true, tok: int32(c.nTok - 1)}
		logits := alloc(t, b, rows, width, nil)
		enc := make([]backend.Tensor, rows)
		encV := make([][]float32, rows)
		for i := range rows {
			encV[i] = randVec(r, max(ref[i].end, 1)*cols, 1)
			enc[i] = alloc(t, b, max(ref[i].end, 1), cols, encV[i])
		}
		tableV := randVec(r, c.nTok*cols, 1)
		table := alloc(t, b, c.nTok, cols, tableV)
		dst := alloc(t, b, rows, cols, nil)
		for s := range steps {
			// Tokens and Keep read the emit flags and tokens of the last decision.
			must(t, g.Tokens(dst, table), "%s: Tokens", name)
			got := read(t, b, dst)
			for i := range rows {
				want := tableV[int(ref[i].tok)*cols : int(ref[i].tok+1)*cols]
				if fmt.Sprint(got[i*cols:(i+1)*cols]) != fmt.Sprint(want) {
					t.Fatalf("%s step %d: Tokens row %d reads token %d's embedding wrong", name, s, i, ref[i].tok)
				}
			}
			keepDst, keepSrc := randVec(r, rows*cols, 1), randVec(r, rows*cols, 1)
			kd, ks := alloc(t, b, rows, cols, keepDst), alloc(t, b, rows, cols, keepSrc)
			must(t, g.Keep(kd, ks), "%s: Keep", name)
			got = read(t, b, kd)
			for i := range rows {
				want := keepDst
				if ref[i].emit {
					want = keepSrc
				}
				if fmt.Sprint(got[i*cols:(i+1)*cols]) != fmt.Sprint(want[i*cols:(i+1)*cols]) {
					t.Fatalf("%s step %d: Keep row %d (emitted %v)", name, s, i, ref[i].emit)
				}
			}
			v := randVec(r, rows*width, 3)
			row := func(i int) []float32 { return v[i*width : (i+1)*width] }
			switch s {
			case 1:
				row(0)[1], row(0)[2] = 40, 40 // a tie: the first
				if len(c.durs) > 0 {
					row(1)[c.nTok+1], row(1)[c.nTok+2] = 40, 40
					row(1)[0] = 30
				}
				row(2)[0] = float32(math.NaN()) // a NaN never counts
			case 2:
				row(0)[c.nTok-1] = 50 // a blank
			case 3:
				for j := range c.nTok {
					row(3)[j] = float32(math.NaN()) // all NaN: the row fails
				}
				row(4)[c.nTok/2] = 60
			}
			w := alloc(t, b, rows, width, v)
			must(t, b.Copy(logits, w), "%s: Copy", name)
			w.Close()
			must(t, g.Decide(logits), "%s: Decide", name)
			for i := range rows {
				decideRef(&ref[i], row(i), c.nTok, c.durs, maxSym)
			}
			must(t, g.Frames(dst, enc), "%s: Frames", name)
			got = read(t, b, dst)
			for i := range rows {
				f := min(ref[i].frame, max(ref[i].end-1, 0))
				if fmt.Sprint(got[i*cols:(i+1)*cols]) != fmt.Sprint(encV[i][f*cols:(f+1)*cols]) {
					t.Fatalf("%s step %d: Frames row %d does not read frame %d", name, s, i, f)
				}
			}
		}
		var rep backend.GreedyReport
		must(t, g.Read(&rep), "%s: Read", name)
		for i, w := range ref {
			if int(rep.Count[i]) != len(w.toks) || rep.Done[i] != w.done || rep.Failed[i] != w.bad {
				t.Errorf("%s: row %d: %d tokens, done %v, failed %v; want %d, %v, %v", name, i, rep.Count[i], rep.Done[i], rep.Failed[i], len(w.toks), w.done, w.bad)
				continue
			}
			if rep.At[i] != int32(w.frame) || rep.Last[i] != w.tok || rep.Emit[i] != w.emit {
				t.Errorf("%s: row %d stands at frame %d, last token %d, emit %v; want %d, %d, %v", name, i, rep.At[i], rep.Last[i], rep.Emit[i], w.frame, w.tok, w.emit)
			}
			for k, wt := range w.toks {
				at := i*steps + k%steps
				if rep.Token[at] != wt.id || rep.Frame[at] != wt.frame || rep.DurIdx[at] != wt.dur ||
					math.Abs(float64(rep.P[at])-wt.p) > 1e-5*max(1, wt.p) || math.Abs(float64(rep.PLog[at])-wt.plog) > 1e-5*max(1, math.Abs(wt.plog)) {
					t.Errorf("%s: row %d token %d: id %d frame %d duration %d p %g plog %g; want %+v", name, i, k,
						rep.Token[at], rep.Frame[at], rep.DurIdx[at], rep.P[at], rep.PLog[at], wt)
				}
			}
		}
		mustFail(t, "Decide on logits of the wrong width", func() error { return g.Decide(alloc(t, b, rows, width+1, nil)) })
		mustFail(t, "Frames with too few tables", func() error { return g.Frames(dst, enc[:1]) })
		mustFail(t, "Start past the last row", func() error { return g.Start(rows, 1) })
		mustFail(t, "Resume at a negative frame", func() error { return g.Resume(0, -1, 1, 0, true) })
		mustFail(t, "Resume after a token past the blank", func() error { return g.Resume(0, 0, 1, int32(c.nTok), true) })
		must(t, g.Close(), "%s: Close", name)
	}
	_, err := gt.NewGreedyDecoding(backend.GreedyDecodingConfig{Rows: 0, Blank: 1, MaxSymbols: 1, Ring: 1})
	mustFail(t, "a decoding of no rows", func() error { return err })
}
