package purego

import (
	"github.com/parleyhq/parley/internal/vec"
	"github.com/parleyhq/parley/runtime/backend"
)

// The elementwise functions and gated units.

// SwiGLU: dst = gate/(1+exp(-gate)) * up.
func (be *Backend) SwiGLU(dst, gate, up backend.Tensor) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	g, u, o, err := be.gluOperands("swiglu", dst, gate, up)
	if err != nil {
		return err
	}
	for i, v := range g {
		o[i] = v / (1 + vec.Expf(-v)) * u[i]
	}
	return nil
}

// GeGLU: dst = gelu(gate) * up, gelu as GELU's.
func (be *Backend) GeGLU(dst, gate, up backend.Tensor) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	g, u, o, err := be.gluOperands("geglu", dst, gate, up)
	if err != nil {
		return err
	}
	for i, v := range g {
		w := geluC * v * (1 + geluA*v*v)
		o[i] = v / (1 + vec.Expf(-2*w)) * u[i]
	}
	return nil
}

// gluOperands checks a gated activation's operands and returns their elements, gate's length
// each; be.mu is held.
func (be *Backend) gluOperands(op string, dst, gate, up backend.Tensor) (g, u, o []float32, err error) {
	d, gt, ut, err := be.ops.GLU(op, dst, gate, up)
	if err != nil {
		return nil, nil, nil, err
	}
	be.xqFrom = nil // writes activations
	return gt.f32, ut.f32[:len(gt.f32)], d.f32[:len(gt.f32)], nil
}

// geluC is sqrt(2/pi); geluA the cubic coefficient of the tanh form.
const (
	geluC = 0.7978845608028654
	geluA = 0.044715
)

// gelu sets y = 0.5*x*(1 + tanh(u)), u = sqrt(2/pi)*(x + 0.044715*x^3), computed in float32 as
// x / (1 + exp(-2u)), the same quantity without the cancellation of 1 + tanh(u) for negative x:
// where exp(-2u) overflows the result is -0, where it underflows it is x. y may be x. Assembly
// where the CPU allows (simd_amd64.go), geluGo elsewhere.
var gelu = geluGo

func geluGo(y, x []float32) {
	y = y[:len(x)]
	for i, v := range x {
		u := geluC * v * (1 + geluA*v*v)
		y[i] = v / (1 + vec.Expf(-2*u))
	}
}

// GELU: dst = 0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x^3))) element-wise, in float32.
func (be *Backend) GELU(dst, x backend.Tensor) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	d, xt, err := be.ops.Elementwise("gelu", dst, x)
	if err != nil {
		return err
	}
	be.xqFrom = nil // writes activations
	j := &be.rows
	j.op, j.dst32, j.x = opGELU, d.f32, xt.f32
	be.runRows(j, xt.rows, xt.cols)
	return nil
}
