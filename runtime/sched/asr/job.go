package asr

import (
	"math"
	"math/rand/v2"
	"strings"

	"github.com/parleyhq/parley/internal/vec"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/whisper"
)

// Frame arithmetic: mel frames are 10 ms; a timestamp token step is 20 ms (2 frames).
const (
	deltaMin    = 10 // frames: windows closer than this to the end are not decoded
	framesPerTS = 2
)

// silenceLevel is the silence gate's threshold: a window none of whose samples reaches it in
// magnitude (on the [-1, 1] scale: -60 dBFS) is not decoded and gives no segment, as if decoded
// to nothing. Such a window holds digital silence, dither or an idle input's noise floor, for
// which Whisper makes text up ("Thank you.", "you"); recorded speech peaks tens of decibels
// above it. whisper.cpp has no such gate: it decodes every window and leaves a silent one to
// its no-speech and log-probability thresholds, which small and random-weight models pass. A
// window with one sample at the threshold is decoded as whisper.cpp decodes it; after a skipped
// window the next begins a window later, where whisper.cpp's begins when it decodes the silent
// one to no text.
const silenceLevel = 1e-3

type phase int

const (
	phEncode phase = iota // the window at seek needs the encoder
	phDetect              // decoding [sot] to detect the language
	phPrompt              // feeding the window's prompt
	phDecode              // stepping the hypotheses
	phDone
	phScan // waiting for the first pass over the audio (features.scan)
)

// hyp is one decoder of a window: a beam, or one of best-of samples.
type hyp struct {
	seq       *kvcache.Seq
	spare     *kvcache.Seq // reused when beams are reordered
	tokens    []tokData
	next      []tokData // the tokens of the next step while beams are reordered
	pending   []int32   // tokens to feed at the next step
	row       int       // row of the last step: of the logits read, or of those chosen (picked)
	picked    bool      // the decoder chose the last step's tokens
	sumAll    float64   // sum of plog over all tokens
	resultLen int
	seekDelta int
	hasTS     bool
	failed    bool
	completed bool
	rng       *rand.Rand
	// scores after the window
	sumLogprobs, avgLogprobs, score, entropy float64
}

type tokData struct {
	id      int32
	p, plog float32
	tid     int32 // most probable timestamp token
	pt      float32
}

func (h *hyp) live() bool { return !h.failed && !h.completed }

// newHyp makes a hypothesis with room for a whole window, so that decoding never grows it.
func (e *Whisper) newHyp() *hyp {
	n := e.m.TextCtx
	return &hyp{seq: e.dec.Pool().NewSeq(n), spare: e.dec.Pool().NewSeq(n),
		tokens: make([]tokData, 0, n), next: make([]tokData, 0, n), pending: make([]int32, 0, n)}
}

// job is one transcription in the Whisper scheduler.
type job struct {
	request
	p    Params
	feat *features

	nSamples int // of the audio
	// loud has bit h set where hop h (10 ms, a mel frame's step) of the audio holds a sample at
	// silenceLevel or above (loudHops); nil, no silence gate.
	loud []uint64

	seek, seekEnd int
	encSince      uint64 // the step since which the window at seek waits for its encoder
	encPicked     bool   // its window is in the encoder call in progress
	lang          int32  // language token, or -1
	langCode      string
	promptPast    []int32
	promptInit    []int32
	prompt        []int32
	temps         []float32
	tempIdx       int
	cross         *whisper.Cross
	hyps          []*hyp
	nHyp          int     // decoders of the current attempt
	step          int     // tokens sampled in the current attempt
	noSpeech      float32 // no-speech probability of the window
	ph            phase

	segments  []Segment
	onSegment func(Segment)

	detectOnly bool // stop after language detection
	langOnly   bool // nothing to decode: detect the language on the first window, then stop
	langProbs  []LangProb
}

