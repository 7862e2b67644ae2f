package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/tensor"
)

// modelFiles returns the real GGUF files under ../shared/models/{llm,vocab}, skipping the test
// if there are none.
func modelFiles(tb testing.TB) []string {
	tb.Helper()
	s := sharedtest.Lookup()
	if s == "" {
		tb.Skip("../shared (real model files) not found next to the module root")
	}
	var files []string
	for _, sub := range []string{"llm", "vocab"} {
		m, _ := filepath.Glob(filepath.Join(s, "models", sub, "*.gguf"))
		files = append(files, m...)
	}
	if len(files) == 0 {
		tb.Skip("no .gguf files under ../shared/models/{llm,vocab}")
	}
	return files
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	r.Read(b)
	return b
}

// everyValue returns one metadata entry of every scalar type, an array of every element type,
// empty arrays, arrays of arrays and strings that are not UTF-8.
func everyValue() []KV {
	return []KV{
		{"v.u8", Value{Type: Uint8, V: uint8(200)}},
		{"v.i8", Value{Type: Int8, V: int8(-100)}},
		{"v.u16", Value{Type: Uint16, V: uint16(60000)}},
		{"v.i16", Value{Type: Int16, V: int16(-30000)}},
		{"v.u32", Value{Type: Uint32, V: uint32(4000000000)}},
		{"v.i32", Value{Type: Int32, V: int32(-2000000000)}},
		{"v.f32", Value{Type: Float32, V: float32(-1.5e-3)}},
		{"v.bool", Value{Type: Bool, V: true}},
		{"v.false", Value{Type: Bool, V: false}},
		{"v.str", Value{Type: String, V: "héllo\x00world"}},
		{"v.badutf8", Value{Type: String, V: "\xff\xfe\xc3"}},
		{"v.empty", Value{Type: String, V: ""}},
		{"v.u64", Value{Type: Uint64, V: uint64(math.MaxUint64)}},
		{"v.i64", Value{Type: Int64, V: int64(math.MinInt64)}},
		{"v.f64", Value{Type: Float64, V: math.Pi}},
		{"a.u8", Value{Type: Array, Elem: Uint8, V: []uint8{0, 1, 255}}},
		{"a.i8", Value{Type: Array, Elem: Int8, V: []int8{-128, 0, 127}}},
		{"a.u16", Value{Type: Array, Elem: Uint16, V: []uint16{1, 65535}}},
		{"a.i16", Value{Type: Array, Elem: Int16, V: []int16{-32768, 32767}}},
		{"a.u32", Value{Type: Array, Elem: Uint32, V: []uint32{7, math.MaxUint32}}},
		{"a.i32", Value{Type: Array, Elem: Int32, V: []int32{-5, 6, math.MaxInt32}}},
		{"a.f32", Value{Type: Array, Elem: Float32, V: []float32{0.25, -7, float32(math.Inf(1))}}},
		{"a.bool", Value{Type: Array, Elem: Bool, V: []bool{true, false, true}}},
		{"a.str", Value{Type: Array, Elem: String, V: []string{"a", "", "\xff\x00z", "ünïcode"}}},
		{"a.u64", Value{Type: Array, Elem: Uint64, V: []uint64{0, math.MaxUint64}}},
		{"a.i64", Value{Type: Array, Elem: Int64, V: []int64{math.MinInt64, 3}}},
		{"a.f64", Value{Type: Array, Elem: Float64, V: []float64{1e300, -2.5}}},
		{"a.empty", Value{Type: Array, Elem: Float32, V: []float32{}}},
		{"a.emptystr", Value{Type: Array, Elem: String, V: []string{}}},
		{"a.nested", Value{Type: Array, Elem: Array, V: []Value{
			{Type: Array, Elem: Int32, V: []int32{1, 2}},
			{Type: Array, Elem: String, V: []string{"x", "yz"}},
			{Type: Array, Elem: Array, V: []Value{{Type: Array, Elem: Uint8, V: []uint8{9}}}},
			{Type: Array, Elem: Bool, V: []bool{}},
		}}},
		{"a.emptynested", Value{Type: Array, Elem: Array, V: []Value{}}},
	}
}

type testTensor struct {
	name  string
	dt    tensor.DType
	shape []int64
	data  []byte
}

func makeTensors(r *rand.Rand) []testTensor {
	mk := func(name string, dt tensor.DType, shape ...int64) testTensor {
		rs, err := dt.RowSize(shape[0])
		if err != nil {
			panic(err)
		}
		n := rs
		for _, d := range shape[1:] {
			n *= d
		}
		return testTensor{name, dt, shape, randBytes(r, int(n))}
	}
	return []testTensor{
		mk("tok.f32", tensor.F32, 5, 3),
		mk("w.f16", tensor.F16, 7),
		mk("w.q4_0", tensor.Q4_0, 64, 2, 1),
		mk("w.q8_0", tensor.Q8_0, 32, 3),
		mk("w.iq2_xxs", tensor.IQ2_XXS, 256, 1), // known, not supported: still readable
		mk("w.4d", tensor.BF16, 2, 3, 1, 2),
		mk("w.zero", tensor.F32, 0, 4), // zero elements, zero bytes
		mk("w.last", tensor.I8, 3),
	}
}

