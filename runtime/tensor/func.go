package tensor

import "fmt"

// Func names an elementwise function of one float: the function backend.Unary applies and
// backend.GLU gates with. The values are the native kernels' (native/include/parley_fn.h,
// PL_FN_*), which the bindings pass down as they are; 0 is no function.
type Func int32

// The functions. Each backend computes them in float32 within the bounds its conformance suite
// states per function (runtime/backend/backendtest).
const (
	ReLU    Func = 1 // max(x, 0)
	SiLU    Func = 2 // x·σ(x) = x/(1+e^-x) (Swish; SwiGLU's gate)
	Sigmoid Func = 3 // σ(x) = 1/(1+e^-x) (GLU's gate)
	Tanh    Func = 4 // tanh(x)
	GELU    Func = 5 // 0.5·x·(1+tanh(√(2/π)·(x+0.044715·x³))), the tanh form of ggml (GeGLU's gate)
	GELUErf Func = 6 // 0.5·x·(1+erf(x/√2)), the exact form (PyTorch's nn.GELU)
	ELU     Func = 7 // x for x > 0, e^x-1 otherwise (alpha 1)
	Exp     Func = 8 // e^x
)

var funcNames = [...]string{ReLU: "relu", SiLU: "silu", Sigmoid: "sigmoid", Tanh: "tanh", GELU: "gelu",
	GELUErf: "gelu_erf", ELU: "elu", Exp: "exp"}

// Known reports whether f is one of the functions above.
func (f Func) Known() bool { return f > 0 && int(f) < len(funcNames) && funcNames[f] != "" }

// String returns f's name ("silu"), or "func(N)" for an unknown value.
func (f Func) String() string {
	if f.Known() {
		return funcNames[f]
	}
	return fmt.Sprintf("func(%d)", int32(f))
}

// Funcs lists every function, in the order of their values.
func Funcs() []Func {
	fs := make([]Func, 0, len(funcNames))
	for f := range funcNames {
		if Func(f).Known() {
			fs = append(fs, Func(f))
		}
	}
	return fs
}
