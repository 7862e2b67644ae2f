//go:build unix

package ggml

import (
	"fmt"
	"math"
	"os"
	"syscall"
)

// Open memory-maps the file at path read-only and parses it. Tensor data is not copied: it
// aliases the mapping, which Close releases. The file must not be truncated while it is open:
// reading a mapped page past the new end faults.
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
		return nil, fmt.Errorf("ggml: %s: not a regular file", path)
	}
	size := st.Size()
	if size == 0 {
		_, err := Parse(nil)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if size > math.MaxInt {
		return nil, fmt.Errorf("ggml: %s: %d bytes is too large to map", path, size)
	}
	data, err := syscall.Mmap(int(fd.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("ggml: %s: mmap: %w", path, err)
	}
	f, perr := parse(data)
	if perr != nil {
		syscall.Munmap(data)
		return nil, fmt.Errorf("%s: %w", path, perr)
	}
	f.mapped = data
	return f, nil
}

// Close releases the file's mapping. Tensor data must not be used afterwards; the
// hyperparameters, filters, vocabulary and tensor names and shapes stay valid. Closing twice is
// a no-op.
func (f *File) Close() error {
	m := f.mapped
	f.mapped = nil
	for i := range f.Tensors {
		f.Tensors[i].Data = nil
	}
	if m == nil {
		return nil
	}
	return syscall.Munmap(m)
}