func buildFile(t testing.TB, version uint32, kvs []KV, ts []testTensor) []byte {
	t.Helper()
	w := NewWriter()
	w.SetVersion(version)
	for _, kv := range kvs {
		w.Set(kv.Key, kv.Value)
	}
	for _, tt := range ts {
		if err := w.AddTensor(tt.name, tt.dt, tt.shape, tt.data); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	n, err := w.WriteTo(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) {
		t.Fatalf("WriteTo returned %d, wrote %d bytes", n, buf.Len())
	}
	return buf.Bytes()
}

func checkFile(t *testing.T, f *File, version uint32, align int64, kvs []KV, ts []testTensor) {
	t.Helper()
	if f.Version != version || f.Alignment != align {
		t.Errorf("version %d alignment %d, want %d %d", f.Version, f.Alignment, version, align)
	}
	if !reflect.DeepEqual(f.KVs, kvs) {
		if len(f.KVs) != len(kvs) {
			t.Fatalf("%d metadata entries, want %d", len(f.KVs), len(kvs))
		}
		for i := range kvs {
			if !reflect.DeepEqual(f.KVs[i], kvs[i]) {
				t.Errorf("entry %d: got %#v, want %#v", i, f.KVs[i], kvs[i])
			}
		}
	}
	if len(f.Tensors) != len(ts) {
		t.Fatalf("%d tensors, want %d", len(f.Tensors), len(ts))
	}
	for i, tt := range ts {
		ti := &f.Tensors[i]
		if ti.Name != tt.name || ti.DType != tt.dt || !reflect.DeepEqual(ti.Shape, tt.shape) {
			t.Errorf("tensor %d: %s %v %v, want %s %v %v", i, ti.Name, ti.DType, ti.Shape, tt.name, tt.dt, tt.shape)
		}
		if ti.Offset%align != 0 {
			t.Errorf("tensor %s: offset %d not aligned to %d", ti.Name, ti.Offset, align)
		}
		if (f.DataOffset()+ti.Offset)%align != 0 {
			t.Errorf("tensor %s: file offset %d not aligned", ti.Name, f.DataOffset()+ti.Offset)
		}
		if i > 0 && ti.Offset < f.Tensors[i-1].Offset {
			t.Errorf("tensor %s: not laid out in AddTensor order", ti.Name)
		}
		if got, ok := f.Tensor(tt.name); !ok || got != ti {
			t.Errorf("Tensor(%q) = %v, %v", tt.name, got, ok)
		}
		if d := f.TensorData(ti); !bytes.Equal(d, tt.data) || int64(len(d)) != ti.Size {
			t.Errorf("tensor %s: data differs (len %d, size %d, want %d)", ti.Name, len(d), ti.Size, len(tt.data))
		}
	}
}

func TestRoundTrip(t *testing.T) {
	r := rand.New(rand.NewSource(1))
	kvs := everyValue()
	ts := makeTensors(r)
	for _, version := range []uint32{2, 3} {
		b := buildFile(t, version, kvs, ts)
		if again := buildFile(t, version, kvs, ts); !bytes.Equal(b, again) {
			t.Fatal("writer output is not deterministic")
		}
		f, err := Parse(b)
		if err != nil {
			t.Fatalf("v%d: %v", version, err)
		}
		checkFile(t, f, version, DefaultAlignment, kvs, ts)

		path := filepath.Join(t.TempDir(), "x.gguf")
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		f, err = Open(path)
		if err != nil {
			t.Fatalf("v%d: Open: %v", version, err)
		}
		checkFile(t, f, version, DefaultAlignment, kvs, ts)
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal("second Close:", err)
		}
		if d := f.TensorData(&f.Tensors[0]); d != nil {
			t.Error("TensorData after Close returned bytes")
		}
		if s, ok := f.String("v.str"); !ok || s != "héllo\x00world" {
			t.Error("metadata lost after Close")
		}
	}
}

func TestAlignment(t *testing.T) {
	r := rand.New(rand.NewSource(2))
	ts := makeTensors(r)
	for _, a := range []uint32{1, 8, 64, 4096} {
		kvs := []KV{{"general.alignment", Value{Type: Uint32, V: a}}}
		b := buildFile(t, 3, kvs, ts)
		f, err := Parse(b)
		if err != nil {
			t.Fatalf("alignment %d: %v", a, err)
		}
		checkFile(t, f, 3, int64(a), kvs, ts)
	}
}

