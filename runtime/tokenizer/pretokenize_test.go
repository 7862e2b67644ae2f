package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// splitCases are the words that the original expressions (run by Python's regex module) cut
// these texts into:
//
//	GPT-2:  's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//	LLaMA-3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//	Qwen2:  the LLaMA-3 expression with \p{N} for \p{N}{1,3}
//
// The shared vocabularies have no LLaMA-3 or Qwen2 file, so this is what checks those matchers.
var splitCases = []struct {
	text string
	want map[preKind][]string
}{
	{"Hello world", map[preKind][]string{
		preGPT2:   {"Hello", " world"},
		preLlama3: {"Hello", " world"},
		preQwen2:  {"Hello", " world"},
	}},
	{" this is \U0001f999.cpp", map[preKind][]string{
		preGPT2:   {" this", " is", " \U0001f999.", "cpp"},
		preLlama3: {" this", " is", " \U0001f999.", "cpp"},
		preQwen2:  {" this", " is", " \U0001f999.", "cpp"},
	}},
	{"don't you're I'LL we'Ve", map[preKind][]string{
		preGPT2:   {"don", "'t", " you", "'re", " I", "'", "LL", " we", "'", "Ve"},
		preLlama3: {"don", "'t", " you", "'re", " I", "'LL", " we", "'Ve"},
		preQwen2:  {"don", "'t", " you", "'re", " I", "'LL", " we", "'Ve"},
	}},
	{"   Hello\x0a\x0a  x  ", map[preKind][]string{
		preGPT2:   {"  ", " Hello", "\x0a\x0a ", " x", "  "},
		preLlama3: {"  ", " Hello", "\x0a\x0a", " ", " x", "  "},
		preQwen2:  {"  ", " Hello", "\x0a\x0a", " ", " x", "  "},
	}},
	{"3333333 12345", map[preKind][]string{
		preGPT2:   {"3333333", " 12345"},
		preLlama3: {"333", "333", "3", " ", "123", "45"},
		preQwen2:  {"3", "3", "3", "3", "3", "3", "3", " ", "1", "2", "3", "4", "5"},
	}},
	{"a\x0d\x0a\x0d\x0ab", map[preKind][]string{
		preGPT2:   {"a", "\x0d\x0a\x0d", "\x0a", "b"},
		preLlama3: {"a", "\x0d\x0a\x0d\x0a", "b"},
		preQwen2:  {"a", "\x0d\x0a\x0d\x0a", "b"},
	}},
	{"\x09\x09foo  bar\x09", map[preKind][]string{
		preGPT2:   {"\x09", "\x09", "foo", " ", " bar", "\x09"},
		preLlama3: {"\x09", "\x09foo", " ", " bar", "\x09"},
		preQwen2:  {"\x09", "\x09foo", " ", " bar", "\x09"},
	}},
	{"(x+y)**2 == z;\x0a", map[preKind][]string{
		preGPT2:   {"(", "x", "+", "y", ")**", "2", " ==", " z", ";", "\x0a"},
		preLlama3: {"(x", "+y", ")**", "2", " ==", " z", ";\x0a"},
		preQwen2:  {"(x", "+y", ")**", "2", " ==", " z", ";\x0a"},
	}},
	{"na\u00efve caf\u00e9 \u2014 \u201cquotes\u201d", map[preKind][]string{
		preGPT2:   {"na\u00efve", " caf\u00e9", " \u2014", " \u201c", "quotes", "\u201d"},
		preLlama3: {"na\u00efve", " caf\u00e9", " \u2014", " \u201c", "quotes", "\u201d"},
		preQwen2:  {"na\u00efve", " caf\u00e9", " \u2014", " \u201c", "quotes", "\u201d"},
	}},
	{"\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", map[preKind][]string{
		preGPT2:   {"\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8"},
		preLlama3: {"\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8"},
		preQwen2:  {"\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8"},
	}},
	{"a\u00a0b\u200dc\u2028d", map[preKind][]string{
		preGPT2:   {"a", "\u00a0", "b", "\u200d", "c", "\u2028", "d"},
		preLlama3: {"a", "\u00a0b", "\u200dc", "\u2028d"},
		preQwen2:  {"a", "\u00a0b", "\u200dc", "\u2028d"},
	}},
	{"x  \x0a  y", map[preKind][]string{
		preGPT2:   {"x", "  \x0a ", " y"},
		preLlama3: {"x", "  \x0a", " ", " y"},
		preQwen2:  {"x", "  \x0a", " ", " y"},
	}},
	{"'s 'S ''s", map[preKind][]string{
		preGPT2:   {"'s", " '", "S", " ''", "s"},
		preLlama3: {"'s", " '", "S", " ''", "s"},
		preQwen2:  {"'s", " '", "S", " ''", "s"},
	}},
	{"1,000.50$", map[preKind][]string{
		preGPT2:   {"1", ",", "000", ".", "50", "$"},
		preLlama3: {"1", ",", "000", ".", "50", "$"},
		preQwen2:  {"1", ",", "0", "0", "0", ".", "5", "0", "$"},
	}},
	{"\U0001f680 (normal) \U0001f636\u200d\U0001f32b\ufe0f", map[preKind][]string{
		preGPT2:   {"\U0001f680", " (", "normal", ")", " \U0001f636\u200d\U0001f32b\ufe0f"},
		preLlama3: {"\U0001f680", " (", "normal", ")", " \U0001f636\u200d\U0001f32b\ufe0f"},
		preQwen2:  {"\U0001f680", " (", "normal", ")", " \U0001f636\u200d\U0001f32b\ufe0f"},
	}},
	{"\U0001f999,\U0001f999\u00bd\u3000\x0a\x0a.\U0001f999!", map[preKind][]string{
		preGPT2:   {"\U0001f999,\U0001f999", "\u00bd", "\u3000\x0a", "\x0a", ".\U0001f999!"},
		preLlama3: {"\U0001f999,\U0001f999", "\u00bd", "\u3000\x0a\x0a", ".\U0001f999!"},
		preQwen2:  {"\U0001f999,\U0001f999", "\u00bd", "\u3000\x0a\x0a", ".\U0001f999!"},
	}},
	{"S\u00e9.\x0d$-", map[preKind][]string{
		preGPT2:   {"S\u00e9", ".", "\x0d", "$-"},
		preLlama3: {"S\u00e9", ".\x0d", "$-"},
		preQwen2:  {"S\u00e9", ".\x0d", "$-"},
	}},
	{"'\x0a1s ", map[preKind][]string{
		preGPT2:   {"'", "\x0a", "1", "s", " "},
		preLlama3: {"'\x0a", "1", "s", " "},
		preQwen2:  {"'\x0a", "1", "s", " "},
	}},
	{"\u00e9\u0301|$Z- \u200b\x0a$\u00a0", map[preKind][]string{
		preGPT2:   {"\u00e9", "\u0301|$", "Z", "-", " \u200b", "\x0a", "$", "\u00a0"},
		preLlama3: {"\u00e9", "\u0301|$", "Z", "-", " \u200b\x0a", "$", "\u00a0"},
		preQwen2:  {"\u00e9", "\u0301|$", "Z", "-", " \u200b\x0a", "$", "\u00a0"},
	}},
	{"$S-a\u65e5. ZZt\u0301T", map[preKind][]string{
		preGPT2:   {"$", "S", "-", "a\u65e5", ".", " ZZt", "\u0301", "T"},
		preLlama3: {"$S", "-a\u65e5", ".", " ZZt", "\u0301T"},
		preQwen2:  {"$S", "-a\u65e5", ".", " ZZt", "\u0301T"},
	}},
	{"a\u3000\x0a2\x0a!\u65e5t.T$1", map[preKind][]string{
		preGPT2:   {"a", "\u3000", "\x0a", "2", "\x0a", "!", "\u65e5t", ".", "T", "$", "1"},
		preLlama3: {"a", "\u3000\x0a", "2", "\x0a", "!\u65e5t", ".T", "$", "1"},
		preQwen2:  {"a", "\u3000\x0a", "2", "\x0a", "!\u65e5t", ".T", "$", "1"},
	}},
	{"a~ \x0a$0\x09,\u00bd\u65e5", map[preKind][]string{
		preGPT2:   {"a", "~", " ", "\x0a", "$", "0", "\x09", ",", "\u00bd", "\u65e5"},
		preLlama3: {"a", "~", " \x0a", "$", "0", "\x09", ",", "\u00bd", "\u65e5"},
		preQwen2:  {"a", "~", " \x0a", "$", "0", "\x09", ",", "\u00bd", "\u65e5"},
	}},
	{"|02\u3000", map[preKind][]string{
		preGPT2:   {"|", "02", "\u3000"},
		preLlama3: {"|", "02", "\u3000"},
		preQwen2:  {"|", "0", "2", "\u3000"},
	}},
	{".1a !\u3000", map[preKind][]string{
		preGPT2:   {".", "1", "a", " !", "\u3000"},
		preLlama3: {".", "1", "a", " !", "\u3000"},
		preQwen2:  {".", "1", "a", " !", "\u3000"},
	}},
	{" '\U0001f9991", map[preKind][]string{
		preGPT2:   {" '\U0001f999", "1"},
		preLlama3: {" '\U0001f999", "1"},
		preQwen2:  {" '\U0001f999", "1"},
	}},
	{" \u200ba\U0001f999~att\u00bd", map[preKind][]string{
		preGPT2:   {" \u200b", "a", "\U0001f999~", "att", "\u00bd"},
		preLlama3: {" \u200b", "a", "\U0001f999~", "att", "\u00bd"},
		preQwen2:  {" \u200b", "a", "\U0001f999~", "att", "\u00bd"},
	}},
	{"\x0d |", map[preKind][]string{
		preGPT2:   {"\x0d", " |"},
		preLlama3: {"\x0d", " |"},
		preQwen2:  {"\x0d", " |"},
	}},
	{"\x09 !$t\u3000~02", map[preKind][]string{
		preGPT2:   {"\x09", " !$", "t", "\u3000", "~", "02"},
		preLlama3: {"\x09", " !$", "t", "\u3000", "~", "02"},
		preQwen2:  {"\x09", " !$", "t", "\u3000", "~", "0", "2"},
	}},
	{"12a\u200b", map[preKind][]string{
		preGPT2:   {"12", "a", "\u200b"},
		preLlama3: {"12", "a", "\u200b"},
		preQwen2:  {"1", "2", "a", "\u200b"},
	}},
	{"\u3000\u00bd'sT|'aZ", map[preKind][]string{
		preGPT2:   {"\u3000", "\u00bd", "'s", "T", "|'", "aZ"},
		preLlama3: {"\u3000", "\u00bd", "'s", "T", "|'", "aZ"},
		preQwen2:  {"\u3000", "\u00bd", "'s", "T", "|'", "aZ"},
	}},
	{"\u00e9\x0dS~,t\x0a.t\u00a0", map[preKind][]string{
		preGPT2:   {"\u00e9", "\x0d", "S", "~,", "t", "\x0a", ".", "t", "\u00a0"},
		preLlama3: {"\u00e9", "\x0d", "S", "~,", "t", "\x0a", ".t", "\u00a0"},
		preQwen2:  {"\u00e9", "\x0d", "S", "~,", "t", "\x0a", ".t", "\u00a0"},
	}},
	{"\x09$ ' ", map[preKind][]string{
		preGPT2:   {"\x09", "$", " '", " "},
		preLlama3: {"\x09", "$", " '", " "},
		preQwen2:  {"\x09", "$", " '", " "},
	}},
	{"ta0\U0001f999\u00e9!1\u0301a", map[preKind][]string{
		preGPT2:   {"ta", "0", "\U0001f999", "\u00e9", "!", "1", "\u0301", "a"},
		preLlama3: {"ta", "0", "\U0001f999\u00e9", "!", "1", "\u0301a"},
		preQwen2:  {"ta", "0", "\U0001f999\u00e9", "!", "1", "\u0301a"},
	}},
	{"S \U0001f999-$!", map[preKind][]string{
		preGPT2:   {"S", " \U0001f999-$!"},
		preLlama3: {"S", " \U0001f999-$!"},
		preQwen2:  {"S", " \U0001f999-$!"},
	}},
	{"Zst\x0a", map[preKind][]string{
		preGPT2:   {"Zst", "\x0a"},
		preLlama3: {"Zst", "\x0a"},
		preQwen2:  {"Zst", "\x0a"},
	}},
	{"a\u3000-2\u65e51 ", map[preKind][]string{
		preGPT2:   {"a", "\u3000", "-", "2", "\u65e5", "1", " "},
		preLlama3: {"a", "\u3000", "-", "2", "\u65e5", "1", " "},
		preQwen2:  {"a", "\u3000", "-", "2", "\u65e5", "1", " "},
	}},
	{"  t!", map[preKind][]string{
		preGPT2:   {" ", " t", "!"},
		preLlama3: {" ", " t", "!"},
		preQwen2:  {" ", " t", "!"},
	}},
	{"Ta-33-\x0as\u200b!\x0d\u65e5!", map[preKind][]string{
		preGPT2:   {"Ta", "-", "33", "-", "\x0a", "s", "\u200b!", "\x0d", "\u65e5", "!"},
		preLlama3: {"Ta", "-", "33", "-\x0a", "s", "\u200b!\x0d", "\u65e5", "!"},
		preQwen2:  {"Ta", "-", "3", "3", "-\x0a", "s", "\u200b!\x0d", "\u65e5", "!"},
	}},
	{"\U0001f999 S$s", map[preKind][]string{
		preGPT2:   {"\U0001f999", " S", "$", "s"},
		preLlama3: {"\U0001f999", " S", "$s"},
		preQwen2:  {"\U0001f999", " S", "$s"},
	}},
	{"\u00bdT\u65e5-T\u00a0t", map[preKind][]string{
		preGPT2:   {"\u00bd", "T\u65e5", "-", "T", "\u00a0", "t"},
		preLlama3: {"\u00bd", "T\u65e5", "-T", "\u00a0t"},
		preQwen2:  {"\u00bd", "T\u65e5", "-T", "\u00a0t"},
	}},
}

