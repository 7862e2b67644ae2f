package ggml

import (
	"encoding/binary"

	"github.com/parleyhq/parley/internal/mapfile"
)

// Open memory-maps the file at path read-only (reads it where there is no mapping) and parses
// it. Tensor data is not copied: it aliases the mapping, which Close releases. The file must not
// be truncated while it is open: reading a mapped page past the new end faults.
func Open(path string) (*File, error) {
	f, m, err := mapfile.OpenParsed(path, "ggml", Parse)
	if err != nil {
		return nil, err
	}
	f.mapped = m
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
	return m.Close()
}

// Release tells the system that b, tensor data of f that the caller has copied, need not stay
// resident (see mapfile.File.Release); the bytes stay readable. A no-op for parsed buffers.
func (f *File) Release(b []byte) {
	if f.mapped != nil {
		f.mapped.Release(b)
	}
}

// IsFile reports whether the file at path starts with the ggml magic (the bytes "lmgg"). A file
// too short to hold it is not one; only a file that cannot be read is an error.
func IsFile(path string) (bool, error) {
	b, ok, err := mapfile.Magic(path)
	return ok && binary.LittleEndian.Uint32(b[:]) == Magic, err
}