func TestWriterFile(t *testing.T) {
	w := NewWriter()
	w.SetString("general.architecture", "llama")
	w.SetUint32("n", 1)
	w.SetString("general.architecture", "gpt2") // replaced in place
	w.SetInt32("i", -3)
	w.SetFloat32("f", 0.5)
	w.SetBool("b", true)
	w.SetStrings("s", []string{"a", "b"})
	w.SetFloats("fs", []float32{1, 2})
	w.SetInt32s("is", []int32{3, -4})
	path := filepath.Join(t.TempDir(), "w.gguf")
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.KVs[0].Key != "general.architecture" || f.Architecture() != "gpt2" {
		t.Errorf("replaced key: %v, arch %q", f.KVs[0], f.Architecture())
	}
	if len(f.Tensors) != 0 || len(f.KVs) != 8 {
		t.Errorf("%d tensors %d kvs", len(f.Tensors), len(f.KVs))
	}
}

func TestAccessors(t *testing.T) {
	b := buildFile(t, 3, append(everyValue(),
		KV{"general.architecture", Value{Type: String, V: "llama"}},
		KV{"big.u64", Value{Type: Uint64, V: uint64(1) << 40}},
		KV{"a.bigu64", Value{Type: Array, Elem: Uint64, V: []uint64{1, math.MaxUint64}}},
		KV{"a.smallu64", Value{Type: Array, Elem: Uint64, V: []uint64{1, 2}}},
	), nil)
	f, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	if f.Architecture() != "llama" {
		t.Errorf("Architecture = %q", f.Architecture())
	}
	ints := map[string]int64{"v.u8": 200, "v.i8": -100, "v.u16": 60000, "v.i16": -30000,
		"v.u32": 4000000000, "v.i32": -2000000000, "v.i64": math.MinInt64, "big.u64": 1 << 40}
	for k, want := range ints {
		if got, ok := f.Int(k); !ok || got != want {
			t.Errorf("Int(%q) = %d, %v; want %d", k, got, ok, want)
		}
		if got, ok := f.Float(k); !ok || got != float64(want) {
			t.Errorf("Float(%q) = %v, %v; want %d", k, got, ok, want)
		}
	}
	for _, k := range []string{"v.u64", "v.str", "v.f32", "v.bool", "a.i32", "absent"} {
		if _, ok := f.Int(k); ok {
			t.Errorf("Int(%q) ok", k)
		}
	}
	if v, ok := f.Float("v.f32"); !ok || v != float64(float32(-1.5e-3)) {
		t.Errorf("Float(v.f32) = %v %v", v, ok)
	}
	if v, ok := f.Float("v.f64"); !ok || v != math.Pi {
		t.Errorf("Float(v.f64) = %v %v", v, ok)
	}
	if _, ok := f.Float("v.str"); ok {
		t.Error("Float(v.str) ok")
	}
	if v, ok := f.Bool("v.bool"); !ok || !v {
		t.Error("Bool(v.bool)")
	}
	if _, ok := f.Bool("v.u8"); ok {
		t.Error("Bool(v.u8) ok")
	}
	if s, ok := f.String("v.badutf8"); !ok || s != "\xff\xfe\xc3" {
		t.Errorf("String(v.badutf8) = %q", s)
	}
	if _, ok := f.String("a.str"); ok {
		t.Error("String(a.str) ok")
	}
	if s, ok := f.Strings("a.str"); !ok || !reflect.DeepEqual(s, []string{"a", "", "\xff\x00z", "ünïcode"}) {
		t.Errorf("Strings(a.str) = %q", s)
	}
	if _, ok := f.Strings("a.i32"); ok {
		t.Error("Strings(a.i32) ok")
	}
	intArrays := map[string][]int64{"a.u8": {0, 1, 255}, "a.i8": {-128, 0, 127}, "a.u16": {1, 65535},
		"a.i16": {-32768, 32767}, "a.u32": {7, math.MaxUint32}, "a.i32": {-5, 6, math.MaxInt32},
		"a.i64": {math.MinInt64, 3}, "a.smallu64": {1, 2}}
	for k, want := range intArrays {
		if got, ok := f.Ints(k); !ok || !reflect.DeepEqual(got, want) {
			t.Errorf("Ints(%q) = %v, %v; want %v", k, got, ok, want)
		}
	}
	for _, k := range []string{"a.bigu64", "a.f32", "a.str", "v.i32", "a.nested"} {
		if _, ok := f.Ints(k); ok {
			t.Errorf("Ints(%q) ok", k)
		}
	}
	if v, ok := f.Floats("a.f32"); !ok || !reflect.DeepEqual(v, []float32{0.25, -7, float32(math.Inf(1))}) {
		t.Errorf("Floats(a.f32) = %v", v)
	}
	if v, ok := f.Floats("a.f64"); !ok || !reflect.DeepEqual(v, []float32{float32(math.Inf(1)), -2.5}) {
		t.Errorf("Floats(a.f64) = %v", v)
	}
	if _, ok := f.Floats("a.i32"); ok {
		t.Error("Floats(a.i32) ok")
	}
	if v, ok := f.Value("a.nested"); !ok || v.Type != Array || v.Elem != Array {
		t.Errorf("Value(a.nested) = %v", v)
	}
	if _, ok := f.Tensor("nope"); ok {
		t.Error("Tensor(nope) ok")
	}
	if f.TensorData(&TensorInfo{Offset: 1 << 40, Size: 1}) != nil || f.TensorData(nil) != nil {
		t.Error("TensorData out of range returned bytes")
	}
}

