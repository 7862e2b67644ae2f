package parakeet

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/tensor"
)

// TestWhisperCppTestModel reads whisper.cpp's own test model (models/for-tests-ggml-parakeet-tdt.bin
// at 233fe1f, kept in shared/models/asr): a complete model of tiny shapes.
func TestWhisperCppTestModel(t *testing.T) {
	p := sharedtest.Path(t, "models/asr/for-tests-ggml-parakeet-tdt.bin")
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	f, err := ParseGGML(b)
	if err != nil {
		t.Fatal(err)
	}
	if f.HParams != tinyHP {
		t.Errorf("hparams %+v, want %+v", f.HParams, tinyHP)
	}
	if len(f.Tensors) != tinyHP.TensorCount() || f.Weights == nil {
		t.Errorf("%d tensors, want %d", len(f.Tensors), tinyHP.TensorCount())
	}
	if len(f.Window) != 64 || len(f.Filters) != 16*33 || len(f.Durations) != 2 || f.Durations[1] != 1 {
		t.Errorf("window %d, filters %d, durations %v", len(f.Window), len(f.Filters), f.Durations)
	}
	if p, _ := f.Vocab.Piece(1); p != "<s>" || f.Vocab.Blank() != 10 {
		t.Errorf("piece 1 %q, blank %d", p, f.Vocab.Blank())
	}
	if got := ggmlBytes(t, f); !bytes.Equal(got, b) {
		t.Errorf("written back, the file differs (%d vs %d bytes)", len(got), len(b))
	}
	if ok, err := IsModelFile(p); !ok || err != nil {
		t.Errorf("IsModelFile: %v, %v", ok, err)
	}
}

// TestRandomModels reads the random-weight models of the transducer references: the small one
// always (it is written back byte for byte), the 0.6b ones where sharedtest.ParakeetRandomModel
// allows it.
func TestRandomModels(t *testing.T) {
	small := HParams{NVocab: 256, NAudioCtx: 5000, NAudioState: 256, NAudioHead: 4, NAudioLayer: 4, NMels: 128,
		FType: 0, NFFT: 512, SubsamplingFactor: 8, NSubsamplingChannels: 64, NConvKernel: 9, NPredDim: 160,
		NPredLayers: 2, NTDTDurations: 5, NMaxTokens: 10}
	v2 := HParams{NVocab: 1024, NAudioCtx: 5000, NAudioState: 1024, NAudioHead: 8, NAudioLayer: 24, NMels: 128,
		FType: 0, NFFT: 512, SubsamplingFactor: 8, NSubsamplingChannels: 256, NConvKernel: 9, NPredDim: 640,
		NPredLayers: 2, NTDTDurations: 5, NMaxTokens: 10}
	v2f16 := v2
	v2f16.FType = 1
	for _, c := range []struct {
		shape   string
		f16     bool
		h       HParams
		tensors int
	}{{"small", false, small, 141}, {"0.6b-v2", false, v2, 721}, {"0.6b-v2", true, v2f16, 721}} {
		t.Run(c.shape+map[bool]string{false: "-f32", true: "-f16"}[c.f16], func(t *testing.T) {
			p := sharedtest.ParakeetRandomModel(t, c.shape, c.f16)
			f, err := Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			h := c.h
			if f.HParams != h {
				t.Errorf("hparams %+v, want %+v", f.HParams, h)
			}
			if len(f.Tensors) != c.tensors || h.TensorCount() != c.tensors {
				t.Errorf("%d tensors, %d expected, want %d", len(f.Tensors), h.TensorCount(), c.tensors)
			}
			if len(f.Window) != 400 || len(f.Filters) != 128*257 || len(f.Durations) != 5 || f.Durations[4] != 4 {
				t.Errorf("window %d, filters %d, durations %v", len(f.Window), len(f.Filters), f.Durations)
			}
			if p0, _ := f.Vocab.Piece(0); p0 != "<unk>" || int(f.Vocab.Blank()) != h.NVocab || !f.Vocab.IsPunctuation(1) {
				t.Errorf("piece 0 %q, blank %d", p0, f.Vocab.Blank())
			}
			w := f.Weights
			wt := map[bool]tensor.DType{false: tensor.F32, true: tensor.F16}[c.f16]
			if w.Embed.Type != wt || w.Layers[0].Q.Type != wt || w.PreConv[0].Weight.Type != tensor.F32 || w.Layers[0].ConvDW.Type != tensor.F32 {
				t.Errorf("types: embedding %v, q %v, conv.0 %v, depthwise %v", w.Embed.Type, w.Layers[0].Q.Type, w.PreConv[0].Weight.Type, w.Layers[0].ConvDW.Type)
			}
			if w.Layers[h.NAudioLayer-1].ConvDW.Ne[0] != 9 || w.LSTM[1].WIH.Ne[1] != 4*h.NPredDim || w.JointOut.Ne[1] != h.JointOutputs() {
				t.Errorf("shapes: %v %v %v", w.Layers[h.NAudioLayer-1].ConvDW.Ne, w.LSTM[1].WIH.Ne, w.JointOut.Ne)
			}
			// The blank's embedding row is zero (padding_idx in NeMo).
			rs := int(w.Embed.Type.TypeSize()) * h.NPredDim
			row := w.Embed.Data[h.NVocab*rs : (h.NVocab+1)*rs]
			if !bytes.Equal(row, make([]byte, len(row))) {
				t.Error("the blank's embedding row is not zero")
			}
			if ok, err := IsModelFile(p); !ok || err != nil {
				t.Errorf("IsModelFile: %v, %v", ok, err)
			}
			if c.shape != "small" {
				return
			}
			// The file written back is the generator's, byte for byte.
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if got := ggmlBytes(t, f); !bytes.Equal(got, b) {
				t.Errorf("written back, the file differs (%d vs %d bytes)", len(got), len(b))
			}
			if err := f.Close(); err != nil || f.Tensors[0].Data != nil {
				t.Errorf("Close: %v", err)
			}
			if err := f.Close(); err != nil {
				t.Errorf("second Close: %v", err)
			}
		})
	}
}

