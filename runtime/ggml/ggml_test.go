package ggml

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/tensor"
)

var tinyHP = HParams{NVocab: 51865, NAudioCtx: 1500, NAudioState: 384, NAudioHead: 6, NAudioLayer: 4,
	NTextCtx: 448, NTextState: 384, NTextHead: 6, NTextLayer: 4, NMels: 80, FType: 1}

// smallFile returns a file with every accepted tensor type, filled with seeded random bytes, and
// its parts.
func smallFile(t testing.TB) ([]byte, HParams, Filters, [][]byte, []Tensor) {
	rng := rand.New(rand.NewPCG(1, 2))
	hp := tinyHP
	hp.FType = 2007 // Q8_0, quantisation version 2
	fl := Filters{NMel: 3, NFFT: 5, Data: make([]float32, 15)}
	for i := range fl.Data {
		fl.Data[i] = rng.Float32()
	}
	vocab := [][]byte{[]byte("!"), {}, []byte(" hello"), {0xff, 0x00}, []byte("a")}
	var ts []Tensor
	for i, dt := range []tensor.DType{tensor.F32, tensor.F16, tensor.Q4_0, tensor.Q4_1, tensor.Q5_0, tensor.Q5_1, tensor.Q8_0} {
		ne := []int{32 * (i%2 + 1), 3}
		if i%3 == 2 {
			ne = append(ne, 2)
		}
		if dt == tensor.F32 {
			ne = []int{7} // odd, one dimension
		}
		size, err := dataSize(dt, toInt64(ne))
		if err != nil {
			t.Fatal(err)
		}
		data := make([]byte, size)
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		ts = append(ts, Tensor{Name: "t." + dt.String(), Type: dt, Ne: ne, Data: data})
	}
	var buf bytes.Buffer
	if err := Write(&buf, hp, fl, vocab, ts); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), hp, fl, vocab, ts
}

func toInt64(ne []int) []int64 {
	out := make([]int64, len(ne))
	for i, n := range ne {
		out[i] = int64(n)
	}
	return out
}

func checkEqual(t *testing.T, f *File, hp HParams, fl Filters, vocab [][]byte, ts []Tensor) {
	t.Helper()
	if f.HParams != hp {
		t.Errorf("hparams %+v, want %+v", f.HParams, hp)
	}
	if f.Filters.NMel != fl.NMel || f.Filters.NFFT != fl.NFFT || !reflect.DeepEqual(f.Filters.Data, fl.Data) {
		t.Errorf("filters differ")
	}
	if len(f.Vocab) != len(vocab) {
		t.Fatalf("%d tokens, want %d", len(f.Vocab), len(vocab))
	}
	for i := range vocab {
		if !bytes.Equal(f.Vocab[i], vocab[i]) {
			t.Errorf("token %d = %q, want %q", i, f.Vocab[i], vocab[i])
		}
	}
	if len(f.Tensors) != len(ts) {
		t.Fatalf("%d tensors, want %d", len(f.Tensors), len(ts))
	}
	for i := range ts {
		g, w := &f.Tensors[i], &ts[i]
		if g.Name != w.Name || g.Type != w.Type || !reflect.DeepEqual(g.Ne, w.Ne) || !bytes.Equal(g.Data, w.Data) {
			t.Errorf("tensor %d: got %q %v %v (%d bytes), want %q %v %v (%d bytes)",
				i, g.Name, g.Type, g.Ne, len(g.Data), w.Name, w.Type, w.Ne, len(w.Data))
		}
		if p, ok := f.Tensor(w.Name); !ok || p != g {
			t.Errorf("Tensor(%q) does not find tensor %d", w.Name, i)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	b, hp, fl, vocab, ts := smallFile(t)
	f, err := Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	checkEqual(t, f, hp, fl, vocab, ts)
	if dt, err := f.HParams.WeightType(); err != nil || dt != tensor.Q8_0 || f.HParams.QuantVersion() != 2 {
		t.Errorf("WeightType = %v, %v; QuantVersion = %d", dt, err, f.HParams.QuantVersion())
	}
	for i := range f.Tensors {
		tt := &f.Tensors[i]
		if !bytes.Equal(b[tt.Offset:tt.Offset+int64(len(tt.Data))], tt.Data) {
			t.Errorf("tensor %q: Offset %d does not locate its data", tt.Name, tt.Offset)
		}
		if tt.Elements() != int64(len(tt.Data))/int64(tt.Type.TypeSize())*int64(tt.Type.BlockSize()) {
			t.Errorf("tensor %q: Elements %d disagrees with %d bytes", tt.Name, tt.Elements(), len(tt.Data))
		}
	}
	if _, ok := f.Tensor("absent"); ok {
		t.Error("Tensor found an absent name")
	}

	p := filepath.Join(t.TempDir(), "m.bin")
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	of, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	checkEqual(t, of, hp, fl, vocab, ts)
	if err := of.Close(); err != nil {
		t.Fatal(err)
	}
	if err := of.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
	if of.Tensors[0].Data != nil || len(of.Vocab) != len(vocab) || !bytes.Equal(of.Vocab[2], vocab[2]) {
		t.Error("after Close: tensor data kept or vocabulary lost")
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Open(filepath.Join(dir, "absent")); err == nil {
		t.Error("absent file opened")
	}
	if _, err := Open(dir); err == nil {
		t.Error("directory opened")
	}
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o644)
	if _, err := Open(empty); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), empty) {
		t.Errorf("empty file: %v", err)
	}
	bad := filepath.Join(dir, "bad")
	os.WriteFile(bad, []byte("GGUF\x03\x00\x00\x00"), 0o644)
	if _, err := Open(bad); !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), "bad magic") {
		t.Errorf("GGUF file: %v", err)
	}
}

