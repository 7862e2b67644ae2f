//go:build linux

package quant

import (
	"math/rand"
	"syscall"
	"testing"
	"unsafe"

	"github.com/parleyhq/parley/runtime/tensor"
)

// pageEnd returns a buffer of n bytes that ends exactly where an inaccessible page begins, so
// that reading one byte past it faults.
func pageEnd(t *testing.T, n int) []byte {
	ps := syscall.Getpagesize()
	size := (n+ps-1)/ps*ps + ps
	mem, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Skipf("mmap: %v", err)
	}
	t.Cleanup(func() { syscall.Munmap(mem) })
	if err := syscall.Mprotect(mem[size-ps:], syscall.PROT_NONE); err != nil {
		t.Skipf("mprotect: %v", err)
	}
	return mem[size-ps-n : size-ps : size-ps]
}

// No kernel reads past the bytes a row occupies: every operand ends at a guard page.
func TestNoReadPastRow(t *testing.T) {
	r := rand.New(rand.NewSource(14))
	for _, dt := range dotTypes {
		k, _ := KernelFor(dt)
		for _, nb := range []int{1, 3, 8} {
			n := nb * dt.BlockSize()
			if !dt.Quantized() {
				n = 32*nb + 7
			}
			w := pageEnd(t, rowSize(t, dt, n))
			x := pageEnd(t, rowSize(t, k.VecType, n))
			copy(w, randBlocks(r, dt, n/dt.BlockSize()))
			if err := Quantize(k.VecType, randFloats(r, n, 1), x); err != nil {
				t.Fatal(err)
			}
			ref, tol := dotRef(dt, k.VecType, n, w, x)
			if got := k.Dot(n, w, x); float64(got)-ref > tol || ref-float64(got) > tol {
				t.Fatalf("%v n=%d: %g, want %g", dt, n, got, ref)
			}
		}
	}
	for _, dt := range allTypes {
		n := 3 * dt.BlockSize()
		if !dt.Quantized() {
			n = 43
		}
		src := pageEnd(t, rowSize(t, dt, n))
		fsrc := unsafe.Slice((*float32)(unsafe.Pointer(&pageEnd(t, 4*n)[0])), n)
		copy(fsrc, randFloats(r, n, 1))
		if err := Quantize(dt, fsrc, src); err != nil {
			t.Fatal(err)
		}
		if err := Dequantize(dt, src, make([]float32, n)); err != nil {
			t.Fatal(err)
		}
	}
	_ = tensor.F32
}
