package backendtest

import (
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// funcCase is an elementwise function's float64 reference and the bound on a backend's error,
// written per function: tol(x, want) bounds |got - want| for the float32 input x.
type funcCase struct {
	ref func(x float64) float64
	tol func(x, want float64) float64
	// max, when not 0, is the largest input the function is checked at: larger inputs are
	// clamped to it, where the result (times GLU's up) would overflow float32.
	max float32
}

// inputs are funcInputs, within c.max.
func (c funcCase) inputs(name string, n, d int) []float32 {
	v := funcInputs(name, n, d)
	if c.max != 0 {
		for i := range v {
			v[i] = min(v[i], c.max)
		}
	}
	return v
}

// floor is the absolute error allowed everywhere: results below float32's normal range
// (1.2e-38) may be flushed to 0 by an exp that stops there.
const floor = 1e-37

// expUlps bounds the relative error of the float32 exponentials the functions are computed with:
// the vector kernels' polynomial (2 ulp of expf), internal/vec's Expf, libm's and CUDA's expf
// (1 to 2 ulp) are all within it.
const expUlps = 8 * u

// funcCases holds every function of tensor.Func. The bounds assume float32 arithmetic with an exp
// within expUlps, and libm's (or CUDA's) tanh, erfc and expm1 or polynomials of a few ulp; u is
// float32's unit roundoff.
var funcCases = map[tensor.Func]funcCase{
	// max(x, 0) is exact.
	tensor.ReLU: {
		ref: func(x float64) float64 { return math.Max(x, 0) },
		tol: func(x, want float64) float64 { return 0 },
	},
	// x/(1+e^-x): the exp's error reaches the result scaled by σ(-x) < 1; a sum, a quotient.
	tensor.SiLU: {
		ref: func(x float64) float64 { return x / (1 + math.Exp(-x)) },
		tol: func(x, want float64) float64 { return math.Abs(want)*(expUlps+4*u) + floor },
	},
	tensor.Sigmoid: {
		ref: func(x float64) float64 { return 1 / (1 + math.Exp(-x)) },
		tol: func(x, want float64) float64 { return math.Abs(want)*(expUlps+4*u) + floor },
	},
	// Near 0 an odd polynomial (Cephes: 2.4 ulp) or libm; beyond, 1 - 2/(e^2|x| + 1), where the
	// exp's error is at most halved.
	tensor.Tanh: {
		ref: math.Tanh,
		tol: func(x, want float64) float64 { return math.Abs(want)*(expUlps+8*u) + floor },
	},
	// The tanh form, with testGELU's bound.
	tensor.GELU: {
		ref: func(x float64) float64 { g, _ := geluRef([]float32{float32(x)}); return g[0] },
		tol: func(x, want float64) float64 { return geluTol(x, want) },
	},
	// 0.5·x·erfc(-x/√2). A float32 erfc computed as t·exp(-z² + P(t)), z = |x|·fl(1/√2): z is
	// off by 1.5 u, z² by 3 u (1.5·x² u absolute), the exponent's rounding adds 0.5·x² u, so the
	// exp is off by 2·x² u relative besides its own error; the fit 1.2e-7 (2 u), t and P(t) a few
	// u. For x > 0, erfc(-z) = 2 - erfc(z) loses less. Then two products.
	tensor.GELUErf: {
		ref: func(x float64) float64 { return 0.5 * x * math.Erfc(-x/math.Sqrt2) },
		tol: func(x, want float64) float64 {
			return math.Abs(want)*((2*x*x+20)*u+expUlps) + floor
		},
	},
	// x above 0 (exact), else e^x - 1: a polynomial or libm's expm1 near 0 (1.3 ulp), beyond it
	// exp - 1, where the exp's error grows by e^x/(1-e^x) <= 1.6.
	tensor.ELU: {
		ref: func(x float64) float64 {
			if x > 0 {
				return x
			}
			return math.Expm1(x)
		},
		tol: func(x, want float64) float64 { return math.Abs(want)*(2*expUlps+8*u) + floor },
	},
	// e^x to within the exp's bound; results below float32's normal range may be flushed to 0.
	tensor.Exp: {
		ref: math.Exp,
		tol: func(x, want float64) float64 { return math.Abs(want)*(expUlps+u) + floor },
		max: 80,
	},
}

// geluTol is testGELU's bound for the input x of the tanh form of GELU, whose value is want.
func geluTol(x, want float64) float64 {
	y := math.Sqrt(2/math.Pi) * (x + 0.044715*x*x*x)
	sig := 1 / (1 + math.Exp(2*y)) // σ(-2y)
	return math.Abs(want)*(sig*(10*math.Abs(y)*u+expRel)+6*u) + 4*u*math.Abs(x) + 1e-38
}

// funcInputs returns n*d inputs for the functions: values from N(0, 3²), and at the end the
// places where the forms change (0.5, 0.625), values near 0, and tails where exponentials
// overflow or underflow in float32.
func funcInputs(name string, n, d int) []float32 {
	v := randVec(rng(name), n*d, 3)
	tails := []float32{-1e20, -100, -88.5, -30, -10.5, -5.25, -0.625, -0.5, -1e-4, 3e-5, 0.62, 0.5, 5.25, 10.5, 30, 88.5, 100, 1e20}
	for i := 0; i < len(v) && i < len(tails); i++ {
		v[len(v)-1-i] = tails[i]
	}
	return v
}

// funcShapes are the shapes the functions are checked at: odd widths, model widths, and one
// large enough for every backend to split among threads.
var funcShapes = func() [][2]int {
	var s [][2]int
	for _, d := range widths {
		for _, n := range []int{1, 3, 17} {
			s = append(s, [2]int{n, d})
		}
	}
	return append(s, [2]int{50, 1536})
}()

// testUnary checks Unary for every function the backend states against the float64 reference on
// fresh random inputs and the tails, with each function's bound; in place equal to out of
// place; guard regions intact. Every function of tensor.Func must have a case here.
func testUnary(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	caps := backend.CapabilitiesOf(b)
	for _, f := range tensor.Funcs() {
		c, ok := funcCases[f]
		if !ok {
			t.Errorf("%v: no reference and bound in the conformance suite", f)
			continue
		}
		if !caps.Funcs.Has(f) {
			t.Logf("%s does not state %v", b.Name(), f)
			continue
		}
		t.Run(f.String(), func(t *testing.T) {
			for _, sh := range funcShapes {
				n, d := sh[0], sh[1]
				name := fmt.Sprintf("Unary %v n=%d d=%d", f, n, d)
				xv := c.inputs(name, n, d)
				x := alloc(t, b, n, d, xv)
				if n == 3 {
					x = allocView(t, b, n, d, xv)
				}
				dst, g := output(t, b, n, d)
				must(t, b.Unary(dst, x, f), "%s", name)
				got := read(t, b, dst)
				want := make([]float64, len(xv))
				for i, v := range xv {
					want[i] = c.ref(float64(v))
				}
				compare(t, name, d, got, want, func(i int) float64 { return c.tol(float64(xv[i]), want[i]) })
				g.check(t)
				must(t, b.Unary(x, x, f), "%s in place", name)
				for i, v := range read(t, b, x) {
					if v != got[i] {
						t.Fatalf("%s in place: element [%d, %d] = %v, out of place %v", name, i/d, i%d, v, got[i])
					}
				}
			}
		})
	}
}

// testGLU checks GLU for every function the backend states: f(gate)*up against the float64
// reference, with the function's bound times |up| and one rounding of the product; in place on
// gate and on up equal to out of place.
func testGLU(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	caps := backend.CapabilitiesOf(b)
	for _, f := range tensor.Funcs() {
		c, ok := funcCases[f]
		if !ok || !caps.Funcs.Has(f) {
			continue // testUnary reports it
		}
		t.Run(f.String(), func(t *testing.T) {
			for _, sh := range funcShapes {
				n, d := sh[0], sh[1]
				name := fmt.Sprintf("GLU %v n=%d d=%d", f, n, d)
				gv, uv := c.inputs(name, n, d), randVec(rng(name+" up"), n*d, 2)
				gt, ut := alloc(t, b, n, d, gv), alloc(t, b, n, d, uv)
				dst, g := output(t, b, n, d)
				must(t, b.GLU(dst, gt, ut, f), "%s", name)
				got := read(t, b, dst)
				want := make([]float64, len(gv))
				for i, v := range gv {
					want[i] = c.ref(float64(v)) * float64(uv[i])
				}
				compare(t, name, d, got, want, func(i int) float64 {
					x := float64(gv[i])
					return c.tol(x, c.ref(x))*math.Abs(float64(uv[i])) + math.Abs(want[i])*u + floor
				})
				g.check(t)
				for _, in := range []struct {
					name string
					t    backend.Tensor
				}{{"gate", gt}, {"up", ut}} {
					must(t, b.GLU(in.t, gt, ut, f), "%s in place on %s", name, in.name)
					for i, v := range read(t, b, in.t) {
						if v != got[i] {
							t.Fatalf("%s in place on %s: element [%d, %d] = %v, out of place %v", name, in.name, i/d, i%d, v, got[i])
						}
					}
					must(t, b.Write(gt, 0, gv), "Write gate")
					must(t, b.Write(ut, 0, uv), "Write up")
				}
			}
		})
	}
	// The named units are the generic operations with their function, bit for bit.
	const n, d = 3, 100
	gv, uv := funcInputs("named units", n, d), randVec(rng("named units up"), n*d, 2)
	gt, ut := alloc(t, b, n, d, gv), alloc(t, b, n, d, uv)
	for _, c := range []struct {
		name           string
		f              tensor.Func
		named, generic func(dst backend.Tensor) error
	}{
		{"SwiGLU", tensor.SiLU, func(dst backend.Tensor) error { return b.SwiGLU(dst, gt, ut) },
			func(dst backend.Tensor) error { return b.GLU(dst, gt, ut, tensor.SiLU) }},
		{"GeGLU", tensor.GELU, func(dst backend.Tensor) error { return b.GeGLU(dst, gt, ut) },
			func(dst backend.Tensor) error { return b.GLU(dst, gt, ut, tensor.GELU) }},
		{"GELU", tensor.GELU, func(dst backend.Tensor) error { return b.GELU(dst, gt) },
			func(dst backend.Tensor) error { return b.Unary(dst, gt, tensor.GELU) }},
	} {
		if !caps.Funcs.Has(c.f) {
			continue
		}
		named, generic := alloc(t, b, n, d, nil), alloc(t, b, n, d, nil)
		must(t, c.named(named), "%s", c.name)
		must(t, c.generic(generic), "%s as the generic operation", c.name)
		want := read(t, b, generic)
		for i, v := range read(t, b, named) {
			if v != want[i] {
				t.Fatalf("%s: element [%d, %d] = %v, the generic operation with %v %v", c.name, i/d, i%d, v, c.f, want[i])
			}
		}
	}
}

// testFuncErrors checks that a function the backend does not state is refused with
// ErrUnsupported, and a value that is no function with an error.
func testFuncErrors(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	caps := backend.CapabilitiesOf(b)
	x, dst := alloc(t, b, 2, 8, randVec(rng("func errors"), 16, 1)), alloc(t, b, 2, 8, nil)
	for _, f := range tensor.Funcs() {
		if caps.Funcs.Has(f) {
			continue
		}
		if err := b.Unary(dst, x, f); !errors.Is(err, backend.ErrUnsupported) {
			t.Errorf("Unary with %v, which %s does not state: %v, want an error wrapping ErrUnsupported", f, b.Name(), err)
		}
		if err := b.GLU(dst, x, x, f); !errors.Is(err, backend.ErrUnsupported) {
			t.Errorf("GLU with %v, which %s does not state: %v, want an error wrapping ErrUnsupported", f, b.Name(), err)
		}
	}
	for _, f := range []tensor.Func{0, -1, 1000} {
		mustFail(t, fmt.Sprintf("Unary with %v", f), func() error { return b.Unary(dst, x, f) })
		mustFail(t, fmt.Sprintf("GLU with %v", f), func() error { return b.GLU(dst, x, x, f) })
	}
}
