package tokenizer

import "github.com/parleyhq/parley/runtime/tokenizer/utf8stream"

// piece returns token id's bytes as shown with special tokens rendered; nil for ids out of range
// and for control and unknown tokens unless special.
func (t *Tokenizer) piece(id int32, special bool) []byte {
	if id < 0 || int(id) >= t.vocab.Size {
		return nil
	}
	if !special && t.vocab.attrs[id]&attrSpecial != 0 {
		return nil
	}
	a, b := t.pieceOff[id], t.pieceOff[id+1]
	return t.pieces[a:b:b]
}

// Piece returns the bytes token id stands for when detokenised: U+2581 shown as a space
// (SentencePiece, WordPiece), byte tokens as their byte, byte-level BPE tokens mapped back to
// bytes. Control and unknown tokens give nothing, as do ids out of range. The slice is shared:
// do not modify it. It need not be valid UTF-8: a character may span several tokens.
func (t *Tokenizer) Piece(id int32) []byte { return t.piece(id, false) }

// AppendPiece appends token id's bytes to dst; with special, control and unknown tokens are
// written as their text (e.g. "<|eot_id|>").
func (t *Tokenizer) AppendPiece(dst []byte, id int32, special bool) []byte {
	return append(dst, t.piece(id, special)...)
}

// Decode is the inverse of Encode: it concatenates the pieces of ids (control tokens give
// nothing) and, for SentencePiece vocabularies that prefix text with a space ("llama" by
// default), drops the space that begins the first non-empty piece. For valid UTF-8 text without
// special tokens that the vocabulary can spell, Decode(Encode(s)) == s; BERT's normalisation is
// not undone. Unlike llama.cpp's detokenizer, Decode never removes spaces before punctuation
// (clean_up_tokenization_spaces), which would break that identity.
func (t *Tokenizer) Decode(ids []int32) string {
	var buf []byte
	strip := t.model == modelSPM && t.addSpacePrefix
	for _, id := range ids {
		p := t.piece(id, false)
		if len(p) == 0 {
			continue
		}
		if strip && p[0] == ' ' {
			p = p[1:]
		}
		strip = false
		buf = append(buf, p...)
	}
	return string(buf)
}

// Decoder turns a stream of token ids into text without ever splitting a UTF-8 character: bytes
// that begin a character whose remaining bytes have not arrived yet are held back until they do.
// Bytes that cannot begin or continue a valid character are passed through at once, so the
// concatenation of everything a Decoder returns, Flush included, is exactly the concatenation of
// the pieces. A Decoder is not safe for concurrent use.
type Decoder struct {
	t *Tokenizer
	// Special makes control and unknown tokens render as their text.
	Special bool
	j       utf8stream.Joiner
	buf     []byte
}

// NewDecoder returns a Decoder for t's tokens. Pieces are written as they are: for
// SentencePiece vocabularies the space that begins a word is kept, which is what a continuation
// of a prompt needs.
func (t *Tokenizer) NewDecoder() *Decoder { return &Decoder{t: t} }

// Write decodes one more token and returns the text it completes. The slice is valid until the
// next call.
func (d *Decoder) Write(id int32) []byte {
	d.buf = d.Append(d.buf[:0], id)
	return d.buf
}

// Append decodes one more token, appending the text it completes to dst.
func (d *Decoder) Append(dst []byte, id int32) []byte {
	return d.j.Append(dst, d.t.piece(id, d.Special))
}

// Flush returns the bytes still held back (the start of a character that never completed) and
// empties the Decoder. The slice is valid until the next call.
func (d *Decoder) Flush() []byte { return d.j.Flush() }

// Reset drops any held-back bytes.
func (d *Decoder) Reset() { d.j.Reset() }
