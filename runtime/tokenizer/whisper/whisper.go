// Package whisper is Whisper's tokenizer as whisper.cpp implements it: the vocabulary stored in a
// whisper.cpp model file, the special tokens derived from the vocabulary size, the language
// table, text encoding and decoding.
//
// Encoding is not BPE. Text is split into words by GPT-2's pre-tokenisation pattern as
// whisper.cpp runs it through std::regex in the C locale, where only ASCII letters are letters
// and only ASCII digits are digits (every byte from 0x80 up is punctuation to it), and each word
// is then cut greedily into the longest vocabulary tokens from its start. Bytes that begin no
// token are dropped, as whisper.cpp does. Token ids are those whisper.cpp gives; they can differ
// from OpenAI's tokenizer, which applies BPE merges.
//
// Files store the 50257 text tokens only (multilingual ones have an empty token at 50256). Ids
// from there to the model's vocabulary size are special: their pieces are the names whisper.cpp
// gives them ("[_SOT_]", "[_LANG_en]", "[_TT_150]"...).
//
// A Tokenizer is immutable after New and safe for concurrent use.
package whisper

import (
	"fmt"
	"strconv"
)

// Vocabulary sizes of Whisper models.
const (
	NVocabEnglish      = 51864 // English-only models (tiny.en ... medium.en)
	NVocabMultilingual = 51865 // multilingual models up to large-v2: 99 languages
	NVocabLargeV3      = 51866 // large-v3 and large-v3-turbo: 100 languages
)

// Tokenizer encodes and decodes text for one Whisper model.
type Tokenizer struct {
	// Special token ids (whisper.cpp's whisper_vocab).
	EOT            int32 // <|endoftext|>
	SOT            int32 // <|startoftranscript|>
	Translate      int32 // <|translate|>
	Transcribe     int32 // <|transcribe|>
	SOLM           int32 // <|startoflm|>; speaker turn in tinydiarize models
	Prev           int32 // <|startofprev|>
	NoSpeech       int32 // <|nospeech|>
	NoTimestamps   int32 // <|notimestamps|>
	TimestampBegin int32 // <|0.00|>; TimestampBegin+i is the time i*20 ms

	nVocab       int
	multilingual bool
	nLang        int
	pieces       [][]byte // [max(len(vocab), nVocab)] token bytes by id
	ids          map[string]int32
	maxLen       int // longest piece in ids
}

// New builds the tokenizer of a model whose file stores vocab (token bytes in id order, as
// ggml.File.Vocab) and whose vocabulary size (hyperparameter n_vocab) is nVocab. vocab is copied.
func New(vocab [][]byte, nVocab int) (*Tokenizer, error) {
	if nVocab < NVocabEnglish || nVocab > NVocabLargeV3 {
		return nil, fmt.Errorf("whisper: vocabulary size %d: Whisper models have %d (English-only), %d or %d tokens",
			nVocab, NVocabEnglish, NVocabMultilingual, NVocabLargeV3)
	}
	if len(vocab) > 1<<24 {
		return nil, fmt.Errorf("whisper: %d tokens stored is too many", len(vocab))
	}
	t := &Tokenizer{
		EOT: 50256, SOT: 50257, Translate: 50357, Transcribe: 50358, SOLM: 50359, Prev: 50360,
		NoSpeech: 50361, NoTimestamps: 50362, TimestampBegin: 50363,
		nVocab:       nVocab,
		multilingual: nVocab >= NVocabMultilingual,
		nLang:        nVocab - 51765,
	}
	if t.multilingual {
		t.nLang--
		t.EOT++
		t.SOT++
		dt := int32(t.nLang - 98)
		t.Translate += dt
		t.Transcribe += dt
		t.SOLM += dt
		t.Prev += dt
		t.NoSpeech += dt
		t.NoTimestamps += dt
		t.TimestampBegin += dt
	}

	// All pieces share one buffer; the map keys share one string holding the same bytes.
	total := 0
	for _, p := range vocab {
		total += len(p)
	}
	buf := make([]byte, 0, total+(nVocab-min(nVocab, len(vocab)))*12)
	ends := make([]int, max(len(vocab), nVocab))
	for i := range ends {
		if i < len(vocab) {
			buf = append(buf, vocab[i]...)
		} else {
			buf = append(buf, t.extraName(int32(i))...)
		}
		ends[i] = len(buf)
	}
	keys := string(buf)
	t.pieces = make([][]byte, len(ends))
	// A piece stored twice maps to its last id, as in whisper.cpp's token_to_id.
	t.ids = make(map[string]int32, len(ends))
	start := 0
	for i, end := range ends {
		t.pieces[i] = buf[start:end:end]
		if end > start {
			t.ids[keys[start:end]] = int32(i)
			t.maxLen = max(t.maxLen, end-start)
		}
		start = end
	}
	return t, nil
}

