package decode

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"

	"github.com/parleyhq/parley/internal/vec"
	"github.com/parleyhq/parley/runtime/backend"
)

// topPFirstSort is how many candidates top-p sorts first when top-k has not already cut the
// vocabulary down; it sorts eight times more each time the probability mass is not reached.
const topPFirstSort = 256

// pcgStream is the second PCG seed word; the first is Params.Seed.
const pcgStream = 0x9e3779b97f4a7c15

var negInf = float32(math.Inf(-1))

// Sampler picks the next token of one sequence from its logits. Build one per sequence with
// NewSampler; Sample, Accept, AcceptPrompt and Reset allocate nothing.
//
// Sample does not record the token it returns: pass it to Accept (after any stop checks) so
// that the penalties see it.
type Sampler struct {
	vocab   int
	greedy  bool
	topK    int     // 0 when off
	topP    float64 // 1 when off
	logMinP float64 // log(MinP); -Inf when off
	invTemp float64
	temp    float32 // Params.Temperature
	minP    float32 // Params.MinP

	repeat    float32
	presence  float32
	frequency float32

	seed uint64
	rng  *rand.PCG

	biasIDs  []int32   // [len(LogitBias)] ascending
	biasVals []float32 // [len(LogitBias)]

	// Repetition window: the last len(ring) accepted tokens, circular. winCount[id] is how
	// often id occurs in ring[:ringLen]. Both nil when the penalty is off.
	ring     []int32 // [RepeatLastN]
	ringLen  int
	ringPos  int
	winCount []int32 // [vocab]

	// Generated-token counts for presence and frequency penalties; nil when both are off.
	genCount []int32 // [vocab]
	genIDs   []int32 // distinct ids with genCount > 0, capacity vocab

	// Logits overwritten by the Sample in progress and their previous values, in order.
	savedIDs  []int32
	savedVals []float32

	cand []candidate // [TopK] or [vocab]; nil when greedy

	// Weights of a draw (float32 exponentials, indexed like the candidates, or by token id for
	// the whole vocabulary) and their sums by blocks of drawBlock; nil when greedy.
	w32  []float32 // [len(cand)], or [vocab] when top-k is off
	bsum []float64 // [len(w32)/drawBlock rounded up]
	// plain: no top-k, top-p or min-p; every draw is drawAll's, over the whole vocabulary.
	plain bool
	// Mass of the candidates by logit below the maximum (pBuckets of 1/pBucketScale each), for
	// top-p without top-k; nil otherwise.
	bmass  []float64
	bcount []int32

	// Logits with a mask applied, for SampleMasked; nil until its first call.
	masked []float32 // [vocab]
}

// drawBlock is how many weights a draw sums at a time before it walks them one by one.
const drawBlock = 64

// pBuckets buckets of 1/pBucketScale of a logit each sort the candidates that top-p reaches
// past the first topPFirstSort: enough that a bucket holds few of a 150,000-token vocabulary.
const (
	pBuckets     = 1024
	pBucketScale = 16
)

// NewSampler validates p for a vocabulary of vocabSize tokens and allocates everything the
// Sampler will need: about 12 bytes per candidate slot (TopK of them, or the whole vocabulary
// when top-k is off and the temperature is positive; plus 24 KiB of buckets for top-p without
// top-k), plus, per vocabulary entry, 4 bytes when the repetition penalty is on and 16 when
// presence or frequency penalties are.
func NewSampler(p Params, vocabSize int) (*Sampler, error) {
	if err := p.Validate(vocabSize); err != nil {
		return nil, err
	}
	s := &Sampler{
		vocab:     vocabSize,
		greedy:    p.Greedy(),
		topP:      float64(p.TopP),
		logMinP:   math.Inf(-1),
		repeat:    p.RepeatPenalty,
		presence:  p.PresencePenalty,
		frequency: p.FrequencyPenalty,
		seed:      p.Seed,
		rng:       rand.NewPCG(p.Seed, p.Seed^pcgStream),
	}
	if p.TopK > 0 && p.TopK < vocabSize {
		s.topK = p.TopK
	}
	if p.MinP > 0 {
		s.logMinP = math.Log(float64(p.MinP))
		s.minP = p.MinP
	}
	if !s.greedy {
		s.invTemp = 1 / float64(p.Temperature)
		s.temp = p.Temperature
	}

	s.biasIDs = make([]int32, 0, len(p.LogitBias))
	for id := range p.LogitBias {
		s.biasIDs = append(s.biasIDs, id)
	}
	slices.Sort(s.biasIDs)
	s.biasVals = make([]float32, len(s.biasIDs))
	for i, id := range s.biasIDs {
		s.biasVals[i] = p.LogitBias[id]
	}

	saved := len(s.biasIDs)
	if p.RepeatPenalty != 1 && p.RepeatLastN > 0 {
		s.ring = make([]int32, p.RepeatLastN)
		s.winCount = make([]int32, vocabSize)
		saved += min(p.RepeatLastN, vocabSize)
	}
	if p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
		s.genCount = make([]int32, vocabSize)
		s.genIDs = make([]int32, 0, vocabSize)
		saved += vocabSize
	}
	s.savedIDs = make([]int32, 0, saved)
	s.savedVals = make([]float32, 0, saved)

	if !s.greedy {
		n := vocabSize
		if s.topK > 0 {
			n = s.topK
		}
		s.cand = make([]candidate, n)
		s.w32 = make([]float32, n)
		s.bsum = make([]float64, (n+drawBlock-1)/drawBlock)
		s.plain = s.topK == 0 && s.topP >= 1 && math.IsInf(s.logMinP, -1)
		if s.topK == 0 && s.topP < 1 {
			s.bmass = make([]float64, pBuckets)
			s.bcount = make([]int32, pBuckets)
		}
	}
	return s, nil
}

