package backend

import (
	"math"
	"math/rand/v2"
	"testing"
)

// random returns the Draw.Random whose u is k/2^24.
func random(k uint64) uint64 { return k << 40 }

// TestDrawRows checks the host rule of Drawer: temperature 0 and top-k 1 take the argmax; over
// equal logits the token is floor(u·V); ties at the top-k boundary are all kept; top-p keeps the
// smallest top set reaching its mass and min-p the likely enough, both at temperature 1; draws land at the softmax frequencies; rows with a NaN,
// a +Inf or nothing above -Inf get -1; parameters out of range are errors.
func TestDrawRows(t *testing.T) {
	inf := float32(math.Inf(1))
	one := func(x []float32, d Draw) int32 {
		t.Helper()
		ids := []int32{0}
		if err := DrawRows(x, len(x), []Draw{d}, ids); err != nil {
			t.Fatal(err)
		}
		return ids[0]
	}
	x := []float32{0.5, 3, -1, 2.9, 3, 0}
	if id := one(x, Draw{TopP: 1}); id != 1 {
		t.Errorf("temperature 0: %d, want 1 (the first of the largest)", id)
	}
	if id := one(x, Draw{Temperature: 1, TopK: 1, TopP: 1, Random: random(1<<24 - 1)}); id != 1 && id != 4 {
		t.Errorf("top-k 1: %d, want one of the two largest", id)
	}
	flat := make([]float32, 1000)
	for _, k := range []uint64{0, 1, 5<<20 + 3, 1<<23 + 1, 1<<24 - 1} {
		u := float64(k) / (1 << 24)
		if id := one(flat, Draw{Temperature: 0.7, TopP: 1, Random: random(k)}); int(id) != int(u*1000) {
			t.Errorf("equal logits, u = %v: %d, want %d", u, id, int(u*1000))
		}
	}
	// top-k 2 over [5, 3, 3, 3, 0]: the three 3s tie at the boundary and are all kept, so a draw
	// past the first two candidates' mass lands on index 3.
	tie := []float32{5, 3, 3, 3, 0}
	m0, m1 := 1.0, math.Exp(-2)
	u := (m0 + 2*m1 + 0.5*m1) / (m0 + 3*m1)
	if id := one(tie, Draw{Temperature: 1, TopK: 2, TopP: 1, Random: random(uint64(u * (1 << 24)))}); id != 3 {
		t.Errorf("top-k ties: %d, want 3", id)
	}
	// top-p: masses 1, e^-1, e^-2, ... of [3, 2, 1, 0, -1]; 0.5 keeps the first alone (0.58 of
	// the mass), 0.7 the first two.
	dec := []float32{3, 2, 1, 0, -1}
	for _, c := range []struct {
		p    float32
		kept int
	}{{0.5, 1}, {0.7, 2}, {1, 5}} {
		seen := map[int32]bool{}
		for k := uint64(0); k < 1<<24; k += 1 << 16 {
			seen[one(dec, Draw{Temperature: 1, TopP: c.p, Random: random(k)})] = true
		}
		if len(seen) != c.kept || !seen[0] {
			t.Errorf("top-p %v: drew %v, want the first %d", c.p, seen, c.kept)
		}
	}
	// The candidates are chosen at temperature 1: top-p 0.5 keeps only the first of dec however
	// flat the temperature makes the draw, and min-p e^-1.5 keeps the logits within 1.5 of the
	// largest.
	for k := uint64(0); k < 1<<24; k += 1 << 18 {
		if id := one(dec, Draw{Temperature: 50, TopP: 0.5, Random: random(k)}); id != 0 {
			t.Fatalf("top-p 0.5 at temperature 50: drew %d, want 0", id)
		}
	}
	seen := map[int32]bool{}
	for k := uint64(0); k < 1<<24; k += 1 << 16 {
		seen[one(dec, Draw{Temperature: 3, TopP: 1, MinP: float32(math.Exp(-1.5)), Random: random(k)})] = true
	}
	if len(seen) != 2 || !seen[0] || !seen[1] {
		t.Errorf("min-p e^-1.5: drew %v, want 0 and 1", seen)
	}
	// Frequencies: top-k 3 of a row at temperature 2.
	row := []float32{1, 4, 2, 3.5, -2, 3}
	r := rand.New(rand.NewPCG(1, 2))
	const n = 20000
	count := map[int32]int{}
	for range n {
		count[one(row, Draw{Temperature: 2, TopK: 3, TopP: 1, Random: r.Uint64()})]++
	}
	z := []float64{math.Exp(4.0 / 2), math.Exp(3.5 / 2), math.Exp(3.0 / 2)}
	sum := z[0] + z[1] + z[2]
	for i, id := range []int32{1, 3, 5} {
		p := z[i] / sum
		sd := math.Sqrt(n * p * (1 - p))
		if d := math.Abs(float64(count[id]) - n*p); d > 5*sd {
			t.Errorf("token %d drawn %d times in %d, want %.0f ± %.0f", id, count[id], n, n*p, 5*sd)
		}
	}
	if len(count) != 3 {
		t.Errorf("drew %v, want only the top three", count)
	}
	for _, bad := range [][]float32{{1, float32(math.NaN()), 2}, {1, inf, 2}, {-inf, -inf}} {
		if id := one(bad, Draw{Temperature: 1, TopP: 1}); id != -1 {
			t.Errorf("%v: %d, want -1", bad, id)
		}
	}
	if err := DrawRows([]float32{1, 2}, 2, []Draw{{}}, []int32{0}); err != nil {
		t.Errorf("the zero Draw (the argmax): %v", err)
	}
	for _, d := range []Draw{{Temperature: -1, TopP: 1}, {Temperature: inf, TopP: 1}, {Temperature: 1, TopP: 0}, {Temperature: 1, TopP: 1.5}, {Temperature: 1, TopK: -1, TopP: 1}, {Temperature: 1, TopP: 1, MinP: -0.1}, {Temperature: 1, TopP: 1, MinP: 2}} {
		if err := DrawRows([]float32{1, 2}, 2, []Draw{d}, []int32{0}); err == nil {
			t.Errorf("%+v: no error", d)
		}
	}
}

