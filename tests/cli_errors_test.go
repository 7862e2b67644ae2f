package tests

import (
	"bytes"
	"encoding/json"
	"go/parser"
	"go/token"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/gguf"
)

// cliCase is one command line with the exit status and the stderr text it must give. want must
// appear exactly once; none of absent may appear.
type cliCase struct {
	name   string
	args   []string
	code   int
	want   string
	absent []string
}

// commandNames are parley's commands, as its usage lists them.
var commandNames = []string{"bench", "convert", "generate", "inspect", "pull", "serve", "speak", "synth", "tokenize", "transcribe", "version"}

func runCLICases(t *testing.T, cases []cliCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res := parley(t, "", c.args...)
			if res.code != c.code {
				t.Errorf("exit %d, want %d; stderr:\n%s", res.code, c.code, res.stderr)
			}
			if n := strings.Count(res.stderr, c.want); n != 1 {
				t.Errorf("stderr has %q %d times, want once:\n%s", c.want, n, res.stderr)
			}
			absent := c.absent
			for _, cmd := range commandNames {
				absent = append(absent, "parley "+cmd+": "+cmd+":") // a doubled prefix
			}
			for _, a := range absent {
				if strings.Contains(res.stderr, a) {
					t.Errorf("stderr has %q:\n%s", a, res.stderr)
				}
			}
			if c.code != 0 && res.stdout != "" {
				t.Errorf("a failed command wrote to stdout: %q", res.stdout)
			}
		})
	}
}

// TestCLIFlagErrorsOnce: a flag mistake prints the usage and its error line once, and exits 2;
// tokenize, inspect, synth and convert take neither --backend nor -t.
func TestCLIFlagErrorsOnce(t *testing.T) {
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	vocab := sharedtest.Path(t, "models/asr/for-tests-ggml-tiny.en.bin")
	out := filepath.Join(t.TempDir(), "out.gguf")
	runCLICases(t, []cliCase{
		{"tokenize -t", []string{"tokenize", "-m", model, "-t", "2", "hi"}, 2, "flag provided but not defined: -t", nil},
		{"inspect --backend", []string{"inspect", "--backend", "go", model}, 2, "flag provided but not defined: -backend", nil},
		{"synth -t", []string{"synth", "-t", "2", "-o", out}, 2, "flag provided but not defined: -t", nil},
		{"convert --backend", []string{"convert", "--backend", "go", "-o", out, vocab}, 2, "flag provided but not defined: -backend", nil},
		{"bad value", []string{"transcribe", "-m", vocab, "--beam", "many", "a.wav"}, 2, `invalid value "many" for flag -beam`, nil},
		{"usage after a mistake", []string{"tokenize", "--bogus"}, 2, "usage: parley tokenize", nil},
	})
	// --help prints the flags once and succeeds.
	res := parley(t, "", "tokenize", "--help")
	if res.code != 0 || strings.Count(res.stderr, "\n  -no-parse-special\n") != 1 || strings.Count(res.stderr, "usage: parley tokenize") != 1 {
		t.Errorf("tokenize --help: exit %d\n%s", res.code, res.stderr)
	}
}

