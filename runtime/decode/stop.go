package decode

import (
	"bytes"
	"fmt"
	"unicode/utf8"
)

// StopReason says why generation ended.
type StopReason string

// Stop reasons, spelled as OpenAI-style finish reasons except StopEOS.
const (
	NotStopped StopReason = ""       // generation continues
	StopEOS    StopReason = "eos"    // an end-of-generation token was produced
	StopString StopReason = "stop"   // a stop string appeared in the text
	StopLength StopReason = "length" // the token limit was reached
	// StopCancelled: the caller ended generation (a cancelled request or context).
	StopCancelled StopReason = "cancelled"
)

// Limits on stop strings, which bound the work done per token (about the square of the
// longest stop string's length, times their number).
const (
	MaxStopStrings = 64
	MaxStopBytes   = 1024
)

// StopConfig describes when a Stopper ends generation.
type StopConfig struct {
	// VocabSize bounds the token ids; ids outside [0, VocabSize) are never end-of-generation.
	VocabSize int
	// EOG lists end-of-generation token ids. IsEOG, if not nil, marks more: it is called once
	// for every id in [0, VocabSize) by NewStopper and never afterwards.
	EOG   []int32
	IsEOG func(int32) bool
	// Stop lists stop strings (bytes, compared exactly): at most MaxStopStrings of 1 to
	// MaxStopBytes bytes each.
	Stop []string
	// MaxTokens ends generation after this many tokens; 0 or less means no limit.
	MaxTokens int
}

// Stopper watches a stream of generated tokens and their text, releasing text as soon as it
// can no longer turn out to be part of a stop string, and reporting when generation must end.
// Text is handled as bytes: a stop string spanning several tokens, or splitting a multi-byte
// UTF-8 character between tokens, is found all the same, and text released before the end of
// generation never ends inside an incomplete UTF-8 sequence.
//
// Steps allocate nothing once the internal buffer has grown to the longest token text plus
// the longest stop string.
type Stopper struct {
	eog       []uint64 // bitset over [0, vocab)
	vocab     int
	stops     [][]byte
	maxStop   int
	maxTokens int

	n      int
	buf    []byte // held-back text starts at buf[start]
	start  int
	done   bool
	reason StopReason
}

// NewStopper checks c and builds a Stopper.
func NewStopper(c StopConfig) (*Stopper, error) {
	if c.VocabSize < 1 || c.VocabSize > MaxVocab {
		return nil, fmt.Errorf("decode: stopper vocabulary size %d outside [1, %d]", c.VocabSize, MaxVocab)
	}
	s := &Stopper{
		eog:       make([]uint64, (c.VocabSize+63)/64),
		vocab:     c.VocabSize,
		maxTokens: c.MaxTokens,
	}
	for _, id := range c.EOG {
		if id < 0 || int(id) >= c.VocabSize {
			return nil, fmt.Errorf("decode: end-of-generation token %d outside vocabulary [0, %d)", id, c.VocabSize)
		}
		s.eog[id/64] |= 1 << (id % 64)
	}
	if c.IsEOG != nil {
		for id := int32(0); int(id) < c.VocabSize; id++ {
			if c.IsEOG(id) {
				s.eog[id/64] |= 1 << (id % 64)
			}
		}
	}
	if len(c.Stop) > MaxStopStrings {
		return nil, fmt.Errorf("decode: %d stop strings, at most %d allowed", len(c.Stop), MaxStopStrings)
	}
	for i, st := range c.Stop {
		if st == "" || len(st) > MaxStopBytes {
			return nil, fmt.Errorf("decode: stop string %d is %d bytes long (must be 1 to %d)", i, len(st), MaxStopBytes)
		}
		s.stops = append(s.stops, []byte(st))
		s.maxStop = max(s.maxStop, len(st))
	}
	s.buf = make([]byte, 0, 256+s.maxStop)
	return s, nil
}

// IsEOG reports whether id ends generation.
func (s *Stopper) IsEOG(id int32) bool {
	return id >= 0 && int(id) < s.vocab && s.eog[id/64]&(1<<(id%64)) != 0
}

