package backendtest

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
)

// testChoose checks a backend's Choose (where it is a backend.Chooser) against
// backend.ChooseRows on fresh random rows: Whisper's shape (51865 ids, timestamps from 50364,
// beams of 5) and a small one, read from an offset row; logits on a grid of 1/1024, so that
// distinct values are never within rounding of each other and equal ones test the order of ties;
// groups strong enough to be forced in some rows; up to four cuts, a range of a drop list and a
// probe; rows with a NaN that a filter removes, one that none does, and nothing left; draws at a
// temperature (one with nearly everything cut); a row that is all group; fewer tokens left than
// wanted; +0 and -0 as the largest values; a group whose probabilities are below float32's normal
// range. The tokens, counts and groups must be the same, log-probabilities, shares and probes
// within 1e-5 (float32 values after sums in another order); rows whose forcing is within 1e-4
// of its threshold, or whose draw within 1e-5 of a boundary, are left out. Its argument checks
// too.
func testChoose(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	if !backend.Supports(b, backend.OpChoose) {
		t.Skipf("%s is not a backend.Chooser", b.Name())
	}
	ch := b.(backend.Chooser)
	const lead = 3
	for _, sh := range []struct{ vocab, split, k, rows int }{{51865, 50364, 5, 39}, {997, 900, 8, 52}} {
		r := rng(fmt.Sprintf("choose %d", sh.vocab))
		V := sh.vocab
		drop := make([]int32, 150)
		for i := range drop {
			drop[i] = int32(r.IntN(V))
		}
		x := make([]float32, (lead+sh.rows)*V)
		choices := make([]backend.Choice, sh.rows)
		for i := range choices {
			row := x[(lead+i)*V : (lead+i+1)*V]
			boost := float32(r.IntN(3)) * 4
			for j := range row {
				row[j] = float32(math.Round(r.NormFloat64()*3*1024) / 1024)
				if j >= sh.split {
					row[j] += boost
				}
			}
			c := backend.Choice{Split: int32(sh.split), Probe: -1}
			for j := range r.IntN(5) {
				lo := r.Int32N(int32(V))
				c.Cut[j] = [2]int32{lo, lo + r.Int32N(int32(V)-lo+1)}
			}
			lo := r.Int32N(int32(len(drop)) + 1)
			c.Drop = [2]int32{lo, lo + r.Int32N(int32(len(drop))-lo+1)}
			switch i % 13 {
			case 1:
				c.Probe = r.Int32N(int32(V))
			case 2:
				c.Split = int32(V) // no group
			case 3: // a NaN that a cut removes
				c.Cut[0] = [2]int32{5, 9}
				row[7] = float32(math.NaN())
			case 4: // one that nothing removes
				c.Cut[0] = [2]int32{}
				row[V/2] = float32(math.NaN())
				c.Drop = [2]int32{0, 0}
			case 5: // nothing left
				c.Cut[0] = [2]int32{0, int32(V)}
			case 6: // the probe sees a +Inf that a cut removes: refused
				c.Cut[0] = [2]int32{10, 11}
				row[10] = float32(math.Inf(1))
				c.Probe = 3
			case 7, 8: // a draw at a temperature (with a probe)
				c.Temperature, c.Random = float32(0.3+r.Float64()), r.Uint64()
				if i%13 == 8 {
					c.Probe = r.Int32N(int32(V))
				}
			case 9: // the whole row a group
				c.Split = 0
			case 10: // fewer tokens left than wanted
				c.Cut = [4][2]int32{{0, 20}, {23, int32(V)}}
			case 11: // the largest values +0 and -0, either first, and a group whose probabilities are below float32's normal range
				c.Cut = [4][2]int32{}
				for j := range row {
					row[j] = -float32(j%7) - 1
				}
				row[V/3], row[V/2] = float32(math.Copysign(0, float64(i%2*2-1))), float32(math.Copysign(0, float64(1-i%2*2)))
				for j := sh.split; j < V; j++ {
					row[j] = -95 - float32(j%3)
				}
			case 12: // a draw with nearly all cut
				c.Cut = [4][2]int32{{0, 20}, {23, int32(V)}}
				c.Temperature, c.Random = 0.7, r.Uint64()
			}
			choices[i] = c
		}
		lg := alloc(t, b, lead+sh.rows, V, x)
		k := sh.k
		rows, ids, logp := make([]backend.Chosen, sh.rows), make([]int32, sh.rows*k), make([]float32, sh.rows*k)
		if err := ch.Choose(lg, lead, choices, drop, k, rows, ids, logp); err != nil {
			t.Fatalf("vocab %d: %v", V, err)
		}
		host := slices.Clone(x[lead*V:])
		wrows, wids, wlogp := make([]backend.Chosen, sh.rows), make([]int32, sh.rows*k), make([]float32, sh.rows*k)
		if err := backend.ChooseRows(host, V, choices, drop, k, wrows, wids, wlogp); err != nil {
			t.Fatal(err)
		}
		forced, refused, drawn := 0, 0, 0
		for i, c := range choices {
			m, grouped := forcing(x[(lead+i)*V:(lead+i+1)*V], c, drop)
			if grouped && math.Abs(m) < 1e-4 || c.Temperature > 0 && wrows[i].N > 0 && drawMargin(host[i*V:(i+1)*V], c.Random) < 1e-5 {
				continue
			}
			g, w := rows[i], wrows[i]
			if w.N < 0 {
				refused++
			} else if grouped && m > 0 {
				forced++
			}
			if c.Temperature > 0 && w.N > 0 {
				drawn++
			}
			near := func(a, b float32) bool {
				return a == b || math.Abs(float64(a-b)) <= 1e-5+1e-6*math.Abs(float64(b))
			}
			if g.N != w.N || g.Group != w.Group || !near(g.Share, w.Share) || !near(g.Probe, w.Probe) {
				t.Errorf("vocab %d, row %d (%+v): %+v, want %+v", V, i, c, g, w)
				continue
			}
			for j := range k {
				if ids[i*k+j] != wids[i*k+j] || !near(logp[i*k+j], wlogp[i*k+j]) {
					t.Errorf("vocab %d, row %d, token %d: %d (%v), want %d (%v)", V, i, j, ids[i*k+j], logp[i*k+j], wids[i*k+j], wlogp[i*k+j])
				}
			}
		}
		t.Logf("vocab %d: %d rows, %d refused, %d with their group forced, %d drawn", V, sh.rows, refused, forced, drawn)
		if refused == 0 || forced == 0 || drawn == 0 {
			t.Errorf("vocab %d: %d rows refused, %d with their group forced, %d drawn: the cases are not all there", V, refused, forced, drawn)
		}
		// Argument checks: rows past the tensor, a bad filter, a bad k.
		for _, bad := range []func() error{
			func() error { return ch.Choose(lg, lead+1, choices, drop, k, rows, ids, logp) },
			func() error {
				cs := slices.Clone(choices)
				cs[0].Cut[0] = [2]int32{-1, 3}
				return ch.Choose(lg, lead, cs, drop, k, rows, ids, logp)
			},
			func() error { return ch.Choose(lg, lead, choices, []int32{int32(V)}, k, rows, ids, logp) },
			func() error { return ch.Choose(lg, lead, choices, drop, k+1, rows, ids, logp) },
			func() error { return ch.Choose(lg, lead, choices, drop, backend.MaxChooseK+1, rows, ids, logp) },
		} {
			if bad() == nil {
				t.Errorf("vocab %d: bad arguments accepted", V)
			}
		}
	}
}

