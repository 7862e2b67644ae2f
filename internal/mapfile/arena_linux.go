//go:build linux

package mapfile

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// arenaMap maps n bytes of anonymous memory and asks for huge pages for it (a hint: where the
// kernel has none to give, small pages serve).
func arenaMap(n int) ([]byte, error) {
	m, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("mapping %d bytes: %w", n, err)
	}
	_ = unix.Madvise(m, unix.MADV_HUGEPAGE)
	return m, nil
}

func arenaUnmap(m []byte) error { return unix.Munmap(m) }
