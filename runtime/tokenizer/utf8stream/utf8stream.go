// Package utf8stream joins a stream of byte pieces (token texts) into text without ever splitting
// a UTF-8 character: bytes that begin a character whose remaining bytes have not arrived yet are
// held back until they do. Bytes that cannot begin or continue a valid character are passed
// through at once, so the concatenation of everything returned, Flush included, is exactly the
// concatenation of the pieces.
package utf8stream

import "unicode/utf8"

// Joiner holds back at most three bytes of an incomplete character. The zero value is ready to
// use; a Joiner is not safe for concurrent use.
type Joiner struct {
	pend []byte // held-back start of a character, at most 3 bytes
	buf  []byte
}

// Append appends the text that piece p completes to dst.
func (j *Joiner) Append(dst, p []byte) []byte {
	if len(p) == 0 {
		return dst
	}
	if len(j.pend) > 0 {
		// Complete the held-back character with continuation bytes from p, or give it up.
		for len(p) > 0 && p[0]&0xC0 == 0x80 && !utf8.FullRune(j.pend) {
			j.pend = append(j.pend, p[0])
			p = p[1:]
		}
		if !utf8.FullRune(j.pend) && len(p) == 0 {
			return dst
		}
		dst = append(dst, j.pend...)
		j.pend = j.pend[:0]
	}
	cut := CompleteLen(p)
	dst = append(dst, p[:cut]...)
	j.pend = append(j.pend, p[cut:]...)
	return dst
}

// Flush returns the bytes still held back (the start of a character that never completed) and
// empties the Joiner. The slice is valid until the next call.
func (j *Joiner) Flush() []byte {
	j.buf = append(j.buf[:0], j.pend...)
	j.pend = j.pend[:0]
	return j.buf
}

// Reset drops any held-back bytes.
func (j *Joiner) Reset() { j.pend = j.pend[:0] }

// CompleteLen returns the length of p without a trailing incomplete UTF-8 sequence: the last
// non-continuation byte among the final three, if it opens a multi-byte character and the bytes
// after it are too few to complete it.
func CompleteLen(p []byte) int {
	for j := len(p) - 1; j >= 0 && j >= len(p)-3; j-- {
		if p[j]&0xC0 != 0x80 {
			if p[j] >= 0xC0 && !utf8.FullRune(p[j:]) {
				return j
			}
			break
		}
	}
	return len(p)
}
