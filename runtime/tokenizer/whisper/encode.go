package whisper

// Byte classes of whisper.cpp's pre-tokenisation regex in the C locale.
const (
	clsOther = iota // [^\s[:alpha:][:digit:]]: punctuation, control bytes, every byte >= 0x80
	clsSpace        // \s: space, \t, \n, \v, \f, \r
	clsAlpha        // [:alpha:]: A-Z a-z
	clsDigit        // [:digit:]: 0-9
)

var byteClass = func() (c [256]uint8) {
	for _, b := range []byte(" \t\n\v\f\r") {
		c[b] = clsSpace
	}
	for b := 'A'; b <= 'Z'; b++ {
		c[b], c[b+'a'-'A'] = clsAlpha, clsAlpha
	}
	for b := '0'; b <= '9'; b++ {
		c[b] = clsDigit
	}
	return c
}()

// wordEnd returns the end of the word that starts at p < len(s): the match at p of
//
//	's|'t|'re|'ve|'m|'ll|'d| ?[[:alpha:]]+| ?[[:digit:]]+| ?[^\s[:alpha:][:digit:]]+|\s+(?!\S)|\s+
//
// with ECMAScript semantics (the first alternative that matches wins). Some alternative matches
// at every byte, so consecutive words cover the text.
func wordEnd(s string, p int) int {
	n := len(s)
	if s[p] == '\'' && p+1 < n {
		switch s[p+1] {
		case 's', 't', 'm', 'd':
			return p + 2
		case 'r', 'v':
			if p+2 < n && s[p+2] == 'e' {
				return p + 3
			}
		case 'l':
			if p+2 < n && s[p+2] == 'l' {
				return p + 3
			}
		}
	}
	start := p
	if s[p] == ' ' && p+1 < n && byteClass[s[p+1]] != clsSpace {
		start = p + 1 // the optional space of the three class-run alternatives
	}
	if c := byteClass[s[start]]; c != clsSpace {
		e := start + 1
		for e < n && byteClass[s[e]] == c {
			e++
		}
		return e
	}
	e := p + 1
	for e < n && byteClass[s[e]] == clsSpace {
		e++
	}
	if e < n && e-p > 1 {
		return e - 1 // \s+(?!\S) backs off one space so that the next word can take it
	}
	return e
}

// Encode returns the tokens of text as whisper.cpp's tokenize does. Bytes that begin no
// vocabulary token within their word are dropped. With whisper.cpp's vocabularies Encode never
// yields special tokens: "<|endoftext|>" or "[_SOT_]" in text split into several words, and no
// word spells a special token's piece.
func (t *Tokenizer) Encode(text string) []int32 {
	out, _ := t.encode(nil, text)
	return out
}

// AppendEncode appends the tokens of text to dst.
func (t *Tokenizer) AppendEncode(dst []int32, text string) []int32 {
	dst, _ = t.encode(dst, text)
	return dst
}

// encode appends the tokens of text to dst and counts the bytes it dropped.
func (t *Tokenizer) encode(dst []int32, text string) ([]int32, int) {
	dropped := 0
	for p := 0; p < len(text); {
		e := wordEnd(text, p)
		// Longest prefix of text[i:e] in the vocabulary, then continue after it.
		for i := p; i < e; {
			j := min(e, i+t.maxLen)
			for ; j > i; j-- {
				if id, ok := t.ids[text[i:j]]; ok {
					dst = append(dst, id)
					break
				}
			}
			if j == i {
				dropped++
				j++
			}
			i = j
		}
		p = e
	}
	return dst, dropped
}
