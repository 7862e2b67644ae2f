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
// it; the first file of a split model opens with the others beside it, as one (split.go).
// Tensor data is not copied: TensorData returns slices of the mapping, which Close releases.
// The file must not be truncated while it is open: reading a mapped page past the new end faults.
func Open(path string) (*File, error) {
	f, m, err := mapfile.OpenParsed(path, "gguf", Parse)
	if err != nil {
		return nil, err
	}
	f.mapped = m
	if n, ok := f.Int("split.count"); ok && n > 1 {
		if err := f.openSplit(path, n); err != nil {
			f.Close()
			return nil, err
		}
	}
	return f, nil
}

// Close releases the file's mapping. Slices returned by TensorData must not be used afterwards;
// metadata and the tensor table stay valid. Closing twice is a no-op.
func (f *File) Close() error {
	m, parts := f.mapped, f.parts
	f.mapped, f.data, f.parts = nil, nil, nil
	var err error
	for _, p := range parts {
		if e := p.mapped.Close(); err == nil {
			err = e
		}
	}
	if m == nil {
		return err
	}
	if e := m.Close(); e != nil {
		return e
	}
	return err
}