// TestNotParakeet: Whisper's ggml files share the magic but not the header.
func TestNotParakeet(t *testing.T) {
	p := sharedtest.Path(t, "models/asr/for-tests-ggml-tiny.bin")
	if ok, err := IsModelFile(p); ok || err != nil {
		t.Errorf("IsModelFile(whisper tiny) = %v, %v", ok, err)
	}
	if _, err := Open(p); !errors.Is(err, ErrFormat) {
		t.Errorf("Open(whisper tiny): %v, want a format error", err)
	}
	dir := t.TempDir()
	other := filepath.Join(dir, "x.bin")
	os.WriteFile(other, []byte("RIFF...."), 0o644)
	if ok, err := IsModelFile(other); ok || err != nil {
		t.Errorf("IsModelFile(RIFF) = %v, %v", ok, err)
	}
	if _, err := Open(other); !errors.Is(err, ErrFormat) {
		t.Errorf("Open(RIFF): %v", err)
	}
	if _, err := Open(filepath.Join(dir, "absent.bin")); err == nil {
		t.Error("an absent file opened")
	}
	if _, err := IsModelFile(filepath.Join(dir, "absent.bin")); err == nil {
		t.Error("IsModelFile of an absent file: no error")
	}
}

// TestFileTypes writes and reads a file of every type whisper.cpp's quantiser writes: the large
// matrices in the file type, the prediction network and joint in it too unless its block does
// not divide n_pred_dim (k-quants: F32), everything else F32.
func TestFileTypes(t *testing.T) {
	for ft, dt := range ftypes {
		h := quantHP
		h.FType = ft
		if dt.Quantized() {
			h.FType += 2 * quantVersionFactor
		}
		f := synthFile(t, h, uint64(ft))
		b := ggmlBytes(t, f)
		g, err := ParseGGML(b)
		if err != nil {
			t.Fatalf("%v: %v", dt, err)
		}
		if d := sameModel(f, g); d != "" {
			t.Fatalf("%v: %s", dt, d)
		}
		wantPred := dt
		if dt.BlockSize() == 256 {
			wantPred = tensor.F32
		}
		w := g.Weights
		if w.Layers[0].Q.Type != dt || w.JointEnc.Type != dt || w.Embed.Type != wantPred || w.JointOut.Type != wantPred || w.PreConv[0].Weight.Type != tensor.F32 {
			t.Errorf("%v: types %v %v %v %v", dt, w.Layers[0].Q.Type, w.JointEnc.Type, w.Embed.Type, w.JointOut.Type)
		}
		if h.QuantVersion() != g.HParams.QuantVersion() {
			t.Errorf("%v: quantisation version %d", dt, g.HParams.QuantVersion())
		}
	}
}

// TestRNNTFile: a file without durations is a plain RNN-T: the joint has only token outputs.
func TestRNNTFile(t *testing.T) {
	h := tinyHP
	h.NTDTDurations = 0
	f := synthFile(t, h, 3)
	g, err := ParseGGML(ggmlBytes(t, f))
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Durations) != 0 || g.Weights.JointOut.Ne[1] != h.NVocab+1 {
		t.Errorf("durations %v, joint %v", g.Durations, g.Weights.JointOut.Ne)
	}
}

