package gguf

import (
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
	f, m, err := mapfile.OpenParsed(path, "gguf", Parse)
	if err != nil {
		return nil, err
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
