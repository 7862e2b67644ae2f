package asr

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// Word is one word of a transcription with its time span in seconds.
type Word struct {
	Word  string  `json:"word"`
	Start float64 `json:"start"`
	End   float64 `json:"end"`
	seg   int     // index of the segment it came from
	pre   string  // the white space before the word in the transcript
}

// Rounded returns w with its times rounded to milliseconds (RoundTime), for output.
func (w Word) Rounded() Word {
	w.Start, w.End = RoundTime(w.Start), RoundTime(w.End)
	return w
}

// byCharacter lists the languages written without spaces between words, whose every character
// (every whole UTF-8 sequence of tokens) is a word: OpenAI's whisper splits them so
// (tokenizer.py, split_to_word_tokens).
var byCharacter = map[string]bool{"zh": true, "ja": true, "th": true, "lo": true, "my": true, "yue": true}

// OpenAI's punctuation merged into the word that follows or precedes it (timing.py,
// add_word_timestamps's defaults).
const (
	prepended = "\"'“¿([{-"
	appended  = "\"'.。,，!！?？:：”)]}、"
)

// Words splits segments into words. Only text tokens count (isSpecial false; isSpecial nil treats
// every token as text); a word spans its first token's T0 to its last token's T1, and never spans
// two segments. lang is the transcript's language code: in Chinese, Japanese, Thai, Lao, Burmese
// and Cantonese a word ends wherever the tokens so far make whole UTF-8 characters (a character
// or a lone punctuation mark is a word, the mark joined to its neighbour as OpenAI joins it); in
// the others a token starting with a space starts a new word, so punctuation stays with the word
// before it. Words carry no white space around them; tokens that are not whole UTF-8 characters
// are joined before the word is cut, so a word's text is valid where the tokens together are.
func Words(segs []Segment, isSpecial func(id int32) bool, lang string) []Word {
	var out []Word
	var toks []Token
	for si, s := range segs {
		toks = toks[:0]
		for _, t := range s.Tokens {
			if isSpecial == nil || !isSpecial(t.ID) {
				toks = append(toks, t)
			}
		}
		if byCharacter[lang] {
			out = characterWords(out, toks, si)
		} else {
			out = spaceWords(out, toks, si)
		}
	}
	return out
}

// unit is a run of tokens as a word or part of one: its text as the tokens spell it.
type unit struct {
	text       string
	start, end float64
}

func unitOf(ts []Token) unit {
	var b strings.Builder
	for _, t := range ts {
		b.WriteString(t.Text)
	}
	return unit{b.String(), ts[0].T0, ts[len(ts)-1].T1}
}

// spaceWords appends the words of segment si's text tokens, cut before each token that starts
// with a space.
func spaceWords(out []Word, toks []Token, si int) []Word {
	pre := ""
	for i := 0; i < len(toks); {
		j := i + 1
		for j < len(toks) && !strings.HasPrefix(toks[j].Text, " ") {
			j++
		}
		out, pre = appendWord(out, unitOf(toks[i:j]), si, pre)
		i = j
	}
	return out
}

// characterWords appends the words of segment si's text tokens, cut wherever the tokens so far
// make whole characters (tokenizer.py's split_tokens_on_unicode: where they decode without a
// replacement character that the whole text does not have there too), with punctuation merged
// as timing.py's merge_punctuations merges it.
func characterWords(out []Word, toks []Token, si int) []Word {
	var full []byte
	for _, t := range toks {
		full = append(full, t.Text...)
	}
	var units []unit
	first, off, n := 0, 0, 0 // the unit's first token, its offset in full, its bytes so far
	for i, t := range toks {
		n += len(t.Text)
		if wholeChars(full[off:off+n], full[off:]) {
			units = append(units, unitOf(toks[first:i+1]))
			first, off, n = i+1, off+n, 0
		}
	}
	// A mark of prepended punctuation after a space goes with the unit after it; a mark of
	// appended punctuation with the unit before it, unless that ends in a space.
	for i := len(units) - 2; i >= 0; i-- {
		if u := units[i]; strings.HasPrefix(u.text, " ") && onlyOf(strings.TrimSpace(u.text), prepended) {
			units[i+1].text, units[i+1].start = u.text+units[i+1].text, u.start
			units[i].text = ""
		}
	}
	for i, j := 0, 1; j < len(units); j++ {
		if units[i].text != "" && !strings.HasSuffix(units[i].text, " ") && onlyOf(units[j].text, appended) {
			units[i].text, units[i].end = units[i].text+units[j].text, units[j].end
			units[j].text = ""
		} else if units[j].text != "" {
			i = j
		}
	}
	pre := ""
	for _, u := range units {
		out, pre = appendWord(out, u, si, pre)
	}
	return out
}

// wholeChars reports whether cur, a prefix of rest, holds whole characters: every invalid UTF-8
// sequence in it is invalid in rest too (not a character that rest completes).
func wholeChars(cur, rest []byte) bool {
	for i := 0; i < len(cur); {
		r, size := utf8.DecodeRune(cur[i:])
		if r == utf8.RuneError && size == 1 {
			if r2, size2 := utf8.DecodeRune(rest[i:]); r2 != utf8.RuneError || size2 != 1 {
				return false
			}
		}
		i += size
	}
	return true
}

// onlyOf reports whether s is not empty and all its characters are in set.
func onlyOf(s, set string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !strings.ContainsRune(set, r) {
			return false
		}
	}
	return true
}

// appendWord appends u as a word of segment si, trimmed of white space; pre is white space before
// it (from units of nothing else). It returns the white space that comes after the word, for the
// next one.
func appendWord(out []Word, u unit, si int, pre string) ([]Word, string) {
	text := strings.TrimSpace(u.text)
	if text == "" {
		return out, pre + u.text
	}
	lead := u.text[:len(u.text)-len(strings.TrimLeftFunc(u.text, unicode.IsSpace))]
	out = append(out, Word{Word: text, Start: u.start, End: u.end, seg: si, pre: pre + lead})
	return out, u.text[len(lead)+len(text):]
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

// joinWords is the words' text as the transcript spells it, with the white space between them
// that it has (none inside a word cut by a segment's end, or between Chinese characters) and none
// around them.
func joinWords(ws []Word) string {
	return strings.TrimSpace(spell(ws))
}

// spell is the words' text with the white space before each.
func spell(ws []Word) string {
	var b strings.Builder
	for _, w := range ws {
		b.WriteString(w.pre)
		b.WriteString(w.Word)
	}
	return b.String()
}
