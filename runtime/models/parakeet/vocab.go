package parakeet

import "strings"

// spmSpace is SentencePiece's word-boundary mark, U+2581 "▁".
const spmSpace = "\u2581"

// punctuation are the characters whose lone piece gets no time of its own (is_punctuation_token,
// parakeet.cpp:2425).
const punctuation = ".,!?;:'\"-()[]{}"

// Vocab is a model's SentencePiece vocabulary: pieces by id, and the blank, whose id is the
// number of pieces (parakeet.cpp:1163-1166). It is immutable and safe for concurrent use.
type Vocab struct {
	pieces    []string
	control   []bool // <unk>, <s>, </s>: no text
	wordStart []bool
	punct     []bool
}

// NewVocab returns the vocabulary of pieces (their bytes as stored, copied).
func NewVocab(pieces [][]byte) *Vocab {
	v := &Vocab{
		pieces:    make([]string, len(pieces)),
		control:   make([]bool, len(pieces)),
		wordStart: make([]bool, len(pieces)),
		punct:     make([]bool, len(pieces)),
	}
	for i, b := range pieces {
		p := string(b)
		v.pieces[i] = p
		v.control[i] = isControl(p)
		v.wordStart[i] = strings.HasPrefix(p, spmSpace) || strings.HasPrefix(p, "_")
		v.punct[i] = isPunctuation(p)
	}
	return v
}

// isControl is is_sentencepiece_control (parakeet.cpp:546); "[BLANK]", the fourth there, is the
// blank's name and never a stored piece.
func isControl(p string) bool { return p == "<unk>" || p == "<s>" || p == "</s>" }

// isPunctuation reports whether p, without a leading "▁" or "_", is one punctuation character.
func isPunctuation(p string) bool {
	if c, ok := strings.CutPrefix(p, spmSpace); ok {
		p = c
	} else if c, ok := strings.CutPrefix(p, "_"); ok {
		p = c
	}
	return len(p) == 1 && strings.ContainsRune(punctuation, rune(p[0]))
}

// Size is the number of pieces.
func (v *Vocab) Size() int { return len(v.pieces) }

// Blank is the blank's id: the number of pieces.
func (v *Vocab) Blank() int32 { return int32(len(v.pieces)) }

// Piece returns piece id as stored; false for the blank and ids out of range.
func (v *Vocab) Piece(id int32) (string, bool) {
	if id < 0 || int(id) >= len(v.pieces) {
		return "", false
	}
	return v.pieces[id], true
}

// IsWordStart reports whether piece id begins a word: it starts with "▁" or "_"
// (is_word_start_token, parakeet.cpp:2414).
func (v *Vocab) IsWordStart(id int32) bool {
	return id >= 0 && int(id) < len(v.pieces) && v.wordStart[id]
}

// IsPunctuation reports whether piece id is one punctuation character, alone or after "▁" or
// "_" (is_punctuation_token, parakeet.cpp:2425).
func (v *Vocab) IsPunctuation(id int32) bool {
	return id >= 0 && int(id) < len(v.pieces) && v.punct[id]
}

// AppendText appends the text of piece id to dst as sentencepiece_piece_to_text does
// (parakeet.cpp:566): each "▁" becomes a space, except those met before any other character of
// the first piece of a text (first); control pieces, the blank and ids out of range add nothing.
func (v *Vocab) AppendText(dst []byte, id int32, first bool) []byte {
	if id < 0 || int(id) >= len(v.pieces) || v.control[id] {
		return dst
	}
	p := v.pieces[id]
	start := len(dst)
	for len(p) > 0 {
		if rest, ok := strings.CutPrefix(p, spmSpace); ok {
			if !first || len(dst) > start {
				dst = append(dst, ' ')
			}
			p = rest
			continue
		}
		dst = append(dst, p[0])
		p = p[1:]
	}
	return dst
}

// Text joins the text of ids as whisper.cpp builds a segment's text (parakeet.cpp:3739-3748):
// the leading "▁" of the first piece that yields any text is dropped.
func (v *Vocab) Text(ids []int32) string {
	var b []byte
	for _, id := range ids {
		b = v.AppendText(b, id, len(b) == 0)
	}
	return string(b)
}