// VocabSize is the number of logits Sample expects.
func (s *Sampler) VocabSize() int { return s.vocab }

// Greedy reports whether the Sampler decodes greedily.
func (s *Sampler) Greedy() bool { return s.greedy }

// ArgmaxOnly reports whether every token the Sampler draws is the argmax of the logits as they
// come (greedy, with no logit bias and no penalty that would change them): a caller may then
// find the argmax where the logits are (backend.Argmaxer) instead of calling Sample, and pass the
// id to Accept.
func (s *Sampler) ArgmaxOnly() bool {
	return s.greedy && len(s.biasIDs) == 0 && s.ring == nil && s.genCount == nil
}

// Drawable reports whether a backend may draw this Sampler's tokens where the logits are
// (backend.Drawer) and how: it samples (not greedy) with no logit bias and no penalty, which
// change the logits first. backend.Draw chooses the candidates as Sample does (top-k, top-p and
// min-p at temperature 1) and draws from them at the temperature, but walks them in id order
// with float32 weights, so the same seed may give other tokens than Sample would. The draw's
// Random is left for NextRandom; Accept the drawn token as a sampled one.
func (s *Sampler) Drawable() (backend.Draw, bool) {
	if s.greedy || len(s.biasIDs) > 0 || s.ring != nil || s.genCount != nil {
		return backend.Draw{}, false
	}
	return backend.Draw{Temperature: s.temp, TopK: int32(s.topK), TopP: float32(s.topP), MinP: s.minP}, true
}

// NextRandom consumes and returns the random draw that a Sample call would consume, for a
// backend's draw (backend.Draw.Random): the random stream stays one draw a token either way.
func (s *Sampler) NextRandom() uint64 { return s.rng.Uint64() }

// Sample returns the next token for logits, one per vocabulary entry ([vocab]).
//
// Bias and penalties are written into logits while Sample runs and undone before it returns,
// so on return logits holds exactly what it held on entry (and can still be passed to
// TopLogprobs or Logprob); logits must not be read or written concurrently with Sample.
//
// A NaN or +Inf logit (after bias and penalties) is an error, as is a vocabulary in which every
// token is banned (-Inf). Every non-greedy Sample consumes exactly one random draw, so the
// random stream depends only on the number of calls.
func (s *Sampler) Sample(logits []float32) (int32, error) {
	if len(logits) != s.vocab {
		return -1, fmt.Errorf("decode: %d logits for a vocabulary of %d", len(logits), s.vocab)
	}
	s.adjust(logits)
	var id int32
	var err error
	if s.greedy {
		id, err = argmax(logits)
	} else if s.plain {
		id, err = s.drawAll(logits, float64(s.rng.Uint64()>>11)*0x1p-53)
	} else {
		u := float64(s.rng.Uint64()>>11) * 0x1p-53 // [0, 1)
		var c []candidate
		if c, err = s.filter(logits); err == nil {
			id = s.draw(c, u)
		}
	}
	s.restore(logits)
	if err != nil {
		return -1, err
	}
	return id, nil
}