// FuzzDraw feeds DrawRows arbitrary logits (NaN, infinities and subnormals included) and
// parameters: it never panics, refuses out-of-range parameters with an error, and otherwise
// gives -1 exactly for rows with a NaN, a +Inf or nothing above -Inf, the argmax at temperature
// 0 or top-k 1, and else a token whose logit is finite.
func FuzzDraw(f *testing.F) {
	f.Add([]byte{0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64}, float32(0.8), int32(2), float32(0.9), float32(0.05), uint64(12345))
	f.Add([]byte{0, 0, 128, 127, 0, 0, 0, 0}, float32(1), int32(0), float32(1), float32(0), uint64(1<<63))
	f.Add([]byte{0, 0, 128, 255, 0, 0, 128, 255}, float32(2), int32(1), float32(0.5), float32(1), uint64(7))
	f.Fuzz(func(t *testing.T, raw []byte, temp float32, topK int32, topP, minP float32, random uint64) {
		n := len(raw) / 4
		if n == 0 || n > 4096 {
			return
		}
		x := floatsOf(raw)
		d := Draw{Temperature: temp, TopK: topK, TopP: topP, MinP: minP, Random: random}
		ids := []int32{0}
		err := DrawRows(x, n, []Draw{d}, ids)
		if bad := CheckDraws([]Draw{d}); (err != nil) != (bad != nil) {
			t.Fatalf("%+v: DrawRows error %v, CheckDraws %v", d, err, bad)
		}
		if err != nil {
			return
		}
		want := []int32{0}
		if err := ArgmaxRows(x, n, want); err != nil {
			t.Fatal(err)
		}
		id := ids[0]
		switch {
		case want[0] < 0:
			if id != -1 {
				t.Fatalf("%v: drew %d from a row ArgmaxRows refuses", x, id)
			}
		case temp == 0 || topK == 1:
			if temp == 0 && id != want[0] || id < 0 || x[id] != x[want[0]] {
				t.Fatalf("%+v over %v: %d, want the argmax %d", d, x, id, want[0])
			}
		case id < 0 || int(id) >= n || math.IsInf(float64(x[id]), 0) || x[id] != x[id]:
			t.Fatalf("%+v over %v: drew %d", d, x, id)
		}
	})
}

// floatsOf reads raw as little-endian float32s (a fuzzer's bytes as logits: NaNs, infinities and
// subnormals included), len(raw)/4 of them.
func floatsOf(raw []byte) []float32 {
	x := make([]float32, len(raw)/4)
	for i := range x {
		x[i] = math.Float32frombits(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24)
	}
	return x
}
