package backend

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// refChoose is Choose's rule in float64, written out directly: the row divided by the
// temperature, the filtered row's log-softmax, the group's forcing, the k best ids (the lower
// first among equals) or the id drawn, the group's best id and share, the probe. margin is the
// smaller of the forcing's and the draw's distances to their thresholds (the latter relative to
// the total).
func refChoose(x []float32, c Choice, drop []int32, k int) (ids []int32, lp []float64, r Chosen, margin float64) {
	n := len(x)
	y := make([]float64, n)
	for i, v := range x {
		y[i] = float64(v)
	}
	lse := func(v []float64) float64 {
		m := math.Inf(-1)
		for _, e := range v {
			m = max(m, e)
		}
		s := 0.0
		for _, e := range v {
			s += math.Exp(e - m)
		}
		return m + math.Log(s)
	}
	if c.Probe >= 0 {
		r.Probe = float32(y[c.Probe] - lse(y))
	}
	if c.Temperature > 0 {
		for i := range y {
			y[i] /= float64(c.Temperature)
		}
	}
	for _, cut := range c.Cut {
		for i := cut[0]; i < cut[1]; i++ {
			y[i] = math.Inf(-1)
		}
	}
	for _, id := range drop[c.Drop[0]:c.Drop[1]] {
		y[id] = math.Inf(-1)
	}
	l := lse(y)
	for i := range y {
		y[i] -= l
	}
	s := int(c.Split)
	margin = math.Inf(1)
	if s < n {
		g, below := lse(y[s:]), math.Inf(-1)
		for _, v := range y[:s] {
			below = max(below, v)
		}
		margin = math.Abs(g - below)
		if g > below {
			for i := range y[:s] {
				y[i] = math.Inf(-1)
			}
		}
	}
	if c.Temperature > 0 {
		total := 0.0
		for _, v := range y {
			total += math.Exp(v)
		}
		target := float64(c.Random<<11>>11) / (1 << 53) * total
		run, id := 0.0, -1
		for i, v := range y {
			run += math.Exp(v)
			margin = min(margin, math.Abs(run-target)/total)
			if id < 0 && run > target {
				id = i
			}
		}
		if id < 0 {
			id = n - 1
		}
		for id > 0 && math.IsInf(y[id], -1) {
			id--
		}
		if total > 0 {
			ids, lp = []int32{int32(id)}, []float64{y[id]}
			r.N = 1
		}
	}
	order := make([]int32, 0, n)
	for i, v := range y {
		if !math.IsInf(v, -1) {
			order = append(order, int32(i))
		}
	}
	slices.SortStableFunc(order, func(a, b int32) int {
		switch {
		case y[a] > y[b]:
			return -1
		case y[a] < y[b]:
			return 1
		}
		return 0
	})
	order = order[:min(k, len(order))]
	if c.Temperature == 0 {
		for _, id := range order {
			lp = append(lp, y[id])
		}
		ids, r.N = order, int32(len(order))
	}
	r.Group = -1
	best, sum := 0.0, 0.0
	for i := s; i < n; i++ {
		p := math.Exp(y[i])
		sum += p
		if p > best {
			best, r.Group = p, int32(i)
		}
	}
	r.Share = float32(best / (sum + 1e-10))
	return ids, lp, r, margin
}

