package server

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/sched"
)

// job is one validated generation request.
type job struct {
	m       *served
	g       *genParams
	prompts [][]int32 // one for chat; a completion's batch of prompts, each with g.n choices
	// promptChars is each prompt's length in characters (the text as given, or the token ids
	// detokenized), where the text_offset of its completions' tokens starts.
	promptChars []int
	logprobs    int // alternatives per token; -1: no logprobs
	chat        bool
	id          string
	created     int64

	// echo: each completion choice begins with its prompt (and its logprobs with the prompt's
	// tokens'), echoes[k] saying how prompt k is echoed. The scheduler reports the prompt's
	// log-probabilities (sched.Request.PromptLogprobs) to sequence 0; pump hands them to every
	// choice of the prompt.
	echo   bool
	echoes []echoPrompt
	// replicate: each prompt runs as one scheduler sequence whose events pump hands to all g.n
	// choices (echo with max_tokens 0: nothing is sampled, so the choices are all the same).
	replicate bool
}

// echoPrompt is how a prompt is echoed.
type echoPrompt struct {
	text string // the prompt as given, or its token ids detokenized
	// lead counts the prompt tokens not reported: 1 for the BOS the tokenizer added to a text
	// prompt (the next token's log-probability is given it), else 0, when the first token
	// reported has no token before it and is reported with null log-probabilities.
	lead int
	// The detokenizer drops the first strip bytes of the piece of prompt token stripAt (-1:
	// none), SentencePiece's space before the text; text_offset counts without them.
	stripAt, strip int
}

// newEchoPrompt describes how prompt toks, whose text is text, is echoed; lead as echoPrompt's.
func newEchoPrompt(m *served, toks []int32, text string, lead int) echoPrompt {
	e := echoPrompt{text: text, lead: lead, stripAt: -1}
	tk := m.Tokenizer
	for i := lead; i < len(toks); i++ {
		if p := tk.Piece(toks[i]); len(p) > 0 {
			e.stripAt, e.strip = i, max(len(p)-len(tk.Decode(toks[i:i+1])), 0)
			break
		}
	}
	return e
}

// echoEntries are the logprobs entries of the echo of prompt k: those of its tokens the
// scheduler scored (es, from prompt token 1 on), preceded, when the first token is reported,
// by that token with null log-probabilities.
func (j *job) echoEntries(k int, es []logprobEntry) []logprobEntry {
	e := &j.echoes[k]
	out := make([]logprobEntry, 0, len(es)+1)
	if e.lead == 0 {
		out = append(out, logprobEntry{piece: j.m.Tokenizer.Piece(j.prompts[k][0]), null: true})
	}
	out = append(out, es...)
	if i := e.stripAt - e.lead; e.stripAt >= 0 && i < len(out) {
		out[i].skip = min(e.strip, len(out[i].piece))
	}
	return out
}

