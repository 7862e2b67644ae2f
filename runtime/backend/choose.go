package backend

import (
	"fmt"
	"math"

	"github.com/parleyhq/parley/internal/vec"
	"github.com/parleyhq/parley/runtime/tensor"
)

// MaxChooseK is the most tokens Choose reports a row.
const MaxChooseK = tensor.MaxChooseK

// Choice says how a row of a decoder's logits is filtered before its best tokens are chosen
// (Chooser); see tensor.Choice, which the native bindings share.
type Choice = tensor.Choice

// Chosen is what Choose reports of a row besides its tokens (tensor.Chosen).
type Chosen = tensor.Chosen

// Chooser is implemented by backends that choose a decoder's tokens where the logits are (on a
// GPU, only the chosen ids and their log-probabilities leave the device). Choose waits for the
// logits, then filters row row0+i of logits (F32) as choices[i] says and writes its k most
// probable tokens, the most probable first (the lower id first among equal ones), or the one
// token drawn where choices[i] has a temperature, into ids[i*k:(i+1)*k] and their
// log-probabilities into logp[i*k:(i+1)*k] (-1 and -Inf past the tokens found), and the rest of
// what it found into rows[i]. Its answers are ChooseRows', up to the order in which float sums
// are added (a token whose rank or draw, or a group whose forcing, depends on the last bits of a
// sum may differ).
type Chooser interface {
	Choose(logits Tensor, row0 int, choices []Choice, drop []int32, k int, rows []Chosen, ids []int32, logp []float32) error
}

// CheckChoices reports an error for choices over rows of cols logits, with the drop list drop
// and k tokens a row, that are out of range (tensor.CheckChoices).
func CheckChoices(choices []Choice, drop []int32, cols, k int) error {
	return tensor.CheckChoices(choices, drop, cols, k)
}

// FilterRow applies c's filters to x in place and turns it into log-probabilities, as Choose
// does before choosing (x may have been scaled by a temperature first). It returns false, leaving
// x filtered but otherwise as it was, when the filtered row holds a NaN or +Inf or no value above
// -Inf. c must have passed CheckChoices for rows of len(x).
func FilterRow(x []float32, c Choice, drop []int32) bool {
	ninf := float32(math.Inf(-1))
	for _, r := range c.Cut {
		for i := r[0]; i < r[1]; i++ {
			x[i] = ninf
		}
	}
	for _, id := range drop[c.Drop[0]:c.Drop[1]] {
		x[id] = ninf
	}
	if !logSoftmax(x) {
		return false
	}
	s := int(c.Split)
	if s >= len(x) {
		return true
	}
	mx, _ := vec.Max(x[s:])
	group := ninf
	if sum := vec.SumExp(x[s:], mx); sum > 0 {
		group = float32(math.Log(sum)) + mx
	}
	if below, _ := vec.Max(x[:s]); group > below {
		for i := range x[:s] {
			x[i] = ninf
		}
	}
	return true
}

// logSoftmax turns x into log-probabilities in place, and returns false, leaving x as it is, when
// it holds a NaN or no finite maximum: float32 exponentials after subtracting the maximum, summed
// in float64 (whisper.cpp sums in float32 in id order; over 51864 tokens that sum is the less
// accurate, by about 1e-5 relative).
func logSoftmax(x []float32) bool {
	lse, ok := logSumExp(x)
	if !ok {
		return false
	}
	ninf := float32(math.Inf(-1))
	for i, v := range x {
		if v > ninf {
			x[i] = v - lse
		}
	}
	return true
}

// logSumExp is log Σ exp(x) as logSoftmax takes it, false when x holds a NaN or no finite
// maximum.
func logSumExp(x []float32) (float32, bool) {
	mx, nan := vec.Max(x)
	if nan || math.IsInf(float64(mx), 0) {
		return 0, false
	}
	return float32(math.Log(vec.SumExp(x, mx))) + mx, true
}