// TestChooseRows compares ChooseRows with refChoose on fresh random rows and filters: logits on a
// grid of 1/1024 (distinct ones are never within rounding of each other; equal ones test the
// order of ties), groups made strong enough to be forced in some rows, up to four cuts, a range
// of a drop list and a probe. Tolerance: 1e-5 on log-probabilities and shares (float32 values
// after a float64 sum).
func TestChooseRows(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	const cols, split, k, nrows = 300, 250, 5, 64
	drop := make([]int32, 20)
	for i := range drop {
		drop[i] = int32(rng.IntN(cols))
	}
	x := make([]float32, nrows*cols)
	choices := make([]Choice, nrows)
	for r := range choices {
		boost := float32(rng.IntN(3)) * 2.5 // sometimes the group wins
		for i := range cols {
			v := float32(math.Round(rng.NormFloat64()*2*1024) / 1024)
			if i >= split {
				v += boost
			}
			x[r*cols+i] = v
		}
		c := Choice{Split: split, Probe: -1}
		for j := range rng.IntN(5) {
			lo := rng.Int32N(cols)
			c.Cut[j] = [2]int32{lo, lo + rng.Int32N(cols-lo+1)}
		}
		lo := rng.Int32N(int32(len(drop)) + 1)
		c.Drop = [2]int32{lo, lo + rng.Int32N(int32(len(drop))-lo+1)}
		if r%3 == 0 {
			c.Probe = rng.Int32N(cols)
		}
		if r%7 == 0 {
			c.Split = cols // no group
		}
		if r%4 == 1 {
			c.Temperature, c.Random = float32(0.25+rng.Float64()), rng.Uint64()
		}
		choices[r] = c
	}
	orig := slices.Clone(x)
	rows := make([]Chosen, nrows)
	ids := make([]int32, nrows*k)
	logp := make([]float32, nrows*k)
	if err := ChooseRows(x, cols, choices, drop, k, rows, ids, logp); err != nil {
		t.Fatal(err)
	}
	forced, drawn := 0, 0
	for r, c := range choices {
		wid, wlp, wr, margin := refChoose(orig[r*cols:(r+1)*cols], c, drop, k)
		if margin < 1e-4 {
			continue // forcing within rounding
		}
		if c.Split < cols && len(wid) > 0 && wid[0] >= split && c.Temperature == 0 {
			forced++
		}
		if c.Temperature > 0 {
			drawn++
		}
		g := rows[r]
		if g.N != wr.N || g.Group != wr.Group || math.Abs(float64(g.Share-wr.Share)) > 1e-5 || math.Abs(float64(g.Probe-wr.Probe)) > 1e-5 {
			t.Errorf("row %d (%+v): %+v, want %+v", r, c, g, wr)
			continue
		}
		for i := range k {
			id, lp := ids[r*k+i], logp[r*k+i]
			if i >= len(wid) {
				if id != -1 || !math.IsInf(float64(lp), -1) {
					t.Errorf("row %d, token %d past the %d found: %d (%v)", r, i, len(wid), id, lp)
				}
				continue
			}
			if id != wid[i] || math.Abs(float64(lp)-wlp[i]) > 1e-5 {
				t.Errorf("row %d, token %d: %d (%v), want %d (%v)", r, i, id, lp, wid[i], wlp[i])
			}
		}
	}
	if forced == 0 || drawn == 0 {
		t.Errorf("%d rows had their group forced, %d drew: the cases are not all there", forced, drawn)
	}
}

// TestChooseRowsRefuses: rows with a NaN or +Inf that no filter removes, or nothing left above
// -Inf, give N -1 (before filtering where the row has a probe); a NaN that a filter removes does
// not; and out-of-range arguments are errors.
func TestChooseRowsRefuses(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	ninf := -inf
	cases := []struct {
		x    []float32
		c    Choice
		want int32
	}{
		{[]float32{1, nan, 2, 0}, Choice{Split: 4, Probe: -1}, -1},
		{[]float32{1, inf, 2, 0}, Choice{Split: 4, Probe: -1}, -1},
		{[]float32{ninf, ninf, ninf, ninf}, Choice{Split: 4, Probe: -1}, -1},
		{[]float32{1, 3, 2, 0}, Choice{Cut: [4][2]int32{{0, 4}}, Split: 4, Probe: -1}, -1},
		{[]float32{1, nan, 2, 0}, Choice{Cut: [4][2]int32{{1, 2}}, Split: 4, Probe: -1}, 3},
		{[]float32{1, nan, 2, 0}, Choice{Drop: [2]int32{0, 1}, Split: 4, Probe: -1}, 3},
		{[]float32{1, nan, 2, 0}, Choice{Cut: [4][2]int32{{1, 2}}, Split: 4, Probe: 0}, -1},
		{[]float32{1, 5, 9, 0}, Choice{Split: 2, Probe: -1}, 2}, // the group (ids 2, 3) is forced: ids 0, 1 are cut
		{[]float32{1, 5, 2, 0}, Choice{Split: 2, Probe: -1}, 3}, // id 1 is above the whole group
	}
	for _, tc := range cases {
		rows, ids, lp := make([]Chosen, 1), make([]int32, 3), make([]float32, 3)
		if err := ChooseRows(slices.Clone(tc.x), len(tc.x), []Choice{tc.c}, []int32{1}, 3, rows, ids, lp); err != nil {
			t.Fatal(err)
		}
		if rows[0].N != tc.want {
			t.Errorf("%v, %+v: %d tokens, want %d", tc.x, tc.c, rows[0].N, tc.want)
		}
	}
	ok := Choice{Split: 4, Probe: -1}
	for _, bad := range []struct {
		c    Choice
		drop []int32
		k    int
	}{
		{ok, nil, 0}, {ok, nil, 5}, {ok, []int32{4}, 1}, {ok, []int32{-1}, 1},
		{Choice{Cut: [4][2]int32{{0, 5}}, Split: 4, Probe: -1}, nil, 1},
		{Choice{Cut: [4][2]int32{{-1, 2}}, Split: 4, Probe: -1}, nil, 1},
		{Choice{Drop: [2]int32{0, 2}, Split: 4, Probe: -1}, []int32{1}, 1},
		{Choice{Drop: [2]int32{1, 0}, Split: 4, Probe: -1}, []int32{1}, 1},
		{Choice{Split: 5, Probe: -1}, nil, 1}, {Choice{Split: -1, Probe: -1}, nil, 1},
		{Choice{Split: 4, Probe: 4}, nil, 1}, {Choice{Split: 4, Probe: -2}, nil, 1},
	} {
		rows, ids, lp := make([]Chosen, 1), make([]int32, bad.k), make([]float32, bad.k)
		if err := ChooseRows([]float32{1, 2, 3, 4}, 4, []Choice{bad.c}, bad.drop, bad.k, rows, ids, lp); err == nil {
			t.Errorf("%+v, drop %v, k %d: no error", bad.c, bad.drop, bad.k)
		}
	}
	if err := ChooseRows([]float32{1, 2, 3, 4}, 4, []Choice{ok}, nil, 1, make([]Chosen, 1), make([]int32, 2), make([]float32, 1)); err == nil {
		t.Error("wrong output sizes: no error")
	}
	// A cut with lo >= hi is empty, whatever its ends.
	if err := ChooseRows([]float32{1, 2, 3, 4}, 4, []Choice{{Cut: [4][2]int32{{9, 3}}, Split: 4, Probe: -1}}, nil, 1, make([]Chosen, 1), make([]int32, 1), make([]float32, 1)); err != nil {
		t.Errorf("empty cut: %v", err)
	}
}

