//go:build cuda && cgo && !nocgo

package cuda

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// logitsOn uploads rows×vocab seeded normal logits (scale 3) and returns them with the tensor.
func logitsOn(t *testing.T, b *Backend, rows, vocab int, seed uint64) (*Tensor, []float32) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	v := make([]float32, rows*vocab)
	for i := range v {
		v[i] = float32(r.NormFloat64() * 3)
	}
	x, err := b.Alloc(tensor.F32, rows, vocab)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { x.Close() })
	if err := b.Write(x, 0, v); err != nil {
		t.Fatal(err)
	}
	return x.(*Tensor), v
}

func openGPU(t *testing.T) *Backend {
	t.Helper()
	gpu(t)
	b, err := New(Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestArgmax checks device argmax against the host's rule (backend.ArgmaxRows), including a tie
// (the lower index wins) and a NaN (the row refused), on vocabularies that are not multiples of
// the block size. The conformance suite checks the rest of the contract.
func TestArgmax(t *testing.T) {
	b := openGPU(t)
	for _, vocab := range []int{1, 7, 1025, 32003} {
		x, v := logitsOn(t, b, 5, vocab, uint64(vocab))
		if vocab > 10 {
			v[3] = float32(math.NaN())
			v[vocab+9], v[vocab+vocab-1] = 50, 50 // row 1: a tie
			if err := b.Write(x, 0, v); err != nil {
				t.Fatal(err)
			}
		}
		ids := make([]int32, 5)
		if err := b.Argmax(x, 0, ids); err != nil {
			t.Fatal(err)
		}
		want := make([]int32, 5)
		if err := backend.ArgmaxRows(v, vocab, want); err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			if id != want[i] {
				t.Errorf("vocab %d row %d: argmax %d, want %d", vocab, i, id, want[i])
			}
		}
	}
}

// TestDraw checks device draws: temperature 0 and top-k 1 give the argmax; draws from the same
// row land on the top-k tokens at their softmax frequencies; the same random draws give the same
// ids; rows of many shapes agree with the host rule (backend.DrawRows) but for a draw within
// rounding of a boundary; and a row with a NaN gets -1.
func TestDraw(t *testing.T) {
	b := openGPU(t)
	const rows, vocab = 4000, 997
	x, v := logitsOn(t, b, 1, vocab, 7)
	// The same row 4000 times, so that one call makes 4000 draws.
	big, err := b.Alloc(tensor.F32, rows, vocab)
	if err != nil {
		t.Fatal(err)
	}
	defer big.Close()
	all := make([]float32, 0, rows*vocab)
	for i := 0; i < rows; i++ {
		all = append(all, v...)
	}
	if err := b.Write(big, 0, all); err != nil {
		t.Fatal(err)
	}
	order := make([]int, vocab)
	for i := range order {
		order[i] = i
	}
	sort.Slice(order, func(i, j int) bool { return v[order[i]] > v[order[j]] })
	r := rand.New(rand.NewPCG(3, 4))
	draws := make([]backend.Draw, rows)
	for i := range draws {
		draws[i] = backend.Draw{Temperature: 1, TopK: 4, TopP: 1, Random: r.Uint64()}
	}
	one := []int32{0}
	for _, d := range []backend.Draw{{TopP: 1}, {Temperature: 1, TopK: 1, TopP: 1}, {Temperature: 1, TopP: 1e-6}, {Temperature: 5, TopK: 1, TopP: 0.5}} {
		d.Random = r.Uint64()
		if err := b.Draw(x, 0, []backend.Draw{d}, one); err != nil {
			t.Fatal(err)
		}
		if int(one[0]) != order[0] {
			t.Errorf("%+v: drew %d, want the argmax %d", d, one[0], order[0])
		}
	}
	const topK = 4
	ids := make([]int32, rows)
	if err := b.Draw(big, 0, draws, ids); err != nil {
		t.Fatal(err)
	}
	p := make([]float64, topK)
	sum := 0.0
	for i := range p {
		p[i] = math.Exp(float64(v[order[i]] - v[order[0]]))
		sum += p[i]
	}
	count := make([]int, topK)
	for _, id := range ids {
		rank := -1
		for i := 0; i < topK; i++ {
			if int(id) == order[i] {
				rank = i
			}
		}
		if rank < 0 {
			t.Fatalf("drew %d, outside the top %d %v", id, topK, order[:topK])
		}
		count[rank]++
	}
	for i := range p {
		pi := p[i] / sum
		sd := math.Sqrt(rows * pi * (1 - pi))
		if d := math.Abs(float64(count[i]) - rows*pi); d > 5*sd+1 {
			t.Errorf("rank %d drawn %d times in %d, want %.1f ± %.1f", i, count[i], rows, rows*pi, 5*sd)
		}
	}
	again := make([]int32, rows)
	if err := b.Draw(big, 0, draws, again); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids, again) {
		t.Fatal("the same random draws gave different ids")
	}

	// Many rows, each its own parameters, against the host rule.
	const n = 256
	lg, lv := logitsOn(t, b, n, vocab, 11)
	for i := range draws[:n] {
		draws[i] = backend.Draw{Temperature: []float32{0, 0.3, 1, 2.5}[i%4], TopK: []int32{0, 1, 7, 40, 996}[i%5],
			TopP: []float32{1, 0.95, 0.5, 0.05}[i%7%4], MinP: []float32{0, 0, 0.05, 0.3}[i%11%4], Random: r.Uint64()}
	}
	got, want := make([]int32, n), make([]int32, n)
	if err := b.Draw(lg, 0, draws[:n], got); err != nil {
		t.Fatal(err)
	}
	if err := backend.DrawRows(lv, vocab, draws[:n], want); err != nil {
		t.Fatal(err)
	}
	diff := 0
	for i := range got {
		if got[i] != want[i] {
			diff++
			t.Logf("row %d (%+v): device %d, host %d", i, draws[i], got[i], want[i])
		}
	}
	if diff > 1 {
		t.Errorf("%d of %d rows drew differently from the host rule", diff, n)
	}
	// Rows from an offset, and a NaN.
	lv[3*vocab+5] = float32(math.NaN())
	if err := b.Write(lg, 0, lv); err != nil {
		t.Fatal(err)
	}
	if err := b.Draw(lg, 3, draws[:2], got[:2]); err != nil {
		t.Fatal(err)
	}
	if got[0] != -1 {
		t.Errorf("a row with a NaN drew %d, want -1", got[0])
	}
	if err := backend.DrawRows(lv[4*vocab:5*vocab], vocab, draws[1:2], want[:1]); err != nil {
		t.Fatal(err)
	}
	if got[1] != want[0] {
		t.Errorf("row 4 from an offset: %d, want %d", got[1], want[0])
	}
}

