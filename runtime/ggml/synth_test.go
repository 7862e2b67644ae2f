package ggml

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

// wantLayout is the tensor list of a Whisper model as written by make_random_ggml.py and
// whisper.cpp's converter, transcribed independently of synthLayout: name, ggml shape, and
// whether the tensor is a weight matrix (w), a conv kernel (c) or an F32 vector/embedding (f).
func wantLayout(hp HParams) [][3]any {
	S, T := hp.NAudioState, hp.NTextState
	out := [][3]any{
		{"encoder.positional_embedding", []int{S, hp.NAudioCtx}, "f"},
		{"encoder.conv1.weight", []int{3, hp.NMels, S}, "c"},
		{"encoder.conv1.bias", []int{1, S}, "f"},
		{"encoder.conv2.weight", []int{3, S, S}, "c"},
		{"encoder.conv2.bias", []int{1, S}, "f"},
	}
	block := func(p string, n int, cross bool) {
		out = append(out,
			[3]any{p + "mlp_ln.weight", []int{n}, "f"}, [3]any{p + "mlp_ln.bias", []int{n}, "f"},
			[3]any{p + "mlp.0.weight", []int{n, 4 * n}, "w"}, [3]any{p + "mlp.0.bias", []int{4 * n}, "f"},
			[3]any{p + "mlp.2.weight", []int{4 * n, n}, "w"}, [3]any{p + "mlp.2.bias", []int{n}, "f"})
		as := []string{"attn"}
		if cross {
			as = append(as, "cross_attn")
		}
		for _, a := range as {
			out = append(out,
				[3]any{p + a + "_ln.weight", []int{n}, "f"}, [3]any{p + a + "_ln.bias", []int{n}, "f"},
				[3]any{p + a + ".query.weight", []int{n, n}, "w"}, [3]any{p + a + ".query.bias", []int{n}, "f"},
				[3]any{p + a + ".key.weight", []int{n, n}, "w"},
				[3]any{p + a + ".value.weight", []int{n, n}, "w"}, [3]any{p + a + ".value.bias", []int{n}, "f"},
				[3]any{p + a + ".out.weight", []int{n, n}, "w"}, [3]any{p + a + ".out.bias", []int{n}, "f"})
		}
	}
	for i := 0; i < hp.NAudioLayer; i++ {
		block(fmt.Sprintf("encoder.blocks.%d.", i), S, false)
	}
	out = append(out,
		[3]any{"encoder.ln_post.weight", []int{S}, "f"}, [3]any{"encoder.ln_post.bias", []int{S}, "f"},
		[3]any{"decoder.positional_embedding", []int{T, hp.NTextCtx}, "f"},
		[3]any{"decoder.token_embedding.weight", []int{T, hp.NVocab}, "w"})
	for i := 0; i < hp.NTextLayer; i++ {
		block(fmt.Sprintf("decoder.blocks.%d.", i), T, true)
	}
	return append(out, [3]any{"decoder.ln.weight", []int{T}, "f"}, [3]any{"decoder.ln.bias", []int{T}, "f"})
}

type countWriter struct{ n int64 }

func (w *countWriter) Write(p []byte) (int, error) { w.n += int64(len(p)); return len(p), nil }

