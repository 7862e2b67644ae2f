package grammar

import (
	"slices"
	"unicode/utf8"
)

const (
	surrogateLo = 0xD800
	surrogateHi = 0xDFFF
)

// byteRange is an inclusive range of byte values.
type byteRange struct{ lo, hi byte }

// normalizeRanges sorts and merges ranges, negates them over the code points when neg, and
// removes the surrogates (which UTF-8 cannot encode).
func normalizeRanges(in []runeRange, neg bool) []runeRange {
	rs := slices.Clone(in)
	slices.SortFunc(rs, func(a, b runeRange) int { return int(a.lo) - int(b.lo) })
	var out []runeRange
	for _, r := range rs {
		if n := len(out); n > 0 && r.lo <= out[n-1].hi+1 {
			out[n-1].hi = max(out[n-1].hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	if neg {
		var comp []runeRange
		next := rune(0)
		for _, r := range out {
			if r.lo > next {
				comp = append(comp, runeRange{next, r.lo - 1})
			}
			next = r.hi + 1
		}
		if next <= utf8.MaxRune {
			comp = append(comp, runeRange{next, utf8.MaxRune})
		}
		out = comp
	}
	var clean []runeRange
	for _, r := range out {
		if r.lo <= surrogateHi && r.hi >= surrogateLo {
			if r.lo < surrogateLo {
				clean = append(clean, runeRange{r.lo, surrogateLo - 1})
			}
			if r.hi > surrogateHi {
				clean = append(clean, runeRange{surrogateHi + 1, r.hi})
			}
			continue
		}
		clean = append(clean, r)
	}
	return clean
}

// utf8Sequences appends to dst the byte-range sequences whose concatenations are exactly the
// UTF-8 encodings of the code points in [lo, hi] (no surrogates inside): the range is split
// where the encoded length changes and where a continuation byte would not span its full
// 0x80-0xBF range, after which each byte position is a plain range (the method of Russ Cox's
// RE2 and Rust's utf8-ranges).
func utf8Sequences(dst [][]byteRange, lo, hi rune) [][]byteRange {
	if lo > hi {
		return dst
	}
	for _, m := range [...]rune{0x7F, 0x7FF, 0xFFFF} {
		if lo <= m && hi > m {
			dst = utf8Sequences(dst, lo, m)
			return utf8Sequences(dst, m+1, hi)
		}
	}
	if hi < 0x80 {
		return append(dst, []byteRange{{byte(lo), byte(hi)}})
	}
	n := utf8.RuneLen(lo)
	for i := 1; i < n; i++ {
		m := rune(1)<<(6*i) - 1
		if lo&^m != hi&^m {
			if lo&m != 0 {
				dst = utf8Sequences(dst, lo, lo|m)
				return utf8Sequences(dst, (lo|m)+1, hi)
			}
			if hi&m != m {
				dst = utf8Sequences(dst, lo, (hi&^m)-1)
				return utf8Sequences(dst, hi&^m, hi)
			}
		}
	}
	var a, b [4]byte
	utf8.EncodeRune(a[:], lo)
	utf8.EncodeRune(b[:], hi)
	seq := make([]byteRange, n)
	for i := range seq {
		seq[i] = byteRange{a[i], b[i]}
	}
	return append(dst, seq)
}