// attempt resets the hypotheses for decoding the current window at temps[tempIdx].
func (e *Whisper) attempt(j *job) {
	t := j.temps[j.tempIdx]
	n := 1
	if t > 0 {
		n = j.p.BestOf
	} else if j.p.BeamSize > 1 {
		n = j.p.BeamSize
	}
	j.nHyp = n
	for len(j.hyps) < n {
		j.hyps = append(j.hyps, e.newHyp())
	}
	for i, h := range j.hyps {
		h.seq.Release()
		h.tokens = h.tokens[:0]
		h.pending = h.pending[:0]
		h.sumAll, h.resultLen, h.seekDelta = 0, 0, 100*30
		h.hasTS, h.failed, h.completed = false, i >= n, false
		h.sumLogprobs, h.avgLogprobs, h.score, h.entropy = math.Inf(-1), math.Inf(-1), math.Inf(-1), 0
		h.rng = rand.New(rand.NewPCG(j.p.Seed, uint64(i)<<32|uint64(j.seek)))
	}
	j.prompt = j.prompt[:0]
	if len(j.promptPast) > 0 && t < 0.5 {
		take := min(e.m.TextCtx/2, len(j.promptPast))
		j.prompt = append(j.prompt, e.tok.Prev)
		j.prompt = append(j.prompt, j.promptPast[len(j.promptPast)-take:]...)
	}
	j.prompt = append(j.prompt, j.promptInit...)
	j.hyps[0].pending = append(j.hyps[0].pending, j.prompt...)
	j.step = 0
	j.ph = phPrompt
}

// setupPrompt builds the start-of-transcript sequence once the language is known.
func (e *Whisper) setupPrompt(j *job) {
	j.promptInit = e.tok.AppendPrompt(j.promptInit[:0], j.lang, j.p.Translate, j.p.NoTimestamps)
}

// choice states whisper.cpp's logit filters for hypothesis h's next token as a backend.Choice:
// the blank tokens at a window's first step, the tokens never produced, the non-speech symbols
// where asked, and the timestamp rules (none without timestamps; after a timestamp, text only if
// the one before was one too, else timestamps or end of text; the first timestamp at most
// MaxInitialTimestamp; timestamps never going back), with the timestamps as the group that is
// forced when together more probable than any text token. The prompt's step probes the
// no-speech token.
func (e *Whisper) choice(j *job, h *hyp) backend.Choice {
	tk := e.tok
	V := int64(e.m.NVocab)
	beg := min(int64(tk.TimestampBegin), V)
	c := backend.Choice{Split: int32(beg), Probe: -1}
	if j.ph == phPrompt {
		c.Probe = tk.NoSpeech
	}
	initial := len(h.tokens) == 0
	lo, hi := e.nBlank, e.nBlank+e.nAlways
	if j.p.SuppressBlank && initial {
		lo = 0
	}
	if j.p.SuppressNonSpeech {
		hi = len(e.drop)
	}
	c.Drop = [2]int32{int32(lo), int32(hi)}
	nc := 0
	cut := func(a, b int64) {
		c.Cut[nc] = [2]int32{int32(min(a, V)), int32(min(b, V))}
		nc++
	}
	if j.p.NoTimestamps {
		cut(beg, V)
	}
	if n := len(h.tokens); n > 0 && int64(h.tokens[n-1].id) >= beg {
		if n < 2 || int64(h.tokens[n-2].id) >= beg {
			cut(beg, V)
		} else {
			cut(0, int64(tk.EOT))
		}
	}
	if initial && j.p.MaxInitialTimestamp > 0 && !j.p.NoTimestamps {
		tid0 := min(math.Round(float64(j.p.MaxInitialTimestamp)/0.02), float64(V))
		cut(beg+int64(tid0)+1, V)
	}
	if h.hasTS {
		cut(beg, beg+int64(h.seekDelta/2))
	}
	return c
}

// dropList makes the decoder's drop list for a vocabulary of nVocab tokens (Whisper.drop): the
// blank tokens, those never produced, then the non-speech symbols (ids outside the vocabulary
// left out).
func dropList(tk *whisper.Vocab, nVocab int) (drop []int32, nBlank, nAlways int) {
	add := func(ids ...int32) int {
		n := 0
		for _, id := range ids {
			if id >= 0 && int(id) < nVocab {
				drop = append(drop, id)
				n++
			}
		}
		return n
	}
	nBlank = add(tk.EOT, tk.Space)
	nAlways = add(tk.Suppressed()...)
	add(tk.NonSpeech()...)
	return drop, nBlank, nAlways
}

// token makes the token data of id, of log-probability plog, from its row's timestamp
// statistics.
func (e *Whisper) token(id int32, plog float32, tid int32, pt float32) tokData {
	d := tokData{id: id, plog: plog, p: vec.Expf(plog), tid: tid, pt: pt}
	if d.id >= e.tok.TimestampBegin {
		d.tid, d.pt = d.id, d.p
	}
	return d
}

