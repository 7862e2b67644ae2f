// Package npy reads the float32 arrays that reference tools write with numpy.save: format
// versions 1.0 to 3.0, dtype little-endian float32 ('<f4'), C order. It is for tests that compare
// against recorded tensors; anything else in the format is an error, never a panic.
package npy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
)

// Array is a float32 array: Data in C order (the last dimension fastest) of shape Shape.
type Array struct {
	Shape []int
	Data  []float32
}

// Rows returns the shape's first dimension and the product of the rest, for a 2-D view; a 0-D
// array is one row of one element, a 1-D array one row.
func (a *Array) Rows() (rows, cols int) {
	switch len(a.Shape) {
	case 0:
		return 1, 1
	case 1:
		return 1, a.Shape[0]
	}
	cols = 1
	for _, d := range a.Shape[1:] {
		cols *= d
	}
	return a.Shape[0], cols
}

var magic = []byte("\x93NUMPY")

// ReadFile reads the .npy file at path.
func ReadFile(path string) (*Array, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	a, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return a, nil
}

// Parse reads an .npy file held in memory.
func Parse(b []byte) (*Array, error) {
	if len(b) < 10 || !bytes.Equal(b[:6], magic) {
		return nil, errors.New("npy: not an .npy file (bad magic)")
	}
	major := b[6]
	var hlen, off int
	switch major {
	case 1:
		hlen, off = int(binary.LittleEndian.Uint16(b[8:])), 10
	case 2, 3:
		if len(b) < 12 {
			return nil, errors.New("npy: truncated header")
		}
		h := binary.LittleEndian.Uint32(b[8:])
		if uint64(h) > uint64(len(b)) {
			return nil, fmt.Errorf("npy: header length %d exceeds the file", h)
		}
		hlen, off = int(h), 12
	default:
		return nil, fmt.Errorf("npy: format version %d.%d is not supported", b[6], b[7])
	}
	if hlen > len(b)-off {
		return nil, fmt.Errorf("npy: header length %d exceeds the file", hlen)
	}
	shape, err := parseHeader(string(b[off : off+hlen]))
	if err != nil {
		return nil, err
	}
	n := 1
	for _, d := range shape {
		if d != 0 && n > math.MaxInt32/d {
			return nil, fmt.Errorf("npy: shape %v is too large", shape)
		}
		n *= d
	}
	data := b[off+hlen:]
	if len(data) != 4*n {
		return nil, fmt.Errorf("npy: shape %v needs %d bytes of data, the file has %d", shape, 4*n, len(data))
	}
	a := &Array{Shape: shape, Data: make([]float32, n)}
	for i := range a.Data {
		a.Data[i] = math.Float32frombits(binary.LittleEndian.Uint32(data[4*i:]))
	}
	return a, nil
}

// parseHeader reads the dictionary literal numpy writes:
// {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }.
func parseHeader(h string) ([]int, error) {
	h = strings.TrimSpace(h)
	if !strings.HasPrefix(h, "{") || !strings.HasSuffix(h, "}") {
		return nil, fmt.Errorf("npy: header %q is not a dictionary", h)
	}
	descr, ok := field(h, "descr")
	if !ok {
		return nil, fmt.Errorf("npy: header %q has no descr", h)
	}
	if descr != "'<f4'" {
		return nil, fmt.Errorf("npy: dtype %s, want '<f4' (little-endian float32)", descr)
	}
	order, ok := field(h, "fortran_order")
	if !ok || order != "False" {
		return nil, fmt.Errorf("npy: fortran_order %q, want False (C order)", order)
	}
	s, ok := field(h, "shape")
	if !ok || !strings.HasPrefix(s, "(") || !strings.HasSuffix(s, ")") {
		return nil, fmt.Errorf("npy: header %q has no shape tuple", h)
	}
	shape := []int{}
	for _, p := range strings.Split(s[1:len(s)-1], ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		d, err := strconv.Atoi(p)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("npy: shape %s has a bad dimension %q", s, p)
		}
		shape = append(shape, d)
	}
	return shape, nil
}

// field returns the literal after 'key': in the dictionary h, up to the next top-level comma or
// the closing brace.
func field(h, key string) (string, bool) {
	i := strings.Index(h, "'"+key+"'")
	if i < 0 {
		return "", false
	}
	rest := strings.TrimSpace(h[i+len(key)+2:])
	rest, ok := strings.CutPrefix(rest, ":")
	if !ok {
		return "", false
	}
	rest = strings.TrimSpace(rest)
	depth := 0
	for j, c := range rest {
		switch c {
		case '(':
			depth++
		case ')':
			depth--
		case ',', '}':
			if depth == 0 {
				return strings.TrimSpace(rest[:j]), true
			}
		}
	}
	return "", false
}