func TestPreTokenizerSplits(t *testing.T) {
	classOnce.Do(buildClassTable)
	for _, c := range splitCases {
		for k, want := range c.want {
			if got := splitWords(k, c.text); !slices.Equal(got, want) {
				t.Errorf("pre %d: %q\n want %q\n  got %q", k, c.text, want, got)
			}
		}
	}
}

// splitWords runs the steps of pre-tokenizer k over text.
func splitWords(k preKind, text string) []string {
	cps := appendCodePoints(nil, text)
	segs := []seg{{0, int32(len(cps))}}
	for _, step := range preSteps(k) {
		var next []seg
		for _, s := range segs {
			next = step(cps, s.a, s.b, next)
		}
		segs = next
	}
	var words []string
	for _, s := range segs {
		words = append(words, string(cps[s.a:s.b]))
	}
	return words
}

// gpt4oRegexp is llama.cpp's GPT-4o expression over the collapsed text, in Go's syntax, whose
// leftmost-first matching is the backtracking order of std::regex for these alternatives:
// non-ASCII white space collapsed to \v, letters to U+E000, numbers to U+E001 and every other
// non-ASCII code point to U+E002. Go has no lookahead: \s+(?!\S) is applied to the last
// alternative's match by hand (gpt4oReference).
var gpt4oRegexp = regexp.MustCompile(`^(?:` +
	`[^\r\n\x{E000}A-Za-z\x{E001}0-9]?[\x{E000}A-Z]*[\x{E000}a-z]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?` +
	`|[^\r\n\x{E000}A-Za-z\x{E001}0-9]?[\x{E000}A-Z]+[\x{E000}a-z]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?` +
	`|[\x{E001}0-9]{1,3}` +
	`| ?[^\t\n\v\f\r \x{E000}A-Za-z\x{E001}0-9]+[\r\n/]*` +
	`|[\t\n\v\f\r ]*[\r\n]+` +
	`|([\t\n\v\f\r ]+))`)

