package ggml

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/parleyhq/parley/runtime/tensor"
)

var scalarRules = TensorRules{Scalars: true, Types: []tensor.DType{tensor.F32, tensor.Q4_K}}

// recordFile writes a file of a custom header (the magic, an int32 count n, n uint32s, a float32
// array, filters, a vocabulary) and tensor records under scalarRules.
func recordFile(t *testing.T) []byte {
	t.Helper()
	le := binary.LittleEndian
	h := le.AppendUint32(nil, Magic)
	h = le.AppendUint32(h, 2)
	h = le.AppendUint32(h, 7)
	h = le.AppendUint32(h, 9)
	h = le.AppendUint32(h, 3) // float32 array of 3
	for _, v := range []float32{0.5, -1, 2} {
		h = le.AppendUint32(h, math.Float32bits(v))
	}
	h = le.AppendUint32(h, 1) // filters 1 x 2
	h = le.AppendUint32(h, 2)
	h = le.AppendUint32(h, math.Float32bits(1))
	h = le.AppendUint32(h, math.Float32bits(3))
	h = le.AppendUint32(h, 2) // vocabulary
	h = le.AppendUint32(h, 1)
	h = append(h, 'a')
	h = le.AppendUint32(h, 0)
	var buf bytes.Buffer
	w, err := NewRecordWriter(&buf, h, scalarRules)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.WriteTensor("scalar", tensor.F32, nil, le.AppendUint32(nil, math.Float32bits(4))); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteTensor("k", tensor.Q4_K, []int{256}, make([]byte, 144)); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteTensor("f16", tensor.F16, []int{2}, make([]byte, 4)); err == nil {
		t.Error("a type outside the rules was written")
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestDecoder(t *testing.T) {
	b := recordFile(t)
	d := NewDecoder(b)
	if err := d.Magic(); err != nil {
		t.Fatal(err)
	}
	n, err := d.Int32("count")
	if err != nil || n != 2 {
		t.Fatalf("count %d, %v", n, err)
	}
	u, err := d.Uint32s(int(n), "values")
	if err != nil || u[0] != 7 || u[1] != 9 {
		t.Fatalf("values %v, %v", u, err)
	}
	a, err := d.Float32Array("array")
	if err != nil || len(a) != 3 || a[1] != -1 {
		t.Fatalf("array %v, %v", a, err)
	}
	fl, err := d.Filters()
	if err != nil || fl.NMel != 1 || fl.NFFT != 2 || fl.Data[1] != 3 {
		t.Fatalf("filters %+v, %v", fl, err)
	}
	v, err := d.Vocab()
	if err != nil || len(v) != 2 || string(v[0]) != "a" || len(v[1]) != 0 {
		t.Fatalf("vocab %q, %v", v, err)
	}
	at := d.Offset()
	ts, index, err := d.Tensors(scalarRules)
	if err != nil {
		t.Fatal(err)
	}
	if len(ts) != 2 || len(ts[0].Ne) != 0 || ts[0].Elements() != 1 || len(ts[0].Data) != 4 || ts[1].Type != tensor.Q4_K || index["k"] != 1 {
		t.Fatalf("tensors %+v", ts)
	}
	if d.Left() != 0 {
		t.Errorf("%d bytes left", d.Left())
	}

	// Whisper's rules refuse both records.
	d2 := NewDecoder(b)
	d2.d.off = at
	if _, _, err := d2.Tensors(TensorRules{}); err == nil || !strings.Contains(err.Error(), "0 dimensions, want 1 to 4") {
		t.Errorf("scalar under Whisper's rules: %v", err)
	}
	d3 := NewDecoder(b)
	d3.d.off = at
	if _, _, err := d3.Tensors(TensorRules{Scalars: true}); err == nil || !strings.Contains(err.Error(), "type id 12 (want F32, F16, Q4_0, Q4_1, Q5_0, Q5_1 or Q8_0)") {
		t.Errorf("Q4_K under Whisper's types: %v", err)
	}
}

func TestDecoderTruncated(t *testing.T) {
	b := recordFile(t)
	// Files cut at a record boundary are whole: after the header (61 bytes) and after the scalar
	// record (22 more).
	for n := 0; n < len(b); n++ {
		if n == 61 || n == 83 {
			continue
		}
		d := NewDecoder(b[:n])
		err := d.Magic()
		steps := []func() error{
			func() error { _, err := d.Int32("count"); return err },
			func() error { _, err := d.Uint32s(2, "values"); return err },
			func() error { _, err := d.Float32Array("array"); return err },
			func() error { _, err := d.Filters(); return err },
			func() error { _, err := d.Vocab(); return err },
			func() error { _, _, err := d.Tensors(scalarRules); return err },
		}
		for _, s := range steps {
			if err != nil {
				break
			}
			err = s()
		}
		if !errors.Is(err, ErrFormat) {
			t.Fatalf("%d of %d bytes: %v, want a format error", n, len(b), err)
		}
	}
	d := NewDecoder(b[:8])
	d.d.off = 4
	if _, err := d.Uint32s(-1, "values"); !errors.Is(err, ErrFormat) {
		t.Errorf("negative count: %v", err)
	}
}
