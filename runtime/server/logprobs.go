package server

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/sched"
)

// logprobEntry is one token's log-probabilities, in either endpoint's shape.
type logprobEntry struct {
	piece     []byte
	logprob   float64
	top       []decode.TokenLogprob
	topPieces [][]byte // the bytes of top's tokens
	end       int      // bytes of the sequence's text up to the end of piece
	null      bool     // an echoed prompt's first token, which has no token before it: no log-probabilities
	skip      int      // bytes of piece the text does not hold (an echoed prompt's space prefix)
}

// logprobQueue holds one sequence's log-probabilities until the text of their tokens is
// released. The scheduler sends a token's log-probability with the token but may hold its text
// back (a possible start of a stop string, an incomplete UTF-8 sequence) and, on a stop string,
// never release it. An entry is reported once every byte of its token's text is out; those still
// held when the sequence ends are dropped. So the tokens reported spell a prefix of the text
// returned and no text_offset passes its end. A token cut by the stop string (" Lily" for stop
// "Lily") is dropped with the stop, as OpenAI drops it, although some of its bytes are kept.
type logprobQueue struct {
	held     []logprobEntry
	pieces   int // bytes of the pieces of every entry queued
	released int // bytes of text released
}

// push takes ev and returns the entries whose text is now wholly released, valid until the
// next push.
func (q *logprobQueue) push(j *job, ev *sched.Event) []logprobEntry {
	if wantsLogprob(j, ev) {
		e := j.entry(ev)
		q.pieces += len(e.piece)
		e.end = q.pieces
		q.held = append(q.held, e)
	}
	q.released += len(ev.Text)
	k := 0
	for k < len(q.held) && q.held[k].end <= q.released {
		k++
	}
	ready := q.held[:k:k]
	q.held = q.held[k:]
	return ready
}

// wantsLogprob reports whether ev's token is reported in logprobs: a sampled token that is
// part of the output (not the final flush, not the end-of-generation token).
func wantsLogprob(j *job, ev *sched.Event) bool {
	return j.logprobs >= 0 && ev.Token >= 0 && !(ev.Done && ev.Reason == decode.StopEOS)
}

// minLogprob is the least log-probability a response reports, as OpenAI's API reports it for
// tokens of (almost) no probability: JSON has no -Inf, which a model's -Inf logit would give.
const minLogprob = -9999.0

func floorLogprob(x float64) float64 {
	if !(x >= minLogprob) { // -Inf, and NaN, which the sampler refuses before it gets here
		return minLogprob
	}
	return x
}

func (j *job) entry(ev *sched.Event) logprobEntry {
	top, pieces := ev.Top, ev.TopPieces
	if len(top) > j.logprobs {
		top, pieces = top[:j.logprobs], pieces[:j.logprobs]
	}
	return logprobEntry{piece: ev.Piece, logprob: floorLogprob(ev.Logprob), top: top, topPieces: pieces}
}

type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"` // nil (null) where nulls says
	TextOffset    []int                `json:"text_offset"`
	nulls         []int                // the tokens whose token_logprobs are null (an echoed prompt's first)
}

// MarshalJSON writes lp with null token_logprobs at lp.nulls.
func (lp *completionLogprobs) MarshalJSON() ([]byte, error) {
	type plain completionLogprobs
	if len(lp.nulls) == 0 {
		return json.Marshal((*plain)(lp))
	}
	tl := make([]*float64, len(lp.TokenLogprobs))
	for i := range tl {
		tl[i] = &lp.TokenLogprobs[i]
	}
	for _, i := range lp.nulls {
		tl[i] = nil
	}
	return json.Marshal(struct {
		Tokens        []string             `json:"tokens"`
		TokenLogprobs []*float64           `json:"token_logprobs"`
		TopLogprobs   []map[string]float64 `json:"top_logprobs"`
		TextOffset    []int                `json:"text_offset"`
	}{lp.Tokens, tl, lp.TopLogprobs, lp.TextOffset})
}

// charOffsets counts the characters (Unicode code points) of a prompt and its completion, for
// text_offset.
type charOffsets struct{ n int }

// isCont reports whether b continues a UTF-8 sequence (10xxxxxx).
func isCont(b byte) bool { return b&0xc0 == 0x80 }

// countChars counts the characters of b: its bytes that do not continue a UTF-8 sequence (for
// valid UTF-8, utf8.RuneCount).
func countChars(b []byte) int {
	n := 0
	for _, c := range b {
		if !isCont(c) {
			n++
		}
	}
	return n
}

