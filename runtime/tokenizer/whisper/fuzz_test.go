package whisper

import (
	"github.com/parleyhq/parley/internal/sharedtest"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/parleyhq/parley/runtime/ggml"
)

// oracleRE is whisper.cpp's pre-tokenisation regex for Go's regexp, which has no lookahead: the
// alternative \s+(?!\S) is applied by oracleSplit after the match. Classes are spelled out in
// ASCII as the C locale defines them (Go's \s lacks \v).
var oracleRE = regexp.MustCompile(`^(?:'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\t\n\v\f\r A-Za-z0-9]+|[\t\n\v\f\r ]+)`)

// oracleSplit splits s with oracleRE. A whitespace run followed by a non-space gives up its last
// byte when it has more than one, which is what \s+(?!\S) matches before \s+ is tried.
func oracleSplit(s string) []string {
	var w []string
	for len(s) > 0 {
		loc := oracleRE.FindStringIndex(s)
		if loc == nil {
			return append(w, "<no match at "+s+">")
		}
		m := s[:loc[1]]
		if strings.Trim(m, "\t\n\v\f\r ") == "" && len(m) > 1 && len(m) < len(s) {
			m = m[:len(m)-1]
		}
		w = append(w, m)
		s = s[len(m):]
	}
	return w
}

// randomText returns text drawn from pieces that exercise every branch of the split.
func randomText(rng *rand.Rand, n int) string {
	alphabet := []string{"'", "s", "t", "r", "e", "v", "l", "m", "d", "S", " ", " ", " ", "\t", "\n", "\v", "\f",
		"\r", "a", "Z", "0", "9", ".", "!", "\x00", "\x7f", "\xc3", "\xa9", "\xff", "日", "é", "🙂", "_", "-", "\u00a0"}
	var b strings.Builder
	for i := 0; i < n; i++ {
		b.WriteString(alphabet[rng.IntN(len(alphabet))])
	}
	return b.String()
}

func TestSplitOracle(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for i := 0; i < 20000; i++ {
		s := randomText(rng, rng.IntN(20))
		if got, want := splitWords(s), oracleSplit(s); !reflect.DeepEqual(got, want) && !(len(got) == 0 && len(want) == 0) {
			t.Fatalf("split %q = %q, oracle %q", s, got, want)
		}
	}
}

// fuzzTokenizer returns the tiny model's tokenizer when the shared directory is there, and a
// tokenizer over vocab256 otherwise, so that the target runs either way.
func fuzzTokenizer(tb testing.TB) *Tokenizer {
	if dir := sharedtest.Lookup(); dir != "" {
		if f, err := ggml.Open(filepath.Join(dir, "models", "asr", "for-tests-ggml-tiny.bin")); err == nil {
			defer f.Close()
			tk, err := New(f.Vocab, f.HParams.NVocab)
			if err != nil {
				tb.Fatal(err)
			}
			return tk
		}
	}
	tk, err := New(vocab256(), NVocabMultilingual)
	if err != nil {
		tb.Fatal(err)
	}
	return tk
}

// FuzzEncode checks that Encode never panics, that the words cover the text and agree with the
// regexp oracle, that Encode yields only text tokens, and that Decode(Encode(s)) == s whenever
// no byte was dropped, which must be the case for valid UTF-8 whose every byte is a token.
func FuzzEncode(f *testing.F) {
	tk := fuzzTokenizer(f)
	for _, s := range []string{"", " And so, my fellow Americans", "I'm she's we'll 're 'S", "a   b\t\n\n c  ",
		"naïve café 日本語 🙂", "\x00\xff's\xc3", "123.45 -- !!!", "<|endoftext|>[_SOT_]"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		words := splitWords(s)
		if strings.Join(words, "") != s {
			t.Fatalf("words %q do not cover %q", words, s)
		}
		if want := oracleSplit(s); len(s) > 0 && !reflect.DeepEqual(words, want) {
			t.Fatalf("split %q = %q, oracle %q", s, words, want)
		}
		ids, dropped := tk.encode(nil, s)
		for _, id := range ids {
			if tk.IsSpecial(id) {
				t.Fatalf("Encode(%q) yields special token %d", s, id)
			}
		}
		allBytes := true
		for i := 0; i < len(s); i++ {
			if _, ok := tk.ids[s[i:i+1]]; !ok {
				allBytes = false
			}
		}
		if utf8.ValidString(s) && allBytes && dropped != 0 {
			t.Fatalf("Encode(%q) dropped %d bytes although every byte is a token", s, dropped)
		}
		if got := tk.Decode(ids); dropped == 0 && got != s {
			t.Fatalf("Decode(Encode(%q)) = %q", s, got)
		}
	})
}

const benchText = " And so my fellow Americans, ask not what your country can do for you, ask what you can do for your country. " +
	"The invention of movable metal letters in the middle of the fifteenth century may justly be considered as the invention of the art of printing. " +
	"Ça va? Très bien, merci! 日本語のテキストです。 I'm sure they'll've done it by 10:45.\n\n"

// BenchmarkEncode measures encoding mixed English, French and Japanese text with the tiny model's
// vocabulary.
func BenchmarkEncode(b *testing.B) {
	tk := fuzzTokenizer(b)
	text := strings.Repeat(benchText, 20)
	ids := tk.Encode(text)
	b.ReportAllocs()
	b.ResetTimer()
	b.SetBytes(int64(len(text)))
	var out []int32
	for i := 0; i < b.N; i++ {
		out = tk.AppendEncode(out[:0], text)
	}
	b.ReportMetric(float64(b.N)*float64(len(ids))/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkDecoder measures streaming detokenisation, one token at a time.
func BenchmarkDecoder(b *testing.B) {
	tk := fuzzTokenizer(b)
	ids := tk.Encode(strings.Repeat(benchText, 20))
	d := tk.NewDecoder()
	b.ReportAllocs()
	b.ResetTimer()
	var out []byte
	for i := 0; i < b.N; i++ {
		out = out[:0]
		for _, id := range ids {
			out = d.Append(out, id)
		}
		out = append(out, d.Flush()...)
	}
	b.ReportMetric(float64(b.N)*float64(len(ids))/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkNew measures building the tokenizer from the tiny model's 50257 stored tokens.
func BenchmarkNew(b *testing.B) {
	dir := sharedtest.Lookup()
	f, err := ggml.Open(filepath.Join(dir, "models", "asr", "for-tests-ggml-tiny.bin"))
	if dir == "" || err != nil {
		b.Skip("shared for-tests-ggml-tiny.bin is absent")
	}
	defer f.Close()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := New(f.Vocab, f.HParams.NVocab); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tokenizers/s")
}