// chosenTokens returns the first n of the tokens the decoder chose for h's row (fewer where it
// found fewer), most probable first.
func (e *Whisper) chosenTokens(h *hyp, n int, out []tokData) []tokData {
	r := e.chosen[h.row]
	out = out[:0]
	for i := range min(n, int(r.N)) {
		at := h.row*e.chK + i
		out = append(out, e.token(e.chIDs[at], e.chLogp[at], r.Group, r.Share))
	}
	return out
}

// accept applies whisper.cpp's end-of-window rules after token d was appended to h at step i.
func (e *Whisper) accept(j *job, h *hyp, i int) {
	d := h.tokens[len(h.tokens)-1]
	beg := e.tok.TimestampBegin
	if d.id > beg {
		sd := framesPerTS * int(d.id-beg)
		if h.hasTS && h.seekDelta > sd && h.resultLen < i {
			h.failed = true
			return
		}
		h.seekDelta, h.resultLen, h.hasTS = sd, i+1, true
	}
	maxTok := j.p.MaxTokens > 0 && i >= j.p.MaxTokens
	if d.id == e.tok.EOT || maxTok || (h.hasTS && j.seek+h.seekDelta+deltaMin >= j.seekEnd) {
		if h.resultLen == 0 && !j.p.NoTimestamps {
			if j.seek+h.seekDelta+deltaMin >= j.seekEnd {
				h.resultLen = i + 1
			} else {
				h.failed = true
				return
			}
		}
		if j.p.NoTimestamps {
			h.resultLen = i + 1
			h.seekDelta = 100 * 30
		}
		h.completed = true
		return
	}
	if i == e.nMax-1 && (h.resultLen == 0 || h.seekDelta < 100*30/2) {
		h.failed = true
	}
}

// score computes whisper.cpp's sequence score (decode.SequenceScore) and the entropy of the last
// 32 tokens (decode.TokenEntropy) of a finished hypothesis, cut to its result.
func (e *Whisper) score(h *hyp, p *Params) {
	if h.resultLen > len(h.tokens) {
		h.resultLen = len(h.tokens)
	}
	h.tokens = h.tokens[:h.resultLen]
	if h.resultLen == 0 {
		return
	}
	var s float64
	for _, t := range h.tokens {
		s += float64(t.plog)
	}
	h.sumLogprobs = s
	h.avgLogprobs = s / float64(h.resultLen)
	h.score = decode.SequenceScore(s, h.resultLen, p.LengthPenalty)
	e.ids = e.ids[:0]
	for _, t := range h.tokens[max(0, h.resultLen-32):] {
		e.ids = append(e.ids, t.id)
	}
	h.entropy = decode.TokenEntropy(e.ids)
}

// endWindow scores the hypotheses of the attempt, picks the best, falls back to the next
// temperature (decode.Fallback) or emits the window's segments and advances seek.
func (e *Whisper) endWindow(j *job) {
	fb := j.p.fallback()
	e.best.Reset()
	for i, h := range j.hyps[:j.nHyp] {
		if h.failed {
			continue
		}
		e.score(h, &j.p)
		if fb.LowEntropy(h.resultLen, h.entropy) {
			h.failed = true
			continue
		}
		e.best.Offer(i, h.score)
	}
	last := j.tempIdx == len(j.temps)-1
	best, ok := e.best.Best()
	if !ok { // every hypothesis failed
		best = 0
	}
	bh := j.hyps[best]
	if !last && fb.Retry(bh.failed, bh.avgLogprobs, j.noSpeech, func() float64 { return e.ratio.Ratio(e.text(bh.tokens)) }) {
		j.tempIdx++
		e.attempt(j)
		return
	}
	e.emit(j, bh)
	for _, h := range j.hyps {
		h.seq.Release()
	}
	j.tempIdx = 0
	j.ph, j.encSince = phEncode, e.steps
	j.skipSilence()
}

// skipSilence moves seek past each window from it on that is silent (silenceLevel) up to its
// end or the end of the audio's content, whichever comes first, as if the window had been
// decoded to no text, and ends j when no window is left to decode.
func (j *job) skipSilence() {
	for j.loud != nil && j.seek+deltaMin < j.seekEnd {
		end := min(j.seek+whisper.WindowFrames, j.seekEnd)
		if anyLoud(j.loud, j.seek, end) {
			break
		}
		j.seek = end
	}
	if j.seek+deltaMin >= j.seekEnd {
		j.ph = phDone
	}
}

func (e *Whisper) text(ts []tokData) string {
	var sb strings.Builder
	for _, t := range ts {
		if t.id < e.tok.EOT {
			sb.Write(e.tok.Piece(t.id))
		}
	}
	return sb.String()
}