// SampleMasked is Sample over the tokens that allowed permits: bit id%64 of allowed[id/64] set
// means token id may be drawn (a grammar's mask, for instance). Disallowed tokens get logit -Inf
// before anything else, so logit bias, penalties, top-k, top-p, min-p, temperature and the seeded
// draw all act on the allowed tokens alone, and greedy decoding picks the best allowed one. This
// is llama.cpp's order with the grammar sampler first (common_sampler_sample with
// grammar_first). logits ([vocab]) is not modified: log-probabilities computed from it
// afterwards are of the unmasked distribution, which is what llama.cpp's server reports unless
// post_sampling_probs is set. allowed must hold at least (vocab+63)/64 words; bits past the
// vocabulary are ignored. No allowed token with a logit above -Inf is an error. The first call
// allocates a vocabulary-sized buffer, kept for the next ones; it consumes one random draw, as
// Sample does.
func (s *Sampler) SampleMasked(logits []float32, allowed []uint64) (int32, error) {
	if len(logits) != s.vocab {
		return -1, fmt.Errorf("decode: %d logits for a vocabulary of %d", len(logits), s.vocab)
	}
	if len(allowed) < (s.vocab+63)/64 {
		return -1, fmt.Errorf("decode: mask of %d words for a vocabulary of %d", len(allowed), s.vocab)
	}
	if s.masked == nil {
		s.masked = make([]float32, s.vocab)
		for i := range s.masked {
			s.masked[i] = negInf
		}
	}
	applyMask(s.masked, logits, allowed)
	id, err := s.Sample(s.masked)
	clearMask(s.masked, allowed)
	return id, err
}

// negInfs is a word's worth of -Inf, copied to fill.
var negInfs = func() (w [64]float32) {
	for i := range w {
		w[i] = negInf
	}
	return w
}()

// applyMask copies into dst, which holds -Inf everywhere, the entries of src that mask allows:
// nothing for an empty word, the whole word for a full one, else each set bit, or for a mostly
// set word the whole word then -Inf at each clear bit. The cost is a pass over the mask plus
// the allowed entries.
func applyMask(dst, src []float32, mask []uint64) {
	n := len(src)
	for w := 0; w*64 < n; w++ {
		m := mask[w]
		if m == 0 {
			continue
		}
		lo, hi := w*64, min(w*64+64, n)
		d, x := dst[lo:hi:hi], src[lo:hi:hi]
		if bits.OnesCount64(m) < 48 {
			for m != 0 {
				i := bits.TrailingZeros64(m)
				m &= m - 1
				if i < len(d) {
					d[i] = x[i]
				}
			}
			continue
		}
		copy(d, x)
		for c := ^m; c != 0; {
			i := bits.TrailingZeros64(c)
			c &= c - 1
			if i < len(d) {
				d[i] = negInf
			}
		}
	}
}

// clearMask undoes applyMask, leaving dst all -Inf again.
func clearMask(dst []float32, mask []uint64) {
	n := len(dst)
	for w := 0; w*64 < n; w++ {
		m := mask[w]
		if m == 0 {
			continue
		}
		lo, hi := w*64, min(w*64+64, n)
		d := dst[lo:hi:hi]
		if bits.OnesCount64(m) < 48 {
			for m != 0 {
				i := bits.TrailingZeros64(m)
				m &= m - 1
				if i < len(d) {
					d[i] = negInf
				}
			}
			continue
		}
		copy(d, negInfs[:])
	}
}

// Accept records a generated token for the penalties.
func (s *Sampler) Accept(id int32) error {
	if id < 0 || int(id) >= s.vocab {
		return fmt.Errorf("decode: accepted token %d outside vocabulary [0, %d)", id, s.vocab)
	}
	s.pushWindow(id)
	if s.genCount != nil {
		if s.genCount[id] == 0 {
			s.genIDs = append(s.genIDs, id)
		}
		s.genCount[id]++
	}
	return nil
}

// AcceptPrompt records prompt (or otherwise not generated) tokens, oldest first. They enter
// the repetition-penalty window but not the presence/frequency counts. Nothing is recorded if
// any id is outside the vocabulary.
func (s *Sampler) AcceptPrompt(ids []int32) error {
	for i, id := range ids {
		if id < 0 || int(id) >= s.vocab {
			return fmt.Errorf("decode: prompt token %d (at %d) outside vocabulary [0, %d)", id, i, s.vocab)
		}
	}
	if s.ring == nil {
		return nil
	}
	if len(ids) > len(s.ring) {
		ids = ids[len(ids)-len(s.ring):]
	}
	for _, id := range ids {
		s.pushWindow(id)
	}
	return nil
}

