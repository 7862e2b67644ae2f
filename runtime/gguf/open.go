package gguf

import (
	"fmt"

	"github.com/parleyhq/parley/internal/mapfile"
)

// IsFile reports whether the file at path starts with GGUF's magic.
func IsFile(path string) (bool, error) {
	b, ok, err := mapfile.Magic(path)
	return ok && string(b[:]) == "GGUF", err
}

// Open memory-maps the file at path read-only (reads it where there is no mapping) and parses
// it. Tensor data is not copied: TensorData returns slices of the mapping, which Close releases.
// The file must not be truncated while it is open: reading a mapped page past the new end faults.
func Open(path string) (*File, error) {
	m, err := mapfile.Open(path)
	if err != nil {
		return nil, fmt.Errorf("gguf: %w", err)
	}
	f, err := parse(m.Data)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.mapped = m
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
	return m.Close()
}
