package gguf

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"

	"github.com/parleyhq/parley/internal/mapfile"
)

// A model that llama.cpp's gguf-split wrote in several files, PREFIX-00001-of-0000N.gguf to
// PREFIX-0000N-of-0000N.gguf, opens as one File: every file carries split.no (0-based) and
// split.count, the first the model's metadata and split.tensors.count, and each its own
// tensors, whose offsets count from its own data section. Open, given the first file, maps the
// others beside it and adds their tensors to the table; TensorData reads each from its file.

// splitName matches a split file's name.
var splitName = regexp.MustCompile(`^(.*)-([0-9]{5})-of-([0-9]{5})\.gguf$`)

// split is one further file of a split model.
type split struct {
	data       []byte
	dataOffset int64
	mapped     *mapfile.File
}

// openSplit opens files 2..count of the split model whose first file f, at path, is.
func (f *File) openSplit(path string, count int64) error {
	no, _ := f.Int("split.no")
	m := splitName.FindStringSubmatch(filepath.Base(path))
	if m == nil {
		return fmt.Errorf("%s: file %d of %d of a split model, not named PREFIX-00001-of-%05d.gguf as gguf-split names them", path, no+1, count, count)
	}
	if no != 0 {
		return fmt.Errorf("%s: file %d of %d of a split model: open the first, %s-00001-of-%s.gguf", path, no+1, count, m[1], m[3])
	}
	if n, _ := strconv.ParseInt(m[3], 10, 64); n != count {
		return fmt.Errorf("%s: split.count is %d, the name says %d files", path, count, n)
	}
	for i := int64(2); i <= count; i++ {
		p := filepath.Join(filepath.Dir(path), fmt.Sprintf("%s-%05d-of-%s.gguf", m[1], i, m[3]))
		mf, err := mapfile.Open(p)
		if err != nil {
			return fmt.Errorf("gguf: file %d of %d of a split model: %w", i, count, err)
		}
		part, err := parse(mf.Data)
		if err == nil {
			pn, _ := part.Int("split.no")
			pc, _ := part.Int("split.count")
			if pn != i-1 || pc != count {
				err = fmt.Errorf("split.no %d and split.count %d, want %d and %d", pn, pc, i-1, count)
			}
		}
		if err != nil {
			mf.Close()
			return fmt.Errorf("%s: %w", p, err)
		}
		f.parts = append(f.parts, split{data: mf.Data, dataOffset: part.dataOffset, mapped: mf})
		for _, t := range part.Tensors {
			if _, dup := f.tensorIdx[t.Name]; dup {
				return fmt.Errorf("%s: tensor %q is in an earlier file of the split model too", p, t.Name)
			}
			t.part = len(f.parts)
			f.tensorIdx[t.Name] = len(f.Tensors)
			f.Tensors = append(f.Tensors, t)
		}
	}
	if n, ok := f.Int("split.tensors.count"); ok && n != int64(len(f.Tensors)) {
		return fmt.Errorf("%s: split.tensors.count is %d, the %d files hold %d tensors", path, n, count, len(f.Tensors))
	}
	return nil
}