// choices is the number of choices the response carries: g.n for each prompt, choice
// k*g.n+i being choice i of prompt k.
func (j *job) choices() int { return len(j.prompts) * j.g.n }

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(r)
	if e != nil {
		writeError(w, e)
		return
	}
	var req completionRequest
	if e := decodeBody(body, &req); e != nil {
		writeError(w, e)
		return
	}
	m, e := s.model(req.Model)
	if e != nil {
		writeError(w, e)
		return
	}
	echo := req.Echo != nil && *req.Echo
	minTokens := 1
	if echo {
		minTokens = 0 // the prompt alone: score it
	}
	g, e := parseGen(&req.commonRequest, m.vocab, m.ctx, minTokens, randomSeed)
	if e != nil {
		writeError(w, e)
		return
	}
	if e := req.checkUnsupported(g.n); e != nil {
		writeError(w, e)
		return
	}
	lp := -1
	if req.Logprobs != nil {
		if *req.Logprobs < 0 || *req.Logprobs > decode.MaxTopLogprobs {
			writeError(w, invalid("logprobs", fmt.Sprintf("Invalid 'logprobs': expected a value in [0, %d], but got %d instead.", decode.MaxTopLogprobs, *req.Logprobs)))
			return
		}
		lp = *req.Logprobs
	}
	ps, e := parsePrompt(req.Prompt, m.vocab)
	if e != nil {
		writeError(w, e)
		return
	}
	if len(ps) > 1 && len(ps)*g.n > maxN {
		writeError(w, invalid("prompt", fmt.Sprintf("Invalid 'prompt': %d prompts of %d choices each make %d choices; a request may have at most %d.", len(ps), g.n, len(ps)*g.n, maxN)))
		return
	}
	j := &job{m: m, g: g, logprobs: lp, echo: echo}
	for _, p := range ps {
		toks, chars, text, lead := p.tokens, 0, p.text, 0
		if p.isText {
			var err error
			if toks, err = m.Tokenizer.Encode(p.text); err != nil {
				writeError(w, invalid("prompt", "Invalid 'prompt': it could not be tokenized."))
				return
			}
			chars = utf8.RuneCountInString(p.text)
			if bos, added := m.Tokenizer.BOS(); added && len(toks) > 0 && toks[0] == bos {
				lead = 1 // the tokenizer's
			}
		} else if lp >= 0 || echo {
			text = m.Tokenizer.Decode(toks)
			chars = countChars([]byte(text))
		}
		j.prompts = append(j.prompts, toks)
		j.promptChars = append(j.promptChars, chars)
		if echo {
			j.echoes = append(j.echoes, newEchoPrompt(m, toks, text, lead))
		}
	}
	s.generate(w, r, j)
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(r)
	if e != nil {
		writeError(w, e)
		return
	}
	var req chatRequest
	if e := decodeBody(body, &req); e != nil {
		writeError(w, e)
		return
	}
	m, e := s.model(req.Model)
	if e != nil {
		writeError(w, e)
		return
	}
	msgs, e := parseMessages(req.Messages)
	if e != nil {
		writeError(w, e)
		return
	}
	g, e := parseCommon(&req.commonRequest, m.vocab, m.ctx, randomSeed)
	if e != nil {
		writeError(w, e)
		return
	}
	if e := req.checkUnsupported(); e != nil {
		writeError(w, e)
		return
	}
	lp := -1
	if req.TopLogprobs != nil {
		if *req.TopLogprobs < 0 || *req.TopLogprobs > decode.MaxTopLogprobs {
			writeError(w, invalid("top_logprobs", fmt.Sprintf("Invalid 'top_logprobs': expected a value in [0, %d], but got %d instead.", decode.MaxTopLogprobs, *req.TopLogprobs)))
			return
		}
		if req.Logprobs == nil || !*req.Logprobs {
			writeError(w, invalid("top_logprobs", "Invalid 'top_logprobs': 'logprobs' must be set to true when 'top_logprobs' is given."))
			return
		}
	}
	if req.Logprobs != nil && *req.Logprobs {
		lp = 0
		if req.TopLogprobs != nil {
			lp = *req.TopLogprobs
		}
	}
	if m.tmpl == nil {
		writeError(w, invalidCode("model", "no_chat_template", m.tmplErr))
		return
	}
	kw, e := templateKwargs(req.ChatTemplateKwargs)
	if e != nil {
		writeError(w, e)
		return
	}
	text, err := m.tmpl.render(msgs, kw)
	if err != nil {
		var te *templateError
		if errors.As(err, &te) {
			writeError(w, invalid("messages", "The model's chat template rejected the messages: "+te.msg))
			return
		}
		info(r.Context()).log.Error("chat template failed", "model", m.Name, "err", err)
		writeError(w, &apiError{Status: http.StatusInternalServerError, Type: typeServer, Code: strptr("chat_template_failed"),
			Message: fmt.Sprintf("The chat template of model '%s' failed on these messages (%v); use /v1/completions with a prompt of your own.", m.Name, err)})
		return
	}
	if m.addBOS && m.bosText != "" {
		// The template writes BOS itself; the tokenizer adds it again otherwise.
		text = strings.TrimPrefix(text, m.bosText)
	}
	toks, err := m.Tokenizer.Encode(text)
	if err != nil {
		writeError(w, invalid("messages", "Invalid 'messages': they could not be tokenized."))
		return
	}
	s.generate(w, r, &job{m: m, g: g, prompts: [][]int32{toks}, promptChars: []int{0}, logprobs: lp, chat: true})
}