func TestWriterErrors(t *testing.T) {
	w := NewWriter()
	cases := []struct {
		name  string
		dt    tensor.DType
		shape []int64
		n     int
		want  string
	}{
		{"a", tensor.F32, []int64{4, 2}, 31, "needs 32"},
		{"b", tensor.Q8_0, []int64{16}, 17, "block size"},
		{"c", tensor.DType(99), []int64{1}, 4, "unknown dtype"},
		{"d", tensor.F32, []int64{1, 1, 1, 1, 1}, 4, "dimensions"},
		{"e", tensor.F32, nil, 4, "dimensions"},
		{"f", tensor.F32, []int64{2, -1}, 0, "negative"},
		{"g", tensor.F32, []int64{1 << 40, 1 << 40}, 0, "overflow"},
		{strings.Repeat("n", 64), tensor.F32, []int64{1}, 4, "limit"},
	}
	for _, c := range cases {
		err := w.AddTensor(c.name, c.dt, c.shape, make([]byte, c.n))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("AddTensor(%q, %v, %v, %d bytes) = %v, want error containing %q", c.name, c.dt, c.shape, c.n, err, c.want)
		}
	}
	if err := w.AddTensor("ok", tensor.F32, []int64{1}, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	if err := w.AddTensor("ok", tensor.F32, []int64{1}, make([]byte, 4)); err == nil {
		t.Error("duplicate tensor accepted")
	}
	bad := []struct {
		set  func(w *Writer)
		want string
	}{
		{func(w *Writer) { w.SetVersion(1) }, "version 1"},
		{func(w *Writer) { w.Set("x", Value{Type: Uint32, V: 3}) }, "uint32 value holds int"},
		{func(w *Writer) { w.Set("x", Value{Type: Array, Elem: String, V: []int{1}}) }, "array of string holds []int"},
		{func(w *Writer) { w.Set("x", Value{Type: ValueType(40)}) }, "invalid value type"},
		{func(w *Writer) { w.Set("x", Value{Type: Array, Elem: ValueType(40)}) }, "invalid array element type"},
		{func(w *Writer) { w.Set("x", Value{Type: Array, Elem: Array, V: []Value{{Type: Int8, V: int8(1)}}}) }, "element 0"},
		{func(w *Writer) { w.Set("x", nested(maxNesting+1)) }, "nested"},
		{func(w *Writer) { w.SetString("", "x") }, "empty metadata key"},
		{func(w *Writer) { w.SetUint32("general.alignment", 48) }, "power of two"},
		{func(w *Writer) { w.SetUint32("general.alignment", 0) }, "power of two"},
		{func(w *Writer) { w.SetInt32("general.alignment", 32) }, "must be a uint32"},
	}
	for i, c := range bad {
		w := NewWriter()
		c.set(w)
		_, err := w.WriteTo(io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("case %d: WriteTo = %v, want error containing %q", i, err, c.want)
		}
	}
	// The deepest nesting the writer accepts, the reader accepts too.
	w = NewWriter()
	w.Set("deep", nested(maxNesting))
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := f.Value("deep"); !reflect.DeepEqual(v, nested(maxNesting)) {
		t.Errorf("deep nesting read back as %#v", v)
	}
}

// nested returns an array value with depth levels of arrays: depth 1 is a plain []int32.
func nested(depth int) Value {
	if depth == 1 {
		return Value{Type: Array, Elem: Int32, V: []int32{1}}
	}
	return Value{Type: Array, Elem: Array, V: []Value{nested(depth - 1)}}
}

// corruptBase is a small valid file whose fields the corruption table locates and mutates.
func corruptBase(t testing.TB) []byte {
	r := rand.New(rand.NewSource(3))
	kvs := []KV{
		{"general.architecture", Value{Type: String, V: "llama"}},
		{"a.x", Value{Type: Uint32, V: uint32(7)}},
		{"a.y", Value{Type: Uint32, V: uint32(8)}},
		{"general.alignment", Value{Type: Uint32, V: uint32(32)}},
		{"arr.s", Value{Type: Array, Elem: String, V: []string{"p", "q"}}},
		{"arr.n", Value{Type: Array, Elem: Int32, V: []int32{1, 2, 3}}},
	}
	ts := []testTensor{
		{"t.a", tensor.F32, []int64{4, 2}, randBytes(r, 32)},
		{"t.b", tensor.Q8_0, []int64{32, 1}, randBytes(r, 34)},
	}
	return buildFile(t, 3, kvs, ts)
}

