package bert_test

import (
	"bytes"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/models/bert"
	"github.com/parleyhq/parley/runtime/pooling"
	"github.com/parleyhq/parley/runtime/tensor"
	"github.com/parleyhq/parley/runtime/tokenizer"
)

// TestSynthShapes: each named shape is written with llama.cpp's bert keys and tensor names, in
// the types its converter gives each tensor, and loads as that shape and runs.
func TestSynthShapes(t *testing.T) {
	for _, name := range bert.ShapeNames() {
		s := bert.Shapes[name]
		f, err := bert.SynthFile(s, tensor.Q8_0, 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		c, err := bert.ConfigFrom(f)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := bert.Config{Dim: s.Dim, Layers: s.Layers, Heads: s.Heads, KVHeads: s.Heads, HeadDim: s.Dim / s.Heads, FFN: s.FFN,
			Vocab: s.Vocab, Positions: s.Positions, TokenTypes: s.TokenTypes, NormEps: 1e-12, Pooling: s.Pooling}
		if c != want {
			t.Fatalf("%s: config %+v, want %+v", name, c, want)
		}
		names := []string{"token_embd.weight", "position_embd.weight", "token_types.weight", "token_embd_norm.weight", "token_embd_norm.bias"}
		for i := range s.Layers {
			for _, n := range []string{"attn_q", "attn_k", "attn_v", "attn_output", "attn_output_norm", "ffn_up", "ffn_down", "layer_output_norm"} {
				names = append(names, fmt.Sprintf("blk.%d.%s.weight", i, n), fmt.Sprintf("blk.%d.%s.bias", i, n))
			}
		}
		var got []string
		for i := range f.Tensors {
			ti := &f.Tensors[i]
			got = append(got, ti.Name)
			wantType := tensor.F32
			if ti.Name == "token_embd.weight" || strings.HasPrefix(ti.Name, "blk.") && strings.HasSuffix(ti.Name, ".weight") && !strings.HasSuffix(ti.Name, "norm.weight") {
				wantType = tensor.Q8_0
			}
			if ti.DType != wantType {
				t.Errorf("%s: %s is %v, want %v", name, ti.Name, ti.DType, wantType)
			}
		}
		slices.Sort(got)
		slices.Sort(names)
		if !slices.Equal(got, names) {
			t.Fatalf("%s: tensors %v, want %v", name, got, names)
		}
		for key, v := range map[string]any{"general.architecture": "bert", "bert.attention.causal": false, "general.file_type": uint32(7)} {
			if kv, ok := f.Value(key); !ok || kv.V != v {
				t.Errorf("%s: %s = %v, want %v", name, key, kv.V, v)
			}
		}
		be := sharedtest.Backend(t, "go", 2)
		m, err := bert.Load(f, be)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		ctx, err := m.NewContext(bert.ContextConfig{StepTokens: 8})
		if err != nil {
			t.Fatal(err)
		}
		for _, row := range embedAll(t, ctx, [][]int32{{101, 2000, 102}, {101, 102}}, pooling.NormEuclidean) {
			for _, v := range row {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("%s: embedding holds %v", name, v)
				}
			}
		}
		ctx.Close()
		m.Close()
	}
}

// TestSynthDeterministic: a seed gives the same file, byte for byte; another seed another file.
func TestSynthDeterministic(t *testing.T) {
	write := func(seed uint64) []byte {
		w, err := bert.Synth(tinyShape, tensor.F16, seed, nil)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if _, err := w.WriteTo(&b); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	a, b, c := write(7), write(7), write(8)
	if !bytes.Equal(a, b) {
		t.Fatal("one seed gives two different files")
	}
	if bytes.Equal(a, c) {
		t.Fatal("two seeds give the same file")
	}
}

// TestSynthVocabulary: without a vocabulary file the model gets a WordPiece vocabulary that the
// tokenizer loads, with BERT's special tokens at their ids and no unknown token for ASCII text;
// with one (the bert-bge vocabulary of ../shared), every tokenizer key is copied and the model
// tokenizes as the vocabulary file does.
func TestSynthVocabulary(t *testing.T) {
	s := tinyShape
	s.Vocab = 1000 // room for every character, as a word and as a continuation
	f, err := bert.SynthFile(s, tensor.F32, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.New(f)
	if err != nil {
		t.Fatal(err)
	}
	v := tok.Vocab()
	if v.Size != s.Vocab || v.CLS != 101 || v.SEP != 102 || v.UNK != 100 || v.PAD != 0 || v.Mask != 103 {
		t.Fatalf("vocabulary %+v", v)
	}
	ids, err := tok.Encode("Hello, world! 42 tokens; naive text.", true, true)
	if err != nil {
		t.Fatal(err)
	}
	if ids[0] != 101 || ids[len(ids)-1] != 102 || slices.Contains(ids, 100) {
		t.Fatalf("ids %v: want [CLS] ... [SEP] without [UNK]", ids)
	}
	if _, err := bert.Synth(bert.Shape{Name: "x", Dim: 8, Layers: 1, Heads: 1, FFN: 8, Positions: 4, Vocab: 50, TokenTypes: 1, Pooling: pooling.CLS}, tensor.F32, 1, nil); err == nil {
		t.Fatal("a synthetic vocabulary of 50 tokens, too few for BERT's special ids, was written")
	}

	vf, err := gguf.Open(sharedtest.Path(t, "models/vocab/ggml-vocab-bert-bge.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer vf.Close()
	s.Vocab = 10 // taken from the vocabulary file instead
	mf, err := bert.SynthFile(s, tensor.F32, 1, vf)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range vf.KVs {
		if !strings.HasPrefix(kv.Key, "tokenizer.") {
			continue
		}
		got, ok := mf.Value(kv.Key)
		if !ok || !reflect.DeepEqual(got, kv.Value) {
			t.Fatalf("%s not copied", kv.Key)
		}
	}
	c, err := bert.ConfigFrom(mf)
	if err != nil || c.Vocab != 30522 {
		t.Fatalf("config %+v, %v: want the vocabulary file's 30522 tokens", c, err)
	}
	want, err := tokenizer.New(vf)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tokenizer.New(mf)
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{"Hello world, this is a test.", "naïve café — 日本語", "[CLS] special [SEP]"} {
		a, _ := want.Encode(text, true, true)
		b, _ := got.Encode(text, true, true)
		if !slices.Equal(a, b) {
			t.Fatalf("%q: %v from the model, %v from the vocabulary file", text, b, a)
		}
	}
}
