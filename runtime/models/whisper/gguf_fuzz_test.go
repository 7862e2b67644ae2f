package whisper

import (
	"bytes"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/backend/purego"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/tensor"
)

// FuzzGGUFSource: whatever a GGUF file holds, reading a Whisper model's description from it and
// loading its weights (pure-Go backend) return an error or a model, and never panic.
func FuzzGGUFSource(f *testing.F) {
	be, err := purego.New(backend.Options{Threads: 1})
	if err != nil {
		f.Fatal(err)
	}
	defer be.Close()
	w := gguf.NewWriter()
	w.SetString("general.architecture", Architecture)
	w.SetUint32("whisper.encoder.attention.head_count", 2)
	w.SetUint32("whisper.decoder.block_count", 0)
	w.SetString("tokenizer.ggml.model", "gpt2")
	w.SetStrings("tokenizer.ggml.tokens", []string{"a", "Ġb", "Ċ", ""})
	for _, t := range []struct {
		name  string
		dt    tensor.DType
		shape []int64
	}{
		{"decoder.token_embedding.weight", tensor.F32, []int64{8, 16}},
		{"decoder.positional_embedding", tensor.F32, []int64{8, 4}},
		{"encoder.positional_embedding", tensor.F32, []int64{8, 6}},
		{"encoder.conv1.weight", tensor.F16, []int64{3, 2, 8}},
		{"encoder.blocks.0.attn.query.weight", tensor.F16, []int64{8, 8}},
		{"mel_filters", tensor.F32, []int64{201, 2}},
	} {
		size, err := t.dt.RowSize(t.shape[0])
		if err != nil {
			f.Fatal(err)
		}
		for _, d := range t.shape[1:] {
			size *= d
		}
		if err := w.AddTensor(t.name, t.dt, t.shape, make([]byte, size)); err != nil {
			f.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		gf, err := gguf.Parse(data)
		if err != nil {
			return
		}
		src, err := ggufSource(gf, nil)
		if err != nil {
			return
		}
		if src.hp.NVocab <= 0 || len(src.filters.Data) != src.filters.NMel*src.filters.NFFT {
			t.Fatalf("accepted a description with %d tokens and %d filter weights", src.hp.NVocab, len(src.filters.Data))
		}
		if m, err := load(be, src); err == nil {
			m.file = nil // the parsed buffer needs no closing
			m.Close()
		}
	})
}

// FuzzParseTokenizerJSON: any bytes give a vocabulary or an error, never a panic.
func FuzzParseTokenizerJSON(f *testing.F) {
	f.Add([]byte(`{"model": {"type": "BPE", "vocab": {"a": 0, "Ġb": 2, "<|endoftext|>": 50256}}}`))
	f.Add([]byte(`{"!": 0, "\"": 1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := ParseTokenizerJSON(data)
		if err == nil && (len(v) == 0 || len(v) > textTokens) {
			t.Fatalf("%d tokens", len(v))
		}
	})
}