// TestWeightless: whisper.cpp loads a file with no tensor records (its tests do); so does this,
// with no Weights; ConvertGGML refuses it.
func TestWeightless(t *testing.T) {
	f := synthFile(t, tinyHP, 1)
	f.Tensors, f.Weights = nil, nil
	g, err := ParseGGML(ggmlBytes(t, f))
	if err != nil {
		t.Fatal(err)
	}
	if g.Weights != nil || len(g.Tensors) != 0 {
		t.Error("weights in a weightless file")
	}
	if _, err := ConvertGGML(g, ""); err == nil {
		t.Error("a weightless file converted")
	}
}

// offsets of a tiny file's parts, for the corruption table.
type layout struct {
	filters, window, durations, vocab, tensors int
}

func tinyLayout(h HParams, f *File) layout {
	var l layout
	l.filters = 4 + 4*15
	l.window = l.filters + 8 + 4*len(f.Filters)
	l.durations = l.window + 4 + 4*len(f.Window)
	l.vocab = l.durations + 4*len(f.Durations)
	l.tensors = l.vocab + 4
	for _, p := range f.Vocab.pieces {
		l.tensors += 4 + len(p)
	}
	return l
}

func patch(b []byte, off int, v int32) []byte {
	c := bytes.Clone(b)
	binary.LittleEndian.PutUint32(c[off:], uint32(v))
	return c
}

func TestCorrupt(t *testing.T) {
	f := synthFile(t, tinyHP, 2)
	b := ggmlBytes(t, f)
	l := tinyLayout(tinyHP, f)
	rec0 := l.tensors // encoder.pre_encode.out.weight [8, 8] F32
	name0 := rec0 + 12 + 8
	hp := func(i int, v int32) []byte { return patch(b, 4+4*i, v) }

	renamed := bytes.Clone(b)
	copy(renamed[name0:], "encoder.pre_encode.out.weighX")
	missing := b[:len(b)-(12+4+len("joint.joint_net.2.bias")+4*13)]
	if !strings.HasSuffix(f.Tensors[len(f.Tensors)-1].Name, "joint_net.2.bias") {
		t.Fatal("synthFile changed: update the offsets")
	}
	nanFilter := bytes.Clone(b)
	binary.LittleEndian.PutUint32(nanFilter[l.filters+8:], math.Float32bits(float32(math.NaN())))

	for _, c := range []struct {
		name string
		b    []byte
		msg  string
	}{
		{"empty", nil, "reading magic"},
		{"gguf magic", append([]byte("GGUF"), b[4:]...), "bad magic"},
		{"swapped magic", append([]byte("ggml"), b[4:]...), "byte-swapped"},
		{"short header", b[:30], "reading hyperparameter ftype"},
		{"zero n_vocab", hp(0, 0), "n_vocab at offset 4: 0, want 1 to 65536"},
		{"negative n_audio_head", hp(3, -2), "n_audio_head at offset 16: -2"},
		{"huge n_audio_layer", hp(4, 1<<20), "n_audio_layer at offset 20: 1048576, want 1 to 256"},
		{"bad ftype", hp(6, 4), "ftype at offset 28: 4 names no weight type"},
		{"subsampling 4", hp(8, 4), "subsampling_factor at offset 36: 4: the encoder's three stride-2"},
		{"n_mels 12", hp(5, 12), "n_mels at offset 24: 12 is not a multiple"},
		{"heads", hp(3, 3), "n_audio_state at offset 12: 8 is not a multiple of n_audio_head = 3"},
		{"even kernel", hp(10, 4), "n_conv_kernel at offset 44: 4 is even"},
		{"odd n_fft", hp(7, 63), "n_fft at offset 32: 63 is odd"},
		{"zero n_fft", hp(7, 0), "n_fft at offset 32: 0, want 1 to 65536"}, // whisper.cpp's for-tests-ggml-parakeet-tdt-bad-nfft0.bin
		{"negative durations", hp(13, -1), "n_tdt_durations at offset 56: -1, want 0 to 64"},
		{"zero max tokens", hp(14, 0), "n_max_tokens at offset 60: 0"},
		{"filters n_mel", patch(b, l.filters, 15), "mel filter bank at offset 64 is 15 × 33, want n_mels × (n_fft/2 + 1) = 16 × 33"},
		{"filters too big", patch(b, l.filters+4, 1<<28), "mel filter bank"},
		{"NaN filter", nanFilter, "mel filter bank value 0 is NaN"},
		{"window too long", patch(b, l.window, 65), "window at offset 2184 has 65 samples, more than n_fft = 64"},
		{"negative window", patch(b, l.window, -1), "window length"},
		{"huge duration", patch(b, l.durations+4, 1<<20), "TDT durations at offset 2380: duration 1 is 1048576"},
		{"vocab count", patch(b, l.vocab, 9), "vocabulary at offset"},
		{"vocab too long", patch(b, l.vocab, 1<<20), "vocabulary size"},
		{"piece too long", patch(b, l.vocab+4, 1<<30), "exceeds"},
		{"unknown tensor", renamed, `unknown tensor "encoder.pre_encode.out.weighX"`},
		{"missing tensor", missing, `tensor "joint.joint_net.2.bias" is missing`},
		{"wrong type", patch(b, rec0+8, int32(tensor.F16)), "tensors: ggml: tensor 1 at offset"},
		{"wrong shape", patch(patch(b, rec0+12, 4), rec0+16, 16), "has shape [4 16], want [8 8]"},
		{"unsupported type", patch(b, rec0+8, int32(tensor.IQ4_NL)), "unknown or unsupported type id 20"},
		{"five dims", patch(b, rec0, 5), "5 dimensions, want 0 to 4"},
		{"short data", b[:len(b)-1], "needs"},
	} {
		_, err := ParseGGML(c.b)
		if !errors.Is(err, ErrFormat) {
			t.Errorf("%s: %v, want a format error", c.name, err)
			continue
		}
		if !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %q does not contain %q", c.name, err, c.msg)
		}
	}

	// A tensor of a type other than the one the loader creates it with, at the right size.
	g := synthFile(t, tinyHP, 2)
	for i := range g.Tensors {
		if g.Tensors[i].Name == "encoder.pre_encode.out.weight" {
			g.Tensors[i].Type, g.Tensors[i].Ne = tensor.F16, []int{8, 16}
		}
	}
	if _, err := ParseGGML(ggmlBytes(t, g)); err == nil || !strings.Contains(err.Error(), "is F16, want F32") {
		t.Errorf("an F16 matrix in an F32 file: %v", err)
	}
}

