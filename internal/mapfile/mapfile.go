// Package mapfile gives model readers a file's bytes without copying them: a read-only memory
// mapping where the platform has one, the file read into memory elsewhere.
package mapfile

import (
	"fmt"
	"io"
	"os"
	"unsafe"
)

// File is a mapped (or read) file. Data must not be used after Close.
type File struct {
	Data  []byte
	unmap func([]byte) error
	fd    *os.File // the open file behind a mapping, for ReadInto
}

// Close releases the mapping. Closing twice is a no-op.
func (f *File) Close() error {
	d := f.Data
	f.Data = nil
	var err error
	if f.fd != nil {
		err = f.fd.Close()
		f.fd = nil
	}
	if d == nil || f.unmap == nil {
		return err
	}
	if uerr := f.unmap(d); uerr != nil {
		return uerr
	}
	return err
}

// ReadInto fills dst with the bytes of b, a part of Data, read from the file rather than through
// the mapping: a copy that touches none of the mapping's pages (no page faults on them, nothing
// added to the resident set). It reports false, doing nothing useful, where the file was not
// mapped, b lies outside Data, len(dst) != len(b) or the read fails; the caller then copies b.
func (f *File) ReadInto(dst, b []byte) bool {
	if f.fd == nil || len(b) == 0 || len(dst) != len(b) {
		return false
	}
	off, ok := f.offset(b)
	if !ok {
		return false
	}
	n, err := f.fd.ReadAt(dst, int64(off))
	return err == nil && n == len(b)
}

// offset is where b, a part of Data, starts within it; ok is false for a b outside Data.
func (f *File) offset(b []byte) (uintptr, bool) {
	if len(b) == 0 || len(f.Data) == 0 {
		return 0, false
	}
	base := uintptr(unsafe.Pointer(&f.Data[0]))
	p := uintptr(unsafe.Pointer(&b[0]))
	if p < base || p+uintptr(len(b)) > base+uintptr(len(f.Data)) {
		return 0, false
	}
	return p - base, true
}

// Release tells the system that b, a part of Data that the caller has copied and will not read
// again, need not stay resident: the whole pages inside b leave the process's resident set (they
// stay in the page cache, and a later read maps them back with the same contents). It is a no-op
// where the file was read rather than mapped, and for a b outside Data.
func (f *File) Release(b []byte) {
	if f.unmap == nil {
		return
	}
	off, ok := f.offset(b)
	if !ok {
		return
	}
	ps := uintptr(pageSize)
	lo := (off + ps - 1) / ps * ps
	hi := (off + uintptr(len(b))) / ps * ps
	if hi > lo {
		release(f.Data[lo:hi])
	}
}

// Magic returns the first four bytes of the file at path; ok is false when it is shorter. It
// tells the model formats apart without mapping or parsing the file.
func Magic(path string) (magic [4]byte, ok bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return magic, false, err
	}
	defer f.Close()
	if _, err := io.ReadFull(f, magic[:]); err != nil {
		return magic, false, nil
	}
	return magic, true, nil
}

// OpenParsed opens the file at path (see Open) and parses its bytes with parse. It returns the
// parsed value and the mapping, which the caller releases once it is done with the bytes. An
// error opening the file is prefixed with format (such as "gguf"); a parse error is prefixed
// with path, and the mapping is released.
func OpenParsed[T any](path, format string, parse func([]byte) (T, error)) (T, *File, error) {
	var zero T
	m, err := Open(path)
	if err != nil {
		return zero, nil, fmt.Errorf("%s: %w", format, err)
	}
	v, err := parse(m.Data)
	if err != nil {
		m.Close()
		return zero, nil, fmt.Errorf("%s: %w", path, err)
	}
	return v, m, nil
}
