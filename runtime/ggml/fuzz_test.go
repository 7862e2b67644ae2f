package ggml

import (
	"bytes"
	"errors"
	"github.com/parleyhq/parley/internal/sharedtest"
	"os"
	"path/filepath"
	"testing"

	"github.com/parleyhq/parley/runtime/tensor"
)

// FuzzParse checks that Parse never panics, that every failure is a format error, and that a
// parsed file written back gives the input bytes. Run it with -fuzzminimizetime of a few
// seconds: minimising an input derived from the 0.6 MB seed files otherwise stalls the fuzzer for
// up to a minute each time.
func FuzzParse(f *testing.F) {
	b, _, _, _, _ := smallFile(f)
	f.Add(b)
	var buf bytes.Buffer
	if err := Synth(&buf, synthFrom(f), Shape{State: 32, Head: 1, AudioLayer: 1, TextLayer: 1}, tensor.Q8_0, 1); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	// whisper.cpp's weightless test models, when the shared directory is there (optional seeds:
	// the target runs without them).
	if dir := sharedtest.Lookup(); dir != "" {
		for _, name := range []string{"tiny", "tiny.en", "base.en", "parakeet-tdt"} {
			if seed, err := os.ReadFile(filepath.Join(dir, "models", "asr", "for-tests-ggml-"+name+".bin")); err == nil {
				f.Add(seed)
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v does not wrap ErrFormat", err)
			}
			return
		}
		var out bytes.Buffer
		if err := Write(&out, p.HParams, p.Filters, p.Vocab, p.Tensors); err != nil {
			t.Fatalf("parsed file does not write back: %v", err)
		}
		if !bytes.Equal(out.Bytes(), data) {
			t.Fatalf("written file differs from the input (%d vs %d bytes)", out.Len(), len(data))
		}
	})
}

// BenchmarkParse measures parsing whisper.cpp's weightless tiny model (header, 80x201 filters,
// 50257 tokens), the part of loading that does not depend on the weights.
func BenchmarkParse(b *testing.B) {
	dir := sharedtest.Lookup()
	data, err := os.ReadFile(filepath.Join(dir, "models", "asr", "for-tests-ggml-tiny.bin"))
	if dir == "" || err != nil {
		b.Skip("shared for-tests-ggml-tiny.bin is absent")
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkOpenTiny measures opening a random-weight F16 tiny model (77.7 MB, 167 tensors):
// mapping, validation and the tensor table; tensor data is not read.
func BenchmarkOpenTiny(b *testing.B) {
	from := synthFrom(b)
	from.HParams.NVocab = 51865
	p := filepath.Join(b.TempDir(), "tiny.bin")
	fd, err := os.Create(p)
	if err != nil {
		b.Fatal(err)
	}
	if err := Synth(fd, from, Tiny, tensor.F16, 1); err != nil {
		b.Fatal(err)
	}
	fd.Close()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		f, err := Open(p)
		if err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "opens/s")
}
