package speech

import (
	"strings"
	"unicode"

	"github.com/parleyhq/parley/runtime/models/whisper"
)

// Word is one word of a transcription with its time span in seconds.
type Word struct {
	Word  string  `json:"word"`
	Start float64 `json:"start"`
	End   float64 `json:"end"`
	seg   int     // index of the segment it came from
}

// Words splits segments into words: text tokens (isSpecial false) are joined, a token starting
// with a space starts a new word, and a word spans its first token's T0 to its last token's T1.
// isSpecial nil treats every token as text. Words carry no leading space; tokens that are not
// whole UTF-8 characters are joined before the word is cut, so a word's text is valid where the
// tokens together are.
func Words(segs []whisper.Segment, isSpecial func(id int32) bool) []Word {
	var out []Word
	for si, s := range segs {
		var cur strings.Builder
		var w Word
		flush := func() {
			text := strings.TrimSpace(cur.String())
			cur.Reset()
			if text != "" {
				w.Word = text
				out = append(out, w)
			}
		}
		started := false
		for _, t := range s.Tokens {
			if isSpecial != nil && isSpecial(t.ID) {
				continue
			}
			if started && strings.HasPrefix(t.Text, " ") {
				flush()
				started = false
			}
			if !started {
				w = Word{Start: t.T0, seg: si}
				started = true
			}
			cur.WriteString(t.Text)
			w.End = t.T1
		}
		if started {
			flush()
		}
	}
	return out
}

// normWord is the form two hypotheses' words are compared in: lower case without punctuation.
func normWord(w string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsPunct(r) || unicode.IsSpace(r) {
			return -1
		}
		return unicode.ToLower(r)
	}, w)
}

// commonPrefix is how many leading words a and b share.
func commonPrefix(a, b []Word) int {
	n := 0
	for n < len(a) && n < len(b) && normWord(a[n].Word) == normWord(b[n].Word) {
		n++
	}
	return n
}

// joinWords is the words' text separated by single spaces.
func joinWords(ws []Word) string {
	var b strings.Builder
	for i, w := range ws {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(w.Word)
	}
	return b.String()
}
