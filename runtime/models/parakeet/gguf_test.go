package parakeet

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/tensor"
)

// ggufRoundTrip converts f to GGUF, parses the bytes and reads the model back.
func ggufRoundTrip(t testing.TB, f *File) *File {
	t.Helper()
	w, err := ConvertGGML(f, "test")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	g, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	out, err := ReadGGUF(g)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestGGUFRoundTrip: the GGUF form holds the same hyper-parameters, front-end tables,
// durations, vocabulary and tensors (names, types, shapes, bytes) as the ggml file it was
// converted from, for every file type and an RNN-T.
func TestGGUFRoundTrip(t *testing.T) {
	for ft, dt := range ftypes {
		h := quantHP
		h.FType = ft
		if dt.Quantized() {
			h.FType += 2 * quantVersionFactor
		}
		f := synthFile(t, h, uint64(ft)+10)
		if d := sameModel(f, ggufRoundTrip(t, f)); d != "" {
			t.Errorf("%v: %s", dt, d)
		}
	}
	h := tinyHP
	h.NTDTDurations = 0
	f := synthFile(t, h, 9)
	if d := sameModel(f, ggufRoundTrip(t, f)); d != "" {
		t.Errorf("RNN-T: %s", d)
	}
}

// TestGGUFSmallModel converts the random small model, writes it, and opens both forms from disk.
func TestGGUFSmallModel(t *testing.T) {
	p := sharedtest.ParakeetRandomModel(t, "small", false)
	f, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := ConvertGGML(f, "parakeet-tdt-small-random")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "small.gguf")
	if err := w.WriteFile(out); err != nil {
		t.Fatal(err)
	}
	g, err := Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if d := sameModel(f, g); d != "" {
		t.Fatal(d)
	}
	if ok, err := IsModelFile(out); !ok || err != nil {
		t.Errorf("IsModelFile(gguf) = %v, %v", ok, err)
	}
	if g.Weights.Layers[2].Pos == nil || g.Weights.Layers[2].Pos.Type != tensor.F32 {
		t.Error("the GGUF form's weights are not bound")
	}
}

// TestGGUFErrors: metadata that is missing, of the wrong kind or out of range, and tensors that
// do not fit, are format errors.
func TestGGUFErrors(t *testing.T) {
	f := synthFile(t, tinyHP, 6)
	for _, c := range []struct {
		name string
		edit func(w *gguf.Writer)
		msg  string
	}{
		{"architecture", func(w *gguf.Writer) { w.SetString("general.architecture", "whisper") }, `architecture is "whisper"`},
		{"missing key", func(w *gguf.Writer) { w.SetString("parakeet.encoder.block_count", "one") }, "parakeet.encoder.block_count = one is out of range or not an integer"},
		{"layers", func(w *gguf.Writer) { w.SetUint32("parakeet.encoder.block_count", 2) }, `tensor "encoder.layers.1.norm_feed_forward1.weight" is missing`},
		{"zero heads", func(w *gguf.Writer) { w.SetUint32("parakeet.encoder.attention.head_count", 0) }, "n_audio_head: 0"},
		{"file type", func(w *gguf.Writer) { w.SetUint32("general.file_type", 1) }, "is F32, want F16"},
		{"bad file type", func(w *gguf.Writer) { w.SetUint32("general.file_type", 5) }, "ftype: 5 names no weight type"},
		{"quant version", func(w *gguf.Writer) { w.SetUint32("general.quantization_version", 5000) }, "out of range"},
		{"durations", func(w *gguf.Writer) { w.SetInt32s("parakeet.tdt.durations", []int32{0, -1}) }, "parakeet.tdt.durations[1] = -1"},
		{"duration count", func(w *gguf.Writer) { w.SetInt32s("parakeet.tdt.durations", []int32{0, 1, 2}) }, `tensor "joint.joint_net.2.weight" has shape [8 13], want [8 14]`},
		{"durations kind", func(w *gguf.Writer) { w.SetString("parakeet.tdt.durations", "0 1") }, "not an integer array"},
		{"filters", func(w *gguf.Writer) { w.SetFloats("parakeet.audio.mel_filters", []float32{1}) }, "parakeet.audio.mel_filters is missing or not 16 × 33"},
		{"window", func(w *gguf.Writer) { w.SetFloats("parakeet.audio.window", make([]float32, 65)) }, "longer than n_fft"},
		{"tokenizer", func(w *gguf.Writer) { w.SetString("tokenizer.ggml.model", "gpt2") }, `tokenizer.ggml.model is "gpt2"`},
		{"tokens", func(w *gguf.Writer) { w.SetStrings("tokenizer.ggml.tokens", []string{"a"}) }, "has 1 pieces"},
		{"tokens kind", func(w *gguf.Writer) { w.SetUint32("tokenizer.ggml.tokens", 1) }, "not an array of strings"},
	} {
		w, err := ConvertGGML(f, "")
		if err != nil {
			t.Fatal(err)
		}
		c.edit(w)
		var buf bytes.Buffer
		if _, err := w.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
		g, err := gguf.Parse(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		_, err = ReadGGUF(g)
		if !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want a format error containing %q", c.name, err, c.msg)
		}
	}

	// A tensor of a type the loader never takes, and a file without tensors.
	w := gguf.NewWriter()
	w.SetString("general.architecture", Architecture)
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	g, _ := gguf.Parse(buf.Bytes())
	if _, err := ReadGGUF(g); !errors.Is(err, ErrFormat) {
		t.Errorf("an empty GGUF file: %v", err)
	}
}

// FuzzGGUF checks that ReadGGUF never panics on a parsable GGUF file and fails only with format
// errors.
func FuzzGGUF(f *testing.F) {
	for i, h := range []HParams{tinyHP, func() HParams { h := tinyHP; h.NTDTDurations = 0; return h }()} {
		w, err := ConvertGGML(synthFile(f, h, uint64(i)), "")
		if err != nil {
			f.Fatal(err)
		}
		var buf bytes.Buffer
		if _, err := w.WriteTo(&buf); err != nil {
			f.Fatal(err)
		}
		f.Add(buf.Bytes())
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := gguf.Parse(data)
		if err != nil {
			return
		}
		if _, err := ReadGGUF(g); err != nil && !errors.Is(err, ErrFormat) {
			t.Fatalf("error %v does not wrap ErrFormat", err)
		}
	})
}