// next returns the text_offset of piece, the next token's text, and moves past it: the index of
// the character it begins, or that it begins within when a character spans several tokens.
func (c *charOffsets) next(piece []byte) int {
	o := c.n
	if len(piece) > 0 && isCont(piece[0]) && o > 0 {
		o--
	}
	c.n += countChars(piece)
	return o
}

// tokenString is a token's text as the legacy logprobs write it: as it is when it is valid UTF-8,
// else as OpenAI writes a piece of a character, "bytes:" and its bytes escaped as Python writes
// them ("bytes:\xe2\x80"), so that such tokens neither collide as U+FFFD nor lose their bytes.
func tokenString(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var sb strings.Builder
	sb.WriteString("bytes:")
	for _, c := range b {
		switch {
		case c == '\\':
			sb.WriteString(`\\`)
		case c == '\t':
			sb.WriteString(`\t`)
		case c == '\n':
			sb.WriteString(`\n`)
		case c == '\r':
			sb.WriteString(`\r`)
		case c >= 0x20 && c < 0x7f:
			sb.WriteByte(c)
		default:
			fmt.Fprintf(&sb, `\x%02x`, c)
		}
	}
	return sb.String()
}

// newCompletionLogprobs writes es in the legacy shape; offs counts the characters of the choice's
// prompt and of its text before es.
func newCompletionLogprobs(es []logprobEntry, offs *charOffsets) *completionLogprobs {
	lp := &completionLogprobs{Tokens: []string{}, TokenLogprobs: []float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{}}
	appendLogprobs(lp, es, offs)
	return lp
}

// echoLogprobs writes the logprobs of choice c of an echoing job: those of its prompt's tokens
// (es: their entries, from echoEntries), with text_offset from 0, then those of its completion
// (gen), from the prompt's length in characters on.
func (j *job) echoLogprobs(c int, es, gen []logprobEntry) *completionLogprobs {
	lp := newCompletionLogprobs(es, &charOffsets{})
	appendLogprobs(lp, gen, &charOffsets{j.promptChars[c/j.g.n]})
	return lp
}

// appendLogprobs appends es to lp; offs as newCompletionLogprobs'.
func appendLogprobs(lp *completionLogprobs, es []logprobEntry, offs *charOffsets) {
	for _, e := range es {
		tok := tokenString(e.piece)
		lp.Tokens = append(lp.Tokens, tok)
		lp.TextOffset = append(lp.TextOffset, offs.next(e.piece[e.skip:]))
		if e.null {
			lp.nulls = append(lp.nulls, len(lp.TokenLogprobs))
			lp.TokenLogprobs = append(lp.TokenLogprobs, 0)
			lp.TopLogprobs = append(lp.TopLogprobs, nil)
			continue
		}
		lp.TokenLogprobs = append(lp.TokenLogprobs, e.logprob)
		// The logprobs most likely tokens and the sampled one, as OpenAI: up to logprobs+1.
		top := make(map[string]float64, len(e.top)+1)
		for i, t := range e.top {
			top[tokenString(e.topPieces[i])] = floorLogprob(t.Logprob)
		}
		top[tok] = e.logprob
		lp.TopLogprobs = append(lp.TopLogprobs, top)
	}
}

type chatTopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type chatTokenLogprob struct {
	chatTopLogprob
	TopLogprobs []chatTopLogprob `json:"top_logprobs"`
}

type chatLogprobs struct {
	Content []chatTokenLogprob `json:"content"`
	Refusal []chatTokenLogprob `json:"refusal"` // always null: no refusals are generated
}

func bytesOf(b []byte) []int {
	out := make([]int, len(b))
	for i, c := range b {
		out[i] = int(c)
	}
	return out
}

// newChatLogprobs writes es in the chat shape.
func newChatLogprobs(es []logprobEntry) *chatLogprobs {
	lp := &chatLogprobs{Content: []chatTokenLogprob{}}
	for _, e := range es {
		t := chatTokenLogprob{chatTopLogprob: chatTopLogprob{string(e.piece), e.logprob, bytesOf(e.piece)}, TopLogprobs: []chatTopLogprob{}}
		for i, a := range e.top {
			p := e.topPieces[i]
			t.TopLogprobs = append(t.TopLogprobs, chatTopLogprob{string(p), floorLogprob(a.Logprob), bytesOf(p)})
		}
		lp.Content = append(lp.Content, t)
	}
	return lp
}
