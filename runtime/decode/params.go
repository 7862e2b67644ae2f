package decode

import (
	"fmt"
	"math"
)

// Limits checked by Params.Validate and NewSampler. They bound what a Sampler allocates from
// caller-supplied numbers.
const (
	// MaxVocab is the largest vocabulary a Sampler or Stopper accepts.
	MaxVocab = 1 << 24
	// MaxRepeatLastN is the longest repetition-penalty window.
	MaxRepeatLastN = 1 << 20
	// MaxTopLogprobs is the most alternatives a request may ask log-probabilities for
	// (the OpenAI API limit).
	MaxTopLogprobs = 20
	// MaxPenalty bounds the penalties: presence and frequency penalties lie in [-MaxPenalty,
	// MaxPenalty], the repetition penalty in [1/MaxPenalty, MaxPenalty]. Beyond, a penalised
	// logit can leave float32's range, and every draw would fail.
	MaxPenalty = 100
)

// Params configures a Sampler. The zero value is not valid (TopP and RepeatPenalty must be
// positive); start from DefaultParams.
type Params struct {
	// Temperature divides the logits before the draw. Zero or negative selects greedy
	// decoding, in which TopK, TopP, MinP and Seed have no effect.
	Temperature float32
	// TopK keeps the K most likely tokens; zero or negative turns it off, and a K of at least
	// the vocabulary size keeps everything.
	TopK int
	// TopP keeps the smallest set of most likely tokens whose probabilities (softmax of the
	// candidates left by TopK, at temperature 1) sum to at least TopP. Must lie in (0, 1];
	// 1 turns it off.
	TopP float32
	// MinP keeps tokens whose probability is at least MinP times that of the most likely one
	// (measured at temperature 1). Must lie in [0, 1]; 0 turns it off.
	MinP float32
	// RepeatPenalty is llama.cpp's repetition penalty: for each distinct token among the last
	// RepeatLastN accepted tokens (prompt tokens included), a positive logit is divided by it
	// and a negative one multiplied by it. Must be positive; 1 turns it off.
	RepeatPenalty float32
	// RepeatLastN is the repetition-penalty window in tokens; 0 turns the penalty off. Unlike
	// llama.cpp, -1 ("the whole context") is not accepted: give the window explicitly.
	RepeatLastN int
	// PresencePenalty and FrequencyPenalty follow OpenAI: for a token generated c times so
	// far, logit -= FrequencyPenalty*c + PresencePenalty*(c > 0). They count every token passed
	// to Accept since the last Reset, with no window, and never prompt tokens (AcceptPrompt).
	// llama.cpp instead applies them over its RepeatLastN window, prompt included. 0 turns
	// each off; any finite value is accepted.
	PresencePenalty  float32
	FrequencyPenalty float32
	// LogitBias is added to the logits of the given token ids before anything else; -Inf bans
	// a token. Ids must lie in the vocabulary; values must not be NaN or +Inf.
	LogitBias map[int32]float32
	// Seed seeds the draw (a PCG generator from math/rand/v2). The same seed, the same
	// accepted tokens and the same logits give the same tokens; callers wanting independent
	// outputs for independent requests must vary it.
	Seed uint64
	// TopLogprobs is how many alternatives the caller wants log-probabilities for
	// (0..MaxTopLogprobs). The Sampler only validates it; see TopLogprobs.
	TopLogprobs int
}

// DefaultParams returns llama.cpp's default sampling settings: temperature 0.8, top-k 40,
// top-p 0.95, min-p 0.05, no penalties (window 64), seed 0.
func DefaultParams() Params {
	return Params{
		Temperature:   0.8,
		TopK:          40,
		TopP:          0.95,
		MinP:          0.05,
		RepeatPenalty: 1,
		RepeatLastN:   64,
	}
}

// Greedy reports whether p selects greedy decoding.
func (p Params) Greedy() bool { return !(p.Temperature > 0) }

// Validate checks p against a vocabulary of vocabSize tokens.
func (p Params) Validate(vocabSize int) error {
	if vocabSize < 1 || vocabSize > MaxVocab {
		return fmt.Errorf("decode: vocabulary size %d outside [1, %d]", vocabSize, MaxVocab)
	}
	if err := finite("temperature", p.Temperature); err != nil {
		return err
	}
	if isNaN32(p.TopP) || !(p.TopP > 0 && p.TopP <= 1) {
		return fmt.Errorf("decode: top_p %v outside (0, 1] (1 turns it off)", p.TopP)
	}
	if isNaN32(p.MinP) || !(p.MinP >= 0 && p.MinP <= 1) {
		return fmt.Errorf("decode: min_p %v outside [0, 1] (0 turns it off)", p.MinP)
	}
	if err := finite("repeat_penalty", p.RepeatPenalty); err != nil {
		return err
	}
	if !(p.RepeatPenalty >= 1.0/MaxPenalty && p.RepeatPenalty <= MaxPenalty) {
		return fmt.Errorf("decode: repeat_penalty %v outside [%v, %v] (1 turns it off)", p.RepeatPenalty, 1.0/MaxPenalty, MaxPenalty)
	}
	if p.RepeatLastN < 0 || p.RepeatLastN > MaxRepeatLastN {
		return fmt.Errorf("decode: repeat_last_n %d outside [0, %d]", p.RepeatLastN, MaxRepeatLastN)
	}
	for _, q := range []struct {
		name string
		v    float32
	}{{"presence_penalty", p.PresencePenalty}, {"frequency_penalty", p.FrequencyPenalty}} {
		if !(q.v >= -MaxPenalty && q.v <= MaxPenalty) { // NaN fails too
			return fmt.Errorf("decode: %s %v outside [%v, %v] (0 turns it off)", q.name, q.v, -MaxPenalty, MaxPenalty)
		}
	}
	for id, v := range p.LogitBias {
		if id < 0 || int(id) >= vocabSize {
			return fmt.Errorf("decode: logit_bias token %d outside vocabulary [0, %d)", id, vocabSize)
		}
		if isNaN32(v) || math.IsInf(float64(v), 1) {
			return fmt.Errorf("decode: logit_bias for token %d is %v (must be finite or -Inf)", id, v)
		}
	}
	if p.TopLogprobs < 0 || p.TopLogprobs > MaxTopLogprobs {
		return fmt.Errorf("decode: top_logprobs %d outside [0, %d]", p.TopLogprobs, MaxTopLogprobs)
	}
	return nil
}

func finite(name string, v float32) error {
	if isNaN32(v) || math.IsInf(float64(v), 0) {
		return fmt.Errorf("decode: %s is %v (must be finite)", name, v)
	}
	return nil
}

func isNaN32(v float32) bool { return v != v }