// generate submits j, one scheduler request per prompt, and answers with the whole result or a
// stream.
func (s *Server) generate(w http.ResponseWriter, r *http.Request, j *job) {
	ri := info(r.Context())
	m, g := j.m, j.g
	for _, p := range j.prompts {
		if len(p) >= m.ctx && !(g.scoreOnly && len(p) == m.ctx) {
			writeError(w, invalidCode(j.promptParam(), "context_length_exceeded", fmt.Sprintf("This model's maximum context length is %d tokens. However, your %s has %d tokens.", m.ctx, j.promptParam(), len(p))))
			return
		}
	}
	if most := m.Sched.MaxSeqs(); g.n > most {
		writeError(w, invalid("n", fmt.Sprintf("Invalid 'n': this model serves at most %d choices per request, but got %d.", most, g.n)))
		return
	}
	reqs := make([]*sched.Request, len(j.prompts))
	for k, p := range j.prompts {
		room := m.ctx - len(p)
		maxTokens := room // chat without max_tokens: the rest of the context
		n := g.n
		switch {
		case g.scoreOnly:
			maxTokens = 0
			if n > 1 {
				n, j.replicate = 1, true
			}
		case g.maxTokens > room:
			// As OpenAI: a limit given explicitly that does not fit is an error, not shortened.
			writeError(w, invalidCode(g.maxParam, "context_length_exceeded", fmt.Sprintf(
				"This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the %s, %d in the completion). Please reduce the length of the %s or of the completion.",
				m.ctx, len(p)+g.maxTokens, len(p), j.promptParam(), g.maxTokens, j.promptParam())))
			return
		case g.maxTokens > 0:
			maxTokens = g.maxTokens
		case !j.chat:
			maxTokens = min(room, maxCompletion) // completions' default of 16, shortened to fit
		}
		reqs[k] = &sched.Request{
			Prompt:      p,
			MaxTokens:   maxTokens,
			Sampling:    g.sampling,
			Stop:        g.stop,
			IgnoreEOS:   g.ignoreEOS,
			TopLogprobs: max(j.logprobs, 0),
			Logprobs:    j.logprobs >= 0,
			N:           n,
			// The prompt's log-probabilities for echo's logprobs; a request that generates
			// nothing must ask for them (and pays for them).
			PromptLogprobs: j.echo && (j.logprobs >= 0 || g.scoreOnly),
		}
		if s.cfg.RequestTimeout > 0 {
			reqs[k].Deadline = ri.start.Add(s.cfg.RequestTimeout)
		}
	}
	sts := make([]*sched.Stream, 0, len(reqs))
	for k, req := range reqs {
		st, err := m.Sched.Submit(r.Context(), req)
		if err != nil {
			for _, st := range sts { // the request fails whole: end what was submitted of it
				st.Cancel()
			}
			writeError(w, s.submitError(ri, j, k, err))
			return
		}
		sts = append(sts, st)
	}
	j.id = ri.id
	if ri.client {
		j.id = newID() // two clients may send the same X-Request-Id; response ids stay unique
	}
	j.created = ri.start.Unix()
	if g.stream {
		s.stream(w, r, j, sts)
		return
	}
	s.collect(w, r, j, sts)
}

