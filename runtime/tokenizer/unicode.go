package tokenizer

import (
	"sync"
	"unicode"
	"unicode/utf8"
)

// Code point classes, as llama.cpp's unicode_cpt_flags sees them: one general category per code
// point (Cn is "undefined", Cc/Cf/Co/Cs are "control") plus a White_Space bit. The tables come
// from Go's unicode package (Unicode 15.0.0 in Go 1.26). llama.cpp's tables at commit c392e509
// (src/unicode-data.cpp) are Unicode 15.1: the 627 code points 15.1 added (CJK Extension I
// U+2EBF0..U+2EE5D, letters; U+2FFC..U+2FFF and U+31EF, symbols) are unassigned here. No
// tokenizer here treats a letter or a symbol above U+007F differently from an unassigned code
// point except the byte-level BPE pre-tokenizers, which split at letters. Simple lower-case
// mappings, White_Space and first code points of NFD agree for every code point. A Go release on
// a later Unicode edition assigns more code points that llama.cpp leaves undefined; among them,
// new punctuation would split WordPiece words where llama.cpp does not.
const (
	clsNone      uint8 = 0 // position outside the segment being split
	clsUndefined uint8 = 1
	clsNumber    uint8 = 2
	clsLetter    uint8 = 3
	clsSeparator uint8 = 4
	clsMark      uint8 = 5
	clsPunct     uint8 = 6
	clsSymbol    uint8 = 7
	clsControl   uint8 = 8
	clsCatMask   uint8 = 0x0F
	clsSpace     uint8 = 0x10
)

const maxCodePoint = 0x110000

var (
	classOnce  sync.Once
	classTable []uint8 // [maxCodePoint] category | clsSpace
)

func buildClassTable() {
	t := make([]uint8, maxCodePoint)
	for i := range t {
		t[i] = clsUndefined
	}
	fill := func(rt *unicode.RangeTable, c uint8) {
		for _, r := range rt.R16 {
			for x := uint32(r.Lo); x <= uint32(r.Hi); x += uint32(r.Stride) {
				t[x] = c
			}
		}
		for _, r := range rt.R32 {
			for x := r.Lo; x <= r.Hi; x += r.Stride {
				t[x] = c
			}
		}
	}
	// Category by category: since Go 1.25, unicode.C also holds Cn (unassigned), which llama.cpp
	// keeps apart as "undefined".
	for _, rt := range []*unicode.RangeTable{unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs} {
		fill(rt, clsControl)
	}
	fill(unicode.Z, clsSeparator)
	fill(unicode.S, clsSymbol)
	fill(unicode.P, clsPunct)
	fill(unicode.M, clsMark)
	fill(unicode.N, clsNumber)
	fill(unicode.L, clsLetter)
	for _, r := range unicode.White_Space.R16 {
		for x := uint32(r.Lo); x <= uint32(r.Hi); x += uint32(r.Stride) {
			t[x] |= clsSpace
		}
	}
	for _, r := range unicode.White_Space.R32 {
		for x := r.Lo; x <= r.Hi; x += r.Stride {
			t[x] |= clsSpace
		}
	}
	classTable = t
}

// class returns the class byte of r (never clsNone).
func class(r rune) uint8 {
	if uint32(r) >= maxCodePoint {
		return clsUndefined
	}
	return classTable[r]
}

func isSpace(r rune) bool  { return class(r)&clsSpace != 0 }
func isLetter(r rune) bool { return class(r)&clsCatMask == clsLetter }
func isNumber(r rune) bool { return class(r)&clsCatMask == clsNumber }

