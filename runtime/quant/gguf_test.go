package quant

import (
	"encoding/binary"
	"fmt"
	"os"

	"github.com/parleyhq/parley/runtime/tensor"
)

// ggufTensor is one tensor of a GGUF file read by readGGUF.
type ggufTensor struct {
	dt    tensor.DType
	shape []int64
	data  []byte
}

// readGGUF is a minimal GGUF v2/v3 reader for tests: it skips metadata except
// general.alignment and returns the tensors by name.
func readGGUF(path string) (map[string]ggufTensor, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p := 0
	fail := func(what string) error { return fmt.Errorf("%s: bad GGUF (%s at %d)", path, what, p) }
	need := func(n int) bool { return n >= 0 && p+n <= len(b) }
	u32 := func() uint32 {
		if !need(4) {
			return 0
		}
		v := binary.LittleEndian.Uint32(b[p:])
		p += 4
		return v
	}
	u64 := func() uint64 {
		if !need(8) {
			return 0
		}
		v := binary.LittleEndian.Uint64(b[p:])
		p += 8
		return v
	}
	str := func() string {
		n := u64()
		if n > uint64(len(b)) || !need(int(n)) {
			p = len(b) + 1
			return ""
		}
		s := string(b[p : p+int(n)])
		p += int(n)
		return s
	}
	if !need(4) || string(b[:4]) != "GGUF" {
		return nil, fail("magic")
	}
	p = 4
	if v := u32(); v != 2 && v != 3 {
		return nil, fail("version")
	}
	nt, nkv := u64(), u64()
	if nt > 1<<20 || nkv > 1<<20 {
		return nil, fail("counts")
	}
	scalar := map[uint32]int{0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
	var skip func(t uint32) bool
	skip = func(t uint32) bool {
		if n, ok := scalar[t]; ok {
			p += n
			return p <= len(b)
		}
		switch t {
		case 8:
			str()
			return p <= len(b)
		case 9:
			et, n := u32(), u64()
			if n > uint64(len(b)) {
				return false
			}
			for i := uint64(0); i < n; i++ {
				if !skip(et) {
					return false
				}
			}
			return true
		}
		return false
	}
	align := 32
	for i := uint64(0); i < nkv; i++ {
		k := str()
		t := u32()
		if k == "general.alignment" && t == 4 {
			align = int(u32())
			continue
		}
		if !skip(t) {
			return nil, fail("metadata")
		}
	}
	type info struct {
		name  string
		dt    tensor.DType
		shape []int64
		off   uint64
	}
	infos := make([]info, 0, nt)
	for i := uint64(0); i < nt; i++ {
		in := info{name: str()}
		nd := u32()
		if nd > 4 {
			return nil, fail("dims")
		}
		for d := uint32(0); d < nd; d++ {
			in.shape = append(in.shape, int64(u64()))
		}
		in.dt = tensor.DType(u32())
		in.off = u64()
		infos = append(infos, in)
	}
	if p > len(b) || align <= 0 {
		return nil, fail("tensor infos")
	}
	base := (p + align - 1) / align * align
	out := map[string]ggufTensor{}
	for _, in := range infos {
		n := int64(1)
		for _, d := range in.shape {
			n *= d
		}
		sz, err := in.dt.RowSize(n)
		if err != nil {
			return nil, fmt.Errorf("%s: tensor %q: %v", path, in.name, err)
		}
		start := uint64(base) + in.off
		if start > uint64(len(b)) || uint64(sz) > uint64(len(b))-start {
			return nil, fmt.Errorf("%s: tensor %q out of bounds", path, in.name)
		}
		out[in.name] = ggufTensor{in.dt, in.shape, b[start : start+uint64(sz)]}
	}
	return out, nil
}