// emit turns the best hypothesis's tokens into segments, as whisper.cpp does, and advances seek.
func (e *Whisper) emit(j *job, bh *hyp) {
	temp := j.temps[j.tempIdx]
	toks := bh.tokens
	seekDelta := bh.seekDelta
	noSpeech := j.p.fallback().Silent(bh.avgLogprobs, j.noSpeech)
	past := j.promptPast[:0]
	if len(j.prompt) > 0 && j.prompt[0] == e.tok.Prev {
		past = append(past, j.prompt[1:len(j.prompt)-len(j.promptInit)]...)
	}
	if !noSpeech {
		for _, t := range toks {
			past = append(past, t.id)
		}
	}
	j.promptPast = past
	if j.p.NoContext {
		j.promptPast = j.promptPast[:0]
	}
	avg := 0.0 // of the window's tokens (also when every hypothesis failed and none was scored)
	for _, t := range toks {
		avg += float64(t.plog) / float64(len(toks))
	}
	beg := e.tok.TimestampBegin
	// OpenAI reports the window's compression ratio, the one the fallback judged, on each of its
	// segments (transcribe.py's compression_ratio of the window's DecodingResult).
	ratio := 0.0
	if len(toks) > 0 && !noSpeech {
		ratio = e.ratio.Ratio(e.text(toks))
	}
	// With word timing, starts[i] is the audio frame (20 ms, from the window's start) at which
	// the window's i-th text token begins; starts[i+1] is where it ends.
	var starts []int
	nText := 0
	if j.p.WordTimestamps && len(toks) > 0 && !noSpeech {
		starts = e.alignWindow(j, toks, seekDelta)
	}
	add := func(t0, t1 int, ts []tokData) {
		text := e.text(ts)
		if text == "" {
			for _, t := range ts { // keep the aligned times of later tokens in step
				if t.id < e.tok.EOT {
					nText++
				}
			}
			return
		}
		// Timestamps are predicted, and may point past the end of the audio: keep them inside it.
		// A window's first segment starts at its first token's most probable timestamp when that
		// token is text (whisper.cpp's tokens_cur.front().tid), which may come after the timestamp
		// that ends the segment; whisper.cpp keeps such an inverted segment, which no subtitle
		// format can show: it starts at its end here (the predicted timestamp, from which the
		// next segment starts).
		t0 = min(t0, t1)
		end := float64(j.nSamples) / whisper.SampleRate
		seg := Segment{ID: len(j.segments), Start: min(float64(t0)/100, end), End: min(float64(t1)/100, end), Text: text,
			Temperature: temp, AvgLogprob: avg, CompressionRatio: ratio, NoSpeechProb: j.noSpeech}
		for _, t := range ts {
			seg.Tokens = append(seg.Tokens, Token{ID: t.id, Text: string(e.tok.Piece(t.id)), P: t.p, PLog: t.plog})
		}
		eot := e.tok.EOT
		interpolate(&seg, func(id int32) bool { return id < eot })
		if starts != nil {
			for i, t := range ts {
				if t.id >= e.tok.EOT {
					continue
				}
				if nText+1 < len(starts) {
					t0 := float64(j.seek)/100 + float64(starts[nText])*0.02
					t1 := float64(j.seek)/100 + float64(starts[nText+1])*0.02
					seg.Tokens[i].T0, seg.Tokens[i].T1 = min(t0, end), min(max(t1, t0), end)
				}
				nText++
			}
		}
		j.segments = append(j.segments, seg)
		if j.onSegment != nil {
			j.onSegment(seg)
		}
	}
	if len(toks) > 0 && !noSpeech {
		i0 := 0
		t0 := j.seek + framesPerTS*int(toks[0].tid-beg)
		if toks[0].tid < beg {
			t0 = j.seek
		}
		for i := 0; i < len(toks); i++ {
			if toks[i].id > beg && !j.p.NoTimestamps {
				t1 := j.seek + framesPerTS*int(toks[i].tid-beg)
				add(t0, t1, toks[i0:i+1])
				for i < len(toks) && toks[i].id > beg {
					i++
				}
				i--
				t0, i0 = t1, i+1
			}
		}
		if i0 < len(toks) {
			add(t0, j.seek+seekDelta, toks[i0:])
		}
	}
	if n := len(toks); n > 1 && toks[n-2].id < beg && toks[n-1].id > beg {
		seekDelta = min(j.seekEnd-j.seek, 100*30)
	}
	j.seek += seekDelta
}