// TestTruncated: a prefix of a file is an error, but for the one that ends with the
// vocabulary (a file without weights).
func TestTruncated(t *testing.T) {
	f := synthFile(t, tinyHP, 4)
	b := ggmlBytes(t, f)
	l := tinyLayout(tinyHP, f)
	// Every byte of the header and the first records; every 5th after.
	for n := 0; n < len(b); n++ {
		if n > l.tensors+4096 && n%5 != 0 {
			continue
		}
		g, err := ParseGGML(b[:n])
		if n == l.tensors {
			if err != nil || g.Weights != nil {
				t.Errorf("the header alone: %v", err)
			}
			continue
		}
		if !errors.Is(err, ErrFormat) {
			t.Fatalf("%d of %d bytes: %v, want a format error", n, len(b), err)
		}
	}
}

func TestWriteGGMLErrors(t *testing.T) {
	f := synthFile(t, tinyHP, 5)
	bad := *f
	bad.HParams.NMels = 12
	if err := WriteGGML(&bytes.Buffer{}, &bad); err == nil {
		t.Error("bad hparams written")
	}
	bad = *f
	bad.Window = make([]float32, 65)
	if err := WriteGGML(&bytes.Buffer{}, &bad); err == nil {
		t.Error("a long window written")
	}
	bad = *f
	bad.Durations = []int{0, -1}
	if err := WriteGGML(&bytes.Buffer{}, &bad); err == nil {
		t.Error("a negative duration written")
	}
	bad = *f
	bad.Vocab = NewVocab([][]byte{[]byte("a")})
	if err := WriteGGML(&bytes.Buffer{}, &bad); err == nil {
		t.Error("a short vocabulary written")
	}
}

// FuzzLoad checks that ParseGGML never panics, that every failure is a format error, that a
// parsed file written back gives the input bytes, and that a parsed file with weights converts to
// GGUF and reads back the same.
func FuzzLoad(f *testing.F) {
	f.Add(ggmlBytes(f, synthFile(f, tinyHP, 1)))
	h := tinyHP
	h.NTDTDurations = 0
	f.Add(ggmlBytes(f, synthFile(f, h, 2)))
	h = tinyHP
	h.FType = 1
	f.Add(ggmlBytes(f, synthFile(f, h, 3)))
	w := synthFile(f, tinyHP, 4)
	w.Tensors = nil
	f.Add(ggmlBytes(f, w))
	if dir := sharedtest.Lookup(); dir != "" {
		for _, name := range []string{"parakeet-tdt"} {
			if seed, err := os.ReadFile(filepath.Join(dir, "models", "asr", "for-tests-ggml-"+name+".bin")); err == nil {
				f.Add(seed)
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParseGGML(data)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not wrap ErrFormat", err)
			}
			return
		}
		var out bytes.Buffer
		if err := WriteGGML(&out, p); err != nil {
			t.Fatalf("parsed file does not write back: %v", err)
		}
		if !bytes.Equal(out.Bytes(), data) {
			t.Fatalf("written file differs from the input (%d vs %d bytes)", out.Len(), len(data))
		}
		if p.Weights == nil {
			return
		}
		g := ggufRoundTrip(t, p)
		if d := sameModel(p, g); d != "" {
			t.Fatalf("GGUF round trip: %s", d)
		}
	})
}
