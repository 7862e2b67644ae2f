package cpu

import (
	"testing"

	"github.com/parleyhq/parley/bindings/cpu"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/backend/backendtest"
	"github.com/parleyhq/parley/runtime/tensor"
)

// TestConformance runs the shared suite with one thread (serial paths) and three (work split
// among more threads than this machine may have cores), at the best instruction set.
//
// With -short (scripts/test's race pass) only the three threads run: the thread count changes
// only the C side, which the race detector does not see, while the Go side (the bindings' unsafe
// pointers, checked under -race) is the same.
func TestConformance(t *testing.T) {
	if !cpu.Available() {
		t.Skip(cpu.ErrNotBuilt)
	}
	for _, threads := range []int{1, 3} {
		t.Run(map[int]string{1: "Threads1", 3: "Threads3"}[threads], func(t *testing.T) {
			if threads == 1 && testing.Short() {
				t.Skip("-short: one thread differs from three only in C code; the full run covers it")
			}
			backendtest.Run(t, func() (backend.Backend, error) { return New(backend.Options{Threads: threads}) })
		})
	}
}

// TestConformanceISA runs the suite again with the kernels lowered to each instruction set below
// the best this processor has (scalar, AVX2), so that every form is checked here. The forms
// differ only in C code, so -short (scripts/test's race pass) skips them.
func TestConformanceISA(t *testing.T) {
	if !cpu.Available() {
		t.Skip(cpu.ErrNotBuilt)
	}
	if testing.Short() {
		t.Skip("-short: the instruction sets differ only in C code; the full run checks each")
	}
	best := cpu.BestISA()
	defer cpu.SetISA(best)
	for isa := cpu.ISAScalar; isa < best; isa++ {
		t.Run(isa.String(), func(t *testing.T) {
			if err := cpu.SetISA(isa); err != nil {
				t.Fatal(err)
			}
			defer cpu.SetISA(best)
			backendtest.Run(t, func() (backend.Backend, error) { return New(backend.Options{Threads: 2}) })
		})
	}
}

// shortISA is the first instruction set a test loops over, from lo to best: best alone under
// -short (scripts/test's race pass), as the lower ones differ only in C code, which the race
// detector does not see; the full run checks each.
func shortISA(lo, best cpu.ISA) cpu.ISA {
	if testing.Short() {
		return best
	}
	return lo
}

func TestRegistered(t *testing.T) {
	b, _, err := backend.New("cpu", backend.Options{})
	if !cpu.Available() {
		if err == nil {
			b.Close()
			t.Fatal("a build without cgo started the cpu backend")
		}
		t.Logf("as expected: %v", err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.Name() != "cpu" {
		t.Fatalf("Name() = %q", b.Name())
	}
	backendtest.AllFuncs(t, b)
}

// BenchmarkBackend runs the shared benchmarks with 2 threads.
func BenchmarkBackend(b *testing.B) {
	if !cpu.Available() {
		b.Skip(cpu.ErrNotBuilt)
	}
	backendtest.Bench(b, func() (backend.Backend, error) { return New(backend.Options{Threads: 2}) })
}

// BenchmarkBackendOneThread measures the same shapes on one thread: the per-core cost, which
// contention from other processes on the machine disturbs less.
func BenchmarkBackendOneThread(b *testing.B) {
	if !cpu.Available() {
		b.Skip(cpu.ErrNotBuilt)
	}
	backendtest.Bench(b, func() (backend.Backend, error) { return New(backend.Options{Threads: 1}) })
}

// BenchmarkBackendOneThreadAVX2 is BenchmarkBackendOneThread with the kernels lowered to AVX2 (the
// level of Zen 2/3 and of many Intel processors), on a processor that has more.
func BenchmarkBackendOneThreadAVX2(b *testing.B) {
	if !cpu.Available() {
		b.Skip(cpu.ErrNotBuilt)
	}
	best := cpu.BestISA()
	if best <= cpu.ISAAVX2 {
		b.Skip("AVX2 is this processor's best level: BenchmarkBackendOneThread measures it")
	}
	defer cpu.SetISA(best)
	if err := cpu.SetISA(cpu.ISAAVX2); err != nil {
		b.Fatal(err)
	}
	backendtest.Bench(b, func() (backend.Backend, error) { return New(backend.Options{Threads: 1}) })
}

// TestUseAfterClose checks that tensors and caches of a closed backend give errors instead of
// touching freed native memory.
func TestUseAfterClose(t *testing.T) {
	if !cpu.Available() {
		t.Skip(cpu.ErrNotBuilt)
	}
	bi, err := New(backend.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	x, err := bi.Alloc(tensor.F32, 2, 32)
	if err != nil {
		t.Fatal(err)
	}
	v, err := bi.View(x, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := bi.NewKV(backend.KVConfig{Layers: 1, Slots: 4, Width: 32, BlockSize: 4, DType: tensor.F16})
	if err != nil {
		t.Fatal(err)
	}
	if err := bi.Close(); err != nil {
		t.Fatal(err)
	}
	row := make([]float32, 32)
	bt := &backend.Batch{Pos: []int32{0}, Slot: []int32{0}, Seqs: []backend.Seq{{Count: 1, CtxLen: 1, Blocks: []int32{0}}}}
	for name, err := range map[string]error{
		"Write":   bi.Write(x, 0, row),
		"Read":    bi.Read(v, 0, row),
		"SwiGLU":  bi.SwiGLU(x, x, x),
		"StoreKV": bi.StoreKV(kv, 0, v, v, bt),
	} {
		if err == nil {
			t.Errorf("%s after Close: no error", name)
		}
	}
	if _, err := bi.Alloc(tensor.F32, 1, 1); err == nil {
		t.Error("Alloc after Close: no error")
	}
	if err := x.Close(); err != nil {
		t.Errorf("closing a tensor after its backend: %v", err)
	}
	if err := kv.Close(); err != nil {
		t.Errorf("closing a cache after its backend: %v", err)
	}
	if err := bi.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
