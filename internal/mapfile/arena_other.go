//go:build !linux

package mapfile

import "unsafe"

// arenaMap returns n zeroed bytes of the Go heap at a 64-byte boundary.
func arenaMap(n int) ([]byte, error) {
	w := make([]uint64, (n+63)/8+8)
	off := 0
	for uintptr(unsafe.Pointer(&w[off]))%64 != 0 {
		off++
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[off])), n), nil
}

func arenaUnmap([]byte) error { return nil }
