package purego

import (
	"math"

	"github.com/parleyhq/parley/internal/vec"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// The elementwise functions and gated units: applyFunc is the kernel switch, run over spans of
// elements split among the workers.

// applyFunc sets y = f(x), or f(x)*u where u is not nil (y, x and u of one length; y may be x or
// u), and reports whether it computes f. Called with empty slices it only answers.
func applyFunc(f tensor.Func, y, x, u []float32) bool {
	var fn func(float32) float32
	switch f {
	case tensor.ReLU:
		fn = relu
	case tensor.SiLU:
		fn = silu
	case tensor.Sigmoid:
		fn = sigmoid
	case tensor.Tanh:
		fn = tanh
	case tensor.GELU:
		if u == nil {
			gelu(y, x) // assembly where the CPU allows
			return true
		}
		fn = geluOne
	case tensor.GELUErf:
		fn = geluErf
	case tensor.ELU:
		fn = elu
	case tensor.Exp:
		fn = vec.Expf
	default:
		return false
	}
	y = y[:len(x)]
	if u == nil {
		for i, v := range x {
			y[i] = fn(v)
		}
		return true
	}
	u = u[:len(x)]
	for i, v := range x {
		y[i] = fn(v) * u[i]
	}
	return true
}

// The scalar forms: float32 arithmetic and vec.Expf where the other backends' kernels use a
// float32 exp, float64 from package math and one rounding for tanh, erfc and expm1.

func relu(x float32) float32 {
	if x > 0 {
		return x
	}
	return 0
}

func silu(x float32) float32    { return x / (1 + vec.Expf(-x)) }
func sigmoid(x float32) float32 { return 1 / (1 + vec.Expf(-x)) }
func tanh(x float32) float32    { return float32(math.Tanh(float64(x))) }

// geluErf is 0.5·x·erfc(-x/√2): erfc, not 1 + erf, keeps the relative precision of the small
// values of negative x.
func geluErf(x float32) float32 {
	v := float64(x)
	return float32(0.5 * v * math.Erfc(-v/math.Sqrt2))
}

func elu(x float32) float32 {
	if x > 0 {
		return x
	}
	return float32(math.Expm1(float64(x)))
}

// geluC is sqrt(2/pi); geluA the cubic coefficient of the tanh form.
const (
	geluC = 0.7978845608028654
	geluA = 0.044715
)

// geluOne is 0.5*x*(1 + tanh(u)), u = sqrt(2/pi)*(x + 0.044715*x^3), computed in float32 as
// x / (1 + exp(-2u)), the same quantity without the cancellation of 1 + tanh(u) for negative x:
// where exp(-2u) overflows the result is -0, where it underflows it is x.
func geluOne(x float32) float32 {
	u := geluC * x * (1 + geluA*x*x)
	return x / (1 + vec.Expf(-2*u))
}

// gelu sets y = geluOne(x) elementwise; y may be x. Assembly where the CPU allows
// (simd_amd64.go), geluGo elsewhere.
var gelu = geluGo

func geluGo(y, x []float32) {
	y = y[:len(x)]
	for i, v := range x {
		y[i] = geluOne(v)
	}
}

// funcs are the functions applyFunc computes.
var funcs = backend.SetOf(func() []tensor.Func {
	var fs []tensor.Func
	for _, f := range tensor.Funcs() {
		if applyFunc(f, nil, nil, nil) {
			fs = append(fs, f)
		}
	}
	return fs
}()...)

// funcJob applies a function over units of chunk elements.
type funcJob struct {
	f       tensor.Func
	y, x, u []float32
	chunk   int
}

func (j *funcJob) unit(_, c int) {
	lo, hi := c*j.chunk, min((c+1)*j.chunk, len(j.x))
	var u []float32
	if j.u != nil {
		u = j.u[lo:hi]
	}
	applyFunc(j.f, j.y[lo:hi], j.x[lo:hi], u)
}

// runFunc applies f (one of funcs) to x into y, times u where u is not nil, on the caller alone
// when the elements are few; be.mu is held.
func (be *Backend) runFunc(f tensor.Func, y, x, u []float32) {
	be.xqFrom = nil // writes activations
	n := len(x)
	if n == 0 {
		return
	}
	j := &be.fn
	j.f, j.y, j.x, j.u, j.chunk = f, y, x, u, minParallelElems // a multiple of 8: gelu's tails stay at the end
	if n < minParallelElems {
		j.chunk = n
	}
	be.pool.do(j, (n+j.chunk-1)/j.chunk)
	*j = funcJob{}
}

// Unary: dst = f(x) elementwise. dst may be x.
func (be *Backend) Unary(dst, x backend.Tensor, f backend.Func) error {
	return be.unary("unary", dst, x, f)
}

// GELU: dst = 0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x^3))) elementwise, in float32 (Unary with
// tensor.GELU). dst may be x.
func (be *Backend) GELU(dst, x backend.Tensor) error { return be.unary("gelu", dst, x, tensor.GELU) }

func (be *Backend) unary(op string, dst, x backend.Tensor, f backend.Func) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	d, xt, err := be.ops.Unary(op, dst, x, f)
	if err != nil {
		return err
	}
	be.runFunc(f, d.f32, xt.f32, nil)
	return nil
}

// GLU: dst = f(gate) * up elementwise. dst may be gate or up.
func (be *Backend) GLU(dst, gate, up backend.Tensor, f backend.Func) error {
	return be.glu("glu", dst, gate, up, f)
}

// SwiGLU: dst = gate/(1+exp(-gate)) * up (GLU with tensor.SiLU).
func (be *Backend) SwiGLU(dst, gate, up backend.Tensor) error {
	return be.glu("swiglu", dst, gate, up, tensor.SiLU)
}

// GeGLU: dst = gelu(gate) * up, gelu as GELU's (GLU with tensor.GELU).
func (be *Backend) GeGLU(dst, gate, up backend.Tensor) error {
	return be.glu("geglu", dst, gate, up, tensor.GELU)
}

func (be *Backend) glu(op string, dst, gate, up backend.Tensor, f backend.Func) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	d, g, u, err := be.ops.GLU(op, dst, gate, up, f)
	if err != nil {
		return err
	}
	be.runFunc(f, d.f32, g.f32, u.f32)
	return nil
}
