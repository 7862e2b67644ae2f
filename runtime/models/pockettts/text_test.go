package pockettts

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/tokenizer/sentencepiece"
)

func standInTokenizer(t testing.TB) *sentencepiece.Model {
	t.Helper()
	m, err := sentencepiece.Load(sharedtest.Path(t, "reference/tts/tokenizer/random-unigram-4000.model"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// runMeta is the part of a reference run's meta.json that the front end decides.
type runMeta struct {
	Text   string `json:"text"`
	Chunks []struct {
		Text           string  `json:"text"`
		TokenIDs       []int32 `json:"token_ids"`
		NTokens        int     `json:"n_tokens"`
		MaxGenLen      int     `json:"max_gen_len"`
		FramesAfterEOS int     `json:"frames_after_eos"`
	} `json:"chunks"`
}

func readRuns(t testing.TB) map[string]runMeta {
	t.Helper()
	dir := sharedtest.Path(t, "reference/tts")
	metas, _ := filepath.Glob(filepath.Join(dir, "*", "meta.json"))
	if len(metas) == 0 {
		t.Skip("no reference runs in " + dir)
	}
	runs := map[string]runMeta{}
	for _, p := range metas {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		var m runMeta
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		runs[filepath.Base(filepath.Dir(p))] = m
	}
	return runs
}

// TestSplitTextRuns: every reference run's chunks, tokens, frame budget and frames after EOS.
func TestSplitTextRuns(t *testing.T) {
	tok := standInTokenizer(t)
	for name, run := range readRuns(t) {
		chunks, err := SplitText(tok, run.Text, TextOptions{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(chunks) != len(run.Chunks) {
			t.Fatalf("%s: %d chunks, want %d", name, len(chunks), len(run.Chunks))
		}
		for i, c := range chunks {
			w := run.Chunks[i]
			if c.Text != w.Text || !slices.Equal(c.Tokens, w.TokenIDs) || len(c.Tokens) != w.NTokens ||
				c.MaxFrames != w.MaxGenLen || c.FramesAfterEOS != w.FramesAfterEOS {
				t.Errorf("%s chunk %d: %q %v budget %d after-EOS %d; want %q %v %d %d", name, i,
					c.Text, c.Tokens, c.MaxFrames, c.FramesAfterEOS, w.Text, w.TokenIDs, w.MaxGenLen, w.FramesAfterEOS)
			}
		}
	}
}

func TestPrepareText(t *testing.T) {
	for _, c := range []struct {
		in, want string
		guess    int
		o        TextOptions
	}{
		{"hello world", "Hello world.", 3, TextOptions{}},
		{"  Hello\nthere\r\nfriend  ", "Hello there friend.", 3, TextOptions{}}, // "\r\n" -> "  " -> " "
		{"one two three four five", "One two three four five.", 1, TextOptions{}},
		{"a;b", "A,b.", 3, TextOptions{RemoveSemicolons: true}},
		{"hi!", "Hi!", 3, TextOptions{}},
		{"ßig", "SSig.", 3, TextOptions{}},
		{"ⓐ test", "Ⓐ test.", 3, TextOptions{}},
		{"Ⅻ", "Ⅻ.", 3, TextOptions{}}, // a Roman numeral is upper case and a number
		{"hi", "        Hi.", 3, TextOptions{PadShortInputs: true}},
		{"\x1fx\u3000", "X.", 3, TextOptions{}},
		{"3 cats", "3 cats.", 3, TextOptions{}},
		{"a    b", "A  b.", 3, TextOptions{}}, // one pass of "  " -> " "
	} {
		got, guess, err := PrepareText(c.in, c.o)
		if err != nil || got != c.want || guess != c.guess {
			t.Errorf("PrepareText(%q) = %q, %d, %v; want %q, %d", c.in, got, guess, err, c.want, c.guess)
		}
	}
	if _, _, err := PrepareText(" \t\n", TextOptions{}); !errors.Is(err, ErrEmptyText) {
		t.Errorf("blank text: %v", err)
	}
}

// TestSplitTextLong: a long text is packed into chunks of at most 50 tokens on sentence ends, an
// over-long sentence is cut on commas, and every chunk's tokens are its text's.
func TestSplitTextLong(t *testing.T) {
	tok := standInTokenizer(t)
	sentence := "The quick brown fox jumps over the lazy dog."
	text := strings.Repeat(sentence+" ", 7)
	chunks, err := SplitText(tok, text, TextOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := len(tok.Encode(sentence)) // 19: two sentences per chunk
	if len(chunks) != 4 {
		t.Fatalf("%d chunks, want 4 (sentences of %d tokens)", len(chunks), n)
	}
	for i, c := range chunks {
		if !slices.Equal(c.Tokens, tok.Encode(c.Text)) || len(c.Tokens) > MaxChunkTokens {
			t.Errorf("chunk %d: %d tokens %q", i, len(c.Tokens), c.Text)
		}
		if c.FramesAfterEOS != 3 || c.MaxFrames != MaxFrames(len(c.Tokens), 12.5) {
			t.Errorf("chunk %d: after EOS %d, budget %d", i, c.FramesAfterEOS, c.MaxFrames)
		}
	}
	if chunks[0].Text != sentence+" "+sentence || chunks[3].Text != sentence {
		t.Errorf("chunks %q ... %q", chunks[0].Text, chunks[3].Text)
	}
	long := strings.Repeat("one two three four five six seven eight, ", 8) + "end."
	chunks, err = SplitText(tok, long, TextOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(chunks) < 2 {
		t.Fatalf("a %d-token sentence was not cut on commas", len(tok.Encode(long)))
	}
	for i, c := range chunks {
		if !strings.HasSuffix(c.Text, ",") && i < len(chunks)-1 {
			t.Errorf("chunk %d does not end on a comma: %q", i, c.Text)
		}
	}
	if c, _ := SplitText(tok, "hi", TextOptions{FramesAfterEOS: 8}); len(c) != 1 || c[0].FramesAfterEOS != 8 {
		t.Errorf("FramesAfterEOS override: %+v", c)
	}
	if MaxFrames(6, 12.5) != 50 || MaxFrames(19, 12.5) != 105 || MaxFrames(29, 12.5) != 146 {
		t.Error("MaxFrames")
	}
}

// TestPythonStringSemantics compares the Python string predicates reproduced here with Python
// itself on every code point both Unicode versions assign.
func TestPythonStringSemantics(t *testing.T) {
	py := ""
	for _, c := range []string{"/usr/bin/python3", "python3"} {
		if p, err := exec.LookPath(c); err == nil {
			py = p
			break
		}
	}
	if py == "" {
		t.Skip("no python3 to compare Python's string semantics with")
	}
	const script = `
import json, sys, unicodedata
out = {"version": unicodedata.unidata_version, "assigned": [], "space": [], "upper": [], "alnum": [], "toupper": {}}
for c in range(0x110000):
    if 0xD800 <= c < 0xE000: continue
    ch = chr(c)
    if unicodedata.category(ch) == "Cn": continue
    out["assigned"].append(c)
    if ch.isspace(): out["space"].append(c)
    if ch.isupper(): out["upper"].append(c)
    if ch.isalnum(): out["alnum"].append(c)
    if ch.upper() != ch: out["toupper"][str(c)] = ch.upper()
json.dump(out, sys.stdout)
`
	b, err := exec.Command(py, "-c", script).Output()
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Version                       string
		Assigned, Space, Upper, Alnum []rune
		ToUpper                       map[string]string
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	set := func(rs []rune) map[rune]bool {
		m := make(map[rune]bool, len(rs))
		for _, r := range rs {
			m[r] = true
		}
		return m
	}
	space, upper, alnum := set(res.Space), set(res.Upper), set(res.Alnum)
	goAssigned := func(r rune) bool {
		return unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S, unicode.Z, unicode.C)
	}
	bad, checked := 0, 0
	report := func(format string, args ...any) {
		if bad++; bad <= 20 {
			t.Errorf(format, args...)
		}
	}
	for _, r := range res.Assigned {
		if !goAssigned(r) {
			continue
		}
		checked++
		if pyIsSpace(r) != space[r] {
			report("U+%04X isspace: %v, Python %v", r, pyIsSpace(r), space[r])
		}
		if pyIsUpper(r) != upper[r] {
			report("U+%04X isupper: %v, Python %v", r, pyIsUpper(r), upper[r])
		}
		if pyIsAlnum(r) != alnum[r] {
			report("U+%04X isalnum: %v, Python %v", r, pyIsAlnum(r), alnum[r])
		}
		want, ok := res.ToUpper[strconv.Itoa(int(r))]
		if !ok {
			want = string(r)
		}
		if got := pyUpper(r); got != want {
			report("U+%04X upper: %q, Python %q", r, got, want)
		}
	}
	t.Logf("Python (Unicode %s) and Go (Unicode %s) agree on %d of %d code points assigned in both", res.Version, unicode.Version, checked-bad, checked)
}