// field returns the offset of the length prefix of the string s, which must occur once.
func field(t testing.TB, b []byte, s string) int {
	t.Helper()
	pat := binary.LittleEndian.AppendUint64(nil, uint64(len(s)))
	pat = append(pat, s...)
	i := bytes.Index(b, pat)
	if i < 0 || bytes.Index(b[i+1:], pat) >= 0 {
		t.Fatalf("string %q not found exactly once", s)
	}
	return i
}

func put32(b []byte, off int, v uint32) { binary.LittleEndian.PutUint32(b[off:], v) }
func put64(b []byte, off int, v uint64) { binary.LittleEndian.PutUint64(b[off:], v) }

func TestCorrupt(t *testing.T) {
	base := corruptBase(t)
	if _, err := Parse(base); err != nil {
		t.Fatal(err)
	}
	// Offsets within a KV (s = offset of the key's length prefix, key of length k):
	// type at s+8+k, value at s+12+k. Within a tensor info of name length k and n dims:
	// n_dims at s+8+k, dims at s+12+k, dtype after the dims, then the offset.
	kv := func(b []byte, key string) (typ, val int) {
		s := field(t, b, key)
		return s + 8 + len(key), s + 12 + len(key)
	}
	type ti struct{ ndims, dims, dtype, offset int }
	tinfo := func(b []byte, name string, n int) ti {
		s := field(t, b, name) + 8 + len(name)
		return ti{s, s + 4, s + 4 + 8*n, s + 8 + 8*n}
	}
	cases := []struct {
		name string
		mut  func(b []byte) []byte
		want string
	}{
		{"empty", func(b []byte) []byte { return nil }, "truncated at offset 0 reading magic"},
		{"bad magic", func(b []byte) []byte { b[0] = 'X'; return b }, "bad magic"},
		{"big-endian magic", func(b []byte) []byte { copy(b, "FUGG"); return b }, "big-endian"},
		{"big-endian version", func(b []byte) []byte { put32(b, 4, 0x03000000); return b }, "big-endian"},
		{"version 1", func(b []byte) []byte { put32(b, 4, 1); return b }, "version 1 is not supported"},
		{"version 0", func(b []byte) []byte { put32(b, 4, 0); return b }, "bad GGUF version 0"},
		{"version 4", func(b []byte) []byte { put32(b, 4, 4); return b }, "unsupported GGUF version 4"},
		{"truncated version", func(b []byte) []byte { return b[:6] }, "truncated at offset 4 reading version"},
		{"tensor count", func(b []byte) []byte { put64(b, 8, 1<<40); return b }, "tensor count 1099511627776"},
		{"negative tensor count", func(b []byte) []byte { put64(b, 8, math.MaxUint64); return b }, "tensor count"},
		{"kv count", func(b []byte) []byte { put64(b, 16, 1<<40); return b }, "metadata count 1099511627776"},
		{"more kvs than present", func(b []byte) []byte { put64(b, 16, 7); return b }, ""},
		{"key length", func(b []byte) []byte {
			put64(b, field(t, b, "a.x"), 1<<50)
			return b
		}, "metadata entry 1: key at offset"},
		{"empty key", func(b []byte) []byte { put64(b, field(t, b, "a.x"), 0); return b }, "empty key"},
		{"string length", func(b []byte) []byte {
			put64(b, field(t, b, "llama"), 1<<40)
			return b
		}, "string at offset"},
		{"invalid value type", func(b []byte) []byte {
			typ, _ := kv(b, "a.x")
			put32(b, typ, 13)
			return b
		}, "invalid value type 13"},
		{"invalid element type", func(b []byte) []byte {
			_, val := kv(b, "arr.n")
			put32(b, val, 77)
			return b
		}, "invalid array element type 77"},
		{"array count", func(b []byte) []byte {
			_, val := kv(b, "arr.n")
			put64(b, val+4, 1<<40)
			return b
		}, "array count 1099511627776 of int32"},
		{"string array count", func(b []byte) []byte {
			_, val := kv(b, "arr.s")
			put64(b, val+4, 1<<61)
			return b
		}, "array count 2305843009213693952 of string"},
		{"string in array", func(b []byte) []byte {
			put64(b, field(t, b, "q"), 1<<33)
			return b
		}, "array element 1: string at offset"},
		{"duplicate key", func(b []byte) []byte {
			s := field(t, b, "a.y")
			b[s+8+2] = 'x'
			return b
		}, `duplicate key "a.x" (first is entry 1)`},
		{"alignment not pow2", func(b []byte) []byte {
			_, val := kv(b, "general.alignment")
			put32(b, val, 48)
			return b
		}, "general.alignment 48 at offset 107 is not a power of two"},
		{"alignment zero", func(b []byte) []byte {
			_, val := kv(b, "general.alignment")
			put32(b, val, 0)
			return b
		}, "general.alignment 0 at offset 107 is not a power of two"},
		{"alignment type", func(b []byte) []byte {
			typ, _ := kv(b, "general.alignment")
			put32(b, typ, uint32(Int32))
			return b
		}, "general.alignment at offset 107 has type int32, want uint32"},
		{"too many dims", func(b []byte) []byte {
			put32(b, tinfo(b, "t.a", 2).ndims, 5)
			return b
		}, `tensor "t.a": 5 dimensions, the limit is 4`},
		{"negative dim", func(b []byte) []byte {
			put64(b, tinfo(b, "t.a", 2).dims, math.MaxUint64)
			return b
		}, `tensor "t.a": dimension 0 is negative (-1)`},
		{"element overflow", func(b []byte) []byte {
			put64(b, tinfo(b, "t.a", 2).dims+8, 1<<62)
			return b
		}, `tensor "t.a": element count of shape [4 4611686018427387904] overflows`},
		{"byte size overflow", func(b []byte) []byte {
			put64(b, tinfo(b, "t.a", 2).dims+8, 1<<60)
			return b
		}, `tensor "t.a": byte size of shape [4 1152921504606846976] overflows`},
		{"block size", func(b []byte) []byte {
			put64(b, tinfo(b, "t.b", 2).dims, 16)
			return b
		}, `tensor "t.b": row of 16 elements is not a multiple of the Q8_0 block size 32`},
		{"unknown dtype", func(b []byte) []byte {
			put32(b, tinfo(b, "t.a", 2).dtype, 99)
			return b
		}, `tensor "t.a": unknown dtype id 99`},
		{"retired dtype", func(b []byte) []byte {
			put32(b, tinfo(b, "t.a", 2).dtype, 4) // Q4_2, removed from ggml
			return b
		}, "unknown dtype id 4"},
		{"misaligned offset", func(b []byte) []byte {
			put64(b, tinfo(b, "t.b", 2).offset, 33)
			return b
		}, `tensor "t.b": data offset 33 is not a multiple of the alignment 32`},
		{"offset past end", func(b []byte) []byte {
			put64(b, tinfo(b, "t.b", 2).offset, 1<<20)
			return b
		}, `tensor "t.b": data [1048576, 1048610) of the data section runs past its end`},
		{"huge offset", func(b []byte) []byte {
			put64(b, tinfo(b, "t.b", 2).offset, math.MaxUint64&^31)
			return b
		}, `tensor "t.b": data offset 18446744073709551584 is out of range`},
		{"offset near end", func(b []byte) []byte {
			put64(b, tinfo(b, "t.b", 2).offset, 64) // 34 bytes from 64 need 98, data is 96
			return b
		}, "runs past its end at 96"},
		{"overlap", func(b []byte) []byte {
			put64(b, tinfo(b, "t.b", 2).offset, 0)
			return b
		}, `tensors "t.a" [0, 32) and "t.b" [0, 34) overlap`},
		{"duplicate tensor", func(b []byte) []byte {
			s := field(t, b, "t.b")
			b[s+8+2] = 'a'
			return b
		}, `tensor 1: duplicate name "t.a" (first is tensor 0)`},
		{"truncated data", func(b []byte) []byte { return b[:len(b)-40] }, "runs past its end"},
		{"truncated dims", func(b []byte) []byte {
			return b[:tinfo(b, "t.b", 2).dims+3]
		}, `tensor "t.b": truncated at offset`},
		{"truncated tensor name", func(b []byte) []byte {
			return b[:field(t, b, "t.b")+9]
		}, "tensor 1: name at offset"},
		// The counts bound the truncations below only loosely: one long-keyed entry leaves room.
		{"truncated kv type", func(b []byte) []byte {
			b = oneKV(t, Value{Type: Uint32, V: uint32(1)})
			typ, _ := kv(b, longKey)
			return b[:typ+2]
		}, `metadata "` + longKey + `": truncated at offset 80 reading value type: need 4 bytes, 2 left`},
		{"truncated u32 value", func(b []byte) []byte {
			b = oneKV(t, Value{Type: Uint32, V: uint32(1)})
			_, val := kv(b, longKey)
			return b[:val+1]
		}, "truncated at offset 84 reading uint32 value: need 4 bytes, 1 left"},
		{"truncated f64 value", func(b []byte) []byte {
			b = oneKV(t, Value{Type: Float64, V: 1.0})
			_, val := kv(b, longKey)
			return b[:val+7]
		}, "reading float64 value: need 8 bytes, 7 left"},
		{"truncated element type", func(b []byte) []byte {
			b = oneKV(t, Value{Type: Array, Elem: Uint8, V: []uint8{}})
			_, val := kv(b, longKey)
			return b[:val+3]
		}, "reading array element type"},
		{"truncated array count", func(b []byte) []byte {
			b = oneKV(t, Value{Type: Array, Elem: Uint8, V: []uint8{}})
			_, val := kv(b, longKey)
			return b[:val+4+5]
		}, "reading array count: need 8 bytes, 5 left"},
		{"truncated string length", func(b []byte) []byte {
			b = oneKV(t, Value{Type: String, V: ""})
			_, val := kv(b, longKey)
			return b[:val+3]
		}, "reading string length"},
		{"truncated nested array", func(b []byte) []byte {
			b = oneKV(t, Value{Type: Array, Elem: Array, V: []Value{
				{Type: Array, Elem: Int32, V: []int32{1, 2, 3, 4, 5, 6}},
				{Type: Array, Elem: Int32, V: []int32{1, 2, 3, 4, 5, 6}}}})
			_, val := kv(b, longKey)
			return b[:val+4+8+(4+8+24)+2]
		}, "array element 1: truncated at offset 132 reading array element type"},
		{"data section past end", func(b []byte) []byte {
			return b[:tinfo(b, "t.b", 2).offset+8+1]
		}, "data section would start at offset"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			b := c.mut(bytes.Clone(base))
			f, err := Parse(b)
			if err == nil {
				t.Fatalf("no error; file has %d kvs %d tensors", len(f.KVs), len(f.Tensors))
			}
			if !errors.Is(err, ErrFormat) {
				t.Errorf("error %v does not wrap ErrFormat", err)
			}
			var fe *FormatError
			if !errors.As(err, &fe) || fe.Offset < 0 || fe.Offset > int64(len(b)) {
				t.Errorf("error %v: bad FormatError offset", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not contain %q", err, c.want)
			}
		})
	}
}

