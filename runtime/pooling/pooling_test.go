package pooling_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/parleyhq/parley/internal/modeltest"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/pooling"
)

func file(t *testing.T, set func(w *gguf.Writer)) *gguf.File {
	t.Helper()
	w := gguf.NewWriter()
	w.SetString("general.architecture", "bert")
	set(w)
	f := modeltest.Parse(t, w)
	return f
}

// TestRead: <arch>.pooling_type in llama.cpp's numbering, absent meaning Unspecified, and a value
// that is no pooling type refused.
func TestRead(t *testing.T) {
	for _, tc := range []struct {
		set  func(w *gguf.Writer)
		want pooling.Type
		err  bool
	}{
		{func(w *gguf.Writer) {}, pooling.Unspecified, false},
		{func(w *gguf.Writer) { w.SetUint32("bert.pooling_type", 0) }, pooling.None, false},
		{func(w *gguf.Writer) { w.SetUint32("bert.pooling_type", 1) }, pooling.Mean, false},
		{func(w *gguf.Writer) { w.SetUint32("bert.pooling_type", 2) }, pooling.CLS, false},
		{func(w *gguf.Writer) { w.SetInt32("bert.pooling_type", 3) }, pooling.Last, false},
		{func(w *gguf.Writer) { w.SetUint32("bert.pooling_type", 4) }, pooling.Rank, false},
		{func(w *gguf.Writer) { w.SetInt32("bert.pooling_type", -1) }, pooling.Unspecified, false},
		{func(w *gguf.Writer) { w.SetUint32("bert.pooling_type", 5) }, 0, true},
		{func(w *gguf.Writer) { w.SetString("bert.pooling_type", "cls") }, 0, true},
		{func(w *gguf.Writer) { w.SetUint32("qwen3.pooling_type", 2) }, pooling.Unspecified, false}, // another arch's key
	} {
		got, err := pooling.Read(file(t, tc.set), "bert")
		if (err != nil) != tc.err || err == nil && got != tc.want {
			t.Errorf("got %v, %v; want %v (error %v)", got, err, tc.want, tc.err)
		}
	}
}

func TestParseAndResolve(t *testing.T) {
	for _, ty := range []pooling.Type{pooling.None, pooling.Mean, pooling.CLS, pooling.Last, pooling.Rank} {
		if got, err := pooling.Parse(ty.String()); err != nil || got != ty {
			t.Errorf("Parse(%q) = %v, %v", ty.String(), got, err)
		}
	}
	for _, s := range []string{"", "unspecified", "max"} {
		if _, err := pooling.Parse(s); err == nil {
			t.Errorf("Parse(%q) accepted", s)
		}
	}
	if pooling.Resolve(pooling.Mean, pooling.CLS) != pooling.Mean || pooling.Resolve(pooling.Unspecified, pooling.CLS) != pooling.CLS ||
		pooling.Resolve(pooling.Unspecified, pooling.Unspecified) != pooling.None || pooling.Resolve(pooling.None, pooling.CLS) != pooling.None {
		t.Error("Resolve does not prefer the context's pooling, then the file's, then none")
	}
}

func TestRows(t *testing.T) {
	lens := []int{3, 1, 2}
	for _, tc := range []struct {
		ty   pooling.Type
		want []int32
	}{
		{pooling.CLS, []int32{0, 3, 4}},
		{pooling.Last, []int32{2, 3, 5}},
		{pooling.Mean, []int32{0, 1, 2, 3, 4, 5}},
		{pooling.None, []int32{0, 1, 2, 3, 4, 5}},
	} {
		got, err := pooling.Rows([]int32{99}, tc.ty, lens)
		if err != nil || !slices.Equal(got, append([]int32{99}, tc.want...)) {
			t.Errorf("%v: rows %v, %v; want 99 then %v", tc.ty, got, err, tc.want)
		}
		if c := pooling.Count(tc.ty, lens); tc.ty == pooling.None && c != 6 || tc.ty != pooling.None && c != 3 {
			t.Errorf("%v: count %d", tc.ty, c)
		}
	}
	for _, bad := range []struct {
		ty   pooling.Type
		lens []int
	}{{pooling.Rank, lens}, {pooling.Unspecified, lens}, {pooling.Type(42), lens}, {pooling.Mean, []int{2, 0}}, {pooling.CLS, []int{-1}}} {
		if _, err := pooling.Rows(nil, bad.ty, bad.lens); err == nil {
			t.Errorf("Rows(%v, %v) accepted", bad.ty, bad.lens)
		}
	}
}