// drawMargin is how far a draw with random falls from a boundary between two tokens, relative to
// the total, over log-probabilities lp (float64 sums in id order).
func drawMargin(lp []float32, random uint64) float64 {
	total := 0.0
	for _, v := range lp {
		total += math.Exp(float64(v))
	}
	target := float64(random<<11>>11) / (1 << 53) * total
	run, m := 0.0, math.Inf(1)
	for _, v := range lp {
		run += math.Exp(float64(v))
		m = min(m, math.Abs(run-target)/total)
	}
	return m
}

// forcing returns log Σ exp over a row's group minus the largest log-probability below it, in
// float64 (the group is forced when it is above 0), after the row's temperature, and whether the
// row has a group and is not refused.
func forcing(row []float32, c backend.Choice, drop []int32) (float64, bool) {
	s := int(c.Split)
	y := slices.Clone(row)
	if c.Temperature > 0 {
		backend.ScaleRow(y, c.Temperature)
	}
	if s >= len(y) || !backend.FilterRow(y, backend.Choice{Cut: c.Cut, Drop: c.Drop, Split: int32(len(y)), Probe: -1}, drop) {
		return 0, false
	}
	mx := math.Inf(-1)
	for _, v := range y[s:] {
		mx = max(mx, float64(v))
	}
	if math.IsInf(mx, -1) {
		return mx, true // nothing left in the group: never forced
	}
	sum := 0.0
	for _, v := range y[s:] {
		sum += math.Exp(float64(v) - mx)
	}
	below := math.Inf(-1)
	for _, v := range y[:s] {
		below = max(below, float64(v))
	}
	return mx + math.Log(sum) - below, true
}
