// Package tests drives the real parley binary: it is built once, then run as a user would run
// it, against the real models and llama.cpp's reference outputs in ../shared.
package tests

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/gguf"
)

var parleyBin string

// raceReport begins every report of the race detector (see raceBuild).
const raceReport = "WARNING: DATA RACE"

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "parley-bin")
	if err != nil {
		panic(err)
	}
	parleyBin = filepath.Join(dir, "parley")
	args := []string{"build", "-o", parleyBin}
	if buildTags != "" {
		args = append(args, "-tags", buildTags)
	}
	if raceBuild {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "../cmd/parley")...)
	cmd.Stderr = os.Stderr
	if err := cmd.Run(); err != nil {
		os.Stderr.WriteString("building parley: " + err.Error() + "\n")
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type result struct {
	code           int
	stdout, stderr string
}

func parley(t testing.TB, stdin string, args ...string) result {
	t.Helper()
	return runParley(t, nil, stdin, args)
}

// runParley runs the binary under test with args, env added to this process's environment and
// stdin as its standard input, and fails t if it could not start or panicked.
func runParley(t testing.TB, env []string, stdin string, args []string) result {
	t.Helper()
	cmd := exec.Command(parleyBin, args...)
	cmd.Env = append(cmd.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(errb.String(), raceReport) {
		t.Fatalf("parley %q reported a data race:\n%s", args, errb.String())
	}
	if strings.Contains(errb.String(), "panic:") || strings.Contains(errb.String(), "goroutine ") {
		t.Fatalf("parley %q panicked:\n%s", args, errb.String())
	}
	return result{code, out.String(), errb.String()}
}

// openAINode returns the node binary, for scripts that import the openai package from
// tests/node. Without node or the package the test fails under CI and is skipped elsewhere, the
// message ending in skipNote.
func openAINode(t testing.TB, skipNote string) string {
	t.Helper()
	node, err := exec.LookPath("node")
	if _, serr := os.Stat(filepath.Join("node", "node_modules", "openai")); err != nil || serr != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("node or the openai package is missing (run npm ci in tests/node): %v %v", err, serr)
		}
		t.Skip("node or tests/node/node_modules is missing; run `npm ci` in tests/node" + skipNote)
	}
	return node
}

// backends lists the backends the binary under test has.
// sameInBothBuilds skips t in the pure-Go build under -short (scripts/test's nocgo pass): what t
// checks does not depend on the build (usage errors, HTTP plumbing, admission, a file converted
// and compared with the original on one backend), and the default build, whose binary has the
// pure-Go backend too, runs it.
func sameInBothBuilds(t *testing.T) {
	t.Helper()
	if testing.Short() && buildTags == "nocgo" {
		t.Skip("-short in the pure-Go build: the same in both builds, and the default build runs it")
	}
}

func backends() []string {
	if buildTags == "nocgo" {
		return []string{"go"}
	}
	return []string{"go", "cpu"}
}

// genRef is one of llama.cpp's greedy generations from the F32 model.
type genRef struct {
	Prompt       string  `json:"prompt"`
	PromptTokens []int32 `json:"prompt_tokens"`
	Generated    []int32 `json:"generated_token_ids"`
	Text         string  `json:"generated_text"`
}

