package safetensors

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"strconv"
	"unicode/utf8"
)

const metadataKey = "__metadata__"

type header struct {
	metadata map[string]string
	tensors  []Tensor
}

// parseHeader reads the JSON header strictly: one object whose keys are tensor names (and at most
// one "__metadata__"), no key twice at any level, nothing but whitespace after it.
func parseHeader(b []byte) (header, error) {
	var h header
	if !utf8.Valid(b) {
		return h, formatErr("the header is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	if err := expectDelim(dec, '{', "the header"); err != nil {
		return h, err
	}
	seen := map[string]bool{}
	for dec.More() {
		key, err := objectKey(dec, "the header")
		if err != nil {
			return h, err
		}
		if seen[key] {
			return h, formatErr("%q appears twice in the header", key)
		}
		seen[key] = true
		if key == metadataKey {
			if h.metadata, err = parseMetadata(dec); err != nil {
				return h, err
			}
			continue
		}
		t, err := parseTensor(dec, key)
		if err != nil {
			return h, err
		}
		h.tensors = append(h.tensors, t)
	}
	if err := expectDelim(dec, '}', "the header"); err != nil {
		return h, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return h, formatErr("the header has more after its closing brace")
	}
	return h, nil
}

func syntaxErr(err error, what string) error {
	if errors.Is(err, io.EOF) {
		return formatErr("%s ends early", what)
	}
	return formatErr("%s is not valid JSON: %v", what, err)
}

func expectDelim(dec *json.Decoder, d json.Delim, what string) error {
	tok, err := dec.Token()
	if err != nil {
		return syntaxErr(err, what)
	}
	if got, ok := tok.(json.Delim); !ok || got != d {
		return formatErr("%s: want %q, found %v", what, d, tok)
	}
	return nil
}

func objectKey(dec *json.Decoder, what string) (string, error) {
	tok, err := dec.Token()
	if err != nil {
		return "", syntaxErr(err, what)
	}
	s, ok := tok.(string)
	if !ok {
		return "", formatErr("%s: want a key, found %v", what, tok)
	}
	return s, nil
}

func parseMetadata(dec *json.Decoder) (map[string]string, error) {
	const what = "__metadata__"
	if err := expectDelim(dec, '{', what+" (an object of strings)"); err != nil {
		return nil, err
	}
	m := map[string]string{}
	for dec.More() {
		k, err := objectKey(dec, what)
		if err != nil {
			return nil, err
		}
		if _, dup := m[k]; dup {
			return nil, formatErr("%s: %q appears twice", what, k)
		}
		tok, err := dec.Token()
		if err != nil {
			return nil, syntaxErr(err, what)
		}
		v, ok := tok.(string)
		if !ok {
			return nil, formatErr("%s: %q is %v, not a string", what, k, tok)
		}
		m[k] = v
	}
	return m, expectDelim(dec, '}', what)
}

// parseTensor reads {"dtype": ..., "shape": [...], "data_offsets": [begin, end]} and checks that
// the shape and dtype account for exactly the bytes named.
func parseTensor(dec *json.Decoder, name string) (Tensor, error) {
	t := Tensor{Name: name, DType: unknown}
	what := "tensor " + strconv.Quote(name)
	if err := expectDelim(dec, '{', what); err != nil {
		return t, err
	}
	var haveDType, haveShape, haveOffsets bool
	var offsets []uint64
	for dec.More() {
		k, err := objectKey(dec, what)
		if err != nil {
			return t, err
		}
		switch k {
		case "dtype":
			if haveDType {
				return t, formatErr("%s: dtype appears twice", what)
			}
			haveDType = true
			tok, err := dec.Token()
			if err != nil {
				return t, syntaxErr(err, what)
			}
			s, ok := tok.(string)
			if !ok {
				return t, formatErr("%s: dtype is %v, not a string", what, tok)
			}
			if !DType(s).Known() {
				return t, formatErr("%s: unknown dtype %q", what, s)
			}
			t.DType = DType(s)
		case "shape":
			if haveShape {
				return t, formatErr("%s: shape appears twice", what)
			}
			haveShape = true
			dims, err := uintArray(dec, what+" shape")
			if err != nil {
				return t, err
			}
			if len(dims) > MaxDims {
				return t, formatErr("%s: %d dimensions, the limit is %d", what, len(dims), MaxDims)
			}
			t.Shape = make([]int64, len(dims))
			for i, d := range dims {
				if d > math.MaxInt64 {
					return t, formatErr("%s: dimension %d is %d", what, i, d)
				}
				t.Shape[i] = int64(d)
			}
		case "data_offsets":
			if haveOffsets {
				return t, formatErr("%s: data_offsets appears twice", what)
			}
			haveOffsets = true
			if offsets, err = uintArray(dec, what+" data_offsets"); err != nil {
				return t, err
			}
			if len(offsets) != 2 {
				return t, formatErr("%s: data_offsets has %d entries, want [begin, end]", what, len(offsets))
			}
		default:
			return t, formatErr("%s: unexpected field %q (want dtype, shape, data_offsets)", what, k)
		}
	}
	if err := expectDelim(dec, '}', what); err != nil {
		return t, err
	}
	switch {
	case !haveDType:
		return t, formatErr("%s has no dtype", what)
	case !haveShape:
		return t, formatErr("%s has no shape", what)
	case !haveOffsets:
		return t, formatErr("%s has no data_offsets", what)
	}
	begin, end := offsets[0], offsets[1]
	if end < begin {
		return t, formatErr("%s: data_offsets [%d, %d] end before they begin", what, begin, end)
	}
	if end > math.MaxInt64 {
		return t, formatErr("%s: data_offsets [%d, %d] are out of range", what, begin, end)
	}
	size := uint64(t.DType.Size())
	for _, d := range t.Shape {
		if d != 0 && size > math.MaxInt64/uint64(d) {
			return t, formatErr("%s: shape %v of %s overflows", what, t.Shape, t.DType)
		}
		size *= uint64(d)
	}
	if size != end-begin {
		return t, formatErr("%s: shape %v of %s takes %d bytes, data_offsets [%d, %d] hold %d", what, t.Shape, t.DType, size, begin, end, end-begin)
	}
	t.Offset, t.Size = int64(begin), int64(size)
	return t, nil
}

// uintArray reads a JSON array of non-negative integers (no fraction, no exponent).
func uintArray(dec *json.Decoder, what string) ([]uint64, error) {
	if err := expectDelim(dec, '[', what+" (an array of integers)"); err != nil {
		return nil, err
	}
	var out []uint64
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, syntaxErr(err, what)
		}
		n, ok := tok.(json.Number)
		if !ok {
			return nil, formatErr("%s: %v is not a number", what, tok)
		}
		v, err := strconv.ParseUint(string(n), 10, 64)
		if err != nil {
			return nil, formatErr("%s: %s is not a non-negative 64-bit integer", what, n)
		}
		if len(out) >= MaxDims {
			return nil, formatErr("%s: more than %d entries", what, MaxDims)
		}
		out = append(out, v)
	}
	return out, expectDelim(dec, ']', what)
}