// TestRealFiles parses whisper.cpp's weightless test models and checks that writing their parts
// back gives the same bytes.
func TestRealFiles(t *testing.T) {
	want := map[string]HParams{
		"tiny":    tinyHP,
		"tiny.en": {51864, 1500, 384, 6, 4, 448, 384, 6, 4, 80, 1},
		"base.en": {51864, 1500, 512, 8, 6, 448, 512, 8, 6, 80, 1},
	}
	for name, hp := range want {
		t.Run(name, func(t *testing.T) {
			p := sharedtest.Path(t, "models/asr/for-tests-ggml-"+name+".bin")
			f, err := Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if f.HParams != hp {
				t.Errorf("hparams %+v, want %+v", f.HParams, hp)
			}
			if dt, err := f.HParams.WeightType(); err != nil || dt != tensor.F16 {
				t.Errorf("WeightType = %v, %v", dt, err)
			}
			if f.Filters.NMel != 80 || f.Filters.NFFT != 201 || len(f.Filters.Data) != 80*201 {
				t.Errorf("filters %d x %d (%d values)", f.Filters.NMel, f.Filters.NFFT, len(f.Filters.Data))
			}
			var sum float64
			for _, v := range f.Filters.Data {
				if v < 0 || math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("filter value %v", v)
				}
				sum += float64(v)
			}
			if sum == 0 {
				t.Error("filters are all zero")
			}
			if len(f.Vocab) != 50257 || string(f.Vocab[0]) != "!" || string(f.Vocab[220]) != " " {
				t.Errorf("vocab: %d tokens, [0]=%q [220]=%q", len(f.Vocab), f.Vocab[0], f.Vocab[220])
			}
			if len(f.Tensors) != 0 {
				t.Errorf("%d tensors, want none", len(f.Tensors))
			}
			orig, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			if err := Write(&buf, f.HParams, f.Filters, f.Vocab, nil); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), orig) {
				t.Error("rewritten file differs from the original")
			}
		})
	}
}

// TestNotWhisper checks that another model kind in the same container (same magic, different
// layout) is refused with a format error rather than misread.
func TestNotWhisper(t *testing.T) {
	p := sharedtest.Path(t, "models/asr/for-tests-ggml-parakeet-tdt.bin")
	_, err := Open(p)
	if !errors.Is(err, ErrFormat) {
		t.Fatalf("got %v, want a format error", err)
	}
	t.Log(err)
}

// patch returns a copy of b with v written as a little-endian int32 at off.
func patch(b []byte, off int, v int32) []byte {
	c := bytes.Clone(b)
	binary.LittleEndian.PutUint32(c[off:], uint32(v))
	return c
}

