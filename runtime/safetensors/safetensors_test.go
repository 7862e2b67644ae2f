package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// raw builds a file from a header string and a data section.
func raw(header string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	b = append(b, header...)
	return append(b, data...)
}

func sample(t testing.TB) []byte {
	t.Helper()
	w := NewWriter()
	w.SetMetadata("format", "pt")
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(w.AddFloat32("a.weight", []int64{2, 3}, []float32{1, -2, 3.5, 0, 1e-3, -7}))
	must(w.AddInt64("a.offset", []int64{1}, []int64{42}))
	must(w.Add("h", F16, []int64{3}, []byte{0x00, 0x3c, 0x00, 0xc0, 0x01, 0x00})) // 1, -2, 2^-24
	must(w.Add("b", BF16, []int64{2}, []byte{0x80, 0x3f, 0x49, 0x40}))            // 1, 3.140625
	must(w.Add("empty", F32, []int64{0, 4}, nil))
	must(w.Add("scalar", F64, nil, binary.LittleEndian.AppendUint64(nil, math.Float64bits(0.5))))
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestRoundTrip(t *testing.T) {
	b := sample(t)
	if n := binary.LittleEndian.Uint64(b); (8+n)%8 != 0 {
		t.Errorf("data section starts at %d, not a multiple of 8", 8+n)
	}
	f, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if f.Metadata["format"] != "pt" || len(f.Metadata) != 1 {
		t.Errorf("metadata %v", f.Metadata)
	}
	get := func(name string) *Tensor {
		tt, ok := f.Tensor(name)
		if !ok {
			t.Fatalf("tensor %q missing", name)
		}
		return tt
	}
	a := get("a.weight")
	if a.DType != F32 || !slices.Equal(a.Shape, []int64{2, 3}) || a.Elements() != 6 || a.Size != 24 {
		t.Errorf("a.weight: %+v", *a)
	}
	v, err := f.Float32s(a)
	if err != nil || !slices.Equal(v, []float32{1, -2, 3.5, 0, 1e-3, -7}) {
		t.Errorf("a.weight values %v %v", v, err)
	}
	o, err := f.Int64s(get("a.offset"))
	if err != nil || !slices.Equal(o, []int64{42}) {
		t.Errorf("a.offset %v %v", o, err)
	}
	h, err := f.Float32s(get("h"))
	if err != nil || !slices.Equal(h, []float32{1, -2, 1.0 / (1 << 24)}) {
		t.Errorf("F16 values %v %v", h, err)
	}
	bf, err := f.Float32s(get("b"))
	if err != nil || !slices.Equal(bf, []float32{1, 3.140625}) {
		t.Errorf("BF16 values %v %v", bf, err)
	}
	if e := get("empty"); e.Size != 0 || len(f.Data(e)) != 0 {
		t.Errorf("empty tensor %+v", *e)
	}
	s := get("scalar")
	if len(s.Shape) != 0 || s.Elements() != 1 {
		t.Errorf("scalar %+v", *s)
	}
	if sv, err := f.Float32s(s); err != nil || sv[0] != 0.5 {
		t.Errorf("scalar value %v %v", sv, err)
	}
	if _, err := f.Int64s(a); err == nil {
		t.Error("Int64s of an F32 tensor succeeded")
	}
	if _, err := f.Float32s(get("a.offset")); err == nil {
		t.Error("Float32s of an I64 tensor succeeded")
	}
	for i := 1; i < len(f.Tensors); i++ {
		if f.Tensors[i].Offset < f.Tensors[i-1].Offset {
			t.Errorf("tensors out of file order: %v", f.Tensors)
		}
	}
}

func TestOpen(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.safetensors")
	if err := os.WriteFile(p, sample(t), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := f.Tensor("a.weight")
	if len(f.Data(a)) != 24 {
		t.Error("data of an opened file")
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if f.Data(a) != nil {
		t.Error("data after Close")
	}
	if err := f.Close(); err != nil {
		t.Error("second Close:", err)
	}
	bad := filepath.Join(t.TempDir(), "bad.safetensors")
	os.WriteFile(bad, []byte("nonsense"), 0o644)
	if _, err := Open(bad); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), bad) {
		t.Errorf("malformed file: %v", err)
	}
}

// TestMalformed: every broken layout is refused with an error naming the problem.
func TestMalformed(t *testing.T) {
	f32 := func(n int) []byte { return make([]byte, 4*n) }
	huge := binary.LittleEndian.AppendUint64(nil, MaxHeaderSize+1)
	cases := []struct {
		name string
		file []byte
		want string
	}{
		{"short", []byte{1, 2, 3}, "too short"},
		{"header past end", binary.LittleEndian.AppendUint64(nil, 100), "runs past the end"},
		{"header too large", append(huge, make([]byte, 16)...), "exceeds the limit"},
		{"not json", raw("nope", nil), "not valid JSON"},
		{"not object", raw("[]", nil), `want "{"`},
		{"truncated json", raw(`{"a":{"dtype":"F32"`, nil), "ends early"},
		{"trailing", raw(`{} {}`, nil), "more after"},
		{"bad utf8", raw("{\"\xff\":1}", nil), "UTF-8"},
		{"dup tensor", raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(2)), "appears twice"},
		{"dup field", raw(`{"a":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, f32(1)), "dtype appears twice"},
		{"unknown field", raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":1}}`, f32(1)), "unexpected field"},
		{"unknown dtype", raw(`{"a":{"dtype":"F31","shape":[1],"data_offsets":[0,4]}}`, f32(1)), "unknown dtype"},
		{"no shape", raw(`{"a":{"dtype":"F32","data_offsets":[0,4]}}`, f32(1)), "no shape"},
		{"no dtype", raw(`{"a":{"shape":[1],"data_offsets":[0,4]}}`, f32(1)), "no dtype"},
		{"no offsets", raw(`{"a":{"dtype":"F32","shape":[1]}}`, f32(1)), "no data_offsets"},
		{"negative dim", raw(`{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}`, f32(1)), "non-negative"},
		{"float dim", raw(`{"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}}`, f32(1)), "non-negative"},
		{"size mismatch", raw(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, f32(1)), "takes 8 bytes"},
		{"three offsets", raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}}`, f32(1)), "want [begin, end]"},
		{"reversed", raw(`{"a":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}}`, f32(1)), "end before"},
		{"overflow", raw(`{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}}`, nil), "overflows"},
		{"past data", raw(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, f32(1)), "run past"},
		{"gap", raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(2)), "gap"},
		{"overlap", raw(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, f32(2)), "overlap"},
		{"trailing data", raw(`{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}`, f32(2)), "cover 4 bytes of the 8"},
		{"metadata not strings", raw(`{"__metadata__":{"k":1}}`, nil), "not a string"},
		{"metadata twice", raw(`{"__metadata__":{},"__metadata__":{}}`, nil), "appears twice"},
		{"metadata dup key", raw(`{"__metadata__":{"k":"a","k":"b"}}`, nil), "appears twice"},
		{"too many dims", raw(`{"a":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}}`, f32(1)), "more than 16"},
	}
	for _, c := range cases {
		_, err := Parse(c.file)
		if err == nil {
			t.Errorf("%s: parsed", c.name)
			continue
		}
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q, want one wrapping ErrFormat and containing %q", c.name, err, c.want)
		}
	}
}

func TestWriterRefuses(t *testing.T) {
	w := NewWriter()
	if err := w.Add("a", F32, []int64{2}, make([]byte, 4)); err == nil {
		t.Error("wrong data length accepted")
	}
	if err := w.Add("a", "F7", []int64{1}, make([]byte, 4)); err == nil {
		t.Error("unknown dtype accepted")
	}
	if err := w.Add("__metadata__", F32, []int64{1}, make([]byte, 4)); err == nil {
		t.Error("reserved name accepted")
	}
	if err := w.Add("a", F32, []int64{1}, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	if err := w.Add("a", F32, []int64{1}, make([]byte, 4)); err == nil {
		t.Error("duplicate name accepted")
	}
}

func TestHalf(t *testing.T) {
	for _, c := range []struct {
		h    uint16
		want float32
	}{{0x3c00, 1}, {0xbc00, -1}, {0x7bff, 65504}, {0x0400, 1.0 / (1 << 14)}, {0x0001, 1.0 / (1 << 24)}, {0x8000, float32(math.Copysign(0, -1))}, {0x7c00, float32(math.Inf(1))}, {0x3555, 0.333251953125}} {
		if got := HalfToFloat32(c.h); math.Float32bits(got) != math.Float32bits(c.want) {
			t.Errorf("%#04x: %v, want %v", c.h, got, c.want)
		}
	}
	if !math.IsNaN(float64(HalfToFloat32(0x7e00))) {
		t.Error("NaN")
	}
}

// TestVoiceState reads the reference voice state (upstream's export_model_state layout).
func TestVoiceState(t *testing.T) {
	p := sharedtest.Path(t, "reference/tts/voice/voice_state.safetensors")
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(f.Tensors) != 12 {
		t.Errorf("%d tensors, want 12", len(f.Tensors))
	}
	c, ok := f.Tensor("transformer.layers.0.self_attn/cache")
	if !ok || c.DType != F32 || !slices.Equal(c.Shape, []int64{2, 1, 42, 16, 64}) {
		t.Fatalf("cache: %+v %v", c, ok)
	}
	o, ok := f.Tensor("transformer.layers.5.self_attn/offset")
	if !ok {
		t.Fatal("offset missing")
	}
	v, err := f.Int64s(o)
	if err != nil || !slices.Equal(v, []int64{42}) {
		t.Errorf("offset %v %v", v, err)
	}
}