const longKey = "a.rather.long.key.that.leaves.room.for.one.entry"

// oneKV returns a file holding just longKey = v.
func oneKV(t testing.TB, v Value) []byte {
	return buildFile(t, 3, []KV{{longKey, v}}, nil)
}

func TestNestingLimit(t *testing.T) {
	w := NewWriter()
	w.Set("deep", nested(maxNesting))
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	// Turn the innermost int32 array into an array of arrays: one level too deep.
	b := buf.Bytes()
	i := bytes.Index(b, []byte{byte(Int32), 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0})
	if i < 0 {
		t.Fatal("innermost array not found")
	}
	put32(b, i, uint32(Array))
	_, err := Parse(b)
	if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "nested more than") {
		t.Errorf("got %v", err)
	}
}

func TestZeroDimsAndScalar(t *testing.T) {
	// A record with n_dims == 0 is a one-element tensor to ggml; it reads as shape [1].
	w := NewWriter()
	if err := w.AddTensor("s", tensor.F32, []int64{1}, []byte{1, 2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	if err := w.AddTensor("z", tensor.Q4_0, []int64{32, 0, 3}, nil); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	// Rewrite tensor "s" with n_dims = 0: drop its single dimension.
	b := buf.Bytes()
	s := field(t, b, "s") + 9
	scalar := append(append(bytes.Clone(b[:s]), 0, 0, 0, 0), b[s+12:]...)
	// The header shrank by 8 bytes; restore the data section's position with 8 bytes of padding.
	dataStart := alignUp(int64(s+12+4+8+8+1+4+8*3+4+8), 32)
	scalar = append(scalar[:dataStart-8], append(make([]byte, 8), scalar[dataStart-8:]...)...)
	f, err := Parse(scalar)
	if err != nil {
		t.Fatal(err)
	}
	ts, _ := f.Tensor("s")
	if !reflect.DeepEqual(ts.Shape, []int64{1}) || ts.Size != 4 || !bytes.Equal(f.TensorData(ts), []byte{1, 2, 3, 4}) {
		t.Errorf("scalar tensor: %+v", ts)
	}
	tz, _ := f.Tensor("z")
	if !reflect.DeepEqual(tz.Shape, []int64{32, 0, 3}) || tz.Size != 0 || tz.Elements() != 0 || tz.Rows() != 0 {
		t.Errorf("zero-sized tensor: %+v", tz)
	}
}

func TestTruncation(t *testing.T) {
	base := corruptBase(t)
	f, err := Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	// The bytes a reader needs end with the last tensor's data; padding after it is optional.
	need := 0
	for _, ti := range f.Tensors {
		need = max(need, int(f.DataOffset()+ti.Offset+ti.Size))
	}
	for n := 0; n < len(base); n++ {
		_, err := Parse(bytes.Clone(base[:n]))
		if n < need && (err == nil || !errors.Is(err, ErrFormat)) {
			t.Fatalf("prefix of %d bytes: error %v", n, err)
		}
		if n >= need && err != nil {
			t.Fatalf("prefix of %d bytes (only padding cut): %v", n, err)
		}
	}
}

func TestRealFiles(t *testing.T) {
	for _, path := range modelFiles(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			f, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			st, _ := os.Stat(path)
			if f.Version != 2 && f.Version != 3 {
				t.Errorf("version %d", f.Version)
			}
			if f.Architecture() == "" {
				t.Error("no general.architecture")
			}
			toks, ok := f.Strings("tokenizer.ggml.tokens")
			if !ok || len(toks) == 0 {
				t.Fatal("no tokenizer.ggml.tokens")
			}
			if model, ok := f.String("tokenizer.ggml.model"); !ok || model == "" {
				t.Error("no tokenizer.ggml.model")
			}
			if sc, ok := f.Floats("tokenizer.ggml.scores"); ok && len(sc) != len(toks) {
				t.Errorf("%d scores for %d tokens", len(sc), len(toks))
			}
			if tt, ok := f.Ints("tokenizer.ggml.token_type"); ok && len(tt) != len(toks) {
				t.Errorf("%d token types for %d tokens", len(tt), len(toks))
			}
			var total int64
			for i := range f.Tensors {
				ti := &f.Tensors[i]
				if !ti.DType.Known() || len(ti.Shape) == 0 || ti.Shape[0] <= 0 {
					t.Errorf("tensor %s: %v %v", ti.Name, ti.DType, ti.Shape)
				}
				if d := f.TensorData(ti); int64(len(d)) != ti.Size {
					t.Errorf("tensor %s: %d bytes of data, size %d", ti.Name, len(d), ti.Size)
				}
				total += ti.Size
			}
			if total > st.Size() {
				t.Errorf("tensors total %d bytes, file is %d", total, st.Size())
			}
			if strings.Contains(path, "/llm/") {
				if arch := f.Architecture(); arch != "llama" {
					t.Errorf("architecture %q", arch)
				}
				if len(toks) != 512 {
					t.Errorf("%d tokens, want 512", len(toks))
				}
				if n, ok := f.Int("llama.block_count"); !ok || n != 5 {
					t.Errorf("llama.block_count = %d %v", n, ok)
				}
				if len(f.Tensors) != 48 {
					t.Errorf("%d tensors", len(f.Tensors))
				}
			}
			if filepath.Base(path) == "stories260K-f32.gguf" {
				ti, ok := f.Tensor("token_embd.weight")
				if !ok || ti.DType != tensor.F32 || !reflect.DeepEqual(ti.Shape, []int64{64, 512}) || ti.Size != 64*512*4 {
					t.Fatalf("token_embd.weight = %+v", ti)
				}
				d := f.TensorData(ti)
				v := math.Float32frombits(binary.LittleEndian.Uint32(d))
				if math.IsNaN(float64(v)) || math.Abs(float64(v)) > 100 {
					t.Errorf("token_embd.weight[0] = %v", v)
				}
			}
		})
	}
}

