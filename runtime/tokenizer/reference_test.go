package tokenizer

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/gguf"
)

var (
	tokMu    sync.Mutex
	tokCache = map[string]*Tokenizer{}
)

// loadTokenizer opens a GGUF file and builds its tokenizer, once per test binary.
func loadTokenizer(t testing.TB, path string) *Tokenizer {
	t.Helper()
	tokMu.Lock()
	defer tokMu.Unlock()
	if tk, ok := tokCache[path]; ok {
		return tk
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer f.Close()
	tk, err := New(f)
	if err != nil {
		t.Fatalf("%s: %v", filepath.Base(path), err)
	}
	tokCache[path] = tk
	return tk
}

// loadWithPre is loadTokenizer with tokenizer.ggml.pre replaced by pre, to run the LLaMA-3 and
// Qwen2 pre-tokenizers, which no shared vocabulary uses, over a real byte-level vocabulary.
func loadWithPre(t testing.TB, path, pre string) *Tokenizer {
	t.Helper()
	tokMu.Lock()
	defer tokMu.Unlock()
	key := path + "#" + pre
	if tk, ok := tokCache[key]; ok {
		return tk
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatalf("open %s: %v", path, err)
	}
	defer f.Close()
	tk, err := New(preOverride{f, pre})
	if err != nil {
		t.Fatalf("%s with pre %q: %v", filepath.Base(path), pre, err)
	}
	tokCache[key] = tk
	return tk
}

// vocabPath finds a vocabulary file among the shared models.
func vocabPath(t testing.TB, name string) string {
	t.Helper()
	shared := sharedtest.Dir(t)
	for _, d := range []string{"models/vocab", "models/llm"} {
		p := filepath.Join(shared, d, name)
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skipf("%s not found under %s/models", name, shared)
	return ""
}

type tokRef struct {
	Tool   string `json:"tool"`
	Vocabs []struct {
		ModelFile      string `json:"model_file"`
		TokenizerModel string `json:"tokenizer_model"`
		BOS            *int32 `json:"bos_id"`
		EOS            *int32 `json:"eos_id"`
		AddBOS         *bool  `json:"add_bos"`
		NTokens        int    `json:"n_tokens"`
		Cases          []struct {
			ID                string  `json:"id"`
			Text              string  `json:"text"`
			IDsDefault        []int32 `json:"ids_default"`
			IDsNoBOS          []int32 `json:"ids_no_bos"`
			IDsNoParseSpecial []int32 `json:"ids_no_parse_special"`
		} `json:"cases"`
	} `json:"vocabs"`
}

func loadTokRef(t *testing.T) *tokRef {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(sharedtest.Dir(t), "reference/llm/tokenize.json"))
	if err != nil {
		t.Skipf("tokenize.json: %v", err)
	}
	var ref tokRef
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	return &ref
}

// TestReferenceTokenize compares with llama-tokenize's output (tokenize.json): ids_default is
// Encode(text, true, true), ids_no_bos Encode(text, false, true) and ids_no_parse_special
// Encode(text, true, false).
func TestReferenceTokenize(t *testing.T) {
	ref := loadTokRef(t)
	t.Logf("reference tool: %s", ref.Tool)
	for _, v := range ref.Vocabs {
		t.Run(v.ModelFile, func(t *testing.T) {
			tk := loadTokenizer(t, vocabPath(t, v.ModelFile))
			voc := tk.Vocab()
			if voc.Size != v.NTokens {
				t.Errorf("Size = %d, want %d", voc.Size, v.NTokens)
			}
			if v.BOS != nil && voc.BOS != *v.BOS {
				t.Errorf("BOS = %d, want %d", voc.BOS, *v.BOS)
			}
			if v.EOS != nil && voc.EOS != *v.EOS {
				t.Errorf("EOS = %d, want %d", voc.EOS, *v.EOS)
			}
			if voc.Model != v.TokenizerModel {
				t.Errorf("Model = %q, want %q", voc.Model, v.TokenizerModel)
			}
			for _, c := range v.Cases {
				for _, m := range []struct {
					name                   string
					addSpecial, parseSpecl bool
					want                   []int32
				}{
					{"default", true, true, c.IDsDefault},
					{"no_bos", false, true, c.IDsNoBOS},
					{"no_parse_special", true, false, c.IDsNoParseSpecial},
				} {
					got, err := tk.Encode(c.Text, m.addSpecial, m.parseSpecl)
					if err != nil {
						t.Errorf("%s/%s: %q: %v", c.ID, m.name, c.Text, err)
						continue
					}
					if !slices.Equal(got, m.want) {
						t.Errorf("%s/%s: %q\n want %v\n  got %v", c.ID, m.name, c.Text, m.want, got)
					}
				}
			}
		})
	}
}

// vocabTest is one .inp/.out pair entry.
type vocabTest struct {
	text string
	want []int32
}

// readVocabTests parses X.gguf.inp (texts each followed by "\n__ggml_vocab_test__\n") and
// X.gguf.out (one line of space-separated ids per text), as llama.cpp's test-tokenizer-0 does.
func readVocabTests(t *testing.T, inp, out string) []vocabTest {
	t.Helper()
	raw, err := os.ReadFile(inp)
	if err != nil {
		t.Fatal(err)
	}
	outRaw, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	const sep = "\n__ggml_vocab_test__\n"
	var texts []string
	for s := string(raw); s != ""; {
		i := strings.Index(s, sep)
		if i < 0 {
			texts = append(texts, s)
			break
		}
		texts = append(texts, s[:i])
		s = s[i+len(sep):]
	}
	lines := strings.Split(strings.TrimSuffix(string(outRaw), "\n"), "\n")
	if len(lines) != len(texts) {
		t.Fatalf("%s: %d texts but %d output lines", filepath.Base(inp), len(texts), len(lines))
	}
	tests := make([]vocabTest, len(texts))
	for i, line := range lines {
		tests[i].text = texts[i]
		for _, f := range strings.Fields(line) {
			id, err := strconv.ParseInt(f, 10, 32)
			if err != nil {
				t.Fatalf("%s line %d: %v", filepath.Base(out), i+1, err)
			}
			tests[i].want = append(tests[i].want, int32(id))
		}
	}
	return tests
}

// TestVocabFiles runs every X.gguf.inp/X.gguf.out pair: llama.cpp's test-tokenizer-0 tokenises
// with add_special=false, parse_special=false.
func TestVocabFiles(t *testing.T) {
	dir := filepath.Join(sharedtest.Dir(t), "models/vocab")
	inps, _ := filepath.Glob(filepath.Join(dir, "*.gguf.inp"))
	if len(inps) == 0 {
		t.Skipf("no .inp files in %s", dir)
	}
	for _, inp := range inps {
		model := strings.TrimSuffix(inp, ".inp")
		t.Run(filepath.Base(model), func(t *testing.T) {
			tests := readVocabTests(t, inp, model+".out")
			tk := loadTokenizer(t, model)
			for _, c := range tests {
				got, err := tk.Encode(c.text, false, false)
				if err != nil {
					t.Errorf("%q: %v", c.text, err)
					continue
				}
				if !slices.Equal(got, c.want) {
					t.Errorf("%q\n want %v\n  got %v", c.text, c.want, got)
				}
			}
		})
	}
}

// lossless reports whether Decode(Encode(s)) must give s back with tk: the text is valid UTF-8,
// holds no special token's text, every byte is representable, and the vocabulary does not
// normalise (BERT lower-cases and strips accents; SentencePiece reads U+2581 as a space).
func lossless(tk *Tokenizer, s string) bool {
	if tk.model == modelWPM || !utf8.ValidString(s) {
		return false
	}
	if tk.model == modelSPM && strings.Contains(s, "\u2581") {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch tk.model {
		case modelBPE:
			if _, ok := tk.toID[string(byteToRune[s[i]])]; !ok {
				return false // llama.cpp drops bytes the vocabulary cannot spell
			}
		case modelSPM:
			if tk.byteTok[s[i]] == NoToken {
				return false
			}
		}
	}
	frags := tk.partition(tk.getScratch(), s, true)
	return len(frags) == 0 || (len(frags) == 1 && frags[0].tok < 0)
}

// TestRoundTrip checks Decode(Encode(s)) == s on the reference texts wherever the tokenizer is
// lossless, and that the streaming Decoder gives the same bytes.
func TestRoundTrip(t *testing.T) {
	ref := loadTokRef(t)
	texts := map[string][]string{}
	for _, v := range ref.Vocabs {
		for _, c := range v.Cases {
			texts[v.ModelFile] = append(texts[v.ModelFile], c.Text)
		}
	}
	dir := filepath.Join(sharedtest.Dir(t), "models/vocab")
	inps, _ := filepath.Glob(filepath.Join(dir, "*.gguf.inp"))
	for _, inp := range inps {
		model := strings.TrimSuffix(inp, ".inp")
		for _, c := range readVocabTests(t, inp, model+".out") {
			texts[filepath.Base(model)] = append(texts[filepath.Base(model)], c.text)
		}
	}
	for _, name := range slices.Sorted(mapsKeys(texts)) {
		t.Run(name, func(t *testing.T) {
			tk := loadTokenizer(t, vocabPath(t, name))
			checked := 0
			for _, s := range texts[name] {
				if !lossless(tk, s) {
					continue
				}
				for _, addSpecial := range []bool{false, true} {
					ids, err := tk.Encode(s, addSpecial, false)
					if err != nil {
						t.Errorf("%q: %v", s, err)
						continue
					}
					if got := tk.Decode(ids); got != s {
						t.Errorf("Decode(Encode(%q, %v)) = %q (ids %v)", s, addSpecial, got, ids)
					}
					if addSpecial {
						continue
					}
					d := tk.NewDecoder()
					var stream []byte
					for _, id := range ids {
						b := d.Write(id)
						if !utf8.Valid(b) {
							t.Errorf("%q: Decoder.Write(%d) returned invalid UTF-8 %q", s, id, b)
						}
						stream = append(stream, b...)
					}
					stream = append(stream, d.Flush()...)
					want := s
					if tk.model == modelSPM && tk.addSpacePrefix && s != "" {
						want = " " + s
					}
					if string(stream) != want {
						t.Errorf("Decoder: %q, want %q", stream, want)
					}
				}
				checked++
			}
			if checked == 0 && tk.model != modelWPM {
				t.Errorf("no lossless text to check")
			}
			t.Logf("%d of %d texts round-tripped", checked, len(texts[name]))
		})
	}
	// The LLaMA-3, Qwen2 and GPT-4o pre-tokenizers over DeepSeek LLM's byte-level vocabulary.
	all := slices.Concat(slices.Collect(mapsValues(texts))...)
	for _, pre := range []string{"llama-bpe", "qwen2", "gpt-4o"} {
		t.Run("deepseek-llm+"+pre, func(t *testing.T) {
			tk := loadWithPre(t, vocabPath(t, "ggml-vocab-deepseek-llm.gguf"), pre)
			for _, s := range all {
				if !lossless(tk, s) {
					continue
				}
				ids, err := tk.Encode(s, true, false)
				if err != nil {
					t.Fatal(err)
				}
				if got := tk.Decode(ids); got != s {
					t.Errorf("Decode(Encode(%q)) = %q", s, got)
				}
			}
		})
	}
}

func mapsValues[K comparable, V any](m map[K]V) func(func(V) bool) {
	return func(yield func(V) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}

func mapsKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// TestVocabInfo checks the special ids and end-of-generation sets of the shared vocabularies.
func TestVocabInfo(t *testing.T) {
	for _, c := range []struct {
		file          string
		bos, eos, eot int32
		eog           []int32
		addBOS        bool
	}{
		{"ggml-vocab-llama-spm.gguf", 1, 2, NoToken, []int32{2}, true},
		// Several texts can name the EOT token; llama.cpp takes the first in hash order, we take
		// the lowest id.
		{"ggml-vocab-phi-3.gguf", 1, 32000, 32000, []int32{32000, 32007}, true},
		{"ggml-vocab-gpt-2.gguf", 50256, 50256, 50256, []int32{50256}, false},
		{"ggml-vocab-deepseek-llm.gguf", 100000, 100001, 100001, []int32{100001}, true},
		// [PAD] is taken for a fill-in-the-middle pad token, which ends generation.
		{"ggml-vocab-bert-bge.gguf", 101, NoToken, NoToken, []int32{0}, true},
		{"ggml-vocab-starcoder.gguf", 0, 0, 0, []int32{0, 4}, false},
	} {
		t.Run(c.file, func(t *testing.T) {
			tk := loadTokenizer(t, vocabPath(t, c.file))
			v := tk.Vocab()
			if v.BOS != c.bos || v.EOS != c.eos || v.EOT != c.eot || v.AddBOS != c.addBOS {
				t.Errorf("BOS, EOS, EOT, AddBOS = %d, %d, %d, %v; want %d, %d, %d, %v",
					v.BOS, v.EOS, v.EOT, v.AddBOS, c.bos, c.eos, c.eot, c.addBOS)
			}
			if got := v.EOG(); !slices.Equal(got, c.eog) {
				t.Errorf("EOG = %v, want %v", got, c.eog)
			}
			for _, id := range c.eog {
				if !v.IsEOG(id) {
					t.Errorf("IsEOG(%d) = false", id)
				}
				if v.Type(id) != TypeControl {
					t.Errorf("Type(%d) = %v, want control", id, v.Type(id))
				}
			}
			if v.IsEOG(-1) || v.IsEOG(int32(v.Size)) {
				t.Error("IsEOG true out of range")
			}
		})
	}
}

func ExampleTokenizer_Encode() {
	tk, err := New(exampleVocab())
	if err != nil {
		fmt.Println(err)
		return
	}
	ids, _ := tk.Encode("hello world", true, false)
	fmt.Println(ids, tk.Decode(ids))
	// Output: [1 7 8] hello world
}

// TestSPMWordSplit: merging word by word gives what merging the whole text at once gives.
func TestSPMWordSplit(t *testing.T) {
	path := vocabPath(t, "ggml-vocab-llama-spm.gguf")
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	whole, err := New(f)
	if err != nil {
		t.Fatal(err)
	}
	whole.spmWordSplit = false
	split := loadTokenizer(t, path)
	if !split.spmWordSplit {
		t.Fatal("llama-spm vocabulary not merged word by word")
	}
	ref := loadTokRef(t)
	texts := []string{benchText, "  a  b\t\tc\n\n d ", "\u2581\u2581x\u2581 y", "▁▁hello▁world", "日本 語 🦙  ."}
	for _, v := range ref.Vocabs {
		for _, c := range v.Cases {
			texts = append(texts, c.Text)
		}
	}
	for _, s := range texts {
		a, err1 := whole.Encode(s, true, true)
		b, err2 := split.Encode(s, true, true)
		if err1 != nil || err2 != nil || !slices.Equal(a, b) {
			t.Errorf("%q:\n whole %v %v\n split %v %v", s, a, err1, b, err2)
		}
	}
}
