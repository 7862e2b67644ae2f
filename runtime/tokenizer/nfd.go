package tokenizer

import (
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// nfdFirst is llama.cpp's unicode_cpts_normalize_nfd for one code point: the first code point of
// its canonical decomposition (so "é" becomes a bare "e").
func nfdFirst(r rune) rune {
	if r < 0xC0 || !utf8.ValidRune(r) {
		return r
	}
	var src [utf8.UTFMax]byte
	var dst [4 * utf8.UTFMax]byte
	s := utf8.AppendRune(src[:0], r)
	if norm.NFD.IsNormal(s) {
		return r
	}
	d := norm.NFD.Append(dst[:0], s...)
	first, _ := utf8.DecodeRune(d)
	return first
}