func (s *Server) submitError(ri *reqInfo, j *job, k int, err error) *apiError {
	param := j.promptParam()
	switch {
	case errors.Is(err, sched.ErrQueueFull):
		return &apiError{Status: http.StatusTooManyRequests, Message: "The server is busy; retry shortly.", Type: typeRateLimit, Code: strptr("queue_full"), RetryAfter: 1}
	case errors.Is(err, sched.ErrTooLong):
		return invalidCode(param, "context_length_exceeded", fmt.Sprintf("The prompt (%d tokens) plus max_tokens does not fit this model's cache.", len(j.prompts[k])))
	case errors.Is(err, sched.ErrClosed):
		return &apiError{Status: http.StatusServiceUnavailable, Message: "The server is shutting down.", Type: typeUnavailable, RetryAfter: 5}
	case errors.Is(err, sched.ErrInvalid):
		return invalid("", "Invalid request: "+strings.TrimPrefix(err.Error(), "sched: invalid request: "))
	}
	ri.log.Error("submit failed", "model", j.m.Name, "err", err)
	return internalError()
}

// usageOfAll sums the usage of a request's streams, valid once each has ended.
func usageOfAll(sts []*sched.Stream) sched.Usage {
	var u sched.Usage
	for _, st := range sts {
		su := st.Usage()
		u.PromptTokens += su.PromptTokens
		u.CompletionTokens += su.CompletionTokens
	}
	return u
}

// tagged is an event of stream k, or its error (io.EOF at its end).
type tagged struct {
	k   int
	ev  sched.Event
	err error
}

// merge reads every stream of sts at once; next returns the next event of any (its stream's
// index with it), io.EOF once every stream has ended, or ctx's error. stop must be called
// before sts are read otherwise; it waits until no goroutine reads them.
func merge(ctx context.Context, sts []*sched.Stream) (next func() (int, sched.Event, error), stop func()) {
	if len(sts) == 1 {
		return func() (int, sched.Event, error) {
			ev, err := sts[0].Next(ctx)
			return 0, ev, err
		}, func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	ch := make(chan tagged)
	var wg sync.WaitGroup
	for k, st := range sts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ev, err := st.Next(ctx)
				select {
				case ch <- tagged{k, ev, err}:
				case <-ctx.Done():
					return
				}
				if err != nil {
					return
				}
			}
		}()
	}
	live := len(sts)
	next = func() (int, sched.Event, error) {
		for {
			var t tagged
			select {
			case t = <-ch:
			case <-ctx.Done(): // the readers may have given up without a word
				return 0, sched.Event{}, ctx.Err()
			}
			if t.err == io.EOF {
				if live--; live == 0 {
					return 0, sched.Event{}, io.EOF
				}
				continue
			}
			return t.k, t.ev, t.err
		}
	}
	return next, func() {
		cancel()
		wg.Wait()
	}
}

// pump passes the events of sts, the streams of j's prompts, to fn with the index of their
// choice until every stream closes, the client goes away (ctx) or fn returns false; in the last
// two cases it cancels every stream at once and drains them. It records latencies and token
// counts. It reports whether the streams ran to their end.
func (s *Server) pump(ctx context.Context, j *job, sts []*sched.Stream, fn func(choice int, ev *sched.Event) bool) bool {
	start := info(ctx).start
	last := make([]time.Time, j.choices())
	first := true
	ttft := s.metrics.ttft.WithLabelValues(j.m.Name)
	itl := s.metrics.itl.WithLabelValues(j.m.Name)
	next, stop := merge(ctx, sts)
	ok := true
	for {
		k, ev, err := next()
		if err == io.EOF {
			break
		}
		if err != nil { // the client went away
			ok = false
			break
		}
		if ev.Seq < 0 || ev.Seq >= j.g.n {
			continue
		}
		if ev.Prompt || j.replicate {
			// The prompt's, or the one sequence's: every choice of the prompt has it.
			for i := range j.g.n {
				if !fn(k*j.g.n+i, &ev) {
					ok = false
					break
				}
			}
			if !ok {
				break
			}
			continue
		}
		c := k*j.g.n + ev.Seq
		if ev.Token >= 0 {
			now := time.Now()
			if first {
				ttft.Observe(now.Sub(start).Seconds())
				first = false
			} else if !last[c].IsZero() {
				itl.Observe(now.Sub(last[c]).Seconds())
			}
			last[c] = now
		}
		if !fn(c, &ev) {
			ok = false
			break
		}
	}
	if !ok {
		for _, st := range sts {
			st.Cancel()
		}
	}
	stop()
	if !ok {
		for _, st := range sts {
			for range st.Events() {
			}
		}
	}
	u := usageOfAll(sts)
	s.metrics.prompt.WithLabelValues(j.m.Name).Add(float64(u.PromptTokens))
	s.metrics.generated.WithLabelValues(j.m.Name).Add(float64(u.CompletionTokens))
	return ok
}