// reencode writes f back out with the Writer.
func reencode(f *File) ([]byte, error) {
	w := NewWriter()
	w.SetVersion(f.Version)
	for _, kv := range f.KVs {
		w.Set(kv.Key, kv.Value)
	}
	for i := range f.Tensors {
		ti := &f.Tensors[i]
		if err := w.AddTensor(ti.Name, ti.DType, ti.Shape, f.TensorData(ti)); err != nil {
			return nil, err
		}
	}
	var buf bytes.Buffer
	_, err := w.WriteTo(&buf)
	return buf.Bytes(), err
}

func FuzzParse(f *testing.F) {
	r := rand.New(rand.NewSource(4))
	f.Add(corruptBase(f))
	f.Add(buildFile(f, 2, everyValue()[:10], makeTensors(r)[:3]))
	f.Add(buildFile(f, 3, everyValue()[25:], nil))
	if s := sharedtest.Lookup(); s != "" {
		for _, sub := range []string{"llm", "vocab"} {
			m, _ := filepath.Glob(filepath.Join(s, "models", sub, "*.gguf"))
			for _, p := range m {
				b, err := os.ReadFile(p)
				if err == nil {
					f.Add(b[:min(len(b), 64<<10)])
				}
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not wrap ErrFormat", err)
			}
			return
		}
		for i := range file.Tensors {
			ti := &file.Tensors[i]
			if d := file.TensorData(ti); int64(len(d)) != ti.Size {
				t.Fatalf("tensor %q: %d bytes, size %d", ti.Name, len(d), ti.Size)
			}
		}
		// Whatever parses, the Writer can write, and writing is a fixed point after one pass.
		b1, err := reencode(file)
		if err != nil {
			t.Fatalf("re-encoding a parsed file: %v", err)
		}
		f1, err := Parse(b1)
		if err != nil {
			t.Fatalf("parsing a re-encoded file: %v", err)
		}
		b2, err := reencode(f1)
		if err != nil || !bytes.Equal(b1, b2) {
			t.Fatalf("re-encoding is not stable: %v", err)
		}
	})
}

// BenchmarkOpenVocab opens and parses the largest vocabulary file (most tokens).
func BenchmarkOpenVocab(b *testing.B) {
	var path string
	var size int64
	for _, p := range modelFiles(b) {
		if st, err := os.Stat(p); err == nil && strings.Contains(p, "vocab") && st.Size() > size {
			path, size = p, st.Size()
		}
	}
	if path == "" {
		b.Skip("no vocab files")
	}
	f, err := Open(path)
	if err != nil {
		b.Fatal(err)
	}
	toks, _ := f.Strings("tokenizer.ggml.tokens")
	f.Close()
	b.SetBytes(size)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f, err := Open(path)
		if err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
	b.ReportMetric(float64(len(toks))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
	b.Logf("%s: %d tokens", filepath.Base(path), len(toks))
}
