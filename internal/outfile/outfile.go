// Package outfile writes the files that the model formats' writers build.
package outfile

import (
	"io"
	"os"
)

// Write writes w to path, replacing an existing file. A failed write leaves what was written.
func Write(path string, w io.WriterTo) error {
	fd, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := w.WriteTo(fd); err != nil {
		fd.Close()
		return err
	}
	return fd.Close()
}
