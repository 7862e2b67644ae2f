//go:build unix

package gguf

import (
	"fmt"
	"math"
	"os"
	"syscall"
)

// Open memory-maps the file at path read-only and parses it. Tensor data is not copied:
// TensorData returns slices of the mapping, which Close releases. The file must not be truncated
// while it is open: reading a mapped page past the new end faults.
func Open(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("gguf: %s: not a regular file", path)
	}
	size := st.Size()
	if size == 0 {
		_, err := parse(nil)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if size > math.MaxInt {
		return nil, fmt.Errorf("gguf: %s: %d bytes is too large to map", path, size)
	}
	data, err := syscall.Mmap(int(fd.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("gguf: %s: mmap: %w", path, err)
	}
	f, err := parse(data)
	if err != nil {
		syscall.Munmap(data)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.mapped = data
	return f, nil
}

// Close releases the file's mapping. Slices returned by TensorData must not be used afterwards;
// metadata and the tensor table stay valid. Closing twice is a no-op.
func (f *File) Close() error {
	m := f.mapped
	f.mapped, f.data = nil, nil
	if m == nil {
		return nil
	}
	return syscall.Munmap(m)
}
