package npy

import (
	"encoding/binary"
	"math"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// build writes an .npy file of format version major with the given header dictionary and data.
func build(major byte, dict string, data []float32) []byte {
	pre := 10
	if major > 1 {
		pre = 12
	}
	h := dict
	for (pre+len(h)+1)%64 != 0 {
		h += " "
	}
	h += "\n"
	b := append([]byte("\x93NUMPY"), major, 0)
	if major == 1 {
		b = binary.LittleEndian.AppendUint16(b, uint16(len(h)))
	} else {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(h)))
	}
	b = append(b, h...)
	for _, v := range data {
		b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
	}
	return b
}

func TestParse(t *testing.T) {
	data := []float32{1, -2, 3.5, 0, float32(math.Inf(1)), -0.25}
	for _, c := range []struct {
		major byte
		dict  string
		shape []int
		rows  [2]int
	}{
		{1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", []int{2, 3}, [2]int{2, 3}},
		{2, "{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", []int{6}, [2]int{1, 6}},
		{3, "{'shape': (1, 2, 3), 'fortran_order': False, 'descr': '<f4'}", []int{1, 2, 3}, [2]int{1, 6}},
	} {
		a, err := Parse(build(c.major, c.dict, data))
		if err != nil {
			t.Fatalf("%s: %v", c.dict, err)
		}
		if !reflect.DeepEqual(a.Shape, c.shape) || !reflect.DeepEqual(a.Data, data) {
			t.Errorf("%s: got %v %v", c.dict, a.Shape, a.Data)
		}
		if r, k := a.Rows(); r != c.rows[0] || k != c.rows[1] {
			t.Errorf("%s: rows %d x %d, want %v", c.dict, r, k, c.rows)
		}
	}
	a, err := Parse(build(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", []float32{7}))
	if err != nil || len(a.Shape) != 0 || a.Data[0] != 7 {
		t.Errorf("scalar: %v %v", a, err)
	}
}

func TestParseErrors(t *testing.T) {
	good := build(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", []float32{1, 2})
	for _, c := range []struct {
		name string
		b    []byte
		msg  string
	}{
		{"empty", nil, "bad magic"},
		{"magic", append([]byte("xNUMPY"), good[6:]...), "bad magic"},
		{"version", append(append([]byte{}, good[:6]...), append([]byte{4, 0}, good[8:]...)...), "version 4.0"},
		{"f8", build(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", []float32{1, 2}), "dtype '<f8'"},
		{"fortran", build(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", []float32{1, 2}), "fortran_order"},
		{"no shape", build(1, "{'descr': '<f4', 'fortran_order': False}", nil), "no shape"},
		{"bad dim", build(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }", nil), "bad dimension"},
		{"short data", good[:len(good)-1], "needs 8 bytes"},
		{"long data", append(good, 0), "needs 8 bytes"},
		{"header length", append(append([]byte{}, good[:8]...), 0xff, 0xff), "exceeds"},
		{"huge shape", build(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (100000, 100000), }", nil), "too large"},
		{"not a dict", build(1, "[1, 2]", nil), "not a dictionary"},
	} {
		_, err := Parse(c.b)
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want %q", c.name, err, c.msg)
		}
	}
}

// TestReference reads a tensor the Parakeet references were recorded with.
func TestReference(t *testing.T) {
	p := sharedtest.Path(t, "reference/asr-transducer/tensors/small-f32/jfk/mel.npy")
	a, err := ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.Shape, []int{1101, 128}) {
		t.Errorf("shape %v, want [1101 128]", a.Shape)
	}
	if _, err := ReadFile(filepath.Join(t.TempDir(), "absent.npy")); err == nil {
		t.Error("an absent file was read")
	}
}

func FuzzParse(f *testing.F) {
	f.Add(build(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 1), }", []float32{1, 2}))
	f.Add(build(3, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", []float32{1}))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := Parse(b)
		if err != nil {
			return
		}
		n := 1
		for _, d := range a.Shape {
			n *= d
		}
		if n != len(a.Data) {
			t.Fatalf("shape %v, %d values", a.Shape, len(a.Data))
		}
	})
}
