package backendtest

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// The operations of streaming codecs and flow-matching heads: Mul and Reshape.

// testMul checks Mul against the float64 product, with b of a's rows and with one row, inputs at
// a row offset and the output between guards. Bound: one rounding of the exact product,
// |got - a·b| <= u·|a·b| (the inputs keep their products far from float32's subnormals). In
// place (dst = a; dst = b when b has a's rows) must give the same bits.
func testMul(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	for _, d := range widths {
		for _, n := range []int{1, 3, 17, 300} {
			for _, brows := range []int{n, 1} {
				name := fmt.Sprintf("Mul n=%d d=%d b_rows=%d", n, d, brows)
				r := rng(name)
				av, bv := randVec(r, n*d, 2), randVec(r, brows*d, 1)
				a, bt := alloc(t, b, n, d, av), allocView(t, b, brows, d, bv)
				dst, g := output(t, b, n, d)
				must(t, b.Mul(dst, a, bt), "%s", name)
				want := make([]float64, n*d)
				for i := range want {
					want[i] = float64(av[i]) * float64(bv[(i/d%brows)*d+i%d])
				}
				got := read(t, b, dst)
				compare(t, name, d, got, want, func(i int) float64 { return math.Abs(want[i]) * u })
				g.check(t)

				must(t, b.Mul(a, a, bt), "%s in place (dst = a)", name)
				sameBits(t, name+" in place (dst = a)", d, read(t, b, a), got)
				if brows == n {
					a2 := alloc(t, b, n, d, av)
					must(t, b.Mul(bt, a2, bt), "%s in place (dst = b)", name)
					sameBits(t, name+" in place (dst = b)", d, read(t, b, bt), got)
				}
			}
		}
	}
}

// testReshape checks that Reshape reads and writes its tensor's elements in row-major order, of
// a whole tensor and of a view, that products read the new rows (also right after a product of
// the old ones, which a backend may have converted once), and that it refuses what it must.
func testReshape(t *testing.T, b backend.Backend, newBackend func() (backend.Backend, error)) {
	const rows, cols = 6, 64
	r := rng("reshape")
	vals := randVec(r, rows*cols, 1)
	x := alloc(t, b, rows, cols, vals)
	for _, s := range [][2]int{{12, 32}, {rows * cols, 1}, {1, rows * cols}, {3, 2 * cols}, {rows, cols}} {
		v, err := b.Reshape(x, s[0], s[1])
		must(t, err, "Reshape [%d, %d] into %v", rows, cols, s)
		if v.Rows() != s[0] || v.Cols() != s[1] || v.DType() != tensor.F32 {
			t.Fatalf("Reshape into %v: [%d, %d] %v", s, v.Rows(), v.Cols(), v.DType())
		}
		sameBits(t, fmt.Sprintf("Reshape into %v", s), s[1], read(t, b, v), vals)
		must(t, v.Close(), "Close the reshaped tensor")
	}
	sameBits(t, "the tensor after its reshaped forms are closed", cols, read(t, b, x), vals)

	// Writes through a reshaped view of rows 1..4 land in those rows.
	view, err := b.View(x, 1, 4)
	must(t, err, "View")
	defer view.Close()
	rv, err := b.Reshape(view, 8, cols/2)
	must(t, err, "Reshape of a view")
	defer rv.Close()
	sameBits(t, "Reshape of a view", cols/2, read(t, b, rv), vals[cols:5*cols])
	must(t, b.Scale(rv, rv, 2), "Scale through the reshaped view")
	want := append([]float32(nil), vals...)
	for i := cols; i < 5*cols; i++ {
		want[i] *= 2
	}
	sameBits(t, "the tensor after Scale through a reshaped view", cols, read(t, b, x), want)

	// Products of x [6, 64] and of the same memory as [12, 32], each against the float64 sum
	// (the second reads activations a backend may have converted for the first).
	for _, dt := range []tensor.DType{tensor.F32, tensor.Q8_0} {
		const m = 5
		w64data, w64 := quantRows(t, dt, m, cols, randVec(r, m*cols, 1))
		w32data, w32 := quantRows(t, dt, m, cols/2, randVec(r, m*cols/2, 1))
		wa, wb := load(t, b, dt, m, cols, w64data), load(t, b, dt, m, cols/2, w32data)
		xr, err := b.Reshape(x, 2*rows, cols/2)
		must(t, err, "Reshape")
		out1, out2 := alloc(t, b, rows, m, nil), alloc(t, b, 2*rows, m, nil)
		must(t, b.MatMul(out1, x, wa), "MatMul of x %v", dt)
		must(t, b.MatMul(out2, xr, wb), "MatMul of x reshaped %v", dt)
		for _, c := range []struct {
			name string
			out  backend.Tensor
			w    []float64
			k    int
		}{{"x", out1, w64, cols}, {"x reshaped", out2, w32, cols / 2}} {
			ref, tol := matmulRef(dt, len(want)/c.k, m, c.k, want, c.w)
			compare(t, fmt.Sprintf("MatMul %v of %s", dt, c.name), m, read(t, b, c.out), ref, func(i int) float64 { return tol[i] })
		}
		must(t, xr.Close(), "Close")
	}

	// Refusals, in the words of the shared check where it is one.
	for _, s := range [][2]int{{rows, cols + 1}, {-rows, -cols}, {0, 0}, {rows * cols, 0}, {math.MaxInt / 2, 4}} {
		want := backend.CheckReshape(x, s[0], s[1])
		if want == nil {
			t.Fatalf("CheckReshape accepts [%d, %d] into %v", rows, cols, s)
		}
		_, got := b.Reshape(x, s[0], s[1])
		if got == nil || !strings.HasSuffix(got.Error(), ": "+want.Error()) {
			t.Errorf("Reshape into %v: error %v, want %q after the backend's name", s, got, want)
		}
	}
	other := open(t, newBackend)
	h, err := b.Alloc(tensor.F16, rows, cols)
	must(t, err, "Alloc F16")
	defer h.Close()
	qdata, _ := quantRows(t, tensor.Q8_0, 2, cols, randVec(r, 2*cols, 1))
	closed := alloc(t, b, rows, cols, nil)
	closed.Close()
	for _, c := range []struct {
		name string
		t    backend.Tensor
	}{{"an F16 tensor", h}, {"a quantised tensor", load(t, b, tensor.Q8_0, 2, cols, qdata)}, {"a closed tensor", closed},
		{"a tensor of another backend", alloc(t, other, rows, cols, nil)}, {"a fake tensor", fakeTensor{tensor.F32, rows, cols}}, {"nil", nil}} {
		mustFail(t, "Reshape of "+c.name, func() error { _, err := b.Reshape(c.t, cols, rows); return err })
	}
	parent := alloc(t, b, rows, cols, vals)
	rp, err := b.Reshape(parent, cols, rows)
	must(t, err, "Reshape")
	parent.Close()
	mustFail(t, "Read of the reshaped form of a closed tensor", func() error { return b.Read(rp, 0, make([]float32, rows)) })
}

