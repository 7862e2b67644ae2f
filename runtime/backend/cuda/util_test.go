//go:build cuda && cgo && !nocgo

package cuda

import (
	"os"
	"unsafe"
)

// emulated reports whether the tests run on the CPU emulation of a GPU (scripts/cuda-emu), where
// work sized to keep a real GPU busy would take hours.
func emulated() bool { return os.Getenv("PARLEY_CUDA_EMULATED") == "1" }

// unsafeBytes returns the bytes of v (little-endian F32, as GGUF stores it).
func unsafeBytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}
