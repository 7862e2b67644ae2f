package pockettts

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// npyArray is a .npy file's array: float32 or int64 values in C order.
type npyArray struct {
	Shape []int
	F32   []float32 // for '<f4'
	I64   []int64   // for '<i8'
}

var npyHeaderRE = regexp.MustCompile(`^\{'descr': '([<|>][a-z][0-9])', 'fortran_order': (True|False), 'shape': \(([0-9, ]*)\), \}\s*$`)

// parseNPY reads a .npy file (format versions 1 to 3) of little-endian float32 or int64 in C
// order, the arrays numpy's save writes for the references.
func parseNPY(b []byte) (*npyArray, error) {
	if len(b) < 10 || string(b[:6]) != "\x93NUMPY" {
		return nil, fmt.Errorf("npy: no magic")
	}
	var hlen, off int
	switch b[6] {
	case 1:
		hlen, off = int(binary.LittleEndian.Uint16(b[8:])), 10
	case 2, 3:
		if len(b) < 12 {
			return nil, fmt.Errorf("npy: short header")
		}
		hlen, off = int(binary.LittleEndian.Uint32(b[8:])), 12
	default:
		return nil, fmt.Errorf("npy: version %d", b[6])
	}
	if hlen > len(b)-off {
		return nil, fmt.Errorf("npy: header of %d bytes past the end", hlen)
	}
	m := npyHeaderRE.FindStringSubmatch(string(b[off : off+hlen]))
	if m == nil {
		return nil, fmt.Errorf("npy: header %q", b[off:off+hlen])
	}
	if m[2] != "False" {
		return nil, fmt.Errorf("npy: Fortran order")
	}
	a := &npyArray{}
	n := 1
	for _, f := range strings.Split(m[3], ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		d, err := strconv.Atoi(f)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("npy: shape %q", m[3])
		}
		a.Shape = append(a.Shape, d)
		n *= d
	}
	data := b[off+hlen:]
	switch m[1] {
	case "<f4":
		if len(data) != 4*n {
			return nil, fmt.Errorf("npy: %d bytes for %d float32", len(data), n)
		}
		a.F32 = make([]float32, n)
		for i := range a.F32 {
			a.F32[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
		}
	case "<i8":
		if len(data) != 8*n {
			return nil, fmt.Errorf("npy: %d bytes for %d int64", len(data), n)
		}
		a.I64 = make([]int64, n)
		for i := range a.I64 {
			a.I64[i] = int64(binary.LittleEndian.Uint64(data[8*i:]))
		}
	default:
		return nil, fmt.Errorf("npy: dtype %s (only <f4 and <i8)", m[1])
	}
	return a, nil
}

func readNPY(t testing.TB, path string) *npyArray {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := parseNPY(b)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return a
}

func TestParseNPY(t *testing.T) {
	hdr := func(h string) []byte {
		for (10+len(h)+1)%64 != 0 {
			h += " "
		}
		h += "\n"
		b := append([]byte("\x93NUMPY\x01\x00"), byte(len(h)), byte(len(h)>>8))
		return append(b, h...)
	}
	b := hdr("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 1), }")
	b = binary.LittleEndian.AppendUint32(b, math.Float32bits(1.5))
	b = binary.LittleEndian.AppendUint32(b, math.Float32bits(-2))
	a, err := parseNPY(b)
	if err != nil || len(a.Shape) != 2 || a.F32[0] != 1.5 || a.F32[1] != -2 {
		t.Errorf("%+v %v", a, err)
	}
	c := hdr("{'descr': '<i8', 'fortran_order': False, 'shape': (1,), }")
	c = binary.LittleEndian.AppendUint64(c, 42)
	if a, err := parseNPY(c); err != nil || a.I64[0] != 42 || len(a.Shape) != 1 {
		t.Errorf("%+v %v", a, err)
	}
	for _, bad := range [][]byte{
		b[:len(b)-1],
		hdr("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }"),
		hdr("{'descr': '<f4', 'fortran_order': True, 'shape': (1,), }"),
		[]byte("NUMPY"),
	} {
		if _, err := parseNPY(bad); err == nil {
			t.Errorf("parsed %q", bad)
		}
	}
}