func TestCorrupt(t *testing.T) {
	b, _, _, vocab, ts := smallFile(t)
	filtersOff := 48
	vocabOff := filtersOff + 8 + 4*15
	tok3 := vocabOff + 4 + (4 + 1) + 4 + (4 + 6) // length field of token 3
	tens := make([]int, len(ts)+1)               // record offsets
	tens[len(ts)] = len(b)
	for i := len(ts) - 1; i >= 0; i-- {
		tens[i] = tens[i+1] - (tensorHeader + 4*len(ts[i].Ne) + len(ts[i].Name) + len(ts[i].Data))
	}
	tens0, tens1, tens2 := tens[0], tens[1], tens[2]
	if ts[2].Type != tensor.Q4_0 || len(vocab) != 5 {
		t.Fatal("smallFile changed: update the offsets below")
	}

	dup := bytes.Clone(b)
	copy(dup[tens1+tensorHeader+4*len(ts[1].Ne):], ts[0].Name) // "t.F16" -> "t.F32"

	cases := []struct {
		name string
		b    []byte
		msg  string
		off  int64
	}{
		{"empty", nil, "truncated at offset 0 reading magic", 0},
		{"gguf", []byte("GGUF\x03\x00\x00\x00"), "bad magic", 0},
		{"byte-swapped", append([]byte("ggml"), b[4:]...), "byte-swapped", 0},
		{"short hparams", b[:20], "reading hyperparameter n_audio_layer", 20},
		{"zero n_vocab", patch(b, 4, 0), "n_vocab at offset 4: 0, want a positive value", 4},
		{"negative n_mels", patch(b, 40, -80), "n_mels at offset 40: -80 is out of range", 40},
		{"bad ftype", patch(b, 44, 2005), "ftype at offset 44: 2005 names no weight type", 44},
		{"negative filters", patch(b, filtersOff, -1), "negative size -1 x 5", int64(filtersOff)},
		{"huge filters", patch(b, filtersOff+4, 1<<30), "need 12884901888 bytes", int64(filtersOff)},
		{"filters overflow", patch(patch(b, filtersOff, math.MaxInt32), filtersOff+4, math.MaxInt32), "float32 need", int64(filtersOff)},
		{"negative vocab", patch(b, vocabOff, -3), "vocabulary size at offset 116 is negative (-3)", int64(vocabOff)},
		{"huge vocab", patch(b, vocabOff, math.MaxInt32), "vocabulary size 2147483647", int64(vocabOff)},
		{"long token", patch(b, tok3, 1<<30), "token 3 at offset 139: length 1073741824 exceeds", int64(tok3)},
		{"token length 2^32-1", patch(b, tok3, -1), "length 4294967295 exceeds", int64(tok3)},
		{"zero dims", patch(b, tens0, 0), "0 dimensions, want 1 to 4", int64(tens0)},
		{"five dims", patch(b, tens0, 5), "5 dimensions", int64(tens0)},
		{"empty name", patch(b, tens0+4, 0), "name length 0", int64(tens0 + 4)},
		{"long name", patch(b, tens0+4, 64), "name length 64, want 1 to 63", int64(tens0 + 4)},
		{"unknown type", patch(b, tens0+8, 99), "unknown or unsupported type id 99", int64(tens0 + 8)},
		{"unsupported type", patch(b, tens0+8, int32(tensor.Q4_K)), "type id 12", int64(tens0 + 8)},
		{"negative type", patch(b, tens0+8, -1), "type id -1", int64(tens0 + 8)},
		{"negative dim", patch(b, tens0+12, -7), "dimension 0 is negative (-7)", int64(tens0 + 12)},
		{"huge dim", patch(b, tens0+12, math.MaxInt32), "needs 8589934588 bytes of data", int64(tens0 + 12 + 4 + len(ts[0].Name))},
		{"partial block", patch(b, tens2+12, 33), "not a multiple of the block size 32", int64(tens2)},
		{"duplicate name", dup, `tensor 1 "t.F32" at offset ` + strconv.Itoa(tens1) + ": duplicate name (first is tensor 0)", int64(tens1)},
		{"short header", b[:tens1+5], "reading header of tensor 1", int64(tens1)},
		{"short shape", b[:tens1+tensorHeader+3], "reading shape and name of tensor 1", int64(tens1 + tensorHeader)},
		{"short data", b[:len(b)-1], "needs 102 bytes of data", int64(len(b) - 102)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(c.b)
			var fe *FormatError
			if !errors.As(err, &fe) || !errors.Is(err, ErrFormat) {
				t.Fatalf("got %v, want a *FormatError", err)
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Errorf("error %q does not contain %q", err, c.msg)
			}
			if fe.Offset != c.off {
				t.Errorf("offset %d, want %d (%v)", fe.Offset, c.off, err)
			}
		})
	}
}

// TestTruncation cuts a file at every length: a cut at the end of a record gives a valid file
// with the records before it, any other cut a format error.
func TestTruncation(t *testing.T) {
	b, _, _, _, ts := smallFile(t)
	ends := map[int]int{} // file length -> tensors it holds
	end := len(b)
	for i := len(ts); i >= 0; i-- {
		ends[end] = i
		if i > 0 {
			tt := ts[i-1]
			end -= tensorHeader + 4*len(tt.Ne) + len(tt.Name) + len(tt.Data)
		}
	}
	for n := 0; n <= len(b); n++ {
		f, err := Parse(b[:n])
		if want, ok := ends[n]; ok {
			if err != nil {
				t.Fatalf("length %d: %v", n, err)
			}
			if len(f.Tensors) != want {
				t.Fatalf("length %d: %d tensors, want %d", n, len(f.Tensors), want)
			}
			continue
		}
		if !errors.Is(err, ErrFormat) {
			t.Fatalf("length %d: got %v, want a format error", n, err)
		}
	}
}

