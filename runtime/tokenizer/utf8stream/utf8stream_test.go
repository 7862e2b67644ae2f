package utf8stream

import (
	"math/rand/v2"
	"testing"
	"unicode/utf8"
)

// TestJoinerNeverSplitsCharacters cuts seeded random text (valid UTF-8, or mixed with stray
// bytes) into random pieces: every chunk of a valid text must be valid itself, and all chunks
// plus Flush must equal the input.
func TestJoinerNeverSplitsCharacters(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", " ", "é", "€", "𝄞", "日本", "\xe2", "\x80", "\xff"}
	for trial := 0; trial < 500; trial++ {
		var text []byte
		n := len(alphabet)
		if trial%2 == 0 {
			n -= 3 // valid text only
		}
		for range r.IntN(40) {
			text = append(text, alphabet[r.IntN(n)]...)
		}
		var j Joiner
		var out []byte
		for rest := text; len(rest) > 0; {
			n := 1 + r.IntN(min(4, len(rest)))
			chunk := j.Append(nil, rest[:n])
			rest = rest[n:]
			if utf8.Valid(text) && !utf8.Valid(chunk) {
				t.Fatalf("chunk %q of valid text %q splits a character", chunk, text)
			}
			out = append(out, chunk...)
		}
		out = append(out, j.Flush()...)
		if string(out) != string(text) {
			t.Fatalf("joined %q, want %q", out, text)
		}
	}
}
