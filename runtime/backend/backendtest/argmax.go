package backendtest

import (
	"fmt"
	"math"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// argmaxRef is Argmaxer's rule, element by element: the first index of the largest value, or
// -1 for a row with a NaN or +Inf or nothing above -Inf.
func argmaxRef(row []float32) int32 {
	best := -1
	for j, v := range row {
		if v != v || math.IsInf(float64(v), 1) {
			return -1
		}
		if v > float32(math.Inf(-1)) && (best < 0 || v > row[best]) {
			best = j
		}
	}
	return int32(best)
}

// testArgmax checks a backend's Argmax (where it is a backend.Argmaxer) against argmaxRef on
// random rows of several widths, with rows planted with a tie, a NaN, a +Inf, only -Inf, and
// zeros of both signs (either first) as the largest value, read from an offset row; and its
// argument checks.
func testArgmax(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	if !backend.Supports(b, backend.OpArgmax) {
		t.Skipf("%s is not a backend.Argmaxer", b.Name())
	}
	am := b.(backend.Argmaxer)
	const lead, rows = 2, 7
	inf := float32(math.Inf(1))
	for _, vocab := range []int{1, 7, 1025, 32003} {
		r := rng(fmt.Sprintf("argmax %d", vocab))
		v := randVec(r, (lead+rows)*vocab, 4)
		row := func(i int) []float32 { return v[(lead+i)*vocab : (lead+i+1)*vocab] }
		if vocab > 10 {
			tie := row(1)
			tie[vocab/3], tie[vocab-1] = 50, 50
			row(2)[vocab/2] = float32(math.NaN())
			row(3)[vocab-2] = inf
			z := row(5)
			for j := range z {
				z[j] = -1 - float32(j%5)
			}
			z[vocab/5], z[vocab/4] = float32(math.Copysign(0, -1)), 0 // -0 == +0: the first
			z = row(6)
			for j := range z {
				z[j] = -1 - float32(j%5)
			}
			z[vocab/5], z[vocab/4] = 0, float32(math.Copysign(0, -1)) // and the other way round
		}
		for j := range row(4) {
			row(4)[j] = -inf
		}
		x := alloc(t, b, lead+rows, vocab, v)
		for _, span := range [][2]int{{0, rows}, {3, 2}, {rows - 1, 1}} {
			ids := make([]int32, span[1])
			for i := range ids {
				ids[i] = -7
			}
			must(t, am.Argmax(x, lead+span[0], ids), "Argmax vocab %d rows %v", vocab, span)
			for i, id := range ids {
				if want := argmaxRef(row(span[0] + i)); id != want {
					t.Errorf("vocab %d row %d: argmax %d, want %d", vocab, span[0]+i, id, want)
				}
			}
		}
	}
	x := alloc(t, b, 3, 5, nil)
	mustFail(t, "Argmax past the last row", func() error { return am.Argmax(x, 2, make([]int32, 2)) })
	mustFail(t, "Argmax at a negative row", func() error { return am.Argmax(x, -1, make([]int32, 1)) })
	h, err := b.Alloc(tensor.F16, 3, 5)
	must(t, err, "Alloc(F16, 3, 5)")
	defer h.Close()
	mustFail(t, "Argmax of F16 rows", func() error { return am.Argmax(h, 0, make([]int32, 1)) })
}
