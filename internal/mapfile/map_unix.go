//go:build unix

package mapfile

import (
	"fmt"
	"math"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// Open maps the regular file at path read-only. The file must not be truncated while it is
// mapped: reading a mapped page past the new end faults. An empty file gives empty Data.
func Open(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	keep := false
	defer func() {
		if !keep {
			fd.Close()
		}
	}()
	st, err := fd.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	size := st.Size()
	if size == 0 {
		return &File{}, nil
	}
	if size > math.MaxInt {
		return nil, fmt.Errorf("%s: %d bytes is too large to map", path, size)
	}
	data, err := syscall.Mmap(int(fd.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("%s: mmap: %w", path, err)
	}
	keep = true
	return &File{Data: data, unmap: syscall.Munmap, fd: fd}, nil
}

var pageSize = os.Getpagesize()

// release drops the pages of b (page-aligned, within a mapping) from the resident set.
func release(b []byte) { _ = unix.Madvise(b, unix.MADV_DONTNEED) }