// TestCLIUsageErrors: command-line mistakes exit 2 with one plain message, without a doubled
// "parley CMD: CMD:" prefix.
func TestCLIUsageErrors(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	dir := t.TempDir()
	cases := []cliCase{
		{"synth type it cannot write", []string{"synth", "-o", filepath.Join(dir, "s.gguf"), "--type", "iq2_xxs"}, 2, `--type "iq2_xxs"`, nil},
		{"synth unknown type", []string{"synth", "-o", filepath.Join(dir, "s.gguf"), "--type", "q9_9"}, 2, `--type "q9_9"`, nil},
		{"synth bert type it cannot write", []string{"synth", "--arch", "bert", "--shape", "bge-small", "-o", filepath.Join(dir, "s.gguf"), "--type", "q4_k"}, 2, `--type "q4_k": bert takes one of`, nil},
		{"synth unknown bert shape", []string{"synth", "--arch", "bert", "--shape", "15M", "-o", filepath.Join(dir, "s.gguf")}, 2, `unknown bert shape "15M"`, nil},
		{"synth vocabulary for a decoder", []string{"synth", "--vocab", model, "-o", filepath.Join(dir, "s.gguf")}, 2, "--vocab is for --arch bert", nil},
		{"generate unknown backend", []string{"generate", "--backend", "foo", "-m", model, "-p", "x"}, 2, `--backend "foo": unknown backend`, nil},
		{"bench unknown backend", []string{"bench", "--backend", "foo", "-m", model}, 2, `--backend "foo": unknown backend`, nil},
		{"transcribe unknown backend", []string{"transcribe", "--backend", "foo", "-m", filepath.Join(dir, "none.bin"), "a.wav"}, 2, `--backend "foo": unknown backend`, nil},
		{"serve unknown backend", []string{"serve", "--backend", "foo", "-m", model, "--port", "0"}, 2, `--backend "foo": unknown backend`, nil},
		{"serve port out of range", []string{"serve", "-m", model, "--port", "99999"}, 2, "--port 99999: want a port number from 0 to 65535", nil},
		{"serve malformed hf name", []string{"serve", "-m", "stories=hf://owner/repo", "--port", "0"}, 2, `invalid model name "hf://owner/repo"`, []string{"listening on"}},
		{"generate malformed hf name", []string{"generate", "-m", "hf://owner//x.gguf", "-p", "x"}, 2, `invalid model name "hf://owner//x.gguf"`, nil},
		{"transcribe malformed hf name", []string{"transcribe", "-m", "hf://o/r@../x.bin", filepath.Join(dir, "a.wav")}, 2, "invalid model name", nil},
		{"generate negative temperature", []string{"generate", "-m", model, "-p", "x", "--temp", "-1"}, 2, "--temp -1: Invalid 'temperature': expected a value in [0, 2], but got -1 instead.", nil},
		{"generate temperature the server refuses", []string{"generate", "-m", model, "-p", "x", "--temp", "3"}, 2, "Invalid 'temperature': expected a value in [0, 2]", nil},
		{"generate top-p zero", []string{"generate", "-m", model, "-p", "x", "--top-p", "0"}, 2, "--top-p 0: Invalid 'top_p'", nil},
		{"generate presence penalty the server refuses", []string{"generate", "-m", model, "-p", "x", "--presence-penalty", "5"}, 2, "Invalid 'presence_penalty': expected a value in [-2, 2], but got 5 instead.", nil},
		{"generate logit bias the server refuses", []string{"generate", "-m", model, "-p", "x", "--logit-bias", "5=500"}, 2, "Invalid 'logit_bias': value for token 5 must be in [-100, 100].", nil},
		{"generate logit bias outside the vocabulary", []string{"generate", "-m", model, "-p", "x", "--logit-bias", "99999=1"}, 2, `Invalid 'logit_bias': key "99999" is not a token id of this model`, nil},
		{"serve unknown chat template", []string{"serve", "-m", model, "--port", "0", "--chat-template", "nonesuch"}, 2, `--chat-template "nonesuch": no such file, nor a built-in template (chatml,`, []string{"listening on"}},
		{"serve ctx beyond any model", []string{"serve", "-m", model, "--port", "0", "--ctx", "999999999"}, 2, "--ctx 999999999: want 0", nil},
		{"version takes no arguments", []string{"version", "x"}, 2, `unexpected arguments ["x"]`, nil},
	}
	if buildTags != "cuda" { // a backend of Parley's that this build lacks: how to build it in
		cases = append(cases, cliCase{"backend not in this build", []string{"generate", "--backend", "cuda", "-m", model, "-p", "x"}, 2, `--backend "cuda": not in this build (build the CUDA library`, nil})
	}
	if buildTags == "nocgo" { // the cpu backend is known but cannot start: a failure, not a mistake
		cases = append(cases, cliCase{"backend that cannot start", []string{"generate", "--backend", "cpu", "-m", model, "-p", "x"}, 1, "backend cpu", nil})
	}
	runCLICases(t, cases)
	t.Run("unknown backend from the environment", func(t *testing.T) {
		t.Setenv("PARLEY_BACKEND", "foo")
		res := parley(t, "", "generate", "-m", model, "-p", "x")
		if res.code != 2 || strings.Count(res.stderr, `$PARLEY_BACKEND "foo": unknown backend`) != 1 {
			t.Errorf("exit %d, want 2; stderr:\n%s", res.code, res.stderr)
		}
	})
}

