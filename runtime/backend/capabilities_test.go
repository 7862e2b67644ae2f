package backend

import (
	"slices"
	"testing"

	"github.com/parleyhq/parley/runtime/tensor"
)

func TestSet(t *testing.T) {
	s := SetOf(tensor.F32, tensor.BF16, tensor.Q8_0)
	if !s.Has(tensor.F32) || !s.Has(tensor.BF16) || !s.Has(tensor.Q8_0) || s.Has(tensor.F16) || s.Len() != 3 {
		t.Fatalf("SetOf(F32, BF16, Q8_0) = %v", s.Members())
	}
	if got := s.Members(); !slices.Equal(got, []tensor.DType{tensor.F32, tensor.Q8_0, tensor.BF16}) {
		t.Fatalf("Members() = %v, want [F32 Q8_0 BF16]", got)
	}
	if s.With(64) != s || s.Has(64) || s.Has(200) {
		t.Fatalf("a value from 64 on was added or found")
	}
	if d := DTypes(func(dt tensor.DType) bool { return dt.Quantized() }); d.Has(tensor.F32) || !d.Has(tensor.Q4_K) || d.Has(99) {
		t.Fatalf("DTypes(quantized) = %v", d.Members())
	}
}

// stated is a Backend that states capabilities and has none of the optional interfaces.
type stated struct {
	Backend
	caps Capabilities
}

func (s stated) Capabilities() Capabilities { return s.caps }

// argmaxing adds Argmaxer to a Backend.
type argmaxing struct{ stated }

func (argmaxing) Argmax(Tensor, int, []int32) error { return nil }

func TestCapabilitiesOf(t *testing.T) {
	caps := Capabilities{Ops: SetOf(OpRepack, OpDraw), Weights: SetOf(tensor.F32), KV: SetOf(tensor.F16)}
	c := CapabilitiesOf(stated{caps: caps})
	if c.Ops != 0 || c.Weights != caps.Weights || c.KV != caps.KV {
		t.Fatalf("CapabilitiesOf a backend without optional methods stating %v: ops %v, weights %v, caches %v",
			caps.Ops.Members(), c.Ops.Members(), c.Weights.Members(), c.KV.Members())
	}
	a := argmaxing{stated{caps: caps}}
	if c := CapabilitiesOf(a); c.Ops != SetOf(OpArgmax) || !Supports(a, OpArgmax) || Supports(a, OpRepack) {
		t.Fatalf("CapabilitiesOf an Argmaxer: ops %v", c.Ops.Members())
	}
	if len(Ops()) != int(numOps)-1 || Ops()[0] != OpMatMuls || OpFreeMemory.String() != "free memory" || Op(99).String() != "op(99)" {
		t.Fatalf("Ops() = %v", Ops())
	}
}
