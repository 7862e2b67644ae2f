package tensor

import (
	"fmt"
	"math"
)

// Draw says how a row's token is chosen where the logits are (backend.Drawer). Temperature 0
// takes the argmax, as backend.Argmaxer does (the other fields are not read; the zero Draw is the
// argmax). Above 0 the token is drawn as llama.cpp's sampler chain draws it: the candidates are
// chosen at temperature 1, the TopK largest logits (0: all; ties at the boundary all kept), then
// the smallest top set of those whose mass exp(x - max x) is at least TopP (in (0, 1]) of theirs,
// then those at least MinP (in [0, 1]; 0: off) times as likely as the most likely (x >= max x +
// log MinP, in float32); the token is then drawn from the candidates with weights
// exp((x - max x)/Temperature): with u = (Random >> 40)·2^-24 in [0, 1), the first candidate, in
// id order, at which the running weight exceeds u times the candidates' total. A row that holds
// a NaN or +Inf, or no logit above -Inf, gets -1.
//
// The layout is the CUDA library's plc_draw_row, so that a slice of Draws goes to the device as
// it is.
type Draw struct {
	Temperature float32
	TopK        int32
	TopP        float32
	MinP        float32
	Random      uint64
}

// CheckDraws reports an error for a draw whose parameters are out of range.
func CheckDraws(draws []Draw) error {
	for i, d := range draws {
		t := float64(d.Temperature)
		if t == 0 {
			continue // the argmax: nothing else is read
		}
		if !(t > 0) || math.IsInf(t, 0) || d.TopK < 0 || !(d.TopP > 0 && d.TopP <= 1) || !(d.MinP >= 0 && d.MinP <= 1) {
			return fmt.Errorf("draw %d: temperature %v, top-k %d, top-p %v, min-p %v out of range", i, d.Temperature, d.TopK, d.TopP, d.MinP)
		}
	}
	return nil
}

// MaxChooseK is the most tokens a choice (backend.Chooser) reports a row.
const MaxChooseK = 64

// Choice says how a row of a decoder's logits is filtered before its best tokens are chosen
// (backend.Chooser): the rules by which a speech decoder such as Whisper's suppresses tokens and
// forces timestamps, stated as data so that a backend can apply them where the logits are.
//
// Filtering sets to -Inf the ids of every Cut range [lo, hi) (lo >= hi: none) and those listed
// in drop[Drop[0]:Drop[1]] (drop: the call's list), then takes the row's log-softmax (exp(x - max)
// in float32, summed in float64 on the host). The ids from Split up form a group (Whisper's
// timestamp tokens; Split = the row's length: none): when the group's total probability is above
// that of every id below Split, the ids below Split are set to -Inf (the log-probabilities of the
// others are not renormalised). Probe, when not -1, is an id whose log-probability in the row as
// it came, before any filter, is reported (Whisper's no-speech probability).
//
// Temperature, when above 0, divides the row before it is filtered (after the probe; the row is
// first taken relative to its largest value where dividing would overflow), and one token is
// drawn instead of the k best: with u = (Random mod 2^53)·2^-53 (math/rand/v2's Float64 of the
// same draw), the first id at which the running sum of exp(log-probability), in id order,
// exceeds u times their total (the last id above -Inf where rounding leaves none).
//
// The layout is the CUDA library's plc_choice, so that a slice of Choices goes to the device as
// it is.
type Choice struct {
	Cut         [4][2]int32
	Drop        [2]int32
	Split       int32
	Probe       int32
	Temperature float32
	Random      uint64
}

// Chosen is what a choice reports of a row besides its tokens. The layout is the CUDA library's
// plc_chosen.
type Chosen struct {
	// N is the number of tokens found (at most k: fewer when fewer are above -Inf after
	// filtering; 1 for a draw), or -1 for a row that holds a NaN or +Inf or no value above -Inf (before
	// filtering, when the row has a Probe; after, otherwise), or whose filtered log-softmax does.
	N int32
	// Group is the most probable id of the group (the lowest among equal probabilities), -1 when
	// the row has no group or every id in it has probability 0 in float32; Share is its
	// probability over the group's total plus 1e-10 (whisper.cpp's tid and pt).
	Group int32
	Share float32
	// Probe is the log-probability of Choice.Probe before filtering (0 without a probe).
	Probe float32
}

// CheckChoices reports an error for choices over rows of cols logits, with the drop list drop
// and k tokens a row, that are out of range.
func CheckChoices(choices []Choice, drop []int32, cols, k int) error {
	if cols <= 0 || k < 1 || k > MaxChooseK || k > cols {
		return fmt.Errorf("choose: %d tokens from rows of %d (at most %d)", k, cols, MaxChooseK)
	}
	for i, id := range drop {
		if id < 0 || int(id) >= cols {
			return fmt.Errorf("choose: drop list entry %d is id %d, outside rows of %d", i, id, cols)
		}
	}
	for i, c := range choices {
		for _, r := range c.Cut {
			if r[0] < r[1] && (r[0] < 0 || int(r[1]) > cols) {
				return fmt.Errorf("choose: row %d cuts ids [%d, %d) of %d", i, r[0], r[1], cols)
			}
		}
		if c.Drop[0] < 0 || c.Drop[0] > c.Drop[1] || int(c.Drop[1]) > len(drop) {
			return fmt.Errorf("choose: row %d drops entries [%d, %d) of a list of %d", i, c.Drop[0], c.Drop[1], len(drop))
		}
		if c.Split < 0 || int(c.Split) > cols {
			return fmt.Errorf("choose: row %d splits at id %d of %d", i, c.Split, cols)
		}
		if c.Probe < -1 || int(c.Probe) >= cols {
			return fmt.Errorf("choose: row %d probes id %d of %d", i, c.Probe, cols)
		}
		if t := float64(c.Temperature); !(t >= 0) || math.IsInf(t, 1) {
			return fmt.Errorf("choose: row %d has temperature %v", i, c.Temperature)
		}
	}
	return nil
}

// FlatSeq is one sequence of an attention batch as the native kernels take it (the C structs
// pl_seq and plc_seq, field for field): tokens [Start, Start+Count) of the batch, at positions
// CtxLen-Count .. CtxLen-1, whose block table is entries [BlocksOff, BlocksOff+NBlocks) of one
// array that holds the tables of every sequence of the batch.
type FlatSeq struct {
	Start, Count, CtxLen int32
	BlocksOff, NBlocks   int32
}