// ChooseRows is Chooser's rule on the host, over len(choices) rows of cols values in x (which it
// overwrites: each row is left filtered, as log-probabilities).
func ChooseRows(x []float32, cols int, choices []Choice, drop []int32, k int, rows []Chosen, ids []int32, logp []float32) error {
	n := len(choices)
	if cols <= 0 || len(x) != n*cols || len(rows) != n || len(ids) != n*k || len(logp) != n*k {
		return fmt.Errorf("choose: %d values, %d row reports, %d ids and %d log-probabilities for %d rows of %d, %d tokens each",
			len(x), len(rows), len(ids), len(logp), n, cols, k)
	}
	if err := CheckChoices(choices, drop, cols, k); err != nil {
		return err
	}
	ninf := float32(math.Inf(-1))
	for i, c := range choices {
		row := x[i*cols : (i+1)*cols]
		id, lp := ids[i*k:(i+1)*k], logp[i*k:(i+1)*k]
		for j := range id {
			id[j], lp[j] = -1, ninf
		}
		r := Chosen{N: -1, Group: -1}
		ok := true
		if c.Probe >= 0 {
			var lse float32
			lse, ok = logSumExp(row)
			r.Probe = row[c.Probe] - lse
		}
		if ok && c.Temperature > 0 {
			ScaleRow(row, c.Temperature)
		}
		if !ok || !FilterRow(row, c, drop) {
			rows[i] = Chosen{N: -1, Group: -1}
			continue
		}
		r.Group, r.Share = groupStats(row, int(c.Split))
		if c.Temperature > 0 {
			id[0], lp[0] = drawToken(row, c.Random)
			r.N = 1
		} else {
			r.N = int32(topTokens(row, id, lp))
		}
		rows[i] = r
	}
	return nil
}

// ScaleRow divides x by temp (above 0) in place, first taking it relative to its largest value
// where that value divided would overflow (the softmax is the same; the rest fall towards -Inf
// instead of the largest becoming +Inf). 1/temp is capped at the largest float32.
func ScaleRow(x []float32, temp float32) {
	inv := min(1/temp, math.MaxFloat32)
	shift := float32(0)
	if mx, _ := vec.Max(x); math.IsInf(float64(mx*inv), 1) {
		shift = mx
	}
	for i, v := range x {
		x[i] = (v - shift) * inv
	}
}

// drawToken draws from log-probabilities lp (one above -Inf at least) as Choice says, with the
// uniform of random, and returns the token and its log-probability.
func drawToken(lp []float32, random uint64) (int32, float32) {
	u := float64(random<<11>>11) / (1 << 53)
	r := u * vec.SumExp(lp, 0)
	id := len(lp) - 1
	for i, v := range lp {
		r -= float64(vec.Expf(v))
		if r < 0 {
			id = i
			break
		}
	}
	for math.IsInf(float64(lp[id]), -1) && id > 0 { // rounding at the tail
		id--
	}
	return int32(id), lp[id]
}

// groupStats returns the most probable id of lp[split:] (the first of equal ones; -1 when all
// are 0 as float32 probabilities) and its share of their total, summed in float64.
func groupStats(lp []float32, split int) (int32, float32) {
	var sum, mx float64
	best := int32(-1)
	for i := split; i < len(lp); i++ {
		p := float64(vec.Expf(lp[i]))
		sum += p
		if p > mx {
			mx, best = p, int32(i)
		}
	}
	return best, float32(mx / (sum + 1e-10))
}

// topTokens writes the len(ids) largest values of lp above -Inf, largest first (the lower id
// first among equal ones), with their ids, and returns how many there were.
func topTokens(lp []float32, ids []int32, vals []float32) int {
	k, n := len(ids), 0
	for i, v := range lp {
		if n == k && v <= vals[k-1] || math.IsInf(float64(v), -1) {
			continue
		}
		pos := n
		if n < k {
			n++
		} else {
			pos = k - 1
		}
		for pos > 0 && vals[pos-1] < v {
			ids[pos], vals[pos] = ids[pos-1], vals[pos-1]
			pos--
		}
		ids[pos], vals[pos] = int32(i), v
	}
	return n
}
