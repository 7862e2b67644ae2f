package pockettts

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The text front end, as upstream's models/tts_model.py (prepare_text_prompt :913,
// split_into_best_sentences :978, generate_audio_stream :603-630, _estimate_max_gen_len :907)
// at kyutai-labs/pocket-tts 9514983. Python's string semantics are reproduced where they decide
// the result: whitespace is str.isspace, words are str.split(), the first character is
// upper-cased with str.upper (which can expand it: "ß" → "SS").

// MaxChunkTokens is upstream's MAX_TOKEN_PER_CHUNK: the most tokens a chunk is packed to.
const MaxChunkTokens = 50

const (
	tokensPerSecond   = 3.0 // TTSModel._TOKENS_PER_SECOND_ESTIMATE
	genSecondsPadding = 2.0 // TTSModel._GEN_SECONDS_PADDING
	// extraFramesAfterEOS is what generate_audio_stream adds to prepare_text_prompt's guess.
	extraFramesAfterEOS = 2
)

// TextOptions are the language settings of the text front end (upstream's config).
type TextOptions struct {
	// PadShortInputs prepends 8 spaces to texts of fewer than 5 words (english_2026-01).
	PadShortInputs bool
	// RemoveSemicolons writes ";" as "," (german, french).
	RemoveSemicolons bool
	// MaxChunkTokens is the most tokens per chunk; 0 means MaxChunkTokens.
	MaxChunkTokens int
	// FramesAfterEOS, when positive, replaces the guess from the text (a user's setting, or a
	// config's model_recommended_frames_after_eos).
	FramesAfterEOS int
	// FrameRate is the latent frame rate in Hz; 0 means 12.5.
	FrameRate float64
}

// Tokenizer encodes and decodes text (a *sentencepiece.Model).
type Tokenizer interface {
	Encode(text string) []int32
	Decode(ids []int32) (string, error)
}

// Chunk is one part of a text, generated independently from a fresh copy of the voice state.
type Chunk struct {
	Text           string  // what is tokenised: the chunk's decoded sentences
	Tokens         []int32 // the tokens of Text
	FramesAfterEOS int     // frames still emitted after the EOS step, that step included
	MaxFrames      int     // the frame budget when no EOS comes (upstream's max_gen_len)
}

// ErrEmptyText is returned for a text with nothing but whitespace.
var ErrEmptyText = errors.New("pockettts: the text is empty")

// pyIsSpace is Python's str.isspace for one character: Unicode White_Space and the information
// separators U+001C..U+001F.
func pyIsSpace(r rune) bool { return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f) }

// pyIsUpper is Python's str.isupper for one character (the Uppercase property).
func pyIsUpper(r rune) bool { return unicode.IsUpper(r) || unicode.Is(unicode.Other_Uppercase, r) }

// pyIsAlnum is Python's str.isalnum for one character (letters and numbers).
func pyIsAlnum(r rune) bool { return unicode.IsLetter(r) || unicode.IsNumber(r) }

// pyUpper is Python's str.upper of one character.
func pyUpper(r rune) string {
	if s, ok := upperExpansions[r]; ok {
		return s
	}
	return string(unicode.ToUpper(r))
}

// pyStrip is Python's str.strip() (no argument).
func pyStrip(s string) string { return strings.TrimFunc(s, pyIsSpace) }

// pyWords is len(str.split()).
func pyWords(s string) int { return len(strings.FieldsFunc(s, pyIsSpace)) }

// PrepareText is upstream's prepare_text_prompt: strip; newlines to spaces; one pass of "  " to
// " "; semicolons to commas if asked; the first character upper-cased; a final "." after a
// letter or digit; 8 leading spaces for short texts if asked. It also returns upstream's guess
// of frames after EOS: 3 for texts of at most 4 words, else 1 (generation adds 2).
func PrepareText(text string, o TextOptions) (string, int, error) {
	text = pyStrip(text)
	if text == "" {
		return "", 0, ErrEmptyText
	}
	text = strings.NewReplacer("\n", " ", "\r", " ").Replace(text)
	text = strings.ReplaceAll(text, "  ", " ")
	if o.RemoveSemicolons {
		text = strings.ReplaceAll(text, ";", ",")
	}
	guess := 1
	if pyWords(text) <= 4 {
		guess = 3
	}
	first, n := utf8.DecodeRuneInString(text)
	if !pyIsUpper(first) {
		text = pyUpper(first) + text[n:]
	}
	if last, _ := utf8.DecodeLastRuneInString(text); pyIsAlnum(last) {
		text += "."
	}
	if o.PadShortInputs && pyWords(text) < 5 {
		text = strings.Repeat(" ", 8) + text
	}
	return text, guess, nil
}

