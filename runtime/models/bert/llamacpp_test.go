package bert_test

import (
	"encoding/json"
	"math"
	"os"
	"os/exec"
	"path/filepath"
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

// parityInputs are the texts TestLlamaCppParity embeds: punctuation, accents, CJK, emoji, digits,
// special-token text, surrounding spaces, one character, and one input of 506 tokens (the
// model's 512 positions nearly full). No newlines (llama-embedding splits its prompt at them) and
// no backslashes (llama.cpp's tools unescape their prompts).
var parityInputs = []string{
	"Hello world, this is a test.",
	"The quick brown fox jumps over the lazy dog.",
	"What is the capital of France?",
	"Paris",
	"Embeddings map text to vectors; similar texts get similar vectors.",
	"I can't believe it's not butter!",
	"naïve café résumé — Ünïcödé ÀÉÎÕÜ",
	"日本語のテキストと中文字符 mixed with English words",
	"1234567890 3.14159 2+2=4 $100.00 50% off",
	"A",
	"[CLS] special tokens [SEP] in the text [MASK]",
	"    leading and trailing spaces   ",
	"The mitochondria is the powerhouse of the cell. Photosynthesis converts light energy into chemical energy in plants, algae and some bacteria; cellular respiration releases that energy again.",
	"emoji 🙂👍🏽 and symbols ©®™ ← → ∑ ∞",
	"Tab\tseparated\tvalues\there",
	longInput(),
}

// longInput is 504 words of one token each: with [CLS] and [SEP], 506 of the model's 512
// positions.
func longInput() string {
	words := strings.Fields("was into world off war several march come single saw find court worked various george " +
		"instead track museum thomas originally table talk placed sir energy tournament canadian smith via novel dance " +
		"prior forest paper location foot nodded camp rate fort sam physical stared trees showed mainly plan")
	out := make([]string, 504)
	for i := range out {
		out[i] = words[(i*7)%len(words)]
	}
	return strings.Join(out, " ")
}

// TestLlamaCppParity compares Parley with llama.cpp's own tools on synthetic files in real
// shapes, the bert-bge vocabulary of ../shared copied in: bge-small (CLS pooling) in F32, F16
// and Q8_0, and MiniLM (mean pooling) in F32. Every input's embedding on every backend must have
// a cosine similarity of at least 0.9999 with llama-embedding's (its default L2 normalisation,
// all inputs in one batch), and its token ids must be llama-tokenize's. Nothing of llama.cpp's is
// stored: the files are made here, and the tools run on them. The test needs llama.cpp's binaries
// (built at c392e5094deaf2d1a7c18683214f007fad3fe42b, the commit the bert package follows) named
// by PARLEY_LLAMA_CPP (their directory, e.g. llama.cpp/build/bin) and is skipped without it:
//
//	PARLEY_LLAMA_CPP=$HOME/llama.cpp/build/bin go test -count=1 -v -run TestLlamaCppParity ./runtime/models/bert
func TestLlamaCppParity(t *testing.T) {
	bin := os.Getenv("PARLEY_LLAMA_CPP")
	if bin == "" {
		t.Skip("PARLEY_LLAMA_CPP (the directory of llama.cpp's llama-embedding and llama-tokenize) is not set")
	}
	vf, err := gguf.Open(sharedtest.Path(t, "models/vocab/ggml-vocab-bert-bge.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer vf.Close()
	dir := t.TempDir()
	for _, tc := range []struct {
		shape string
		dt    tensor.DType
	}{{"bge-small", tensor.F32}, {"bge-small", tensor.F16}, {"bge-small", tensor.Q8_0}, {"minilm", tensor.F32}} {
		name := tc.shape + "-" + strings.ToLower(tc.dt.String())
		t.Run(name, func(t *testing.T) {
			w, err := bert.Synth(bert.Shapes[tc.shape], tc.dt, 1, vf)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, name+".gguf")
			if err := w.WriteFile(path); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(filepath.Join(bin, "llama-embedding"), "-m", path, "-p", strings.Join(parityInputs, "\n"),
				"-t", "2", "-c", "4096", "-b", "4096", "--embd-output-format", "json").Output()
			if err != nil {
				t.Fatalf("llama-embedding: %v", err)
			}
			var ref struct {
				Data []struct {
					Embedding []float64 `json:"embedding"`
				} `json:"data"`
			}
			if err := json.Unmarshal(out, &ref); err != nil || len(ref.Data) != len(parityInputs) {
				t.Fatalf("llama-embedding's output: %d embeddings, %v", len(ref.Data), err)
			}
			f, err := gguf.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			tok, err := tokenizer.New(f)
			if err != nil {
				t.Fatal(err)
			}
			var seqs [][]int32
			for _, text := range parityInputs {
				ids, err := tok.Encode(text, true, true)
				if err != nil {
					t.Fatal(err)
				}
				seqs = append(seqs, ids)
			}
			if tc.dt == tensor.F32 && tc.shape == "bge-small" { // the tokenizer does not depend on the weights
				for i, text := range parityInputs {
					out, err := exec.Command(filepath.Join(bin, "llama-tokenize"), "-m", path, "-p", text, "--ids", "--log-disable").Output()
					if err != nil {
						t.Fatalf("llama-tokenize: %v", err)
					}
					lines := strings.Split(strings.TrimSpace(string(out)), "\n")
					var want []int32
					if err := json.Unmarshal([]byte(lines[len(lines)-1]), &want); err != nil {
						t.Fatalf("llama-tokenize's output %q: %v", out, err)
					}
					if !slices.Equal(seqs[i], want) {
						t.Errorf("input %d %q: ids %v, llama-tokenize %v", i, text, seqs[i], want)
					}
				}
			}
			n := 0
			for _, s := range seqs {
				n += len(s)
			}
			for _, be := range backendsUnderTest(t) {
				_, c := newContext(t, f, be, bert.ContextConfig{StepTokens: n})
				got := embedAll(t, c, seqs, pooling.NormEuclidean)
				minCos, worst := 1.0, 0.0
				for i, row := range got {
					var dot, gg, ww float64
					for j, w := range ref.Data[i].Embedding {
						g := float64(row[j])
						dot, gg, ww = dot+g*w, gg+g*g, ww+w*w
						worst = math.Max(worst, math.Abs(g-w))
					}
					minCos = math.Min(minCos, dot/math.Sqrt(gg*ww))
				}
				t.Logf("%s on %s: %d inputs (%d tokens), smallest cosine similarity %.9f (1 - %.1e), largest difference %.1e",
					name, be.Name(), len(seqs), n, minCos, 1-minCos, worst)
				if !(minCos >= 0.9999) {
					t.Errorf("%s on %s: an embedding's cosine similarity with llama.cpp's is %v, under 0.9999", name, be.Name(), minCos)
				}
			}
		})
	}
}