// TestCLITranscribeLanguageChecks: --language and --translate are checked once, before any
// audio file is read (the first file here does not exist), with plain messages and exit 2.
func TestCLITranscribeLanguageChecks(t *testing.T) {
	sameInBothBuilds(t)
	english := sharedtest.WhisperRandomModel(t, "tiny.en")
	multi := sharedtest.WhisperRandomModel(t, "tiny")
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.wav")
	wav := sharedtest.Path(t, "data/asr/wav/jfk.wav")
	http := []string{"bad request", "whisper:"}
	runCLICases(t, []cliCase{
		{"unknown code, before the model loads", []string{"transcribe", "-m", filepath.Join(dir, "none.bin"), "--language", "xx", missing, wav}, 2, `--language "xx": unknown language`, http},
		{"unknown code", []string{"transcribe", "-m", english, "--language", "xx", missing, wav}, 2, `--language "xx": unknown language`, http},
		{"language of an English-only model", []string{"transcribe", "-m", english, "--language", "de", missing, wav}, 2, "English-only", append(http, "no such file")},
		{"translate with an English-only model", []string{"transcribe", "-m", english, "--translate", missing, wav}, 2, "cannot translate", append(http, "no such file")},
		{"language the model lacks", []string{"transcribe", "-m", multi, "--language", "yue", missing, wav}, 2, "does not know this language", append(http, "no such file")},
		{"beam out of range", []string{"transcribe", "-m", english, "--beam", "99", missing}, 2, "beam size 99", []string{"bad request"}},
		// languages the model has pass the checks and reach the (missing) file
		{"language by name", []string{"transcribe", "-m", multi, "--language", "german", missing}, 1, "no such file", http},
		{"English on an English-only model", []string{"transcribe", "-m", english, "--language", "en", missing}, 1, "no such file", http},
	})
}

// TestCLIWhisperModelToLanguageModelCommand: a Whisper model given where a language model is
// wanted is named as such, with the command that takes it.
func TestCLIWhisperModelToLanguageModelCommand(t *testing.T) {
	sameInBothBuilds(t)
	vocab := sharedtest.Path(t, "models/asr/for-tests-ggml-tiny.en.bin")
	want := "is a Whisper speech-recognition model, not a language model: parley transcribe takes it"
	runCLICases(t, []cliCase{
		{"tokenize", []string{"tokenize", "-m", vocab, "hi"}, 1, want, []string{"bad magic"}},
		{"generate", []string{"generate", "-m", vocab, "-p", "hi"}, 1, want, []string{"bad magic"}},
	})
}