// MaxFrames is upstream's _estimate_max_gen_len: ceil((tokens/3 + 2) · frameRate).
func MaxFrames(tokens int, frameRate float64) int {
	return int(math.Ceil((float64(tokens)/tokensPerSecond + genSecondsPadding) * frameRate))
}

// boundaries is _find_boundary_indices: segment starts after each run of boundary tokens, with
// 0 first and len(tokens) last.
func boundaries(tokens, boundary []int32) []int {
	idx := []int{0}
	prev := false
	for i, t := range tokens {
		if slices.Contains(boundary, t) {
			prev = true
			continue
		}
		if prev {
			idx = append(idx, i)
		}
		prev = false
	}
	return append(idx, len(tokens))
}

type segment struct {
	tokens int
	text   string
}

// segments is _segments_from_boundaries: each segment's token count and decoded text.
func segments(tok Tokenizer, tokens []int32, idx []int) ([]segment, error) {
	var out []segment
	for i := 0; i+1 < len(idx); i++ {
		s, err := tok.Decode(tokens[idx[i]:idx[i+1]])
		if err != nil {
			return nil, err
		}
		out = append(out, segment{idx[i+1] - idx[i], s})
	}
	return out, nil
}

// tailIDs returns the ids of text without the first, as upstream's `_, *ids = tokenizer(text)`.
func tailIDs(tok Tokenizer, text string) ([]int32, error) {
	ids := tok.Encode(text)
	if len(ids) == 0 {
		return nil, fmt.Errorf("pockettts: the tokenizer gives no tokens for %q", text)
	}
	return ids[1:], nil
}

// SplitText is upstream's split_into_best_sentences followed by the per-chunk settings of
// generate_audio_stream: the prepared text is cut after runs of sentence-end tokens (the ids of
// ".!...?" but its first), sentences longer than the chunk limit are cut again after ",;:"
// tokens, and the pieces are packed greedily into chunks of at most MaxChunkTokens tokens,
// joined by spaces. Each chunk's text is tokenised again as it will be generated.
func SplitText(tok Tokenizer, text string, o TextOptions) ([]Chunk, error) {
	maxTokens := o.MaxChunkTokens
	if maxTokens <= 0 {
		maxTokens = MaxChunkTokens
	}
	rate := o.FrameRate
	if rate <= 0 {
		rate = 12.5
	}
	prepared, _, err := PrepareText(text, o)
	if err != nil {
		return nil, err
	}
	prepared = pyStrip(prepared)
	tokens := tok.Encode(prepared)
	sentenceEnds, err := tailIDs(tok, ".!...?")
	if err != nil {
		return nil, err
	}
	sentences, err := segments(tok, tokens, boundaries(tokens, sentenceEnds))
	if err != nil {
		return nil, err
	}
	clauseEnds, err := tailIDs(tok, ",;:")
	if err != nil {
		return nil, err
	}
	var refined []segment
	for _, s := range sentences {
		if s.tokens <= maxTokens {
			refined = append(refined, s)
			continue
		}
		sub := tok.Encode(pyStrip(s.text))
		parts, err := segments(tok, sub, boundaries(sub, clauseEnds))
		if err != nil {
			return nil, err
		}
		if len(parts) > 1 {
			refined = append(refined, parts...)
		} else {
			refined = append(refined, s)
		}
	}
	var texts []string
	cur, curTokens := "", 0
	for _, s := range refined {
		if cur == "" {
			cur, curTokens = s.text, s.tokens
			continue
		}
		if curTokens+s.tokens > maxTokens {
			texts = append(texts, pyStrip(cur))
			cur, curTokens = s.text, s.tokens
		} else {
			cur += " " + s.text
			curTokens += s.tokens
		}
	}
	if cur != "" {
		texts = append(texts, pyStrip(cur))
	}
	chunks := make([]Chunk, 0, len(texts))
	for _, t := range texts {
		_, guess, err := PrepareText(t, o)
		if err != nil {
			return nil, err
		}
		c := Chunk{Text: t, Tokens: tok.Encode(t), FramesAfterEOS: guess + extraFramesAfterEOS}
		if o.FramesAfterEOS > 0 {
			c.FramesAfterEOS = o.FramesAfterEOS
		}
		c.MaxFrames = MaxFrames(len(c.Tokens), rate)
		chunks = append(chunks, c)
	}
	return chunks, nil
}