// testCodecErrors checks Mul's argument checks (the shared check's words after the backend's
// name), its refusal of outputs that partly overlap an input and of operands that are not the
// backend's live F32 tensors, and that it allocates nothing in steady state.
func testCodecErrors(t *testing.T, b backend.Backend, newBackend func() (backend.Backend, error)) {
	const n, d = 3, 32
	r := rng("codec errors")
	x := alloc(t, b, n, d, randVec(r, n*d, 1))
	dst := alloc(t, b, n, d, nil)
	row := alloc(t, b, 1, d, randVec(r, d, 1))
	wide := alloc(t, b, n, d+1, nil)
	must(t, b.Mul(dst, x, x), "Mul with good arguments")
	must(t, b.Mul(dst, x, row), "Mul with a gain row")
	for _, c := range []struct {
		name         string
		dst, a, gain backend.Tensor
	}{{"dst shape", wide, x, row}, {"b rows neither 1 nor a's", dst, x, alloc(t, b, 2, d, nil)}, {"b cols", dst, x, alloc(t, b, 1, d+1, nil)}} {
		want := backend.CheckMul(c.dst, c.a, c.gain)
		got := b.Mul(c.dst, c.a, c.gain)
		if want == nil || got == nil || !strings.HasSuffix(got.Error(), ": "+want.Error()) {
			t.Errorf("Mul %s: error %v, want %v after the backend's name", c.name, got, want)
		}
	}

	parent := alloc(t, b, n+1, d, randVec(r, (n+1)*d, 1))
	v0, err := b.View(parent, 0, n)
	must(t, err, "View")
	defer v0.Close()
	v1, err := b.View(parent, 1, n)
	must(t, err, "View")
	defer v1.Close()
	mustFail(t, "Mul with dst one row past a", func() error { return b.Mul(v1, v0, x) })
	mustFail(t, "Mul with dst one row past b", func() error { return b.Mul(v1, x, v0) })
	pv, err := b.View(parent, 0, 1)
	must(t, err, "View")
	defer pv.Close()
	mustFail(t, "Mul with dst over the gain row", func() error { return b.Mul(v0, x, pv) })

	other := open(t, newBackend)
	qdata, _ := quantRows(t, tensor.Q8_0, n, d, randVec(r, n*d, 1))
	wq := load(t, b, tensor.Q8_0, n, d, qdata)
	fdata, _ := quantRows(t, tensor.F32, n, d, randVec(r, n*d, 1))
	wf := load(t, b, tensor.F32, n, d, fdata)
	closed := alloc(t, b, n, d, nil)
	closed.Close()
	foreign := alloc(t, other, n, d, nil)
	mustFail(t, "Mul of a quantised tensor", func() error { return b.Mul(dst, wq, x) })
	mustFail(t, "Mul into loaded weights", func() error { return b.Mul(wf, x, x) })
	mustFail(t, "Mul of a closed tensor", func() error { return b.Mul(dst, x, closed) })
	mustFail(t, "Mul into a tensor of another backend", func() error { return b.Mul(foreign, x, x) })
	mustFail(t, "Mul of a fake tensor", func() error { return b.Mul(dst, fakeTensor{tensor.F32, n, d}, x) })
	mustFail(t, "Mul of nil", func() error { return b.Mul(dst, x, nil) })
	must(t, b.Mul(x, x, row), "Mul after the refusals")

	if raceEnabled {
		return
	}
	out := make([]float32, d)
	run := func() {
		if e := b.Mul(dst, x, row); e != nil && err == nil {
			err = e
		}
		if e := b.Read(dst, 0, out); e != nil && err == nil {
			err = e
		}
	}
	err = nil
	run()
	must(t, err, "Mul")
	if a := testing.AllocsPerRun(20, run); a != 0 {
		t.Errorf("Mul of [%d, %d]: %v allocations per call, want 0", n, d, a)
	}
}
