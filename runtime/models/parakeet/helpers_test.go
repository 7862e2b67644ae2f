package parakeet

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/tensor"
)

// tinyHP is the shape of whisper.cpp's own test model (models/for-tests-ggml-parakeet-tdt.bin).
var tinyHP = HParams{NVocab: 10, NAudioCtx: 3200, NAudioState: 8, NAudioHead: 2, NAudioLayer: 1, NMels: 16,
	FType: 0, NFFT: 64, SubsamplingFactor: 8, NSubsamplingChannels: 4, NConvKernel: 3, NPredDim: 8,
	NPredLayers: 1, NTDTDurations: 2, NMaxTokens: 5}

// quantHP is a shape every file type fits: the large matrices' rows are multiples of 256, the
// prediction network's 32 (so the k-quants keep it F32, as whisper.cpp does for 640).
var quantHP = HParams{NVocab: 20, NAudioCtx: 5000, NAudioState: 256, NAudioHead: 4, NAudioLayer: 1, NMels: 128,
	NFFT: 64, SubsamplingFactor: 8, NSubsamplingChannels: 16, NConvKernel: 9, NPredDim: 32,
	NPredLayers: 2, NTDTDurations: 5, NMaxTokens: 10}

// synthFile builds a complete File of hyper-parameters h with seeded random contents: pieces
// (some word-initial, some punctuation), a filter bank, a window, durations 0..n-1, and every
// tensor of the type and shape h calls for, in whisper.cpp's order. F32 and F16 data are random
// normals; quantised data are random bytes with finite block scales.
func synthFile(t testing.TB, h HParams, seed uint64) *File {
	t.Helper()
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 7))
	f := &File{HParams: h}
	bins := h.NFFT/2 + 1
	f.Filters = make([]float32, h.NMels*bins)
	for i := range f.Filters {
		if rng.IntN(4) == 0 {
			f.Filters[i] = rng.Float32()
		}
	}
	f.Window = make([]float32, h.NFFT*3/4)
	for i := range f.Window {
		f.Window[i] = rng.Float32()
	}
	for i := range h.NTDTDurations {
		f.Durations = append(f.Durations, i)
	}
	pieces := make([][]byte, h.NVocab)
	for i := range pieces {
		switch {
		case i == 0:
			pieces[i] = []byte("<unk>")
		case i == 1:
			pieces[i] = []byte(".")
		case i%3 == 0:
			pieces[i] = []byte(fmt.Sprintf("\u2581w%d", i))
		default:
			pieces[i] = []byte(fmt.Sprintf("p%d", i))
		}
	}
	f.Vocab = NewVocab(pieces)
	sp, err := specs(h, &Weights{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sp {
		ne := trim(s.ne)
		if s.name == "encoder.layers.0.conv.batch_norm.num_batches_tracked" {
			ne = nil // a scalar, as the converter writes it
		}
		f.Tensors = append(f.Tensors, ggml.Tensor{Name: s.name, Type: s.dt, Ne: ne, Data: randomData(t, rng, s.dt, s.ne)})
	}
	f.index = map[string]int{}
	for i := range f.Tensors {
		f.index[f.Tensors[i].Name] = i
	}
	if f.Weights, err = bindWeights(h, f.Tensors, f.index); err != nil {
		t.Fatal(err)
	}
	return f
}

func randomData(t testing.TB, rng *rand.Rand, dt tensor.DType, ne [4]int) []byte {
	rowSize, err := dt.RowSize(int64(ne[0]))
	if err != nil {
		t.Fatal(err)
	}
	rows := ne[1] * ne[2] * ne[3]
	b := make([]byte, int(rowSize)*rows)
	switch dt {
	case tensor.F32:
		for i := 0; i < len(b); i += 4 {
			binary.LittleEndian.PutUint32(b[i:], math.Float32bits(float32(rng.NormFloat64())))
		}
	case tensor.F16:
		for i := 0; i < len(b); i += 2 {
			binary.LittleEndian.PutUint16(b[i:], uint16(0x3000+rng.IntN(0x1000))|uint16(rng.IntN(2))<<15)
		}
	default:
		for i := range b {
			b[i] = byte(rng.Uint32() & 0x3f) // keeps f16 scales finite
		}
	}
	return b
}

// ggmlBytes writes f in the ggml form.
func ggmlBytes(t testing.TB, f *File) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteGGML(&buf, f); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// sameModel reports the first difference between two files' contents, or "".
func sameModel(a, b *File) string {
	if a.HParams != b.HParams {
		return fmt.Sprintf("hparams %+v vs %+v", a.HParams, b.HParams)
	}
	if !equalF32(a.Filters, b.Filters) || !equalF32(a.Window, b.Window) {
		return "filters or window differ"
	}
	if fmt.Sprint(a.Durations) != fmt.Sprint(b.Durations) {
		return fmt.Sprintf("durations %v vs %v", a.Durations, b.Durations)
	}
	if a.Vocab.Size() != b.Vocab.Size() {
		return "vocabulary sizes differ"
	}
	for i := range a.Vocab.pieces {
		if a.Vocab.pieces[i] != b.Vocab.pieces[i] {
			return fmt.Sprintf("piece %d: %q vs %q", i, a.Vocab.pieces[i], b.Vocab.pieces[i])
		}
	}
	if len(a.Tensors) != len(b.Tensors) {
		return fmt.Sprintf("%d vs %d tensors", len(a.Tensors), len(b.Tensors))
	}
	for i := range a.Tensors {
		x := &a.Tensors[i]
		y, ok := b.Tensor(x.Name)
		if !ok {
			return "tensor " + x.Name + " is missing"
		}
		if x.Type != y.Type || padded(x.Ne) != padded(y.Ne) || !bytes.Equal(x.Data, y.Data) {
			return fmt.Sprintf("tensor %s: %v %v vs %v %v, or its bytes differ", x.Name, x.Type, x.Ne, y.Type, y.Ne)
		}
	}
	return ""
}

func equalF32(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}