// FuzzChooseRows feeds ChooseRows arbitrary logits (NaN, infinities and subnormals included) and
// filters: it never panics, errs exactly when CheckChoices does, and otherwise reports at most k
// distinct tokens that no filter removed, each with the log-probability its row was left with,
// most probable first (the lower id first among equals), then -1 and -Inf.
func FuzzChooseRows(f *testing.F) {
	f.Add([]byte{0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64, 0, 0, 0, 0}, int32(0), int32(1), int32(0), int32(1), int32(2), int32(-1), uint8(2), float32(0), uint64(0))
	f.Add([]byte{0, 0, 128, 127, 0, 0, 0, 0, 0, 0, 192, 127}, int32(1), int32(1), int32(0), int32(0), int32(3), int32(0), uint8(1), float32(0.7), uint64(1<<62))
	f.Add([]byte{0, 0, 128, 255, 0, 0, 128, 255}, int32(0), int32(2), int32(1), int32(1), int32(0), int32(1), uint8(3), float32(1e-30), uint64(99))
	f.Fuzz(func(t *testing.T, raw []byte, cutLo, cutHi, dropLo, dropHi, split, probe int32, k uint8, temp float32, random uint64) {
		n := len(raw) / 4
		if n == 0 || n > 4096 {
			return
		}
		x := floatsOf(raw)
		drop := []int32{int32(n / 2), 0, int32(n - 1)}
		c := Choice{Cut: [4][2]int32{{cutLo, cutHi}}, Drop: [2]int32{dropLo, dropHi}, Split: split, Probe: probe, Temperature: temp, Random: random}
		kk := int(k)
		rows, ids, lp := make([]Chosen, 1), make([]int32, kk), make([]float32, kk)
		y := slices.Clone(x)
		err := ChooseRows(y, n, []Choice{c}, drop, kk, rows, ids, lp)
		if bad := CheckChoices([]Choice{c}, drop, n, kk); (err != nil) != (bad != nil) {
			t.Fatalf("%+v, k %d: ChooseRows error %v, CheckChoices %v", c, kk, err, bad)
		}
		if err != nil {
			return
		}
		r := rows[0]
		if r.N < -1 || int(r.N) > kk || temp > 0 && r.N > 1 {
			t.Fatalf("%d tokens of %d (temperature %v)", r.N, kk, temp)
		}
		removed := func(id int32) bool {
			if id >= c.Cut[0][0] && id < c.Cut[0][1] {
				return true
			}
			return slices.Contains(drop[c.Drop[0]:c.Drop[1]], id)
		}
		for i := range kk {
			id, v := ids[i], lp[i]
			if i >= int(max(r.N, 0)) {
				if id != -1 || !math.IsInf(float64(v), -1) {
					t.Fatalf("token %d past the %d found: %d (%v)", i, r.N, id, v)
				}
				continue
			}
			if id < 0 || int(id) >= n || removed(id) || v != y[id] || math.IsInf(float64(v), 0) || v != v {
				t.Fatalf("%+v over %v: token %d is %d (%v)", c, x, i, id, v)
			}
			if temp > 0 {
				continue
			}
			if i > 0 && (v > lp[i-1] || v == lp[i-1] && id < ids[i-1]) {
				t.Fatalf("%+v over %v: tokens out of order: %v %v", c, x, ids, lp)
			}
		}
		if r.N > 0 && temp == 0 {
			// nothing left out ranks above the last token taken
			last := lp[r.N-1]
			for id, v := range y {
				if !slices.Contains(ids[:r.N], int32(id)) && !math.IsInf(float64(v), -1) && (v > last || v == last && int32(id) < ids[r.N-1]) {
					t.Fatalf("%+v over %v: id %d (%v) left out of %v %v", c, x, id, v, ids, lp)
				}
			}
		}
	})
}
