package asr

import (
	"errors"
	"fmt"
	"time"

	"github.com/parleyhq/parley/runtime/decode"
)

// Params control one transcription: what is asked of every recogniser family (language, task,
// prompt, timestamps) and how its search runs (beam size, best-of, temperature schedule and
// fallback thresholds). A family uses what applies to it and ignores the rest; the fallback
// thresholds, MaxInitialTimestamp and the suppression flags are Whisper's. The zero value is not
// useful: start from DefaultParams.
type Params struct {
	// Language is an ISO 639-1 code ("en"), or "" / "auto" to detect it (multilingual models).
	Language string
	// Translate asks for English text (multilingual models).
	Translate bool
	// NoTimestamps decodes without timestamp tokens: one segment per window.
	NoTimestamps bool
	// WordTimestamps times every text token by alignment (Whisper: one more decoder pass over
	// each window's text, then dynamic time warping of its alignment heads' cross-attention; see
	// whisper.Model.AlignHeads) instead of spreading its segment's time over its tokens. Words
	// take their tokens' times.
	WordTimestamps bool

	// BeamSize > 1 selects beam search at temperature 0; 1 is greedy.
	BeamSize int
	// BestOf is the number of sampled candidates at temperatures above 0.
	BestOf int
	// LengthPenalty < 0 ranks finished hypotheses by average log-probability (whisper.cpp's and
	// OpenAI's default); > 0 uses the Google NMT penalty ((5+len)/6)^alpha.
	LengthPenalty float32

	// Temperature is the first temperature; after a failed window the next is Temperature +
	// TemperatureInc, up to 1. TemperatureInc 0 disables fallback.
	Temperature, TemperatureInc float32
	// A window fails (and is decoded again hotter) when its text compresses better than
	// CompressionRatioThold (repetition), its token entropy over the last 32 tokens is below
	// EntropyThold, or its average log-probability is below LogprobThold while the no-speech
	// probability is below NoSpeechThold. A window whose no-speech probability exceeds
	// NoSpeechThold with a low log-probability is silence and yields no text.
	CompressionRatioThold, EntropyThold, LogprobThold, NoSpeechThold float32

	// InitialPrompt is text that conditions the first window (spelling, vocabulary, style).
	InitialPrompt string
	// NoContext stops the text of one window from conditioning the next.
	NoContext bool
	// SuppressBlank suppresses a blank or end-of-text first token; SuppressNonSpeech suppresses
	// the symbols OpenAI lists as non-speech.
	SuppressBlank, SuppressNonSpeech bool
	// MaxInitialTimestamp bounds the first timestamp of a window (seconds).
	MaxInitialTimestamp float32
	// MaxTokens caps the tokens of one segment (0: no cap beyond the window's 220).
	MaxTokens int
	// Seed makes sampling at temperatures above 0 reproducible.
	Seed uint64
	// Timeout bounds the whole transcription (0: none).
	Timeout time.Duration
}

// DefaultParams are whisper.cpp's whisper-cli defaults: greedy with best-of 5 for fallback
// temperatures 0, 0.2, ... 1.
func DefaultParams() Params {
	return Params{
		BeamSize: 1, BestOf: 5, LengthPenalty: -1,
		TemperatureInc: 0.2, CompressionRatioThold: 2.4, EntropyThold: 2.4, LogprobThold: -1, NoSpeechThold: 0.6,
		SuppressBlank: true, MaxInitialTimestamp: 1,
	}
}

// MaxDecoders bounds BeamSize and BestOf.
const MaxDecoders = 8

// fallback is p's temperature-fallback thresholds.
func (p *Params) fallback() decode.Fallback {
	return decode.Fallback{CompressionRatio: p.CompressionRatioThold, Entropy: p.EntropyThold, LogProb: p.LogprobThold, NoSpeech: p.NoSpeechThold}
}

// Validate reports parameters out of range (errors wrap ErrBadRequest).
func (p *Params) Validate() error {
	if err := p.validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return nil
}

func (p *Params) validate() error {
	switch {
	case p.BeamSize < 1 || p.BeamSize > MaxDecoders:
		return fmt.Errorf("asr: beam size %d is outside 1..%d", p.BeamSize, MaxDecoders)
	case p.BestOf < 1 || p.BestOf > MaxDecoders:
		return fmt.Errorf("asr: best-of %d is outside 1..%d", p.BestOf, MaxDecoders)
	case p.Temperature < 0 || p.Temperature > 1 || p.Temperature != p.Temperature:
		return fmt.Errorf("asr: temperature %v is outside 0..1", p.Temperature)
	case p.TemperatureInc < 0 || p.TemperatureInc > 1 || p.TemperatureInc != p.TemperatureInc:
		return fmt.Errorf("asr: temperature increment %v is outside 0..1", p.TemperatureInc)
	case p.MaxTokens < 0:
		return errors.New("asr: negative max tokens")
	case len(p.InitialPrompt) > 1<<16:
		return errors.New("asr: initial prompt longer than 64 KiB")
	}
	return nil
}
