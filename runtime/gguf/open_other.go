//go:build !unix

package gguf

import (
	"fmt"
	"os"
)

// Open reads the file at path into memory and parses it (this platform has no memory mapping
// here).
func Open(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// Close drops the file's bytes. Slices returned by TensorData stay readable but belong to the
// closed file; metadata and the tensor table stay valid. Closing twice is a no-op.
func (f *File) Close() error {
	f.data = nil
	return nil
}
