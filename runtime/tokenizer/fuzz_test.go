package tokenizer

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/gguf"
)

// FuzzEncode encodes arbitrary strings with the shared vocabularies (and the LLaMA-3 and Qwen2
// pre-tokenizers over one of them): no panic, no error for byte-level BPE, ids in range, and
// Decode(Encode(x)) == x wherever the vocabulary is lossless for x (see lossless): valid UTF-8
// without special-token text that every byte of can be spelt, for byte-level BPE and
// SentencePiece. WordPiece (bert-bge, and wordPieceVocab under each normalisation) must give
// the ids of wpmReference.
func FuzzEncode(f *testing.F) {
	for _, s := range []string{"", "Hello world", " \t\n  x", "don't 3.14159 $1,000", "日本語のテキスト",
		"🦙🚀 emoji", "\xff\xfe\x80", "<|endoftext|><s></s>", "a\u00a0b\u200dc\u2028d", "   \n\n\r\n  ",
		"ǅ ß ﬀ Ⅻ ½ ٣", "\xed\xa0\x80", "\xf4\x90\x80\x80", "'S 'LL 're",
		"Cafe\u0301 Café", "नमस्ते", "สวัสดี", "مَرْحَبًا", "שָׁלוֹם", "안녕 ᄀ", "ひらがなカタカナ", "𠀀中文",
		"a\u200bb\u00ad\ufeffc", "x\u0378y", "¿‽⸘«»・", "[CLS] [UNK]"} {
		f.Add(s)
	}
	shared := sharedtest.Dir(f)
	var toks []*Tokenizer
	for _, name := range []string{"ggml-vocab-gpt-2.gguf", "ggml-vocab-deepseek-llm.gguf", "ggml-vocab-deepseek-coder.gguf",
		"ggml-vocab-falcon.gguf", "ggml-vocab-starcoder.gguf", "ggml-vocab-gpt-neox.gguf", "ggml-vocab-llama-spm.gguf",
		"ggml-vocab-bert-bge.gguf"} {
		toks = append(toks, loadTokenizer(f, filepath.Join(shared, "models/vocab", name)))
	}
	for _, pre := range []string{"llama-bpe", "qwen2", "gpt-4o"} {
		toks = append(toks, loadWithPre(f, filepath.Join(shared, "models/vocab/ggml-vocab-deepseek-llm.gguf"), pre))
	}
	var wpms []*Tokenizer
	for _, md := range []mapMeta{wordPieceVocab(), wordPieceVocab().with(keyAccents, true),
		wordPieceVocab().with(keyLower, false), wordPieceVocab().with(keyLower, false).with(keyAccents, true)} {
		tk, err := New(md)
		if err != nil {
			f.Fatal(err)
		}
		wpms = append(wpms, tk)
	}
	for _, tk := range toks {
		if tk.model == modelWPM {
			wpms = append(wpms, tk)
		}
	}
	// SentencePiece merged over the whole text at once, to check word-by-word merging against.
	spmPath := filepath.Join(shared, "models/vocab/ggml-vocab-llama-spm.gguf")
	spm := loadTokenizer(f, spmPath)
	gf, err := gguf.Open(spmPath)
	if err != nil {
		f.Fatal(err)
	}
	whole, err := New(gf)
	gf.Close()
	if err != nil {
		f.Fatal(err)
	}
	whole.spmWordSplit = false
	f.Fuzz(func(t *testing.T, s string) {
		a, err1 := whole.Encode(s, true, true)
		b, err2 := spm.Encode(s, true, true)
		if (err1 == nil) != (err2 == nil) || !slices.Equal(a, b) {
			t.Fatalf("llama-spm %q: merged whole %v %v, word by word %v %v", s, a, err1, b, err2)
		}
		for _, tk := range wpms {
			got, err := tk.Encode(s, false, false)
			if want := wpmReference(tk, s); err != nil || !slices.Equal(got, want) {
				t.Fatalf("WordPiece %q: Encode %v %v, plain reference %v", s, got, err, want)
			}
		}
		for _, tk := range toks {
			for _, parse := range []bool{false, true} {
				ids, err := tk.Encode(s, true, parse)
				if err != nil {
					if tk.model == modelBPE {
						t.Fatalf("%s: Encode(%q): %v", tk.vocab.Pre, s, err)
					}
					continue
				}
				for _, id := range ids {
					if id < 0 || int(id) >= tk.vocab.Size {
						t.Fatalf("%s: Encode(%q) gave id %d", tk.vocab.Model, s, id)
					}
				}
				_ = tk.Decode(ids)
				if parse || !lossless(tk, s) {
					continue
				}
				if got := tk.Decode(ids); got != s {
					t.Fatalf("%s: Decode(Encode(%q)) = %q (ids %v)", tk.vocab.Pre, s, got, ids)
				}
			}
		}
	})
}