// Reset forgets every accepted token and reseeds the random stream, returning the Sampler to
// the state NewSampler left it in.
func (s *Sampler) Reset() {
	for _, id := range s.ring[:s.ringLen] {
		s.winCount[id] = 0
	}
	s.ringLen, s.ringPos = 0, 0
	for _, id := range s.genIDs {
		s.genCount[id] = 0
	}
	s.genIDs = s.genIDs[:0]
	s.rng.Seed(s.seed, s.seed^pcgStream)
}

func (s *Sampler) pushWindow(id int32) {
	if s.ring == nil {
		return
	}
	if s.ringLen == len(s.ring) {
		s.winCount[s.ring[s.ringPos]]--
	} else {
		s.ringLen++
	}
	s.ring[s.ringPos] = id
	s.winCount[id]++
	if s.ringPos++; s.ringPos == len(s.ring) {
		s.ringPos = 0
	}
}

func (s *Sampler) save(logits []float32, id int32) {
	s.savedIDs = append(s.savedIDs, id)
	s.savedVals = append(s.savedVals, logits[id])
}

// adjust applies logit bias, then the repetition penalty, then presence/frequency penalties,
// in place, recording what it overwrites. Arithmetic is float32, as in llama.cpp.
func (s *Sampler) adjust(logits []float32) {
	for i, id := range s.biasIDs {
		s.save(logits, id)
		logits[id] += s.biasVals[i]
	}
	if s.winCount != nil {
		win := s.ring[:s.ringLen]
		// Each distinct token is penalised once: its count is negated once done, and the
		// signs are restored afterwards.
		for _, id := range win {
			if c := s.winCount[id]; c > 0 {
				s.save(logits, id)
				if v := logits[id]; v > 0 {
					logits[id] = v / s.repeat
				} else {
					logits[id] = v * s.repeat
				}
				s.winCount[id] = -c
			}
		}
		for _, id := range win {
			if c := s.winCount[id]; c < 0 {
				s.winCount[id] = -c
			}
		}
	}
	for _, id := range s.genIDs {
		s.save(logits, id)
		logits[id] -= s.frequency*float32(s.genCount[id]) + s.presence
	}
}

// restore undoes adjust, newest write first, so a token written twice gets its original value.
func (s *Sampler) restore(logits []float32) {
	for i := len(s.savedIDs) - 1; i >= 0; i-- {
		logits[s.savedIDs[i]] = s.savedVals[i]
	}
	s.savedIDs = s.savedIDs[:0]
	s.savedVals = s.savedVals[:0]
}

func nanError(i int) error {
	return fmt.Errorf("decode: logit of token %d is NaN", i)
}

var errAllBanned = fmt.Errorf("decode: every token has logit -Inf")

func posInfError(id int32) error {
	return fmt.Errorf("decode: logit of token %d is +Inf", id)
}

// argmax returns the lowest id holding the largest logit, with the errors of a NaN, a +Inf or
// no logit above -Inf (vector passes: the maximum, then its first place).
func argmax(logits []float32) (int32, error) {
	mx, nan := vec.Max(logits)
	if nan {
		return -1, nanError(firstNaN(logits))
	}
	if mx == negInf {
		return -1, errAllBanned
	}
	best := int32(vec.Index(logits, mx))
	if math.IsInf(float64(mx), 1) {
		return -1, posInfError(best)
	}
	return best, nil
}

// firstNaN returns the index of the first NaN in x, -1 if there is none.
func firstNaN(x []float32) int {
	for i, v := range x {
		if v != v {
			return i
		}
	}
	return -1
}

