package whisper

import (
	wtok "github.com/parleyhq/parley/runtime/tokenizer/whisper"
)

// Vocab is the model's tokenizer with what decoding derives from it once.
type Vocab struct {
	*wtok.Tokenizer
	Space int32   // the single-space token, suppressed as a first token; -1 if absent
	langs []int32 // language tokens the model knows
}

// NewVocab builds the tokenizer of m.
func NewVocab(m *Model) (*Vocab, error) {
	t, err := wtok.New(m.Tokens, m.NVocab)
	if err != nil {
		return nil, err
	}
	v := &Vocab{Tokenizer: t, Space: single(t, " ")}
	for i := range t.NumLanguages() {
		v.langs = append(v.langs, t.SOT+1+int32(i))
	}
	return v, nil
}

// single returns the token whose text is exactly s, or -1.
func single(t *wtok.Tokenizer, s string) int32 {
	ids := t.Encode(s)
	if len(ids) == 1 && string(t.Piece(ids[0])) == s {
		return ids[0]
	}
	return -1
}

// Langs lists the language tokens the model knows, in the model's order. The slice is shared.
func (v *Vocab) Langs() []int32 { return v.langs }

// LangCode returns the code of a language token ("" if it is none).
func (v *Vocab) LangCode(id int32) string {
	c, _ := v.Tokenizer.LangCode(id)
	return c
}

// Suppressed lists the tokens whisper.cpp never lets a transcription produce: the task and
// control tokens and all 100 language slots after <|startoftranscript|>.
func (v *Vocab) Suppressed() []int32 {
	ids := []int32{v.NoTimestamps, v.SOT, v.NoSpeech, v.SOLM, v.Translate, v.Transcribe, v.Prev}
	for i := int32(1); i <= 100; i++ {
		if id := v.SOT + i; int(id) < v.NVocab() {
			ids = append(ids, id)
		}
	}
	return ids
}

// NonSpeech lists the tokens of symbols OpenAI's Whisper suppresses as non-speech, with and
// without a leading space, plus " -" and " '" (allowed only inside words).
func (v *Vocab) NonSpeech() []int32 {
	syms := []string{"\"", "#", "(", ")", "*", "+", "/", ":", ";", "<", "=", ">", "@", "[", "\\", "]", "^",
		"_", "`", "{", "|", "}", "~", "「", "」", "『", "』", "<<", ">>", "<<<", ">>>", "--", "---", "-(", "-[",
		"('", "(\"", "((", "))", "(((", ")))", "[[", "]]", "{{", "}}", "♪♪", "♪♪♪", "♩", "♪", "♫", "♬", "♭", "♮", "♯"}
	var ids []int32
	for _, s := range syms {
		for _, w := range []string{s, " " + s} {
			if id := single(v.Tokenizer, w); id >= 0 {
				ids = append(ids, id)
			}
		}
	}
	for _, w := range []string{" -", " '"} {
		if id := single(v.Tokenizer, w); id >= 0 {
			ids = append(ids, id)
		}
	}
	return ids
}