// extraName is the piece whisper.cpp gives id, which the file does not store.
func (t *Tokenizer) extraName(id int32) string {
	switch {
	case id > t.TimestampBegin:
		return "[_TT_" + strconv.Itoa(int(id-t.TimestampBegin)) + "]"
	case id == t.EOT:
		return "[_EOT_]"
	case id == t.SOT:
		return "[_SOT_]"
	case id == t.Translate:
		return "[_TRANSLATE_]"
	case id == t.Transcribe:
		return "[_TRANSCRIBE_]"
	case id == t.SOLM:
		return "[_SOLM_]"
	case id == t.Prev:
		return "[_PREV_]"
	case id == t.NoSpeech:
		return "[_NOSP_]"
	case id == t.NoTimestamps:
		return "[_NOT_]"
	case id == t.TimestampBegin:
		return "[_BEG_]"
	case id > t.SOT && int(id) <= int(t.SOT)+t.nLang:
		// English-only models name these ids too, although they have no language tokens.
		return "[_LANG_" + languages[id-t.SOT-1].Code + "]"
	}
	return "[_extra_token_" + strconv.Itoa(int(id)) + "]"
}

// NVocab returns the model's vocabulary size: ids are in [0, NVocab).
func (t *Tokenizer) NVocab() int { return t.nVocab }

// IsMultilingual reports whether the model has language tokens and the transcribe and translate
// tokens.
func (t *Tokenizer) IsMultilingual() bool { return t.multilingual }

// NumLanguages returns how many languages a multilingual model knows (the first NumLanguages of
// Languages); 0 for English-only models.
func (t *Tokenizer) NumLanguages() int {
	if !t.multilingual {
		return 0
	}
	return t.nLang
}

// LangID returns the token of the language with code (or English name) lang. It is false for
// languages the model does not know and for every language in English-only models.
func (t *Tokenizer) LangID(lang string) (int32, bool) {
	i, ok := LanguageIndex(lang)
	if !ok || i >= t.NumLanguages() {
		return 0, false
	}
	return t.SOT + 1 + int32(i), true
}

// LangCode returns the code of language token id ("en" for SOT+1).
func (t *Tokenizer) LangCode(id int32) (string, bool) {
	i := int(id) - int(t.SOT) - 1
	if i < 0 || i >= t.NumLanguages() {
		return "", false
	}
	return languages[i].Code, true
}

// TimestampID returns the token of time i*20 ms, or -1 if the model has no such token.
func (t *Tokenizer) TimestampID(i int) int32 {
	if i < 0 || i >= t.nVocab-int(t.TimestampBegin) {
		return -1
	}
	return t.TimestampBegin + int32(i)
}

// IsTimestamp reports whether id is a timestamp token.
func (t *Tokenizer) IsTimestamp(id int32) bool {
	return id >= t.TimestampBegin && int(id) < t.nVocab
}

// IsSpecial reports whether id is not a text token: EOT and every id after it (whisper.cpp's
// test "id >= whisper_token_eot"), ids beyond the vocabulary included.
func (t *Tokenizer) IsSpecial(id int32) bool { return id >= t.EOT || id < 0 }

// Prompt returns the tokens that start a transcription window, as whisper_full builds them:
// SOT, then for multilingual models the language token and Transcribe (Translate with
// translate), then NoTimestamps with noTimestamps. lang is a code or English name; English-only
// models ignore it and translate.
func (t *Tokenizer) Prompt(lang string, translate, noTimestamps bool) ([]int32, error) {
	id := int32(-1)
	if t.multilingual {
		var ok bool
		if id, ok = t.LangID(lang); !ok {
			return nil, fmt.Errorf("whisper: unknown language %q", lang)
		}
	}
	return t.AppendPrompt(nil, id, translate, noTimestamps), nil
}

// AppendPrompt appends Prompt's tokens to dst for the language token lang (ignored, as
// translate is, by English-only models).
func (t *Tokenizer) AppendPrompt(dst []int32, lang int32, translate, noTimestamps bool) []int32 {
	dst = append(dst, t.SOT)
	if t.multilingual {
		mode := t.Transcribe
		if translate {
			mode = t.Translate
		}
		dst = append(dst, lang, mode)
	}
	if noTimestamps {
		dst = append(dst, t.NoTimestamps)
	}
	return dst
}