// filter applies top-k, top-p and min-p to the adjusted logits and returns the surviving
// candidates, which are never empty on success and hold no -Inf logit. They are best-first
// when top-k ran; in id order when neither top-k nor top-p did; after top-p alone, best-first
// unless the cut lay past its first sort (see topPCut).
func (s *Sampler) filter(logits []float32) ([]candidate, error) {
	var c []candidate
	sorted := s.topK > 0
	if sorted {
		var nan int
		if c, nan = topKFromLogits(logits, s.topK, s.cand); nan >= 0 {
			return nil, nanError(nan)
		}
		for len(c) > 0 && c[len(c)-1].logit == negInf {
			c = c[:len(c)-1]
		}
	} else {
		n := 0
		for i, v := range logits {
			if v > negInf {
				s.cand[n] = candidate{int32(i), v}
				n++
			} else if v != v {
				return nil, nanError(i)
			}
		}
		c = s.cand[:n]
	}
	if len(c) == 0 {
		return nil, errAllBanned
	}
	top := c[0]
	if !sorted {
		for _, x := range c[1:] {
			if worse(top, x) {
				top = x
			}
		}
	}
	if math.IsInf(float64(top.logit), 1) {
		return nil, posInfError(top.id)
	}
	mx := float64(top.logit)

	if s.topP < 1 {
		c, sorted = s.topPCut(logits, c, sorted, mx)
	}
	if s.logMinP > math.Inf(-1) {
		if sorted {
			n := 1 // the best candidate always passes
			for n < len(c) && float64(c[n].logit)-mx >= s.logMinP {
				n++
			}
			c = c[:n]
		} else {
			n := 0
			for _, x := range c {
				if float64(x.logit)-mx >= s.logMinP {
					c[n] = x
					n++
				}
			}
			c = c[:n]
		}
	}
	return c, nil
}

// topPCut returns the shortest best-first prefix of c whose softmax probabilities (at
// temperature 1, over c) sum to at least topP, and whether it is in best-first order. mx is the
// largest logit in c. When top-k has cut c (sorted), it sums float64 exponentials. Otherwise c
// is every token not banned, in id order, and the probabilities come from float32
// exponentials of the whole vocabulary (vec.ExpSum): the first topPFirstSort candidates are
// sorted and summed one by one; if they do not reach topP, the rest are bucketed by logit, the
// buckets above the one that reaches it are kept whole (in no particular order: the cut is then
// not sorted) and only that bucket is sorted and summed one by one.
func (s *Sampler) topPCut(logits []float32, c []candidate, sorted bool, mx float64) ([]candidate, bool) {
	if sorted {
		sum := 0.0
		for _, x := range c {
			sum += math.Exp(float64(x.logit) - mx)
		}
		cum := 0.0
		for i, x := range c {
			cum += math.Exp(float64(x.logit)-mx) / sum
			if cum >= s.topP {
				return c[:i+1], true
			}
		}
		return c, true
	}
	w := s.w32
	copy(w, logits)
	target := s.topP * vec.ExpSum(w, float32(mx)) // w[id] = e^(logit - mx); 0 for banned ids
	n := len(c)
	m := min(topPFirstSort, n)
	partialSort(c, m)
	cum := 0.0
	for i := 0; i < m; i++ {
		if cum += float64(w[c[i].id]); cum >= target {
			return c[:i+1], true
		}
	}
	if m == n {
		return c, true
	}
	mx32 := float32(mx)
	bucket := func(l float32) int { // float64: a gap past 2^63/pBucketScale (or an infinite one) is the last bucket
		if d := (float64(mx32) - float64(l)) * pBucketScale; d < pBuckets-1 {
			return int(d)
		}
		return pBuckets - 1
	}
	rest := c[m:]
	clear(s.bmass)
	clear(s.bcount)
	for _, x := range rest {
		b := bucket(x.logit)
		s.bmass[b] += float64(w[x.id])
		s.bcount[b]++
	}
	whole, cut := 0, -1 // candidates in the buckets kept whole; the bucket that reaches topP
	for b, bm := range s.bmass {
		if cum+bm >= target {
			cut = b
			break
		}
		cum += bm
		whole += int(s.bcount[b])
	}
	if cut < 0 { // the float64 sums fell short of target by rounding: keep everything
		return c, false
	}
	// rest: the whole buckets first, then the cut bucket, best first, then the others
	i := 0
	for j, x := range rest {
		if bucket(x.logit) < cut {
			rest[i], rest[j] = x, rest[i]
			i++
		}
	}
	j := whole
	for k := whole; k < len(rest); k++ {
		if bucket(rest[k].logit) == cut {
			rest[j], rest[k] = rest[k], rest[j]
			j++
		}
	}
	edge := rest[whole:j]
	slices.SortFunc(edge, func(a, b candidate) int {
		if worse(b, a) {
			return -1
		}
		if worse(a, b) {
			return 1
		}
		return 0
	})
	for k, x := range edge {
		if cum += float64(w[x.id]); cum >= target {
			return c[:m+whole+k+1], false
		}
	}
	return c[:m+j], false
}

