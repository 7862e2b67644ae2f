package whisper

import "github.com/parleyhq/parley/runtime/tokenizer/utf8stream"

// Piece returns the bytes of token id as whisper.cpp's whisper_token_to_str gives them: the
// stored bytes for text tokens, names such as "[_SOT_]", "[_LANG_en]", "[_BEG_]" and "[_TT_75]"
// for special tokens the file does not store. It is nil for ids out of range. The slice is
// shared: do not modify it. It need not be valid UTF-8: a character may span several tokens.
func (t *Tokenizer) Piece(id int32) []byte {
	if id < 0 || int(id) >= len(t.pieces) {
		return nil
	}
	return t.pieces[id]
}

// piece returns id's bytes, or nil for a special token unless special.
func (t *Tokenizer) piece(id int32, special bool) []byte {
	if !special && t.IsSpecial(id) {
		return nil
	}
	return t.Piece(id)
}

// Decode returns the text of ids: the bytes of the text tokens concatenated, special tokens
// skipped (whisper_full's segment text without print_special). The result need not be valid
// UTF-8 (ids may end inside a character). For text whose every byte Encode could match,
// Decode(Encode(s)) == s.
func (t *Tokenizer) Decode(ids []int32) string {
	return string(t.AppendDecode(nil, ids, false))
}

// AppendDecode appends the bytes of ids to dst; with special, special tokens are rendered as
// their pieces (whisper_full's print_special), otherwise skipped.
func (t *Tokenizer) AppendDecode(dst []byte, ids []int32, special bool) []byte {
	for _, id := range ids {
		dst = append(dst, t.piece(id, special)...)
	}
	return dst
}

// Decoder turns a stream of token ids into text without ever splitting a UTF-8 character: bytes
// that begin a character whose remaining bytes have not arrived yet are held back until they do.
// Bytes that cannot begin or continue a valid character are passed through at once, so the
// concatenation of everything a Decoder returns, Flush included, is exactly the concatenation of
// the pieces. A Decoder is not safe for concurrent use.
type Decoder struct {
	t *Tokenizer
	// Special makes special tokens render as their pieces ("[_SOT_]", "[_TT_42]"); without it
	// they give nothing.
	Special bool
	j       utf8stream.Joiner
	buf     []byte
}

// NewDecoder returns a Decoder for t's tokens.
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
