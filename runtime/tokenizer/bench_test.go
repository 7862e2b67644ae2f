package tokenizer

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/gguf"
)

// benchText is a few KB of ordinary English prose with some punctuation and numbers.
var benchText = strings.Repeat("The quick brown fox jumps over the lazy dog. It wasn't the first time: "+
	"in 1987, 42 foxes (and 3.5 dogs!) did the same - or so they say. Once upon a time, there was a "+
	"little girl named Lily who loved to play outside in the sunshine with her friends.\n", 16)

// preOverride presents a vocabulary file with another tokenizer.ggml.pre.
type preOverride struct {
	Metadata
	pre string
}

func (p preOverride) String(key string) (string, bool) {
	if key == keyPre {
		return p.pre, true
	}
	return p.Metadata.String(key)
}

func benchEncode(b *testing.B, name string) {
	benchEncodeWith(b, loadTokenizer(b, vocabPath(b, name)))
}

func benchEncodeWith(b *testing.B, tk *Tokenizer) {
	dst := make([]int32, 0, 8192)
	ids, _ := tk.AppendEncode(dst, benchText, true, true)
	b.SetBytes(int64(len(benchText)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		var err error
		if ids, err = tk.AppendEncode(dst[:0], benchText, true, true); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(ids))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkEncodeLlamaSPM: SentencePiece (LLaMA 1/2, 32k vocabulary).
func BenchmarkEncodeLlamaSPM(b *testing.B) { benchEncode(b, "ggml-vocab-llama-spm.gguf") }

// BenchmarkEncodeLlama3Style: LLaMA-3's pre-tokenizer ("llama-bpe": hand-written matcher,
// whole words looked up before merging) over the 102k DeepSeek LLM byte-level vocabulary, the
// shared vocabularies having no LLaMA-3 file.
func BenchmarkEncodeLlama3Style(b *testing.B) {
	f, err := gguf.Open(vocabPath(b, "ggml-vocab-deepseek-llm.gguf"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	tk, err := New(preOverride{f, "llama-bpe"})
	if err != nil {
		b.Fatal(err)
	}
	benchEncodeWith(b, tk)
}

// BenchmarkEncodeDeepseekLLM: byte-level BPE with a 100k vocabulary and DeepSeek's six-step
// pre-tokenizer.
func BenchmarkEncodeDeepseekLLM(b *testing.B) { benchEncode(b, "ggml-vocab-deepseek-llm.gguf") }

// BenchmarkEncodeGPT2: byte-level BPE with GPT-2's pre-tokenizer.
func BenchmarkEncodeGPT2(b *testing.B) { benchEncode(b, "ggml-vocab-gpt-2.gguf") }

// BenchmarkNew measures building a tokenizer from an open file (the 102k-token DeepSeek LLM
// vocabulary with its 100k merges).
func BenchmarkNew(b *testing.B) {
	f, err := gguf.Open(filepath.Join(sharedtest.Dir(b), "models/vocab/ggml-vocab-deepseek-llm.gguf"))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := New(f); err != nil {
			b.Fatal(err)
		}
	}
}