// drawAll is filter and draw for a sampler that filters nothing (no top-k, top-p or min-p, the
// OpenAI API's defaults): it picks token i with probability softmax(logits/T)_i using u in
// [0, 1), with the same errors as filter, from the whole vocabulary's weights.
func (s *Sampler) drawAll(logits []float32, u float64) (int32, error) {
	best, err := argmax(logits)
	if err != nil {
		return -1, err
	}
	vec.ExpSum(s.w32, s.scaled(s.w32, logits, logits[best]))
	return int32(pick(s.w32, s.bsum, u)), nil
}

// scaled sets w[i] to the exponent of l[i]'s weight, (l[i] - mx) / T, less the m it returns (for
// vec.ExpSum(w, m)); mx is the largest of l. Usually w[i] = l[i]·(1/T) and m = mx·(1/T), in
// float32. Where that could overflow or lose precision, a temperature near 0 (1/T past float32's
// range), a huge one (1/T subnormal) or a largest tempered logit past half float32's range, w[i]
// is the difference itself, computed in float64, and m is 0: the exponents then only reach
// -Inf, a weight of 0, never +Inf or NaN. -Inf logits stay -Inf.
func (s *Sampler) scaled(w, l []float32, mx float32) (m float32) {
	it := float32(s.invTemp)
	w = w[:len(l)]
	if m = mx * it; it >= 0x1p-126 && it <= math.MaxFloat32 && m >= -math.MaxFloat32/2 && m <= math.MaxFloat32/2 {
		// Four a pass: a full-vocabulary draw at 32,000 took 47 µs this way, 51 µs with one
		// product a pass (medians, alternated runs). A product that overflows lies below m by
		// at least half float32's range: a weight of 0.
		i := 0
		for ; i+4 <= len(l); i += 4 {
			a, b := l[i:i+4:i+4], w[i:i+4:i+4]
			b[0], b[1], b[2], b[3] = a[0]*it, a[1]*it, a[2]*it, a[3]*it
		}
		for ; i < len(l); i++ {
			w[i] = l[i] * it
		}
		return m
	}
	for i, v := range l {
		w[i] = float32((float64(v) - float64(mx)) * s.invTemp)
	}
	return 0
}

// draw picks one of c with probability softmax(logit/T) using u in [0, 1).
func (s *Sampler) draw(c []candidate, u float64) int32 {
	mx := c[0].logit
	for _, x := range c[1:] {
		mx = max(mx, x.logit)
	}
	w := s.w32[:len(c)]
	for i, x := range c {
		w[i] = x.logit
	}
	vec.ExpSum(w, s.scaled(w, w, mx))
	return c[pick(w, s.bsum, u)].id
}

// pick returns i with probability w[i]/Σw using u in [0, 1), for weights w of which at least
// one is above 0 (float32 exponentials: vec.ExpSum, within a few ulp of e^x). bsum holds at
// least len(w)/drawBlock (rounded up) sums. The total is the sum of the blocks' sums in order,
// and the walk adds the same sums in the same order, so it reaches the block that holds u·total;
// walked one by one, that block's weights may by rounding stop short of it, and its last weight
// above 0 is taken then: never a weight of 0.
func pick(w []float32, bsum []float64, u float64) int {
	nb := (len(w) + drawBlock - 1) / drawBlock
	bsum = bsum[:nb]
	total := 0.0
	for b := range bsum {
		blk := w[b*drawBlock : min((b+1)*drawBlock, len(w))]
		var a0, a1, a2, a3 float64
		i := 0
		for ; i+4 <= len(blk); i += 4 {
			a0 += float64(blk[i])
			a1 += float64(blk[i+1])
			a2 += float64(blk[i+2])
			a3 += float64(blk[i+3])
		}
		for ; i < len(blk); i++ {
			a0 += float64(blk[i])
		}
		bsum[b] = (a0 + a1) + (a2 + a3)
		total += bsum[b]
	}
	target := u * total
	run := 0.0
	for b, bs := range bsum {
		if run+bs <= target {
			run += bs
			continue
		}
		last := -1
		for i := b * drawBlock; i < min((b+1)*drawBlock, len(w)); i++ {
			if w[i] > 0 {
				last = i
				if run += float64(w[i]); run > target {
					return i
				}
			}
		}
		return last
	}
	return len(w) - 1 // not reached: u < 1 and the last block takes run to total
}
