package backendtest

import (
	"errors"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// testCapabilities checks that what a backend says it computes (backend.CapabilitiesOf) is what
// it does: every weight type it states loads and multiplies, every other one of WeightDTypes
// (and a type no backend computes) is refused with ErrUnsupported; likewise the cache types of
// NewKV; and the optional operations are those whose interfaces it implements.
func testCapabilities(t *testing.T, b backend.Backend, _ func() (backend.Backend, error)) {
	caps := backend.CapabilitiesOf(b)
	t.Logf("%s: optional operations %v, functions %v, weights %v, caches %v", b.Name(), caps.Ops.Members(), caps.Funcs.Members(), caps.Weights.Members(), caps.KV.Members())
	if caps.Weights.Len() == 0 || !caps.Weights.Has(tensor.F32) {
		t.Errorf("weight types %v: F32 missing", caps.Weights.Members())
	}
	const m, k = 3, 256
	r := rng("capabilities")
	x := alloc(t, b, 1, k, randVec(r, k, 1))
	for _, dt := range append(WeightDTypes, tensor.IQ2_XXS) {
		data := make([]byte, m*rowSize(t, dt, k)) // IQ2_XXS: zeros, which no backend reads
		if dt != tensor.IQ2_XXS {
			data, _ = quantRows(t, dt, m, k, randVec(r, m*k, 1))
		}
		w, err := b.Load(dt, m, k, data)
		if !caps.Weights.Has(dt) {
			if err == nil {
				w.Close()
				t.Errorf("Load(%v): no error, but %v is not among the weight types the backend states", dt, dt)
			} else if !errors.Is(err, backend.ErrUnsupported) {
				t.Errorf("Load(%v), a type the backend does not state: %v, want an error wrapping ErrUnsupported", dt, err)
			}
			continue
		}
		if err != nil {
			t.Errorf("Load(%v), a weight type the backend states: %v", dt, err)
			continue
		}
		dst, rows := alloc(t, b, 1, m, nil), alloc(t, b, 2, k, nil)
		if err := b.MatMul(dst, x, w); err != nil {
			t.Errorf("MatMul with %v weights, a type the backend states: %v", dt, err)
		}
		if err := b.GetRows(rows, w, []int32{2, 0}); err != nil {
			t.Errorf("GetRows of %v rows, a type the backend states: %v", dt, err)
		}
		w.Close()
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.F16, tensor.BF16, tensor.Q8_0} {
		kv, err := b.NewKV(backend.KVConfig{Layers: 1, Slots: 8, Width: 16, BlockSize: 4, DType: dt})
		switch {
		case caps.KV.Has(dt) && err != nil:
			t.Errorf("NewKV(%v), a cache type the backend states: %v", dt, err)
		case !caps.KV.Has(dt) && err == nil:
			t.Errorf("NewKV(%v): no error, but %v is not among the cache types the backend states", dt, dt)
		case !caps.KV.Has(dt) && !errors.Is(err, backend.ErrUnsupported):
			t.Errorf("NewKV(%v), a type the backend does not state: %v, want an error wrapping ErrUnsupported", dt, err)
		}
		if err == nil {
			kv.Close()
		}
	}
	if b.Capabilities().Ops != 0 {
		t.Errorf("Capabilities() states optional operations %v; they are read off the methods", b.Capabilities().Ops.Members())
	}
	for _, op := range backend.Ops() {
		if caps.Ops.Has(op) != backend.Supports(b, op) {
			t.Errorf("CapabilitiesOf and Supports disagree on %v", op)
		}
	}
}

// AllFuncs fails t unless b states every function of tensor.Func (backend.Capabilities.Funcs),
// as Parley's backends do; a backend that leaves one out says so in its own tests instead.
func AllFuncs(t testing.TB, b backend.Backend) {
	t.Helper()
	if got, want := backend.CapabilitiesOf(b).Funcs, backend.SetOf(tensor.Funcs()...); got != want {
		t.Errorf("%s states the functions %v, want every one of tensor.Funcs: %v", b.Name(), got.Members(), want.Members())
	}
}
