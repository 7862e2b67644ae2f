//go:build !unix

package ggml

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
	f, perr := parse(data)
	if perr != nil {
		return nil, fmt.Errorf("%s: %w", path, perr)
	}
	return f, nil
}

// Close drops the file's tensor data; the hyperparameters, filters, vocabulary and tensor names
// and shapes stay valid. Closing twice is a no-op.
func (f *File) Close() error {
	for i := range f.Tensors {
		f.Tensors[i].Data = nil
	}
	return nil
}
