package whisper

import (
	"github.com/parleyhq/parley/runtime/tokenizer/utf8stream"
	"math"

	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/ggml"
)

// models maps the reference directories' model tags to whisper.cpp's weightless test files.
var models = map[string]string{"tiny-f16": "tiny", "tiny.en-f16": "tiny.en"}

var (
	loadMu sync.Mutex
	loaded = map[string]*Tokenizer{}
)

// load returns the tokenizer of whisper.cpp's for-tests-ggml-<name>.bin, skipping t without the
// shared directory.
func load(t testing.TB, name string) *Tokenizer {
	t.Helper()
	p := sharedtest.Path(t, "models/asr/for-tests-ggml-"+name+".bin")
	loadMu.Lock()
	defer loadMu.Unlock()
	if tk, ok := loaded[name]; ok {
		return tk
	}
	f, err := ggml.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tk, err := New(f.Vocab, f.HParams.NVocab)
	if err != nil {
		t.Fatal(err)
	}
	loaded[name] = tk
	return tk
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

type specialIDs struct {
	SOT        int32 `json:"sot"`
	EOT        int32 `json:"eot"`
	Not        int32 `json:"not"`
	Beg        int32 `json:"beg"`
	SOLM       int32 `json:"solm"`
	Prev       int32 `json:"prev"`
	NoSp       int32 `json:"nosp"`
	Translate  int32 `json:"translate"`
	Transcribe int32 `json:"transcribe"`
	LangEN     int32 `json:"lang_en"`
}

func checkSpecial(t *testing.T, tk *Tokenizer, want specialIDs, where string) {
	t.Helper()
	en, _ := tk.LangID("en")
	if !tk.IsMultilingual() {
		en = tk.SOT + 1 // whisper_token_lang(ctx, 0), which English-only models never use
	}
	got := specialIDs{tk.SOT, tk.EOT, tk.NoTimestamps, tk.TimestampBegin, tk.SOLM, tk.Prev, tk.NoSpeech,
		tk.Translate, tk.Transcribe, en}
	if got != want {
		t.Errorf("%s: special ids %+v, want %+v", where, got, want)
	}
}

// TestForcedIDs checks Encode against whisper.cpp's tokenization of " " + the reference
// transcript, which the reference runs forced through the decoder followed by EOT.
func TestForcedIDs(t *testing.T) {
	dir := sharedtest.Path(t, "reference/asr/tf")
	var utts []struct {
		ID   string `json:"id"`
		Text string `json:"reference_text"`
	}
	readJSON(t, sharedtest.Path(t, "reference/asr/utterances.json"), &utts)
	texts := map[string]string{}
	for _, u := range utts {
		texts[u.ID] = u.Text
	}
	metas, _ := filepath.Glob(filepath.Join(dir, "*", "*", "text_fa*", "meta.json"))
	if len(metas) == 0 {
		t.Skip("no reference/asr/tf/*/*/text_fa*/meta.json")
	}
	t.Logf("%d reference runs", len(metas))
	for _, m := range metas {
		rel, _ := filepath.Rel(dir, m)
		parts := strings.Split(filepath.ToSlash(rel), "/")
		model, utt := parts[0], parts[1]
		var meta struct {
			NVocab  int        `json:"n_vocab"`
			Multi   int        `json:"multilingual"`
			Prompt  []int32    `json:"prompt"`
			Forced  []int32    `json:"forced_ids"`
			Space   int32      `json:"space_token_id"`
			Special specialIDs `json:"special"`
		}
		readJSON(t, m, &meta)
		tk := load(t, models[model])
		text, ok := texts[utt]
		if !ok || len(meta.Forced) == 0 {
			t.Fatalf("%s: no reference text or forced ids", rel)
		}
		if tk.NVocab() != meta.NVocab || tk.IsMultilingual() != (meta.Multi == 1) {
			t.Errorf("%s: n_vocab %d multilingual %v, want %d %d", rel, tk.NVocab(), tk.IsMultilingual(), meta.NVocab, meta.Multi)
		}
		checkSpecial(t, tk, meta.Special, rel)
		if p, err := tk.Prompt("en", false, true); err != nil || !reflect.DeepEqual(p, meta.Prompt) {
			t.Errorf("%s: prompt %v (%v), want %v", rel, p, err, meta.Prompt)
		}
		if got := tk.Encode(" "); len(got) != 1 || got[0] != meta.Space {
			t.Errorf("%s: Encode(\" \") = %v, want [%d]", rel, got, meta.Space)
		}
		got := append(tk.Encode(" "+text), tk.EOT)
		if !reflect.DeepEqual(got, meta.Forced) {
			t.Errorf("%s: Encode(%q) + EOT =\n%v, want\n%v", rel, " "+text, got, meta.Forced)
		}
		if s := tk.Decode(got); s != " "+text {
			t.Errorf("%s: Decode = %q", rel, s)
		}
	}
}

// TestDecodeReference checks Piece against the bytes of every token whisper.cpp emitted in the
// reference decoding runs, and the special and prompt ids those runs used.
func TestDecodeReference(t *testing.T) {
	dir := sharedtest.Path(t, "reference/asr/decode")
	files, _ := filepath.Glob(filepath.Join(dir, "*", "*", "*.tokens.json"))
	if len(files) == 0 {
		t.Skip("no reference/asr/decode/*/*/*.tokens.json")
	}
	n := 0
	for _, p := range files {
		rel, _ := filepath.Rel(dir, p)
		var run struct {
			Model   string     `json:"model"`
			Lang    string     `json:"language"`
			NoTS    bool       `json:"no_timestamps"`
			Prompt  []int32    `json:"prompt_ids"`
			Special specialIDs `json:"special_token_ids"`
			Tokens  []struct {
				ID    int32  `json:"id"`
				Bytes string `json:"bytes_hex"`
			} `json:"tokens"`
		}
		readJSON(t, p, &run)
		tk := load(t, models[run.Model])
		checkSpecial(t, tk, run.Special, rel)
		if got, err := tk.Prompt(run.Lang, false, run.NoTS); err != nil || !reflect.DeepEqual(got, run.Prompt) {
			t.Errorf("%s: prompt %v (%v), want %v", rel, got, err, run.Prompt)
		}
		var ids []int32
		var all []byte
		for _, tok := range run.Tokens {
			want, err := hex.DecodeString(tok.Bytes)
			if err != nil {
				t.Fatal(err)
			}
			if got := tk.Piece(tok.ID); string(got) != string(want) {
				t.Errorf("%s: Piece(%d) = %q, want %q", rel, tok.ID, got, want)
			}
			ids = append(ids, tok.ID)
			all = append(all, want...)
			n++
		}
		if tk.Decode(ids) != string(all) {
			t.Errorf("%s: Decode differs from the concatenated bytes", rel)
		}
	}
	t.Logf("%d files, %d tokens", len(files), n)
}

// vocab256 returns a vocabulary whose first 256 tokens are the single bytes, followed by words
// and a few stored duplicates, padded to the 50257 tokens of a file.
func vocab256() [][]byte {
	v := make([][]byte, 0, 50257)
	for b := 0; b < 256; b++ {
		v = append(v, []byte{byte(b)})
	}
	for _, w := range []string{" the", "the", " a", "an", " an", "'s", " hello", "hel", "lo", "ll", "\n\n",
		"  ", "123", "12", "é", " é", "ab", "abc", "\xe2\x82", "st", "\xef\xbf\xbd", "\xef\xbf\xbd"} {
		v = append(v, []byte(w))
	}
	for len(v) < 50257 {
		v = append(v, nil)
	}
	return v
}

func TestNew(t *testing.T) {
	for _, n := range []int{0, -1, 51863, 51867, math.MaxInt} {
		if _, err := New(vocab256(), n); err == nil {
			t.Errorf("New(n_vocab %d) succeeded", n)
		}
	}
	cases := []struct {
		n                    int
		multi                bool
		langs                int
		eot, sot, tr, beg    int32
		last, lastLang, code string
	}{
		{NVocabEnglish, false, 0, 50256, 50257, 50357, 50363, "[_TT_1500]", "", ""},
		{NVocabMultilingual, true, 99, 50257, 50258, 50358, 50364, "[_TT_1500]", "su", "[_LANG_su]"},
		{NVocabLargeV3, true, 100, 50257, 50258, 50359, 50365, "[_TT_1500]", "yue", "[_LANG_yue]"},
	}
	for _, c := range cases {
		tk, err := New(vocab256(), c.n)
		if err != nil {
			t.Fatal(err)
		}
		if tk.IsMultilingual() != c.multi || tk.NumLanguages() != c.langs || tk.EOT != c.eot || tk.SOT != c.sot ||
			tk.Translate != c.tr || tk.TimestampBegin != c.beg {
			t.Errorf("n_vocab %d: %+v", c.n, tk)
		}
		if got := string(tk.Piece(int32(c.n - 1))); got != c.last {
			t.Errorf("n_vocab %d: last piece %q, want %q", c.n, got, c.last)
		}
		if tk.Piece(int32(c.n)) != nil || tk.Piece(-1) != nil {
			t.Errorf("n_vocab %d: pieces out of range", c.n)
		}
		names := map[int32]string{tk.SOT: "[_SOT_]", tk.Translate: "[_TRANSLATE_]", tk.Transcribe: "[_TRANSCRIBE_]",
			tk.SOLM: "[_SOLM_]", tk.Prev: "[_PREV_]", tk.NoSpeech: "[_NOSP_]", tk.NoTimestamps: "[_NOT_]",
			tk.TimestampBegin: "[_BEG_]", tk.TimestampBegin + 1: "[_TT_1]", tk.SOT + 1: "[_LANG_en]", tk.SOT + 2: "[_LANG_zh]"}
		if c.multi {
			names[tk.EOT] = "[_EOT_]"
			names[tk.SOT+int32(c.langs)] = c.code
			if id, ok := tk.LangID(c.lastLang); !ok || id != tk.SOT+int32(c.langs) {
				t.Errorf("n_vocab %d: LangID(%q) = %d, %v", c.n, c.lastLang, id, ok)
			}
		}
		for id, want := range names {
			if got := string(tk.Piece(id)); got != want {
				t.Errorf("n_vocab %d: Piece(%d) = %q, want %q", c.n, id, got, want)
			}
		}
		if !tk.IsTimestamp(tk.TimestampBegin) || tk.IsTimestamp(tk.TimestampBegin-1) || !tk.IsTimestamp(int32(c.n-1)) ||
			tk.IsTimestamp(int32(c.n)) {
			t.Errorf("n_vocab %d: IsTimestamp", c.n)
		}
		if tk.TimestampID(0) != tk.TimestampBegin || tk.TimestampID(1500) != int32(c.n-1) || tk.TimestampID(1501) != -1 ||
			tk.TimestampID(-1) != -1 {
			t.Errorf("n_vocab %d: TimestampID", c.n)
		}
		if !tk.IsSpecial(tk.EOT) || tk.IsSpecial(tk.EOT-1) || !tk.IsSpecial(-1) {
			t.Errorf("n_vocab %d: IsSpecial", c.n)
		}
	}
}

func TestLanguages(t *testing.T) {
	ls := Languages()
	if len(ls) != 100 || ls[0] != (Language{"en", "english"}) || ls[99] != (Language{"yue", "cantonese"}) ||
		ls[93].Code != "haw" || ls[80].Name != "haitian creole" {
		t.Fatalf("table: %d languages, %v ... %v", len(ls), ls[0], ls[len(ls)-1])
	}
	seen := map[string]bool{}
	for _, l := range ls {
		if seen[l.Code] || seen[l.Name] {
			t.Errorf("duplicate %v", l)
		}
		seen[l.Code], seen[l.Name] = true, true
	}
	ls[0].Code = "xx"
	if i, ok := LanguageIndex("en"); !ok || i != 0 {
		t.Error("Languages returned the table itself")
	}
	for s, want := range map[string]int{"de": 2, "german": 2, "jw": 97, "su": 98, "cantonese": 99} {
		if i, ok := LanguageIndex(s); !ok || i != want {
			t.Errorf("LanguageIndex(%q) = %d, %v, want %d", s, i, ok, want)
		}
	}
	if _, ok := LanguageIndex("German"); ok {
		t.Error("names are case-sensitive in whisper.cpp")
	}

	multi, _ := New(vocab256(), NVocabMultilingual)
	if id, ok := multi.LangID("german"); !ok || id != 50261 {
		t.Errorf("LangID(german) = %d, %v", id, ok)
	}
	if c, ok := multi.LangCode(50261); !ok || c != "de" {
		t.Errorf("LangCode(50261) = %q, %v", c, ok)
	}
	if _, ok := multi.LangID("yue"); ok {
		t.Error("a 99-language model knows yue")
	}
	for _, id := range []int32{multi.SOT, multi.Translate, -5} {
		if _, ok := multi.LangCode(id); ok {
			t.Errorf("LangCode(%d) succeeded", id)
		}
	}
	if _, err := multi.Prompt("klingon", false, false); err == nil {
		t.Error("Prompt with an unknown language succeeded")
	}
	if p, _ := multi.Prompt("fr", true, false); !reflect.DeepEqual(p, []int32{50258, 50265, 50358}) {
		t.Errorf("Prompt(fr, translate) = %v", p)
	}
	en, _ := New(vocab256(), NVocabEnglish)
	if _, ok := en.LangID("en"); ok || en.NumLanguages() != 0 {
		t.Error("an English-only model has language tokens")
	}
	if p, err := en.Prompt("", true, false); err != nil || !reflect.DeepEqual(p, []int32{50257}) {
		t.Errorf("English-only Prompt = %v, %v", p, err)
	}
}

// splitWords returns the words wordEnd cuts s into.
func splitWords(s string) []string {
	var w []string
	for p := 0; p < len(s); {
		e := wordEnd(s, p)
		w = append(w, s[p:e])
		p = e
	}
	return w
}

func TestSplit(t *testing.T) {
	cases := map[string][]string{
		"":                          nil,
		"Hello world":               {"Hello", " world"},
		" And so, my fellow":        {" And", " so", ",", " my", " fellow"},
		"I'm she's we'll you've 'd": {"I", "'m", " she", "'s", " we", "'ll", " you", "'ve", " '", "d"},
		"'S 're 'rex '":             {"'", "S", " '", "re", " '", "rex", " '"},
		"it''s":                     {"it", "''", "s"},
		"a  b":                      {"a", " ", " b"},
		"a   b  ":                   {"a", "  ", " b", "  "},
		"a\tb":                      {"a", "\t", "b"},
		"a\t b":                     {"a", "\t", " b"},
		"x\n\n\ny":                  {"x", "\n\n", "\n", "y"},
		"abc123def":                 {"abc", "123", "def"},
		" 123 4.5":                  {" 123", " 4", ".", "5"},
		"!!?? ...":                  {"!!??", " ..."},
		"naïve café":                {"na", "\xc3\xaf", "ve", " caf", "\xc3\xa9"},
		" ß":                        {" \xc3\x9f"},
		"日本語 テキスト":                  {"日本語", " テキスト"},
		"\x00\x01a\x7f":             {"\x00\x01", "a", "\x7f"},
		"\xff's\xfe":                {"\xff'", "s", "\xfe"},
		"   ":                       {"   "},
		" ":                         {" "},
		"\v\f\r a":                  {"\v\f\r", " a"},
	}
	for in, want := range cases {
		if got := splitWords(in); !reflect.DeepEqual(got, want) {
			t.Errorf("split %q = %q, want %q", in, got, want)
		}
	}
}

func TestEncodeGreedy(t *testing.T) {
	tk, err := New(vocab256(), NVocabEnglish)
	if err != nil {
		t.Fatal(err)
	}
	id := func(s string) int32 {
		i, ok := tk.ids[s]
		if !ok {
			t.Fatalf("%q not in the vocabulary", s)
		}
		return i
	}
	for in, want := range map[string][]string{
		" hello":    {" hello"},
		"hello":     {"hel", "lo"},
		"hellol":    {"hel", "lo", "l"},
		"abcab":     {"abc", "ab"},
		"1234":      {"123", "4"},
		" the\n\n":  {" the", "\n\n"},
		"the's":     {"the", "'s"},
		"   a":      {"  ", " a"},
		" é":        {" é"},
		"\xe2\x82x": {"\xe2\x82", "x"},
	} {
		var ids []int32
		for _, w := range want {
			ids = append(ids, id(w))
		}
		if got := tk.Encode(in); !reflect.DeepEqual(got, ids) {
			t.Errorf("Encode(%q) = %v, want %v", in, got, ids)
		}
	}
	// The piece stored twice maps to its later id.
	if got := tk.Encode("\xef\xbf\xbd"); len(got) != 1 || got[0] != 256+21 {
		t.Errorf("duplicate piece encodes as %v, want [277]", got)
	}
	// Bytes that begin no token are dropped.
	small := vocab256()
	small['q'] = nil
	tk2, _ := New(small, NVocabEnglish)
	if got, n := tk2.encode(nil, "aqa q"); n != 2 || tk2.Decode(got) != "aa " {
		t.Errorf("dropping: %v (%d dropped) decodes to %q", got, n, tk2.Decode(got))
	}
	if got := tk.AppendEncode([]int32{7}, "a"); !reflect.DeepEqual(got, []int32{7, 'a'}) {
		t.Errorf("AppendEncode = %v", got)
	}
}

// TestDecoder streams tokens that split multi-byte characters and checks that no character is
// split and that the output concatenates to Decode's.
func TestDecoder(t *testing.T) {
	tk, _ := New(vocab256(), NVocabEnglish)
	text := "naïve €uro 日本 \xff done 🙂"
	var ids []int32
	for i := 0; i < len(text); i++ { // one byte token each
		ids = append(ids, int32(text[i]))
	}
	ids = append(ids, tk.SOT, tk.TimestampID(3), int32('x'), int32(0xe2))
	d := tk.NewDecoder()
	var out []byte
	for _, id := range ids {
		w := d.Write(id)
		if len(w) > 0 && w[0]&0xC0 == 0x80 {
			t.Fatalf("output starts inside a character: %q", w)
		}
		if cut := utf8stream.CompleteLen(w); cut != len(w) {
			t.Fatalf("output ends inside a character: %q", w)
		}
		out = append(out, w...)
	}
	out = append(out, d.Flush()...)
	if want := tk.Decode(ids); string(out) != want || want != text+"x\xe2" {
		t.Errorf("streamed %q, Decode %q", out, want)
	}

	d = tk.NewDecoder()
	d.Special = true
	var sp []byte
	for _, id := range []int32{tk.SOT, 'h', 0xc3, tk.TimestampID(150), 0xa9} {
		sp = d.Append(sp, id)
	}
	sp = append(sp, d.Flush()...)
	if string(sp) != "[_SOT_]h\xc3[_TT_150]\xa9" {
		t.Errorf("special stream %q", sp)
	}
	if got := tk.AppendDecode([]byte(">"), []int32{tk.SOT, 'h', tk.TimestampID(150)}, true); string(got) != ">[_SOT_]h[_TT_150]" {
		t.Errorf("AppendDecode with special = %q", got)
	}
	d.Write(0xe6)
	d.Reset()
	if len(d.Flush()) != 0 {
		t.Error("Reset kept held-back bytes")
	}
}
