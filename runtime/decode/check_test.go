package decode

import (
	"errors"
	"math"
	"strings"
	"testing"
)

// TestCheck: the request limits every caller (the server's requests, the command line) checks
// sampling parameters against, with the parameter's API name and one message for both.
func TestCheck(t *testing.T) {
	mod := func(f func(*Params)) Params {
		p := DefaultParams()
		f(&p)
		return p
	}
	for _, c := range []struct {
		p     Params
		param string // "": valid
		msg   string
	}{
		{DefaultParams(), "", ""},
		{mod(func(p *Params) { p.Temperature = 0 }), "", ""},
		{mod(func(p *Params) { p.Temperature = 2 }), "", ""},
		{mod(func(p *Params) { p.Temperature = -1 }), "temperature", "Invalid 'temperature': expected a value in [0, 2], but got -1 instead."},
		{mod(func(p *Params) { p.Temperature = 2.5 }), "temperature", "[0, 2]"},
		{mod(func(p *Params) { p.Temperature = float32(math.NaN()) }), "temperature", "NaN"},
		{mod(func(p *Params) { p.TopP = 0 }), "top_p", "(0, 1]"},
		{mod(func(p *Params) { p.TopP = 1.5 }), "top_p", "(0, 1]"},
		{mod(func(p *Params) { p.MinP = -0.1 }), "min_p", "[0, 1]"},
		{mod(func(p *Params) { p.PresencePenalty = 3 }), "presence_penalty", "[-2, 2]"},
		{mod(func(p *Params) { p.FrequencyPenalty = -3 }), "frequency_penalty", "[-2, 2]"},
		{mod(func(p *Params) { p.RepeatPenalty = 0 }), "repeat_penalty", "[0.01, 100]"},
		{mod(func(p *Params) { p.RepeatLastN = -1 }), "repeat_last_n", "got -1"},
		{mod(func(p *Params) { p.TopLogprobs = 21 }), "top_logprobs", "[0, 20]"},
		{mod(func(p *Params) { p.LogitBias = map[int32]float32{5: 101} }), "logit_bias", "Invalid 'logit_bias': value for token 5 must be in [-100, 100]."},
		{mod(func(p *Params) { p.LogitBias = map[int32]float32{5: float32(math.Inf(-1))} }), "", ""}, // a ban
		{mod(func(p *Params) { p.LogitBias = map[int32]float32{5: float32(math.Inf(1))} }), "logit_bias", "[-100, 100]"},
		{mod(func(p *Params) { p.LogitBias = map[int32]float32{500: 1} }), "logit_bias", `key "500" is not a token id of this model (0 to 99)`},
		{mod(func(p *Params) { p.TopK = -5 }), "", ""}, // off
	} {
		err := c.p.Check(100)
		var pe *ParamError
		switch {
		case c.param == "" && err != nil:
			t.Errorf("%+v: %v", c.p, err)
		case c.param != "" && (!errors.As(err, &pe) || pe.Param != c.param || !strings.Contains(err.Error(), c.msg)):
			t.Errorf("%+v: got %v, want %s: ...%s...", c.p, err, c.param, c.msg)
		}
	}
	// Without the vocabulary, token ids are not checked.
	if err := (Params{Temperature: 1, TopP: 1, RepeatPenalty: 1, LogitBias: map[int32]float32{500: 1}}).Check(0); err != nil {
		t.Errorf("Check(0): %v", err)
	}
	// As given and as the float32 the sampler gets: 1e-300 is 0 as a float32.
	if err := CheckParam("top_p", 1e-300); err == nil {
		t.Error("top_p 1e-300 accepted")
	}
	if err := CheckParam("temperature", 1e40); err == nil || !strings.Contains(err.Error(), "1e+40") {
		t.Errorf("temperature 1e40: %v", err)
	}
	if err := CheckParam("nonsense", 1); err == nil {
		t.Error("a parameter without a range was accepted")
	}
}
