// Package mapfile gives model readers a file's bytes without copying them: a read-only memory
// mapping where the platform has one, the file read into memory elsewhere.
package mapfile

// File is a mapped (or read) file. Data must not be used after Close.
type File struct {
	Data  []byte
	unmap func([]byte) error
}

// Close releases the mapping. Closing twice is a no-op.
func (f *File) Close() error {
	d := f.Data
	f.Data = nil
	if d == nil || f.unmap == nil {
		return nil
	}
	return f.unmap(d)
}
