package decode

import (
	"fmt"
	"math"

	"github.com/parleyhq/parley/internal/vec"
)

// TDT is the greedy decision rule of a Token-and-Duration Transducer, and without durations of a
// plain RNN-T, as whisper.cpp's parakeet_decode applies it (src/parakeet.cpp:2496-2635 at
// 233fe1f). It only decides: the caller computes each joint row (token logits for ids 0..Blank,
// the blank last, then one logit per duration) at the frame TDTState.Frame names, and runs the
// prediction network on every emitted token. The loop is
//
//	s := TDTState{}                 // frame 0; the prediction network has run on the blank
//	for s.Frame < frames {
//		row := joint(enc[s.Frame], pred)
//		st, _ := rule.Step(&s, row)
//		if st.Emit {
//			emit(st); pred = predict(st.Token)
//		}
//	}
//
// Each step takes k, the first maximum of the token logits, and d, the first maximum of the
// duration logits (dur = Durations[d]). A blank moves the frame on by max(dur, 1) and resets the
// count of zero-duration tokens; any other token is emitted at the frame, and then the frame
// moves on by dur if dur > 0 (resetting the count), else the count grows and, when it reaches
// MaxSymbols, the frame moves on by one. Without durations dur is 0: a blank moves on one frame
// and at most MaxSymbols tokens are emitted per frame, NeMo's RNN-T greedy rule.
//
// A TDT is immutable and can be shared; each hypothesis holds its own TDTState, so beam search
// can keep several. Step allocates nothing.
type TDT struct {
	Blank      int32 // the blank's id, the last token logit: a row starts with Blank+1 token logits
	Durations  []int // frames each duration output advances; empty for an RNN-T
	MaxSymbols int   // zero-duration tokens emitted at one frame before the frame is forced on
}

// TDTState is where one hypothesis stands: the encoder frame the next joint call reads and the
// zero-duration tokens emitted there so far. The zero value starts a clip at frame 0.
type TDTState struct {
	Frame int
	run   int
}

// TDTStep is one decision.
type TDTStep struct {
	Frame  int   // the frame the row was computed at, where an emitted token belongs
	Token  int32 // the first maximum of the token logits; Blank for a blank
	DurIdx int   // the first maximum of the duration logits (0 for an RNN-T)
	Dur    int   // Durations[DurIdx] (0 for an RNN-T), as chosen; a blank advances at least one
	Emit   bool  // Token is not the blank: the caller emits it and advances the prediction network
	// P and PLog are set for an emitted token as whisper.cpp reports them (create_token_data,
	// parakeet.cpp:2466): P is its softmax probability over the token logits, PLog its
	// log-softmax over the whole row, duration logits included (not NeMo's token log-probability).
	P, PLog float32
}

// Width is the length of a joint row: Blank+1 token logits and one per duration.
func (c *TDT) Width() int { return int(c.Blank) + 1 + len(c.Durations) }

// Validate checks the rule's parameters.
func (c *TDT) Validate() error {
	if c.Blank < 0 || c.MaxSymbols < 1 {
		return fmt.Errorf("decode: TDT: blank %d, max symbols %d (want ≥ 0 and ≥ 1)", c.Blank, c.MaxSymbols)
	}
	for i, d := range c.Durations {
		if d < 0 {
			return fmt.Errorf("decode: TDT: duration %d is negative (%d)", i, d)
		}
	}
	return nil
}

// Step decides on row, the joint output at s.Frame, and moves s on. It fails, leaving s as it
// was, when row is not Width() long, or when its token logits, or its duration logits, are all
// NaN.
func (c *TDT) Step(s *TDTState, row []float32) (TDTStep, error) {
	if len(row) != c.Width() {
		return TDTStep{}, fmt.Errorf("decode: TDT: a joint row of %d logits, want %d (%d tokens, the blank, %d durations)",
			len(row), c.Width(), c.Blank, len(c.Durations))
	}
	nTok := int(c.Blank) + 1
	k := firstMax(row[:nTok])
	if k < 0 {
		return TDTStep{}, fmt.Errorf("decode: TDT: the token logits at frame %d are all NaN", s.Frame)
	}
	st := TDTStep{Frame: s.Frame, Token: int32(k)}
	if len(c.Durations) > 0 {
		d := firstMax(row[nTok:])
		if d < 0 {
			return TDTStep{}, fmt.Errorf("decode: TDT: the duration logits at frame %d are all NaN", s.Frame)
		}
		st.DurIdx, st.Dur = d, c.Durations[d]
	}
	if st.Token == c.Blank {
		s.Frame += max(st.Dur, 1)
		s.run = 0
		return st, nil
	}
	st.Emit = true
	// z[k] is the largest token logit: p = 1 / Σ_{j≤Blank} exp(z[j] - z[k]).
	st.P = float32(1 / vec.SumExp(row[:nTok], row[k]))
	st.PLog = float32(float64(row[k]) - LogSumExp(row))
	if st.Dur > 0 {
		s.Frame += st.Dur
		s.run = 0
		return st, nil
	}
	s.run++
	if s.run >= c.MaxSymbols {
		s.Frame++
		s.run = 0
	}
	return st, nil
}

// firstMax returns the index of the first largest value of x, NaN never counting; -1 if x is
// empty or all NaN. (whisper.cpp starts from -1e10 with index 0, which differs only for rows
// whose every value is at most -1e10.)
func firstMax(x []float32) int {
	best, bi := float32(math.Inf(-1)), -1
	for i, v := range x {
		if v > best || (bi < 0 && v == v) {
			best, bi = v, i
		}
	}
	return bi
}
