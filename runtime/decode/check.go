package decode

import (
	"fmt"
	"math"
	"strconv"
)

// Request limits: the values a request may give the sampling parameters, the same for the
// server's API and the command line. They are OpenAI's where OpenAI defines the parameter and
// narrower than Validate's, which only keep the sampler's arithmetic finite.
const (
	// MaxTemperature is the highest temperature a request may ask for.
	MaxTemperature = 2
	// MaxRequestPenalty bounds the presence and frequency penalties of a request:
	// [-MaxRequestPenalty, MaxRequestPenalty].
	MaxRequestPenalty = 2
	// MaxLogitBias bounds a request's logit biases: [-MaxLogitBias, MaxLogitBias], or -Inf (a ban,
	// which only the command line can spell).
	MaxLogitBias = 100
)

// ParamError is a sampling parameter outside the values a request may give it. Its message
// is the one the server's 400 and the command line's usage error both print.
type ParamError struct {
	Param string // the parameter's name in the API: temperature, top_p, logit_bias...
	Msg   string // what is wrong, without the parameter's name
}

func (e *ParamError) Error() string { return fmt.Sprintf("Invalid '%s': %s.", e.Param, e.Msg) }

// paramRange is the interval [lo, hi] ((lo, hi] when openLo) a float parameter may take.
type paramRange struct {
	lo, hi float64
	openLo bool
}

// requestRanges are the float parameters' intervals, by API name.
var requestRanges = map[string]paramRange{
	"temperature":       {0, MaxTemperature, false},
	"top_p":             {0, 1, true},
	"min_p":             {0, 1, false},
	"presence_penalty":  {-MaxRequestPenalty, MaxRequestPenalty, false},
	"frequency_penalty": {-MaxRequestPenalty, MaxRequestPenalty, false},
	"repeat_penalty":    {1.0 / MaxPenalty, MaxPenalty, false},
}

// CheckParam reports, as a *ParamError, whether the value v a request gives the float parameter
// param (temperature, top_p, min_p, presence_penalty, frequency_penalty, repeat_penalty) lies
// outside its range, as given or as the float32 the sampler gets (a top_p of 1e-300 is 0
// there). NaN and the infinities lie outside every range.
func CheckParam(param string, v float64) error {
	r, ok := requestRanges[param]
	if !ok {
		return fmt.Errorf("decode: no request range for %q", param)
	}
	in := func(x float64) bool { // false for NaN too
		return x <= r.hi && (x > r.lo || !r.openLo && x == r.lo)
	}
	if in(v) && in(float64(float32(v))) {
		return nil
	}
	open := "["
	if r.openLo {
		open = "("
	}
	return &ParamError{param, fmt.Sprintf("expected a value in %s%v, %v], but got %v instead", open, r.lo, r.hi, v)}
}

// CheckLogitBias reports, as a *ParamError, whether a request's bias v for token id lies outside
// [-MaxLogitBias, MaxLogitBias] (-Inf, a ban, is allowed), or id outside a vocabulary of
// vocabSize tokens (vocabSize 0: not checked).
func CheckLogitBias(id int64, v float64, vocabSize int) error {
	if vocabSize > 0 && (id < 0 || id >= int64(vocabSize)) {
		return &ParamError{"logit_bias", fmt.Sprintf("key %q is not a token id of this model (0 to %d)", strconv.FormatInt(id, 10), vocabSize-1)}
	}
	if !(v >= -MaxLogitBias && v <= MaxLogitBias) && !math.IsInf(v, -1) { // NaN fails too
		return &ParamError{"logit_bias", fmt.Sprintf("value for token %d must be in [%d, %d]", id, -MaxLogitBias, MaxLogitBias)}
	}
	return nil
}

// Check reports the first parameter of p outside the values a request may give it (see
// CheckParam and CheckLogitBias), as a *ParamError, and then anything Validate refuses. With
// vocabSize 0 the checks that need the vocabulary (logit_bias ids, Validate) are left out, for
// a caller that checks its parameters before it has loaded the model.
func (p Params) Check(vocabSize int) error {
	for _, f := range []struct {
		name string
		v    float32
	}{
		{"temperature", p.Temperature}, {"top_p", p.TopP}, {"min_p", p.MinP},
		{"presence_penalty", p.PresencePenalty}, {"frequency_penalty", p.FrequencyPenalty},
		{"repeat_penalty", p.RepeatPenalty},
	} {
		if err := CheckParam(f.name, float64(f.v)); err != nil {
			return err
		}
	}
	if p.RepeatLastN < 0 || p.RepeatLastN > MaxRepeatLastN {
		return &ParamError{"repeat_last_n", fmt.Sprintf("expected a value in [0, %d], but got %d instead", MaxRepeatLastN, p.RepeatLastN)}
	}
	if p.TopLogprobs < 0 || p.TopLogprobs > MaxTopLogprobs {
		return &ParamError{"top_logprobs", fmt.Sprintf("expected a value in [0, %d], but got %d instead", MaxTopLogprobs, p.TopLogprobs)}
	}
	for id, v := range p.LogitBias {
		if err := CheckLogitBias(int64(id), float64(v), vocabSize); err != nil {
			return err
		}
	}
	if vocabSize == 0 {
		return nil
	}
	return p.Validate(vocabSize)
}
