//go:build !unix

package mapfile

import (
	"fmt"
	"os"
)

// Open reads the regular file at path into memory (this platform has no memory mapping here).
func Open(path string) (*File, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return &File{Data: data}, nil
}

const pageSize = 4096

func release([]byte) {}