// llamaCppGenerations returns the F32 model's path and llama.cpp's first three greedy
// generations from it.
func llamaCppGenerations(t *testing.T) (string, []genRef) {
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	raw, err := os.ReadFile(sharedtest.Path(t, "reference/llm/gen-stories260K-f32.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref struct {
		Results []genRef `json:"results"`
	}
	if err := json.Unmarshal(raw, &ref); err != nil {
		t.Fatal(err)
	}
	if len(ref.Results) < 3 {
		t.Fatalf("%d reference generations, want 3 or more", len(ref.Results))
	}
	return model, ref.Results[:3]
}

// TestGenerateMatchesLlamaCpp: greedy generation through the binary gives llama.cpp's ids for
// the F32 model, on every backend this build has.
func TestGenerateMatchesLlamaCpp(t *testing.T) {
	model, refs := llamaCppGenerations(t)
	for _, be := range backends() {
		for _, r := range refs {
			res := parley(t, "", "generate", "--backend", be, "-m", model, "-p", r.Prompt, "-n", "64", "--temp", "0", "--ignore-eos", "--json")
			if res.code != 0 {
				t.Fatalf("%s: exit %d: %s", be, res.code, res.stderr)
			}
			var got struct {
				PromptTokens []int32 `json:"prompt_tokens"`
				Tokens       []int32 `json:"tokens"`
				Text         string  `json:"text"`
				Logprobs     [][]struct {
					ID      int32   `json:"id"`
					Logprob float64 `json:"logprob"`
				} `json:"logprobs"`
			}
			if err := json.Unmarshal([]byte(res.stdout), &got); err != nil {
				t.Fatalf("%s: output is not JSON: %v\n%s", be, err, res.stdout)
			}
			if !slices.Equal(got.PromptTokens, r.PromptTokens) {
				t.Errorf("%s %q: prompt tokens %v, llama.cpp %v", be, r.Prompt, got.PromptTokens, r.PromptTokens)
			}
			if !slices.Equal(got.Tokens, r.Generated) {
				t.Errorf("%s %q: generated %v, llama.cpp %v", be, r.Prompt, got.Tokens, r.Generated)
			}
			if got.Text != r.Text {
				t.Errorf("%s %q: text %q, llama.cpp %q", be, r.Prompt, got.Text, r.Text)
			}
			if len(got.Logprobs) != len(got.Tokens) || len(got.Logprobs) > 0 && len(got.Logprobs[0]) != 5 {
				t.Errorf("%s: %d logprob rows for %d tokens", be, len(got.Logprobs), len(got.Tokens))
			}
		}
	}
}

// TestGenerateBF16Cache generates with a BF16 KV cache on every backend of this build (all hold
// BF16 caches): greedy tokens as llama.cpp's (whose references use an F16 cache; on this model
// the caches' roundings move no choice between the two best tokens).
func TestGenerateBF16Cache(t *testing.T) {
	model, refs := llamaCppGenerations(t)
	for _, be := range backends() {
		for _, r := range refs {
			res := parley(t, "", "generate", "--backend", be, "--kv-type", "bf16", "-m", model, "-p", r.Prompt, "-n", "64", "--temp", "0", "--ignore-eos", "--json")
			if res.code != 0 {
				t.Fatalf("%s: exit %d: %s", be, res.code, res.stderr)
			}
			var got struct {
				Tokens []int32 `json:"tokens"`
			}
			if err := json.Unmarshal([]byte(res.stdout), &got); err != nil {
				t.Fatalf("%s: output is not JSON: %v\n%s", be, err, res.stdout)
			}
			if !slices.Equal(got.Tokens, r.Generated) {
				t.Errorf("%s %q with a BF16 cache: generated %v, llama.cpp %v", be, r.Prompt, got.Tokens, r.Generated)
			}
		}
	}
}

func TestGeneratePromptFromStdin(t *testing.T) {
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	a := parley(t, "", "generate", "-m", model, "-p", "Once upon a time", "-n", "8", "--temp", "0", "--json")
	b := parley(t, "Once upon a time", "generate", "-m", model, "-f", "-", "-n", "8", "--temp", "0", "--json")
	if a.code != 0 || b.code != 0 || a.stdout != b.stdout {
		t.Fatalf("-p and -f - differ:\n%s\n%s\n%s%s", a.stdout, b.stdout, a.stderr, b.stderr)
	}
}

func TestTokenizeMatchesLlamaCpp(t *testing.T) {
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	res := parley(t, "", "tokenize", "-m", model, "Hello world")
	if res.code != 0 || strings.TrimSpace(res.stdout) != "[1,346,306,414,263,304,341]" {
		t.Fatalf("tokenize: exit %d, %q %s", res.code, res.stdout, res.stderr)
	}
	res = parley(t, "Hello world", "tokenize", "-m", model, "--no-bos", "-")
	if res.code != 0 || strings.TrimSpace(res.stdout) != "[346,306,414,263,304,341]" {
		t.Fatalf("tokenize --no-bos -: exit %d, %q %s", res.code, res.stdout, res.stderr)
	}
}

func TestInspect(t *testing.T) {
	model := sharedtest.Path(t, "models/llm/stories260K-ffn192-q4_0.gguf")
	res := parley(t, "", "inspect", model)
	if res.code != 0 || !strings.Contains(res.stdout, "general.architecture") || !strings.Contains(res.stdout, "blk.0.ffn_up.weight") || !strings.Contains(res.stdout, "Q4_0") {
		t.Fatalf("inspect: exit %d\n%s\n%s", res.code, res.stdout, res.stderr)
	}
	res = parley(t, "", "inspect", "--json", model)
	var js map[string]any
	if res.code != 0 || json.Unmarshal([]byte(res.stdout), &js) != nil {
		t.Fatalf("inspect --json: exit %d\n%s", res.code, res.stdout)
	}
}

// TestSynthBERT: synth --arch bert writes the shape's encoder with llama.cpp's keys, its pooling,
// and the tokenizer of the file --vocab names.
func TestSynthBERT(t *testing.T) {
	vocab := sharedtest.Path(t, "models/vocab/ggml-vocab-bert-bge.gguf")
	path := filepath.Join(t.TempDir(), "minilm.gguf")
	if res := parley(t, "", "synth", "--arch", "bert", "--shape", "minilm", "--type", "q8_0", "--vocab", vocab, "-o", path); res.code != 0 {
		t.Fatalf("synth: %s", res.stderr)
	}
	res := parley(t, "", "inspect", path)
	for _, want := range []string{`general.architecture               string         "bert"`, "bert.block_count", "bert.pooling_type", "blk.5.layer_output_norm.bias", "[30522]string"} {
		if res.code != 0 || !strings.Contains(res.stdout, want) {
			t.Fatalf("inspect (exit %d) lacks %q:\n%s%s", res.code, want, res.stdout, res.stderr)
		}
	}
	a, b := parley(t, "", "tokenize", "-m", path, "Hello, world!"), parley(t, "", "tokenize", "-m", vocab, "Hello, world!")
	if a.code != 0 || a.stdout != b.stdout || !strings.HasPrefix(a.stdout, "[101,") {
		t.Fatalf("tokenize: %s%s from the model, %s from the vocabulary", a.stdout, a.stderr, b.stdout)
	}
}

// TestSynthThenBench: a synthetic model in a real shape loads, generates and benchmarks.
func TestSynthThenBench(t *testing.T) {
	dir := t.TempDir()
	for _, typ := range []string{"f32", "q8_0", "q4_0", "q4_k"} {
		path := filepath.Join(dir, "s-"+typ+".gguf")
		if res := parley(t, "", "synth", "--shape", "15M", "--type", typ, "-o", path); res.code != 0 {
			t.Fatalf("synth %s: %s", typ, res.stderr)
		}
		res := parley(t, "", "bench", "-m", path, "-p", "32", "-n", "8", "-r", "1", "-t", "2", "--json")
		if res.code != 0 {
			t.Fatalf("bench %s: %s", typ, res.stderr)
		}
		var br map[string]any
		if err := json.Unmarshal([]byte(res.stdout), &br); err != nil {
			t.Fatalf("bench --json: %v\n%s", err, res.stdout)
		}
		if br["pp_tokens_per_s"].(float64) <= 0 || br["tg_tokens_per_s"].(float64) <= 0 {
			t.Fatalf("bench %s: %s", typ, res.stdout)
		}
		if typ != "q8_0" {
			continue
		}
		// batched generation: 1 and 3 sequences a step
		res = parley(t, "", "bench", "-m", path, "-p", "0", "-n", "8", "-r", "1", "-t", "2", "--parallel", "1,3", "--json")
		if res.code != 0 {
			t.Fatalf("bench --parallel: %s", res.stderr)
		}
		var pr struct {
			Parallel []struct {
				Seqs int     `json:"seqs"`
				TG   float64 `json:"tg_tokens_per_s"`
			} `json:"parallel"`
		}
		if err := json.Unmarshal([]byte(res.stdout), &pr); err != nil || len(pr.Parallel) != 2 ||
			pr.Parallel[0].Seqs != 1 || pr.Parallel[1].Seqs != 3 || pr.Parallel[0].TG <= 0 || pr.Parallel[1].TG <= 0 {
			t.Fatalf("bench --parallel --json: %v\n%s", err, res.stdout)
		}
	}
}

// TestBadInput: every mistake gives a clear message and a non-zero exit, never a panic or a hang.
func TestBadInput(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	dir := t.TempDir()
	good, err := os.ReadFile(model)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	corrupt := append([]byte(nil), good...)
	copy(corrupt, "GGUX")
	truncated := write("truncated.gguf", good[:len(good)/2])
	badMagic := write("magic.gguf", corrupt)
	w := gguf.NewWriter()
	w.SetString("general.architecture", "mamba")
	var arch bytes.Buffer
	if _, err := w.WriteTo(&arch); err != nil {
		t.Fatal(err)
	}
	unsupported := write("arch.gguf", arch.Bytes())
	long := strings.Repeat("Once upon a time ", 200)

	for _, c := range []struct {
		name  string
		args  []string
		code  int
		match string
	}{
		{"no command", nil, 2, "usage"},
		{"unknown command", []string{"fly"}, 2, "unknown command"},
		{"unknown flag", []string{"generate", "--bogus"}, 2, "bogus"},
		{"no model", []string{"generate", "-p", "x"}, 2, "-m MODEL"},
		{"no prompt", []string{"generate", "-m", model}, 2, "prompt"},
		{"missing file", []string{"generate", "-m", filepath.Join(dir, "none.gguf"), "-p", "x"}, 1, "no such file"},
		{"truncated", []string{"generate", "-m", truncated, "-p", "x"}, 1, "gguf"},
		{"bad magic", []string{"inspect", badMagic}, 1, "magic"},
		{"unsupported architecture", []string{"generate", "-m", unsupported, "-p", "x"}, 1, "mamba"},
		{"prompt too long", []string{"generate", "-m", model, "-p", long, "--temp", "0"}, 1, "context"},
		{"negative -n", []string{"generate", "-m", model, "-p", "x", "-n", "-3"}, 2, "-n"},
		{"bad top-p", []string{"generate", "-m", model, "-p", "x", "--top-p", "1.5"}, 2, "top_p"},
		{"bad backend", []string{"generate", "--backend", "tpu", "-m", model, "-p", "x"}, 2, "tpu"},
		{"bad logit bias", []string{"generate", "-m", model, "-p", "x", "--logit-bias", "99999=1"}, 2, "logit_bias"},
		{"bad synth type", []string{"synth", "--type", "q9_9", "-o", filepath.Join(dir, "x.gguf")}, 2, "q9_9"},
		{"bad kv type", []string{"bench", "-m", model, "--kv-type", "q4_0"}, 2, "kv-type"},
		{"bad parallel", []string{"bench", "-m", model, "--parallel", "4,0"}, 2, "parallel"},
		{"encoder batch over asr-parallel", []string{"serve", "-m", model, "--asr-parallel", "2", "--asr-encode-batch", "3"}, 2, "asr-encode-batch"},
		{"zero tts-parallel", []string{"serve", "-m", model, "--tts-parallel", "0"}, 2, "tts-parallel"},
		{"stream chunk over 30 s", []string{"serve", "-m", model, "--stream-chunk", "31s"}, 2, "stream-chunk"},
		{"negative left context", []string{"serve", "-m", model, "--stream-left-context", "-1s"}, 2, "stream-left-context"},
	} {
		t.Run(c.name, func(t *testing.T) {
			res := parley(t, "", c.args...)
			if res.code != c.code {
				t.Errorf("exit %d, want %d; stderr: %s", res.code, c.code, res.stderr)
			}
			if !strings.Contains(strings.ToLower(res.stderr), strings.ToLower(c.match)) {
				t.Errorf("stderr %q does not mention %q", res.stderr, c.match)
			}
		})
	}
}