func TestWriterErrors(t *testing.T) {
	_, hp, fl, vocab, _ := smallFile(t)
	bad := hp
	bad.NTextHead = -1
	if _, err := NewWriter(&bytes.Buffer{}, bad, fl, vocab); err == nil || !strings.Contains(err.Error(), "n_text_head") {
		t.Errorf("negative hparam: %v", err)
	}
	bad = hp
	bad.FType = 4
	if _, err := NewWriter(&bytes.Buffer{}, bad, fl, vocab); err == nil || !strings.Contains(err.Error(), "ftype") {
		t.Errorf("bad ftype: %v", err)
	}
	if _, err := NewWriter(&bytes.Buffer{}, hp, Filters{NMel: 2, NFFT: 2, Data: make([]float32, 3)}, vocab); err == nil {
		t.Error("filters of the wrong length accepted")
	}
	w, err := NewWriter(&bytes.Buffer{}, hp, fl, vocab)
	if err != nil {
		t.Fatal(err)
	}
	f32 := make([]byte, 16)
	for _, c := range []struct {
		name string
		dt   tensor.DType
		ne   []int
		data []byte
		msg  string
	}{
		{"", tensor.F32, []int{4}, f32, "want 1 to 63"},
		{strings.Repeat("x", 64), tensor.F32, []int{4}, f32, "want 1 to 63"},
		{"a", tensor.Q4_K, []int{256}, make([]byte, 144), "not one whisper.cpp loads"},
		{"a", tensor.F32, nil, nil, "0 dimensions"},
		{"a", tensor.F32, []int{1, 1, 1, 1, 1}, f32[:4], "5 dimensions"},
		{"a", tensor.F32, []int{-4}, f32, "out of range"},
		{"a", tensor.F32, []int{int(dim31)}, f32, "out of range"}, // 2^31, or -2^31 where int has 32 bits
		{"a", tensor.F32, []int{5}, f32, "16 bytes of data, shape [5] of F32 needs 20"},
		{"a", tensor.Q8_0, []int{16}, f32, "multiple of the block size"},
		{"a", tensor.F32, []int{math.MaxInt32, math.MaxInt32, math.MaxInt32, math.MaxInt32}, f32, "overflows"},
	} {
		if err := w.WriteTensor(c.name, c.dt, c.ne, c.data); err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("WriteTensor(%q, %v, %v, %d bytes): %v, want %q", c.name, c.dt, c.ne, len(c.data), err, c.msg)
		}
	}
	if err := w.WriteTensor("a", tensor.F32, []int{4}, f32); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteTensor("a", tensor.F32, []int{4}, f32); err == nil || !strings.Contains(err.Error(), "twice") {
		t.Errorf("duplicate: %v", err)
	}
}

type failWriter struct{ n int }

func (w *failWriter) Write(p []byte) (int, error) {
	if w.n < len(p) {
		k := w.n
		w.n = 0
		return k, errors.New("disk full")
	}
	w.n -= len(p)
	return len(p), nil
}

func TestWriterSticky(t *testing.T) {
	b, hp, fl, vocab, ts := smallFile(t)
	err := Write(&failWriter{n: len(b) - 10}, hp, fl, vocab, ts)
	if err == nil || err.Error() != "disk full" {
		t.Fatalf("got %v, want the write error", err)
	}
}

func TestIsFile(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name string
		data []byte
		want bool
	}{{"model.bin", []byte("lmgg\x00\x00"), true}, {"gguf", []byte("GGUF\x03\x00"), false}, {"short", []byte("lm"), false}} {
		p := filepath.Join(dir, c.name)
		if err := os.WriteFile(p, c.data, 0o644); err != nil {
			t.Fatal(err)
		}
		if got, err := IsFile(p); got != c.want || err != nil {
			t.Errorf("%s: %v, %v; want %v", c.name, got, err, c.want)
		}
	}
	if _, err := IsFile(filepath.Join(dir, "absent")); err == nil {
		t.Error("a missing file: no error")
	}
}

// dim31 is 2^31, a variable so that a 32-bit build compiles int(dim31) (to -2^31).
var dim31 = int64(1) << 31