// TestSynthSize checks that a synthetic F16 tiny model has exactly the size of the random-weight
// reference files, which have the same layout (header, filters, vocabulary and 167 tensors).
func TestSynthSize(t *testing.T) {
	var models []struct {
		Tag       string `json:"tag"`
		SizeBytes int64  `json:"size_bytes"`
		NTensors  int    `json:"n_tensors"`
	}
	raw, err := os.ReadFile(sharedtest.Path(t, "reference/asr/models.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &models); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{"tiny.en-f16": "tiny.en", "tiny-f16": "tiny"}
	for _, m := range models {
		from, err := Open(sharedtest.Path(t, "models/asr/for-tests-ggml-"+files[m.Tag]+".bin"))
		if err != nil {
			t.Fatal(err)
		}
		var cw countWriter
		if err := Synth(&cw, from, Tiny, tensor.F16, 1); err != nil {
			t.Fatal(err)
		}
		if cw.n != m.SizeBytes {
			t.Errorf("%s: %d bytes, the reference file has %d", m.Tag, cw.n, m.SizeBytes)
		}
		if n := len(wantLayout(from.HParams)); n != m.NTensors {
			t.Errorf("%s: %d tensors listed, the reference file has %d", m.Tag, n, m.NTensors)
		}
		from.Close()
	}
}

// synthFrom returns a weightless file like whisper.cpp's for-tests models, but with a vocabulary
// of 1000 tokens so that the tests stay small and do not need the shared directory.
func synthFrom(t testing.TB) *File {
	hp := tinyHP
	fl := Filters{NMel: 80, NFFT: 201, Data: make([]float32, 80*201)}
	for i := range fl.Data {
		fl.Data[i] = float32(i%201) / 201
	}
	vocab := make([][]byte, 1000)
	for i := range vocab {
		vocab[i] = []byte(fmt.Sprintf("t%d", i))
	}
	var buf bytes.Buffer
	if err := Write(&buf, hp, fl, vocab, nil); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	f.HParams.NVocab = 1024 // a small token embedding
	return f
}

func TestSynth(t *testing.T) {
	from := synthFrom(t)
	shape := Shape{Name: "test", State: 64, Head: 2, AudioLayer: 2, TextLayer: 1}
	for _, wtype := range []tensor.DType{tensor.F32, tensor.F16, tensor.Q4_0, tensor.Q4_1, tensor.Q5_0, tensor.Q5_1, tensor.Q8_0} {
		t.Run(wtype.String(), func(t *testing.T) {
			var buf bytes.Buffer
			if err := Synth(&buf, from, shape, wtype, 7); err != nil {
				t.Fatal(err)
			}
			f, err := Parse(buf.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			hp := f.HParams
			if hp.NAudioState != 64 || hp.NTextState != 64 || hp.NAudioHead != 2 || hp.NTextHead != 2 ||
				hp.NAudioLayer != 2 || hp.NTextLayer != 1 || hp.NVocab != 1024 || hp.NMels != 80 {
				t.Errorf("hparams %+v", hp)
			}
			if dt, err := hp.WeightType(); err != nil || dt != wtype {
				t.Errorf("WeightType = %v, %v, want %v", dt, err, wtype)
			}
			if (hp.QuantVersion() == 2) != wtype.Quantized() {
				t.Errorf("ftype %d for %v", hp.FType, wtype)
			}
			if !reflect.DeepEqual(f.Filters, from.Filters) || len(f.Vocab) != len(from.Vocab) {
				t.Error("filters or vocabulary not copied")
			}
			want := wantLayout(hp)
			if len(f.Tensors) != len(want) {
				t.Fatalf("%d tensors, want %d", len(f.Tensors), len(want))
			}
			for i, w := range want {
				g := &f.Tensors[i]
				dt := tensor.F32
				switch w[2] {
				case "w":
					dt = wtype
				case "c":
					if wtype != tensor.F32 {
						dt = tensor.F16
					}
				}
				if g.Name != w[0] || !reflect.DeepEqual(g.Ne, w[1]) || g.Type != dt {
					t.Fatalf("tensor %d: %q %v %v, want %q %v %v", i, g.Name, g.Ne, g.Type, w[0], w[1], dt)
				}
				checkSynthValues(t, g)
			}
		})
	}
}

// checkSynthValues checks a synthetic tensor's values: layer-norm gains one, biases zero, random
// tensors with mean about 0 and standard deviation about 1/sqrt(fan-in).
func checkSynthValues(t *testing.T, g *Tensor) {
	t.Helper()
	v := make([]float32, g.Elements())
	if err := quant.Dequantize(g.Type, g.Data, v); err != nil {
		t.Fatal(err)
	}
	var sum, sq float64
	for _, x := range v {
		sum += float64(x)
		sq += float64(x) * float64(x)
	}
	n := float64(len(v))
	mean, std := sum/n, math.Sqrt(sq/n)
	name := g.Name
	switch {
	case strings.HasSuffix(name, ".bias"):
		if sq != 0 {
			t.Errorf("%s: bias not zero", name)
		}
	case strings.HasSuffix(name, "ln.weight") || strings.HasSuffix(name, "ln_post.weight"):
		if mean != 1 || sq != n {
			t.Errorf("%s: gain not one", name)
		}
	default:
		fanIn := float64(g.Ne[0])
		if len(g.Ne) == 3 {
			fanIn *= float64(g.Ne[1])
		}
		// n >= 4096 samples: the sample mean is within 4 standard errors (4/sqrt(n) of the
		// standard deviation) and the sample deviation within 10% (quantisation to 4 bits adds
		// up to a few percent of variance).
		want := 1 / math.Sqrt(fanIn)
		if math.Abs(mean) > 4*want/math.Sqrt(n) || math.Abs(std/want-1) > 0.1 {
			t.Errorf("%s (%v): mean %.3g, std %.4g, want 0 and %.4g", name, g.Type, mean, std, want)
		}
	}
}

func TestSynthDeterministic(t *testing.T) {
	from := synthFrom(t)
	s := Shape{Name: "test", State: 32, Head: 1, AudioLayer: 1, TextLayer: 1}
	var a, b, c bytes.Buffer
	Synth(&a, from, s, tensor.Q5_1, 3)
	Synth(&b, from, s, tensor.Q5_1, 3)
	Synth(&c, from, s, tensor.Q5_1, 4)
	if !bytes.Equal(a.Bytes(), b.Bytes()) || bytes.Equal(a.Bytes(), c.Bytes()) {
		t.Error("output is not a function of the seed")
	}
}

func TestSynthErrors(t *testing.T) {
	from := synthFrom(t)
	if err := Synth(io.Discard, nil, Tiny, tensor.F16, 1); err == nil {
		t.Error("Synth without a header file succeeded")
	}
	huge := *from
	huge.HParams.NVocab = 1<<31 - 1
	if err := Synth(io.Discard, &huge, Large, tensor.F32, 1); err == nil || !strings.Contains(err.Error(), "too large") {
		t.Errorf("Synth with n_vocab 2^31-1: %v", err)
	}
	for _, c := range []struct {
		s  Shape
		dt tensor.DType
	}{
		{Tiny, tensor.Q4_K},
		{Tiny, tensor.BF16},
		{Shape{State: 48, Head: 2, AudioLayer: 1, TextLayer: 1}, tensor.Q8_0},
		{Shape{State: 64, Head: 3, AudioLayer: 1, TextLayer: 1}, tensor.F16},
		{Shape{State: 64, Head: 2, AudioLayer: 0, TextLayer: 1}, tensor.F16},
	} {
		if err := Synth(io.Discard, from, c.s, c.dt, 1); err == nil {
			t.Errorf("Synth(%+v, %v) succeeded", c.s, c.dt)
		}
	}
}

// BenchmarkSynth measures writing a random-weight tiny model.
func BenchmarkSynth(b *testing.B) {
	from := synthFrom(b)
	from.HParams.NVocab = 51865
	for _, dt := range []tensor.DType{tensor.F16, tensor.Q8_0} {
		b.Run(dt.String(), func(b *testing.B) {
			var cw countWriter
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				if err := Synth(&cw, from, Tiny, dt, uint64(i)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cw.n)/b.Elapsed().Seconds()/1e6, "MB/s")
		})
	}
}