// gpt4oReference splits text with gpt4oRegexp.
func gpt4oReference(text string) []string {
	cps := []rune(text)
	col := make([]rune, len(cps))
	for i, r := range cps {
		switch {
		case r < 0x80:
			col[i] = r
		case isSpace(r):
			col[i] = '\v'
		case class(r) == clsLetter:
			col[i] = 0xE000
		case class(r) == clsNumber:
			col[i] = 0xE001
		default:
			col[i] = 0xE002
		}
	}
	var words []string
	for p := 0; p < len(col); {
		rest := string(col[p:])
		m := gpt4oRegexp.FindStringSubmatchIndex(rest)
		if m == nil {
			panic(fmt.Sprintf("no alternative matches %q", string(cps[p:])))
		}
		n := utf8.RuneCountInString(rest[:m[1]])
		if m[2] >= 0 && n > 1 && p+n < len(col) { // \s+(?!\S), before \s+
			n--
		}
		words = append(words, string(cps[p:p+n]))
		p += n
	}
	return words
}

// TestGPT4oMatchesRegexp: the GPT-4o pre-tokenizer cuts random text of letters of both cases
// (ASCII and not), contractions, numbers, marks, symbols, white space of every kind and slashes
// as the regular expression does.
func TestGPT4oMatchesRegexp(t *testing.T) {
	classOnce.Do(buildClassTable)
	alphabet := []string{"a", "z", "A", "Z", "T", "t", "s", "S", "'", "'s", "'LL", "'re", "é", "É", "Ж", "ж", "日", "ǅ",
		"0", "7", "½", "Ⅻ", "١", "\u0301", "😀", "-", "/", "!", ".", "$", "_", " ", "  ", "\t", "\n", "\r", "\r\n", "\v",
		"\f", "\u00a0", "\u3000", "\u2028", "\u200b"}
	r := rand.New(rand.NewPCG(4, 0))
	for i := range 20000 {
		var sb strings.Builder
		for range 1 + r.IntN(14) {
			sb.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		text := sb.String()
		if got, want := splitWords(preGPT4o, text), gpt4oReference(text); !slices.Equal(got, want) {
			t.Fatalf("case %d: %q\n want %q\n  got %q", i, text, want, got)
		}
	}
}