// finishReason maps a scheduler reason to OpenAI's finish_reason; "" for reasons that are not a
// finish (cancelled, error).
func finishReason(r decode.StopReason) string {
	switch r {
	case decode.StopEOS, decode.StopString:
		return "stop"
	case decode.StopLength, sched.ReasonTimeout:
		return "length"
	}
	return ""
}

// stopReason is the stop_reason of a choice that finished for reason r: "timeout" for one cut
// by the server's time limit (reported as finish_reason "length", as llama-server reports it),
// nil otherwise.
func stopReason(r decode.StopReason) *string {
	if r == sched.ReasonTimeout {
		return strptr("timeout")
	}
	return nil
}

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

type usageJSON struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func usageOf(u sched.Usage) *usageJSON {
	return &usageJSON{u.PromptTokens, u.CompletionTokens, u.PromptTokens + u.CompletionTokens}
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

// completionLogprobs writes es in the legacy shape; offs counts the characters of the choice's
// prompt and of its text before es.
func (s *Server) completionLogprobs(j *job, es []logprobEntry, offs *charOffsets) *completionLogprobs {
	lp := &completionLogprobs{Tokens: []string{}, TokenLogprobs: []float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{}}
	s.appendLogprobs(lp, j, es, offs)
	return lp
}

// echoLogprobs writes the logprobs of choice c of an echoing job: those of its prompt's tokens
// (es: their entries, from echoEntries), with text_offset from 0, then those of its completion
// (gen), from the prompt's length in characters on.
func (s *Server) echoLogprobs(j *job, c int, es, gen []logprobEntry) *completionLogprobs {
	lp := s.completionLogprobs(j, es, &charOffsets{})
	s.appendLogprobs(lp, j, gen, &charOffsets{j.promptChars[c/j.g.n]})
	return lp
}

// appendLogprobs appends es to lp; offs as completionLogprobs'.
func (s *Server) appendLogprobs(lp *completionLogprobs, j *job, es []logprobEntry, offs *charOffsets) {
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

func (s *Server) chatLogprobs(j *job, es []logprobEntry) *chatLogprobs {
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

type chatMessageJSON struct {
	Role    string  `json:"role"`
	Content string  `json:"content"`
	Refusal *string `json:"refusal"` // always null, as OpenAI's when the model did not refuse
}

type choiceJSON struct {
	Index        int              `json:"index"`
	Text         *string          `json:"text,omitempty"`
	Message      *chatMessageJSON `json:"message,omitempty"`
	Logprobs     any              `json:"logprobs"`
	FinishReason *string          `json:"finish_reason"`
	StopReason   *string          `json:"stop_reason,omitempty"` // "timeout": cut by the server's time limit
}

type responseJSON struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []choiceJSON `json:"choices"`
	Usage   *usageJSON   `json:"usage"`
}

func (j *job) promptParam() string {
	if j.chat {
		return "messages"
	}
	return "prompt"
}

func (j *job) responseID() string {
	if j.chat {
		return "chatcmpl-" + j.id
	}
	return "cmpl-" + j.id
}

// collect answers with the whole result once every sequence is done.
func (s *Server) collect(w http.ResponseWriter, r *http.Request, j *job, sts []*sched.Stream) {
	ri := info(r.Context())
	type seqOut struct {
		text    []byte
		entries []logprobEntry
		prompt  []logprobEntry // the echoed prompt's scored tokens
		queue   logprobQueue
		reason  decode.StopReason
		err     error
	}
	outs := make([]seqOut, j.choices())
	if !s.pump(r.Context(), j, sts, func(c int, ev *sched.Event) bool {
		o := &outs[c]
		if ev.Prompt {
			if j.logprobs >= 0 {
				o.prompt = append(o.prompt, j.entry(ev))
			}
			return true
		}
		o.text = append(o.text, ev.Text...)
		o.entries = append(o.entries, o.queue.push(j, ev)...)
		if ev.Done {
			o.reason, o.err = ev.Reason, ev.Err
		}
		return true
	}) {
		return // the client is gone
	}
	resp := &responseJSON{ID: j.responseID(), Object: "text_completion", Created: j.created, Model: j.m.Name, Usage: usageOf(usageOfAll(sts))}
	if j.chat {
		resp.Object = "chat.completion"
	}
	for i := range outs {
		o := &outs[i]
		fr := finishReason(o.reason)
		if fr == "" {
			if o.reason == sched.ReasonError {
				ri.log.Error("generation failed", "model", j.m.Name, "err", o.err)
				writeError(w, internalError())
			} else {
				ri.log.Warn("generation ended early", "model", j.m.Name, "reason", string(o.reason))
				writeError(w, &apiError{Status: http.StatusServiceUnavailable, Message: "The request was cancelled by the server.", Type: typeUnavailable, RetryAfter: 5})
			}
			return
		}
		c := choiceJSON{Index: i, FinishReason: &fr, StopReason: stopReason(o.reason)}
		text := string(o.text)
		if j.chat {
			c.Message = &chatMessageJSON{Role: "assistant", Content: text}
			if j.logprobs >= 0 {
				c.Logprobs = s.chatLogprobs(j, o.entries)
			}
		} else {
			switch {
			case j.echo:
				text = j.echoes[i/j.g.n].text + text
				if j.logprobs >= 0 {
					c.Logprobs = s.echoLogprobs(j, i, j.echoEntries(i/j.g.n, o.prompt), o.entries)
				}
			case j.logprobs >= 0:
				c.Logprobs = s.completionLogprobs(j, o.entries, &charOffsets{j.promptChars[i/j.g.n]})
			}
			c.Text = &text
		}
		resp.Choices = append(resp.Choices, c)
	}
	writeJSON(w, resp)
}

// chunkJSON is one streamed event.
type chunkJSON struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []chunkChoiceJSON `json:"choices"`
	Usage   any               `json:"usage,omitempty"`
}

type deltaJSON struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

type chunkChoiceJSON struct {
	Index        int        `json:"index"`
	Text         *string    `json:"text,omitempty"`
	Delta        *deltaJSON `json:"delta,omitempty"`
	Logprobs     any        `json:"logprobs"`
	FinishReason *string    `json:"finish_reason"`
	StopReason   *string    `json:"stop_reason,omitempty"`
}

// stream answers with server-sent events: one chunk per piece of text, a final chunk per
// choice, an optional usage chunk, then [DONE]. A failed write cancels generation at once.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, j *job, sts []*sched.Stream) {
	ri := info(r.Context())
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc.Flush() // the client sees the stream open while the request waits in the queue
	writeErr := false
	send := func(v any) bool {
		b, err := json.Marshal(v)
		if err != nil {
			ri.log.Error("encoding chunk", "err", err)
			writeErr = true
			return false
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			writeErr = true
			return false
		}
		if err := rc.Flush(); err != nil {
			writeErr = true
			return false
		}
		return true
	}
	object := "text_completion"
	if j.chat {
		object = "chat.completion.chunk"
	}
	var nullUsage any
	if j.g.includeUsage {
		nullUsage = json.RawMessage("null")
	}
	chunk := func(c chunkChoiceJSON) *chunkJSON {
		return &chunkJSON{ID: j.responseID(), Object: object, Created: j.created, Model: j.m.Name, Choices: []chunkChoiceJSON{c}, Usage: nullUsage}
	}
	if j.chat {
		empty := ""
		for i := 0; i < j.choices(); i++ {
			if !send(chunk(chunkChoiceJSON{Index: i, Delta: &deltaJSON{Role: "assistant", Content: &empty}})) {
				for _, st := range sts {
					st.Cancel()
				}
				for _, st := range sts {
					for range st.Events() {
					}
				}
				return
			}
		}
	}
	queues := make([]logprobQueue, j.choices())
	offsets := make([]charOffsets, j.choices())
	for c := range offsets {
		offsets[c].n = j.promptChars[c/j.g.n]
	}
	textChunk := func(choice int, text string, es []logprobEntry) bool {
		c := chunkChoiceJSON{Index: choice}
		if j.chat {
			c.Delta = &deltaJSON{Content: &text}
			if j.logprobs >= 0 {
				c.Logprobs = s.chatLogprobs(j, es)
			}
		} else {
			c.Text = &text
			if j.logprobs >= 0 {
				c.Logprobs = s.completionLogprobs(j, es, &offsets[choice])
			}
		}
		return send(chunk(c))
	}
	// An echoing choice's first chunk is its prompt, sent with its first event of another kind
	// than the prompt's log-probabilities (which come first).
	var prompts [][]logprobEntry
	var echoed []bool
	if j.echo {
		prompts, echoed = make([][]logprobEntry, j.choices()), make([]bool, j.choices())
	}
	failed := false
	ok := s.pump(r.Context(), j, sts, func(choice int, ev *sched.Event) bool {
		if ev.Prompt {
			if j.echo && j.logprobs >= 0 {
				prompts[choice] = append(prompts[choice], j.entry(ev))
			}
			return true
		}
		if j.echo && !echoed[choice] && !(ev.Done && finishReason(ev.Reason) == "") {
			echoed[choice] = true
			k := choice / j.g.n
			text := j.echoes[k].text
			c := chunkChoiceJSON{Index: choice, Text: &text}
			if j.logprobs >= 0 {
				c.Logprobs = s.completionLogprobs(j, j.echoEntries(k, prompts[choice]), &charOffsets{})
				prompts[choice] = nil
			}
			if !send(chunk(c)) {
				return false
			}
		}
		es := queues[choice].push(j, ev)
		if len(ev.Text) > 0 || len(es) > 0 {
			if !textChunk(choice, string(ev.Text), es) {
				return false
			}
		}
		if !ev.Done {
			return true
		}
		fr := finishReason(ev.Reason)
		if fr == "" {
			if ev.Reason == sched.ReasonError {
				ri.log.Error("generation failed", "model", j.m.Name, "err", ev.Err)
				send(struct {
					Error *apiError `json:"error"`
				}{internalError()})
			} else {
				ri.log.Warn("generation ended early", "model", j.m.Name, "reason", string(ev.Reason))
				send(struct {
					Error *apiError `json:"error"`
				}{&apiError{Status: http.StatusServiceUnavailable, Message: "The request was cancelled by the server.", Type: typeUnavailable}})
			}
			failed = true
			return false
		}
		c := chunkChoiceJSON{Index: choice, FinishReason: &fr, StopReason: stopReason(ev.Reason)}
		if j.chat {
			c.Delta = &deltaJSON{}
		} else {
			empty := ""
			c.Text = &empty
		}
		return send(chunk(c))
	})
	if !ok && (writeErr || !failed) {
		return // the client is gone
	}
	if ok && j.g.includeUsage {
		send(&chunkJSON{ID: j.responseID(), Object: object, Created: j.created, Model: j.m.Name, Choices: []chunkChoiceJSON{}, Usage: usageOf(usageOfAll(sts))})
	}
	if _, err := fmt.Fprint(w, "data: [DONE]\n\n"); err == nil {
		rc.Flush()
	}
}
func randomSeed() uint64 {
	n, err := rand.Int(rand.Reader, new(big.Int).SetUint64(1<<63))
	if err != nil {
		return uint64(time.Now().UnixNano())
	}
	return n.Uint64()
}