// TestReduce: the mean of each sequence's rows as float64 computes it; CLS, last and none hand
// their rows over.
func TestReduce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	const dim = 7
	lens := []int{3, 1, 5}
	hidden := make([]float32, 9*dim)
	for i := range hidden {
		hidden[i] = float32(rng.NormFloat64() * 10)
	}
	out := make([]float32, 3*dim)
	if err := pooling.Reduce(out, hidden, dim, pooling.Mean, lens); err != nil {
		t.Fatal(err)
	}
	start := 0
	for s, l := range lens {
		for j := range dim {
			var sum float64
			for r := start; r < start+l; r++ {
				sum += float64(hidden[r*dim+j])
			}
			if want := sum / float64(l); math.Abs(float64(out[s*dim+j])-want) > 1e-6*math.Max(1, math.Abs(want)) {
				t.Fatalf("sequence %d, element %d: mean %v, want %v", s, j, out[s*dim+j], want)
			}
		}
		start += l
	}
	picked := hidden[:3*dim]
	if err := pooling.Reduce(out, picked, dim, pooling.CLS, lens); err != nil || !slices.Equal(out, picked) {
		t.Fatalf("cls: %v", err)
	}
	all := make([]float32, len(hidden))
	if err := pooling.Reduce(all, hidden, dim, pooling.None, lens); err != nil || !slices.Equal(all, hidden) {
		t.Fatalf("none: %v", err)
	}
	for _, bad := range []struct {
		dst, hidden []float32
		ty          pooling.Type
	}{
		{out, hidden, pooling.CLS},          // too many hidden rows for CLS
		{out[:dim], hidden, pooling.Mean},   // dst too small
		{out, hidden[:8*dim], pooling.Mean}, // hidden too small
		{make([]float32, len(hidden)), hidden, pooling.Rank},
	} {
		if err := pooling.Reduce(bad.dst, bad.hidden, dim, bad.ty, lens); err == nil {
			t.Errorf("Reduce(%d values into %d, %v) accepted", len(bad.hidden), len(bad.dst), bad.ty)
		}
	}
}

// TestNormalize: each norm scales a row to 1 in that norm (max-abs: to 32760), computed in
// float64 from the float32 row; a zero row stays zero; none leaves rows alone.
func TestNormalize(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	const dim = 384
	row := make([]float32, dim)
	for i := range row {
		row[i] = float32(rng.NormFloat64() * 0.3)
	}
	norm := func(x []float32, p float64) float64 {
		var s float64
		for _, v := range x {
			s += math.Pow(math.Abs(float64(v)), p)
		}
		return math.Pow(s, 1/p)
	}
	for _, tc := range []struct {
		n    pooling.Norm
		size func(x []float32) float64
		want float64
	}{
		{pooling.NormEuclidean, func(x []float32) float64 { return norm(x, 2) }, 1},
		{pooling.NormTaxicab, func(x []float32) float64 { return norm(x, 1) }, 1},
		{pooling.Norm(3), func(x []float32) float64 { return norm(x, 3) }, 1},
		{pooling.NormMaxAbs, func(x []float32) float64 {
			m := 0.0
			for _, v := range x {
				m = math.Max(m, math.Abs(float64(v)))
			}
			return m
		}, 32760},
	} {
		x := append(append([]float32(nil), row...), make([]float32, dim)...) // a row, then a zero row
		if err := pooling.Normalize(x, dim, tc.n); err != nil {
			t.Fatal(err)
		}
		if got := tc.size(x[:dim]); math.Abs(got-tc.want) > 1e-6*tc.want {
			t.Errorf("norm %d: size %v after normalising, want %v", tc.n, got, tc.want)
		}
		if slices.ContainsFunc(x[dim:], func(v float32) bool { return v != 0 }) {
			t.Errorf("norm %d: a zero row is no longer zero", tc.n)
		}
		// Every element is scaled by the same factor.
		k := float64(x[0]) / float64(row[0])
		for i := range row {
			if math.Abs(float64(x[i])-float64(row[i])*k) > 1e-6*math.Abs(float64(x[i])) {
				t.Fatalf("norm %d: element %d = %v, want %v*%v", tc.n, i, x[i], row[i], k)
			}
		}
	}
	x := append([]float32(nil), row...)
	if err := pooling.Normalize(x, dim, pooling.NormNone); err != nil || !slices.Equal(x, row) {
		t.Errorf("none changed the row (%v)", err)
	}
	for _, bad := range []struct {
		n   pooling.Norm
		dim int
	}{{pooling.Norm(-2), dim}, {pooling.NormEuclidean, 0}, {pooling.NormEuclidean, dim - 1}} {
		if err := pooling.Normalize(x, bad.dim, bad.n); err == nil {
			t.Errorf("Normalize(%d values, dim %d, %d) accepted", len(x), bad.dim, bad.n)
		}
	}
}
