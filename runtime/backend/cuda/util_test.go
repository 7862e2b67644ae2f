//go:build cuda && cgo && !nocgo

package cuda

import "unsafe"

// unsafeBytes returns the bytes of v (little-endian F32, as GGUF stores it).
func unsafeBytes(v []float32) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))
}