// TestCLIInspectNonFiniteFloats: NaN and the infinities in GGUF metadata are printed as text and
// written to --json as the strings "NaN", "+Inf" and "-Inf".
func TestCLIInspectNonFiniteFloats(t *testing.T) {
	sameInBothBuilds(t)
	w := gguf.NewWriter()
	w.SetString("general.architecture", "llama")
	w.SetFloat32("test.nan", float32(math.NaN()))
	w.SetFloat32("test.inf", float32(math.Inf(1)))
	w.SetFloat32("test.finite", 0.5)
	w.SetFloats("test.floats", []float32{1.5, float32(math.Inf(-1)), float32(math.NaN())})
	long := make([]float32, 10)
	long[0] = float32(math.Inf(1))
	w.SetFloats("test.long", long)
	w.SetString("test.string", "NaN")
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "nan.gguf")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}

	res := parley(t, "", "inspect", path)
	if res.code != 0 {
		t.Fatalf("inspect: exit %d: %s", res.code, res.stderr)
	}
	for key, want := range map[string]string{
		"test.nan":    "NaN",
		"test.inf":    "+Inf",
		"test.finite": "0.5",
		"test.floats": "[1.5,-Inf,NaN]",
		"test.long":   `{"head":[+Inf,0,0,0,0,0,0,0],"len":10}`,
		"test.string": `"NaN"`,
	} {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(key) + `[ \t]+\S+[ \t]+(.*)$`).FindStringSubmatch(res.stdout)
		if m == nil || strings.TrimSpace(m[1]) != want {
			t.Errorf("inspect %s: got %q, want %q\n%s", key, m, want, res.stdout)
		}
	}

	res = parley(t, "", "inspect", "--json", path)
	if res.code != 0 {
		t.Fatalf("inspect --json: exit %d: %s", res.code, res.stderr)
	}
	var js struct {
		Metadata map[string]any `json:"metadata"`
	}
	if err := json.Unmarshal([]byte(res.stdout), &js); err != nil {
		t.Fatalf("inspect --json: %v\n%s", err, res.stdout)
	}
	for key, want := range map[string]any{
		"test.nan":    "NaN",
		"test.inf":    "+Inf",
		"test.finite": 0.5,
		"test.floats": []any{1.5, "-Inf", "NaN"},
		"test.long":   map[string]any{"len": 10.0, "head": []any{"+Inf", 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0}},
		"test.string": "NaN",
	} {
		got, _ := json.Marshal(js.Metadata[key])
		wantJSON, _ := json.Marshal(want)
		if !bytes.Equal(got, wantJSON) {
			t.Errorf("inspect --json %s: %s, want %s", key, got, wantJSON)
		}
	}
}

// TestCLIUsageColumns: the top-level usage lines up every summary in one column.
func TestCLIUsageColumns(t *testing.T) {
	sameInBothBuilds(t)
	res := parley(t, "")
	_, list, ok := strings.Cut(res.stderr, "commands:\n")
	if res.code != 2 || !ok {
		t.Fatalf("parley: exit %d\n%s", res.code, res.stderr)
	}
	list, _, _ = strings.Cut(list, "\n\n")
	line := regexp.MustCompile(`^  (\S+)( {2,})\S`)
	col := -1
	var names []string
	for _, l := range strings.Split(list, "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("usage line %q: want a name, two or more spaces, a summary", l)
		}
		names = append(names, m[1])
		if c := 2 + len(m[1]) + len(m[2]); col == -1 {
			col = c
		} else if c != col {
			t.Errorf("usage line %q: summary at column %d, others at %d", l, c, col)
		}
	}
	if !slices.Equal(names, commandNames) {
		t.Errorf("usage lists %q, want %q", names, commandNames)
	}
}

// TestCLIDocBackendFlags: the package doc names exactly the commands whose flags include
// --backend and -t.
func TestCLIDocBackendFlags(t *testing.T) {
	var withBackend []string
	for _, n := range commandNames {
		h := parley(t, "", n, "--help")
		if h.code != 0 {
			t.Fatalf("%s --help: exit %d\n%s", n, h.code, h.stderr)
		}
		b, th := strings.Contains(h.stderr, "\n  -backend "), strings.Contains(h.stderr, "\n  -t ") || strings.Contains(h.stderr, "\n  -t, ")
		if b != th {
			t.Errorf("%s --help: --backend %v, -t %v", n, b, th)
		}
		if b {
			withBackend = append(withBackend, n)
		}
	}
	f, err := parser.ParseFile(token.NewFileSet(), "../cmd/parley/main.go", nil, parser.PackageClauseOnly|parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Join(strings.Fields(f.Doc.Text()), " ")
	m := regexp.MustCompile(`commands that run a model \(([^)]*)\) also take --backend`).FindStringSubmatch(doc)
	if m == nil {
		t.Fatalf("package doc does not say which commands take --backend:\n%s", doc)
	}
	documented := strings.Split(m[1], ", ")
	slices.Sort(documented)
	if !slices.Equal(documented, withBackend) {
		t.Errorf("package doc says %q take --backend; their --help says %q", documented, withBackend)
	}
}