// Push takes the next generated token and its text. It returns the text that may be shown
// now and, once generation must end, the reason (NotStopped until then).
//
// Generation stops at the first token after which the text contains a stop string. On
// StopString the released text ends just before that stop string (the earliest-starting one
// if this token completed several), and nothing after it is ever released. On StopEOS the
// token's own text is dropped and all held-back text released; on StopLength all text,
// including this token's, is released. Once stopped (or after Finish), Push returns nil and
// Reason(). The returned slice is only valid until the next call on s.
func (s *Stopper) Push(id int32, text string) ([]byte, StopReason) { return push(s, id, text) }

// PushBytes is Push for text held as bytes.
func (s *Stopper) PushBytes(id int32, text []byte) ([]byte, StopReason) { return push(s, id, text) }

func push[T string | []byte](s *Stopper, id int32, text T) ([]byte, StopReason) {
	if s.done {
		return nil, s.reason
	}
	s.compact()
	s.n++
	if s.IsEOG(id) {
		return s.finish(StopEOS)
	}
	s.buf = append(s.buf, text...)
	return s.scan()
}

// Finish releases all held-back text, for generation ended by the caller (context full,
// request cancelled). Afterwards Push returns nil. The slice is valid until the next call.
func (s *Stopper) Finish() []byte {
	if s.done {
		return nil
	}
	out, _ := s.finish(NotStopped)
	return out
}

// Reason returns why generation stopped, or NotStopped.
func (s *Stopper) Reason() StopReason { return s.reason }

// Tokens returns how many tokens have been pushed since the last Reset.
func (s *Stopper) Tokens() int { return s.n }

// Reset prepares s for a new generation with the same configuration.
func (s *Stopper) Reset() {
	s.n = 0
	s.buf = s.buf[:0]
	s.start = 0
	s.done = false
	s.reason = NotStopped
}

// compact drops text already released.
func (s *Stopper) compact() {
	if s.start > 0 {
		s.buf = s.buf[:copy(s.buf, s.buf[s.start:])]
		s.start = 0
	}
}

func (s *Stopper) finish(r StopReason) ([]byte, StopReason) {
	s.compact()
	out := s.buf
	s.start = len(s.buf)
	s.done = true
	s.reason = r
	return out, r
}

func (s *Stopper) scan() ([]byte, StopReason) {
	// Held-back text is a proper prefix of some stop string (plus at most an incomplete UTF-8
	// sequence), so any stop string ending in this token starts inside buf.
	at := -1
	for _, st := range s.stops {
		if i := bytes.Index(s.buf, st); i >= 0 && (at < 0 || i < at) {
			at = i
		}
	}
	if at >= 0 {
		s.buf = s.buf[:at]
		return s.finish(StopString)
	}
	if s.maxTokens > 0 && s.n >= s.maxTokens {
		return s.finish(StopLength)
	}
	k := len(s.buf) - s.heldPrefix()
	k = completeUTF8(s.buf, k)
	s.start = k
	return s.buf[:k], NotStopped
}

// heldPrefix returns the length of the longest suffix of buf that is a proper prefix of a stop
// string.
func (s *Stopper) heldPrefix() int {
	for l := min(s.maxStop-1, len(s.buf)); l > 0; l-- {
		tail := s.buf[len(s.buf)-l:]
		for _, st := range s.stops {
			if len(st) > l && bytes.Equal(tail, st[:l]) {
				return l
			}
		}
	}
	return 0
}

// completeUTF8 shortens b[:k] so that it does not end inside a UTF-8 sequence that later
// bytes could complete. Invalid bytes are left in place.
func completeUTF8(b []byte, k int) int {
	for j := k - 1; j >= 0 && j >= k-utf8.UTFMax+1; j-- {
		if utf8.RuneStart(b[j]) {
			if !utf8.FullRune(b[j:k]) {
				return j
			}
			return k
		}
	}
	return k
}
