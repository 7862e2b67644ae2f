package bert_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/models/bert"
	"github.com/parleyhq/parley/runtime/pooling"
	"github.com/parleyhq/parley/runtime/tensor"
)

// BenchmarkEmbed measures one batch of 32 inputs of 128 tokens each through a synthetic model in
// the bge-small shape (12 layers, 384 wide, CLS pooling), pooled and normalised embeddings read
// back, per weight type and backend (two threads), reporting tokens/s and allocations per batch
// (zero once the views of the batch's shape exist). PARLEY_BENCH_BACKENDS (comma-separated)
// limits the backends (the pure-Go one takes seconds a batch); PARLEY_BENCH_MODEL names a file
// to measure instead of the synthetic ones (the file a peer measures: `parley synth --arch bert
// --shape bge-small`).
func BenchmarkEmbed(b *testing.B) {
	const seqs, seqLen = 32, 128
	names := []string{"go", "cpu", "cuda"}
	if s := os.Getenv("PARLEY_BENCH_BACKENDS"); s != "" {
		names = strings.Split(s, ",")
	}
	type model struct {
		name string
		f    *gguf.File
	}
	var models []model
	if path := os.Getenv("PARLEY_BENCH_MODEL"); path != "" {
		f, err := gguf.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		models = append(models, model{filepath.Base(path), f})
	} else {
		for _, dt := range []tensor.DType{tensor.F32, tensor.F16, tensor.Q8_0} {
			f, err := bert.SynthFile(bert.Shapes["bge-small"], dt, 1, nil)
			if err != nil {
				b.Fatal(err)
			}
			models = append(models, model{"bge-small/" + dt.String(), f})
		}
	}
	for _, mf := range models {
		f := mf.f
		cfg, err := bert.ConfigFrom(f)
		if err != nil {
			b.Fatal(err)
		}
		toks := make([]int32, seqs*seqLen)
		lens := make([]int, seqs)
		for s := range seqs {
			lens[s] = seqLen
			for i := range seqLen {
				toks[s*seqLen+i] = int32((1000 + s*131 + i*17) % cfg.Vocab)
			}
		}
		for _, name := range names {
			b.Run(fmt.Sprintf("%s/%dx%d/%s", mf.name, seqs, seqLen, name), func(b *testing.B) {
				be, _, err := backend.New(name, backend.Options{Threads: 2})
				if err != nil {
					b.Skipf("backend %s: %v", name, err)
				}
				defer be.Close()
				m, err := bert.Load(f, be)
				if err != nil {
					b.Fatal(err)
				}
				defer m.Close()
				c, err := m.NewContext(bert.ContextConfig{StepTokens: seqs * seqLen})
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				out := make([]float32, seqs*m.Dim)
				if err := c.Embed(toks, lens, pooling.NormEuclidean, out); err != nil { // warm up: views
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					if err := c.Embed(toks, lens, pooling.NormEuclidean, out); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N*seqs*seqLen)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
	}
}