// TestBeamStep checks one beam step against a float64 reference: scores are the running score
// plus the log-softmax, within float32 rounding of the log-sum-exp (a few units in the last
// place of values of size ~10: 1e-4).
func TestBeamStep(t *testing.T) {
	b := openGPU(t)
	const beams, vocab, k = 3, 5003, 6
	x, v := logitsOn(t, b, beams, vocab, 11)
	scores := []float32{-1.5, -0.25, -3}
	type cand struct {
		beam, tok int
		s         float64
	}
	var cands []cand
	for bi := 0; bi < beams; bi++ {
		row := v[bi*vocab : (bi+1)*vocab]
		mx := math.Inf(-1)
		for _, e := range row {
			mx = math.Max(mx, float64(e))
		}
		se := 0.0
		for _, e := range row {
			se += math.Exp(float64(e) - mx)
		}
		lse := mx + math.Log(se)
		for j, e := range row {
			cands = append(cands, cand{bi, j, float64(scores[bi]) + float64(e) - lse})
		}
	}
	sort.SliceStable(cands, func(i, j int) bool { return cands[i].s > cands[j].s })
	beam, tok := make([]int32, k), make([]int32, k)
	sc, norm := make([]float32, k), make([]float32, k)
	const length, penalty = 7, 0.6
	if err := b.BeamStep(x, scores, length, penalty, beam, tok, sc, norm); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < k; i++ {
		w := cands[i]
		if int(beam[i]) != w.beam || int(tok[i]) != w.tok || math.Abs(float64(sc[i])-w.s) > 1e-4 {
			t.Errorf("candidate %d: beam %d token %d score %v, want beam %d token %d score %.6f", i, beam[i], tok[i], sc[i], w.beam, w.tok, w.s)
		}
		if wn := w.s / math.Pow(length, penalty); math.Abs(float64(norm[i])-wn) > 1e-4 {
			t.Errorf("candidate %d: normalised score %v, want %.6f", i, norm[i], wn)
		}
	}
}

// TestTF32 checks that the default backend (TF32 on) multiplies F32 weights within TF32's
// bound: inputs rounded to 10-bit mantissas, relative error 2^-10 per product (2^-11 for each
// of the two inputs), accumulated in F32: |err| <= 2^-10 * sum|w*x| plus F32 summation.
func TestTF32(t *testing.T) {
	b := openGPU(t)
	const n, m, k = 17, 33, 256
	r := rand.New(rand.NewPCG(3, 4))
	wv, xv := make([]float32, m*k), make([]float32, n*k)
	for i := range wv {
		wv[i] = float32(r.NormFloat64())
	}
	for i := range xv {
		xv[i] = float32(r.NormFloat64())
	}
	w, err := b.Load(tensor.F32, m, k, unsafeBytes(wv))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	x, _ := b.Alloc(tensor.F32, n, k)
	defer x.Close()
	dst, _ := b.Alloc(tensor.F32, n, m)
	defer dst.Close()
	if err := b.Write(x, 0, xv); err != nil {
		t.Fatal(err)
	}
	if err := b.MatMul(dst, x, w); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, n*m)
	if err := b.Read(dst, 0, got); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < n; i++ {
		for j := 0; j < m; j++ {
			var dot, abs float64
			for l := 0; l < k; l++ {
				p := float64(xv[i*k+l]) * float64(wv[j*k+l])
				dot += p
				abs += math.Abs(p)
			}
			if d := math.Abs(float64(got[i*m+j]) - dot); d > (0x1p-10+float64(k+2)*0x1p-24)*abs {
				t.Fatalf("[%d, %d] = %v, want %v (TF32 bound %.3g)", i, j, got[i*m+j], dot, (0x1p-10+float64(k+2)*0x1p-24)*abs)
			}
		}
	}
	var _ backend.Backend = b
}