// decodeRune decodes one code point the way llama.cpp's unicode_cpt_from_utf8 does: overlong forms
// and surrogates are accepted, a malformed sequence yields U+FFFD and consumes one byte. Values
// above U+10FFFF, which llama.cpp cannot re-encode, are treated as malformed too.
func decodeRune(s string, i int) (rune, int) {
	b0 := s[i]
	switch {
	case b0 < 0x80:
		return rune(b0), 1
	case b0&0x40 == 0:
		return utf8.RuneError, 1
	case b0&0x20 == 0:
		if i+1 >= len(s) || s[i+1]&0xC0 != 0x80 {
			return utf8.RuneError, 1
		}
		return rune(b0&0x1F)<<6 | rune(s[i+1]&0x3F), 2
	case b0&0x10 == 0:
		if i+2 >= len(s) || s[i+1]&0xC0 != 0x80 || s[i+2]&0xC0 != 0x80 {
			return utf8.RuneError, 1
		}
		return rune(b0&0x0F)<<12 | rune(s[i+1]&0x3F)<<6 | rune(s[i+2]&0x3F), 3
	case b0&0x08 == 0:
		if i+3 >= len(s) || s[i+1]&0xC0 != 0x80 || s[i+2]&0xC0 != 0x80 || s[i+3]&0xC0 != 0x80 {
			return utf8.RuneError, 1
		}
		r := rune(b0&0x07)<<18 | rune(s[i+1]&0x3F)<<12 | rune(s[i+2]&0x3F)<<6 | rune(s[i+3]&0x3F)
		if r >= maxCodePoint {
			return utf8.RuneError, 1
		}
		return r, 4
	}
	return utf8.RuneError, 1
}

// appendCodePoints appends the code points of s, decoded as decodeRune does.
func appendCodePoints(dst []rune, s string) []rune {
	for i := 0; i < len(s); {
		r, n := decodeRune(s, i)
		dst = append(dst, r)
		i += n
	}
	return dst
}

// appendRune appends the UTF-8 encoding of r without Go's surrogate check: llama.cpp encodes
// surrogate code points as three bytes, and so must we to give back what decodeRune read.
func appendRune(dst []byte, r rune) []byte {
	switch {
	case r < 0x80:
		return append(dst, byte(r))
	case r < 0x800:
		return append(dst, 0xC0|byte(r>>6), 0x80|byte(r)&0x3F)
	case r < 0x10000:
		return append(dst, 0xE0|byte(r>>12), 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F)
	}
	return append(dst, 0xF0|byte(r>>18), 0x80|byte(r>>12)&0x3F, 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F)
}

// utf8Len is llama.cpp's unicode_len_utf8: the sequence length announced by the first byte of a
// character, from its high nibble only (continuation bytes count as 1).
func utf8Len(b byte) int {
	switch b >> 4 {
	case 0xC, 0xD:
		return 2
	case 0xE:
		return 3
	case 0xF:
		return 4
	}
	return 1
}

// GPT-2 byte-level alphabet: every byte is shown as a printable code point. Bytes that are
// printable Latin-1 stand for themselves; the rest map, in order, to U+0100 and up.
var (
	byteToRune [256]rune
	runeToByte [0x144]int16 // -1 where the code point is not in the alphabet
)

func init() {
	for i := range runeToByte {
		runeToByte[i] = -1
	}
	n := rune(0)
	for b := 0; b < 256; b++ {
		if (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = 256 + n
			n++
		}
		runeToByte[byteToRune[b]] = int16(b)
	}
}

// cSpace is the C locale's isspace.
func cSpace(b byte) bool {
	return b == ' ' || (b >= '\t' && b <= '\r')
}

// lowerRune is the first code point of r's lower-case mapping.
func lowerRune(r rune) rune { return unicode.ToLower(r) }

// ByteLevel returns b written in GPT-2's byte-level alphabet, the form in which byte-level BPE
// vocabularies (tokenizer.json, GGUF's tokenizer.ggml.tokens) store their tokens.
func ByteLevel(b []byte) string {
	s := make([]byte, 0, 2*len(b))
	for _, c := range b {
		s = utf8.AppendRune(s, byteToRune[c])
	}
	return string(s)
}

// FromByteLevel returns the bytes a token written in GPT-2's byte-level alphabet stands for, and
// false if s is not valid UTF-8 or holds a code point outside the alphabet.
func FromByteLevel(s string) ([]byte, bool) {
	b := make([]byte, 0, len(s))
	for _, r := range s {
		if r < 0 || int(r) >= len(runeToByte) || runeToByte[r] < 0 {
			return nil, false
		}
		b = append(b, byte(runeToByte[r]))
	}
	return b, true
}
