package grammar

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"
)

// byteVocab is a vocabulary of the 256 single bytes, with token 256 ending generation.
func byteVocab(t testing.TB) *Vocab {
	t.Helper()
	pieces := make([][]byte, 257)
	for b := range 256 {
		pieces[b] = []byte{byte(b)}
	}
	v, err := NewVocab(pieces, []int32{256})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// accepts reports whether the automaton takes text as a complete sentence.
func accepts(a *Automaton, text string) bool {
	m := a.NewMatcher()
	return m.AcceptBytes([]byte(text)) == nil && m.Complete()
}

var gbnfCases = []struct {
	name, src      string
	accept, reject []string
}{
	{"literal", `root ::= "abc"`, []string{"abc"}, []string{"", "ab", "abcd", "abd"}},
	{"alternatives", `root ::= "a" | "bc" | "d" "e"`, []string{"a", "bc", "de"}, []string{"", "b", "ade"}},
	{"grouping", `root ::= "x" ("a" | "b") "y"`, []string{"xay", "xby"}, []string{"xy", "xaby"}},
	{"star", `root ::= "a"*`, []string{"", "a", "aaaa"}, []string{"b", "ab"}},
	{"plus", `root ::= "ab"+`, []string{"ab", "abab"}, []string{"", "a", "aba"}},
	{"optional", `root ::= "a" "b"? "c"`, []string{"ac", "abc"}, []string{"abbc", "a"}},
	{"exact", `root ::= [0-9]{3}`, []string{"123"}, []string{"12", "1234"}},
	{"at least", `root ::= [0-9]{2,}`, []string{"12", "12345"}, []string{"1"}},
	{"between", `root ::= [0-9]{1,3}`, []string{"1", "12", "123"}, []string{"", "1234"}},
	{"at most", `root ::= "x"{0,2} "."`, []string{".", "x.", "xx."}, []string{"xxx."}},
	{"spaced braces", `root ::= "a"{ 1 , 2 }`, []string{"a", "aa"}, []string{"aaa"}},
	{"class ranges", `root ::= [a-cx0-1]+`, []string{"abcx01"}, []string{"d", "2"}},
	{"negated class", `root ::= [^a-z\n]+`, []string{"ABC 12", "é"}, []string{"a", "A\n"}},
	{"any", `root ::= . .`, []string{"ab", "\n\x00", "日本"}, []string{"a", "abc"}},
	{"escapes", `root ::= "\x41\u00e9\U0001F600\n\t\r\\\"\[\]"`, []string{"Aé😀\n\t\r\\\"[]"}, []string{"A"}},
	{"class escapes", `root ::= [\]\[\\-]+`, []string{"][\\-"}, []string{"a"}},
	{"dash at end of class", `root ::= [a-]+`, []string{"a-a"}, []string{"b"}},
	{"utf-8 literal", `root ::= "日本語"`, []string{"日本語"}, []string{"日本"}},
	{"utf-8 range", `root ::= [ぁ-ゟ]+`, []string{"ひらがな"}, []string{"カ", "a"}},
	{"astral range", `root ::= [\U0001F600-\U0001F64F]`, []string{"😀", "🙏"}, []string{"🚀", "a"}},
	{"comments", "# c\nroot ::= a # trailing\n# between\na ::= \"x\" # end", []string{"x"}, []string{""}},
	{"newlines in groups", "root ::= (\n  \"a\"\n  | \"b\"\n)", []string{"a", "b"}, []string{"ab"}},
	{"newline after bar", "root ::= \"a\" |\n  \"b\"", []string{"a", "b"}, nil},
	{"crlf", "root ::= a\r\na ::= \"x\"\r\n", []string{"x"}, nil},
	{"empty alternative", `root ::= "a" ( | "b")`, []string{"a", "ab"}, []string{"b"}},
	{"leading bar", `root ::= | "a"`, []string{"", "a"}, nil},
	{"empty literal", `root ::= "" "a"`, []string{"a"}, nil},
	{"repeat of repeat", `root ::= "ab"*{2} "c"`, []string{"c", "ababc"}, []string{"b"}},
	{"nullable loop", `root ::= ("a"?)* "b"`, []string{"b", "aab"}, []string{"a"}},
	{"right recursion", `root ::= "(" root ")" | ""`, []string{"", "()", "((()))"}, []string{"(()", ")("}},
	{"mutual recursion", "root ::= a\na ::= \"[\" b? \"]\"\nb ::= a (\",\" a)*", []string{"[]", "[[],[[]]]"}, []string{"[", "[],[]"}},
	{"dashed names", "root ::= my-rule2\nmy-rule2 ::= \"ok\"", []string{"ok"}, nil},
	{"tail recursion", "root ::= x\nx ::= \"a\" x | \"b\"", []string{"b", "aaab"}, []string{"a"}},
	{"json-like", `root ::= "{" ws (pair ("," ws pair)*)? "}"
pair ::= str ws ":" ws val ws
str ::= "\"" [^"]* "\""
val ::= str | [0-9]+ | root
ws ::= [ ]?`, []string{`{}`, `{"a": 1}`, `{"a":{"b":"c"}, "d":2}`}, []string{`{"a"}`, `{a:1}`}},
}

func TestGBNF(t *testing.T) {
	v := byteVocab(t)
	for _, c := range gbnfCases {
		g, err := ParseGBNF(c.src)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		a, err := NewAutomaton(g, v, 0)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		for _, s := range c.accept {
			if !accepts(a, s) {
				t.Errorf("%s: %q rejected", c.name, s)
			}
			if !refAccepts(t, c.src, s) {
				t.Errorf("%s: the reference rejects %q", c.name, s)
			}
		}
		for _, s := range c.reject {
			if accepts(a, s) {
				t.Errorf("%s: %q accepted", c.name, s)
			}
			if refAccepts(t, c.src, s) {
				t.Errorf("%s: the reference accepts %q", c.name, s)
			}
		}
	}
}

// TestGBNFAgainstReference compares the automaton with refAccepts, a backtracking matcher
// over the parsed rules that shares nothing with the lowering or the automaton, on random
// strings over each grammar's alphabet.
func TestGBNFAgainstReference(t *testing.T) {
	v := byteVocab(t)
	r := rand.New(rand.NewPCG(5, 6))
	for _, c := range gbnfCases {
		g, err := ParseGBNF(c.src)
		if err != nil {
			t.Fatal(err)
		}
		a, _ := NewAutomaton(g, v, 0)
		var alphabet []rune
		for _, s := range append(append([]string{}, c.accept...), c.reject...) {
			alphabet = append(alphabet, []rune(s)...)
		}
		alphabet = append(alphabet, 'z', ' ')
		matched := 0
		for i := 0; i < 300; i++ {
			var b strings.Builder
			if len(c.accept) > 0 && i%3 == 0 { // mutate an accepted string
				b.WriteString(c.accept[r.IntN(len(c.accept))])
			}
			for n := r.IntN(6); n > 0; n-- {
				b.WriteRune(alphabet[r.IntN(len(alphabet))])
			}
			s := b.String()
			got, want := accepts(a, s), refAccepts(t, c.src, s)
			if got != want {
				t.Fatalf("%s: %q: automaton %v, reference %v", c.name, s, got, want)
			}
			if got {
				matched++
			}
		}
		if matched == 0 && c.name != "utf-8 literal" && c.name != "escapes" && c.name != "astral range" {
			t.Logf("%s: no random string matched", c.name)
		}
	}
}

// refAccepts matches text against the GBNF grammar src by backtracking over its parsed items:
// the set of positions each item can end at, from each start.
func refAccepts(t *testing.T, src, text string) bool {
	t.Helper()
	defs, err := parseGBNF(src)
	if err != nil {
		t.Fatal(err)
	}
	if !utf8.ValidString(text) {
		return false
	}
	s := []rune(text)
	index := map[string]int{}
	for i, d := range defs {
		index[d.name] = i
	}
	type key struct{ rule, pos int }
	memo := map[key][]int{}
	var ruleEnds func(r, pos int) []int
	var seqEnds func(items []item, pos int) []int
	union := func(a, b []int) []int {
		for _, x := range b {
			found := false
			for _, y := range a {
				found = found || x == y
			}
			if !found {
				a = append(a, x)
			}
		}
		return a
	}
	unitEnds := func(it item, pos int) []int {
		switch it.kind {
		case itLit:
			if pos+len(it.lit) <= len(s) && string(s[pos:pos+len(it.lit)]) == string(it.lit) {
				return []int{pos + len(it.lit)}
			}
		case itClass:
			if pos < len(s) {
				in := false
				for _, rg := range it.ranges {
					in = in || s[pos] >= rg.lo && s[pos] <= rg.hi
				}
				if in != it.neg {
					return []int{pos + 1}
				}
			}
		case itRef:
			return ruleEnds(index[it.name], pos)
		case itGroup:
			var out []int
			for _, alt := range it.alts {
				out = union(out, seqEnds(alt, pos))
			}
			return out
		}
		return nil
	}
	itemEnds := func(it item, pos int) []int {
		cur := []int{pos}
		for i := 0; i < it.min; i++ {
			var next []int
			for _, p := range cur {
				next = union(next, unitEnds(it, p))
			}
			cur = next
		}
		all := cur
		for i := it.min; it.max < 0 || i < it.max; i++ {
			var next []int
			for _, p := range cur {
				next = union(next, unitEnds(it, p))
			}
			before := len(all)
			all = union(all, next)
			if len(all) == before {
				break
			}
			cur = next
		}
		return all
	}
	seqEnds = func(items []item, pos int) []int {
		cur := []int{pos}
		for _, it := range items {
			var next []int
			for _, p := range cur {
				next = union(next, itemEnds(it, p))
			}
			cur = next
		}
		return cur
	}
	ruleEnds = func(r, pos int) []int {
		k := key{r, pos}
		if e, ok := memo[k]; ok {
			return e
		}
		memo[k] = nil // a re-entry at the same place (a nullable cycle) adds nothing
		var out []int
		for _, alt := range defs[r].alts {
			out = union(out, seqEnds(alt, pos))
		}
		memo[k] = out
		return out
	}
	for _, e := range ruleEnds(index["root"], 0) {
		if e == len(s) {
			return true
		}
	}
	return false
}

func TestGBNFErrors(t *testing.T) {
	cases := []struct{ src, want string }{
		{``, "1:1: empty grammar"},
		{`# only a comment`, "1:1: empty grammar"},
		{`a ::= "x"`, `grammar has no "root" rule`},
		{`root ::= b`, `1:10: rule "b" is not defined`},
		{"root ::= \"x\"\nroot ::= \"y\"", `2:1: rule "root" defined twice`},
		{`root = "x"`, "1:6: expected ::= after rule name"},
		{`root ::= "abc`, "1:10: unterminated string literal"},
		{`root ::= [abc`, "1:10: unterminated character class"},
		{`root ::= ("a"`, "1:14: expected ')'"},
		{`root ::= "a")`, "1:13: expected newline or end of grammar"},
		{`root ::= * "a"`, "1:10: repetition operator with nothing before it"},
		{`root ::= "a"{2,1}`, "1:16: repetition {2,1}: maximum below minimum"},
		{`root ::= "a"{x}`, "1:14: expected a number"},
		{`root ::= "a"{1;2}`, "1:15: expected ',' or '}'"},
		{`root ::= "a"{1,2`, "1:17: expected '}'"},
		{`root ::= "a"{100000}`, "1:14: repetition count exceeds 10000"},
		{`root ::= "\q"`, `1:11: unknown escape \q`},
		{`root ::= "\x4"`, "1:14: expected 2 hexadecimal digits"},
		{`root ::= "\xZZ"`, "1:13: expected 2 hexadecimal digits"},
		{`root ::= "\U00110000"`, "1:11: code point U+110000 beyond U+10FFFF"},
		{`root ::= "\uD800"`, "1:10: literal holds surrogate code point U+D800"},
		{`root ::= [z-a]`, "1:13: character range 'z'-'a' is reversed"},
		{`root ::= [^\x00-\U0010FFFF]`, "1:10: character class matches no character"},
		{"root ::= a\na ::= a \"x\"", `2:1: left recursion: rule "a"`},
		{"root ::= a \"x\" | \"y\"\na ::= \"\" | root", `left recursion`},
		{`root ::= "a" root`, `1:1: rule "root" matches no finite text`},
		{"root ::= \"x\"\n  \"y\"", "2:3: expected a rule name"},
		{"root ::= \"a\" |\nb ::= \"c\"", "2:3: expected newline or end of grammar"},
		{"root ::= \"a\" \x00", "1:14: unexpected NUL"},
		{"root ::= \"\xff\"", "1:11: invalid UTF-8"},
		{`root ::= "a"` + strings.Repeat("{10000}", 3), "lowers to more than"},
		{strings.Repeat("(", 300) + `root`, "1:1: expected a rule name"},
		{`root ::= ` + strings.Repeat("(", 300), "parentheses nested deeper than 256"},
	}
	for _, c := range cases {
		_, err := ParseGBNF(c.src)
		var se *SyntaxError
		if err == nil || !errors.As(err, &se) {
			t.Errorf("%q: error %v, want a *SyntaxError with %q", c.src, err, c.want)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %q, want %q", c.src, err, c.want)
		}
	}
}
