package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/sched"
)

// job is one validated generation request.
type job struct {
	m        *served
	g        *genParams
	prompt   []int32
	logprobs int // alternatives per token; -1: no logprobs
	chat     bool
	id       string
	created  int64
}

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
	g, e := parseCommon(&req.commonRequest, m.vocab, m.ctx, randomSeed)
	if e != nil {
		writeError(w, e)
		return
	}
	if g.maxTokens == 0 {
		g.maxTokens = maxCompletion
	}
	lp := -1
	if req.Logprobs != nil {
		if *req.Logprobs < 0 || *req.Logprobs > decode.MaxTopLogprobs {
			writeError(w, invalid("logprobs", fmt.Sprintf("Invalid 'logprobs': expected a value in [0, %d], but got %d instead.", decode.MaxTopLogprobs, *req.Logprobs)))
			return
		}
		lp = *req.Logprobs
	}
	p, e := parsePrompt(req.Prompt, m.vocab)
	if e != nil {
		writeError(w, e)
		return
	}
	toks := p.tokens
	if p.isText {
		var err error
		if toks, err = m.Engine.Tokenizer.Encode(p.text, true, true); err != nil {
			writeError(w, invalid("prompt", "Invalid 'prompt': it could not be tokenized."))
			return
		}
	}
	s.generate(w, r, &job{m: m, g: g, prompt: toks, logprobs: lp})
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
	text, err := m.tmpl.render(msgs)
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
	toks, err := m.Engine.Tokenizer.Encode(text, true, true)
	if err != nil {
		writeError(w, invalid("messages", "Invalid 'messages': they could not be tokenized."))
		return
	}
	s.generate(w, r, &job{m: m, g: g, prompt: toks, logprobs: lp, chat: true})
}

// generate submits j and answers with the whole result or a stream.
func (s *Server) generate(w http.ResponseWriter, r *http.Request, j *job) {
	ri := info(r.Context())
	m, g := j.m, j.g
	if len(j.prompt) >= m.ctx {
		writeError(w, invalidCode(j.promptParam(), "context_length_exceeded", fmt.Sprintf("This model's maximum context length is %d tokens. However, your prompt has %d tokens.", m.ctx, len(j.prompt))))
		return
	}
	if most := m.Sched.MaxSeqs(); g.n > most {
		writeError(w, invalid("n", fmt.Sprintf("Invalid 'n': this model serves at most %d choices per request, but got %d.", most, g.n)))
		return
	}
	maxTokens := m.ctx - len(j.prompt)
	if g.maxTokens > 0 {
		maxTokens = min(maxTokens, g.maxTokens)
	}
	req := &sched.Request{
		Prompt:      j.prompt,
		MaxTokens:   maxTokens,
		Sampling:    g.sampling,
		Stop:        g.stop,
		IgnoreEOS:   g.ignoreEOS,
		TopLogprobs: max(j.logprobs, 0),
		Logprobs:    j.logprobs >= 0,
		N:           g.n,
	}
	if s.cfg.RequestTimeout > 0 {
		req.Deadline = ri.start.Add(s.cfg.RequestTimeout)
	}
	st, err := m.Sched.Submit(r.Context(), req)
	if err != nil {
		writeError(w, s.submitError(ri, j, err))
		return
	}
	j.id = ri.id
	if ri.client {
		j.id = newID() // two clients may send the same X-Request-Id; response ids stay unique
	}
	j.created = ri.start.Unix()
	if g.stream {
		s.stream(w, r, j, st)
		return
	}
	s.collect(w, r, j, st)
}

func (s *Server) submitError(ri *reqInfo, j *job, err error) *apiError {
	param := j.promptParam()
	switch {
	case errors.Is(err, sched.ErrQueueFull):
		return &apiError{Status: http.StatusTooManyRequests, Message: "The server is busy; retry shortly.", Type: typeRateLimit, Code: strptr("queue_full"), RetryAfter: 1}
	case errors.Is(err, sched.ErrTooLong):
		return invalidCode(param, "context_length_exceeded", fmt.Sprintf("The prompt (%d tokens) plus max_tokens does not fit this model's cache.", len(j.prompt)))
	case errors.Is(err, sched.ErrClosed):
		return &apiError{Status: http.StatusServiceUnavailable, Message: "The server is shutting down.", Type: typeUnavailable, RetryAfter: 5}
	case errors.Is(err, sched.ErrInvalid):
		return invalid("", "Invalid request: "+strings.TrimPrefix(err.Error(), "sched: invalid request: "))
	}
	ri.log.Error("submit failed", "model", j.m.Name, "err", err)
	return internalError()
}

// pump passes st's events to fn until the stream closes, the client goes away (ctx) or fn
// returns false; in the last two cases it cancels st at once and drains it. It records
// latencies and token counts. It reports whether the stream ran to its end.
func (s *Server) pump(ctx context.Context, j *job, st *sched.Stream, fn func(*sched.Event) bool) bool {
	start := info(ctx).start
	last := make([]time.Time, j.g.n)
	first := true
	ttft := s.metrics.ttft.WithLabelValues(j.m.Name)
	itl := s.metrics.itl.WithLabelValues(j.m.Name)
	ok := true
	for {
		ev, err := st.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil { // the client went away
			ok = false
			break
		}
		if ev.Seq < 0 || ev.Seq >= len(last) {
			continue
		}
		if ev.Token >= 0 {
			now := time.Now()
			if first {
				ttft.Observe(now.Sub(start).Seconds())
				first = false
			} else if !last[ev.Seq].IsZero() {
				itl.Observe(now.Sub(last[ev.Seq]).Seconds())
			}
			last[ev.Seq] = now
		}
		if !fn(&ev) {
			ok = false
			break
		}
	}
	if !ok {
		st.Cancel()
		for range st.Events() {
		}
	}
	u := st.Usage()
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

// logprobEntry is one token's log-probabilities, in either endpoint's shape.
type logprobEntry struct {
	piece   []byte
	logprob float64
	top     []decode.TokenLogprob
	end     int // bytes of the sequence's text up to the end of piece
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
	top := ev.Top
	if len(top) > j.logprobs {
		top = top[:j.logprobs]
	}
	return logprobEntry{piece: j.m.Engine.Tokenizer.Piece(ev.Token), logprob: floorLogprob(ev.Logprob), top: top}
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
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

func (s *Server) completionLogprobs(j *job, es []logprobEntry, offset int) *completionLogprobs {
	lp := &completionLogprobs{Tokens: []string{}, TokenLogprobs: []float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{}}
	for _, e := range es {
		lp.Tokens = append(lp.Tokens, string(e.piece))
		lp.TokenLogprobs = append(lp.TokenLogprobs, e.logprob)
		var top map[string]float64
		if j.logprobs > 0 {
			top = make(map[string]float64, len(e.top))
			for _, t := range e.top {
				top[string(j.m.Engine.Tokenizer.Piece(t.ID))] = floorLogprob(t.Logprob)
			}
		}
		lp.TopLogprobs = append(lp.TopLogprobs, top)
		lp.TextOffset = append(lp.TextOffset, offset)
		offset += len(e.piece)
	}
	return lp
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
		for _, a := range e.top {
			p := j.m.Engine.Tokenizer.Piece(a.ID)
			t.TopLogprobs = append(t.TopLogprobs, chatTopLogprob{string(p), floorLogprob(a.Logprob), bytesOf(p)})
		}
		lp.Content = append(lp.Content, t)
	}
	return lp
}

type chatMessageJSON struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type choiceJSON struct {
	Index        int              `json:"index"`
	Text         *string          `json:"text,omitempty"`
	Message      *chatMessageJSON `json:"message,omitempty"`
	Logprobs     any              `json:"logprobs"`
	FinishReason *string          `json:"finish_reason"`
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
func (s *Server) collect(w http.ResponseWriter, r *http.Request, j *job, st *sched.Stream) {
	ri := info(r.Context())
	type seqOut struct {
		text    []byte
		entries []logprobEntry
		queue   logprobQueue
		reason  decode.StopReason
		err     error
	}
	outs := make([]seqOut, j.g.n)
	if !s.pump(r.Context(), j, st, func(ev *sched.Event) bool {
		o := &outs[ev.Seq]
		o.text = append(o.text, ev.Text...)
		o.entries = append(o.entries, o.queue.push(j, ev)...)
		if ev.Done {
			o.reason, o.err = ev.Reason, ev.Err
		}
		return true
	}) {
		return // the client is gone
	}
	resp := &responseJSON{ID: j.responseID(), Object: "text_completion", Created: j.created, Model: j.m.Name, Usage: usageOf(st.Usage())}
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
		c := choiceJSON{Index: i, FinishReason: &fr}
		text := string(o.text)
		if j.chat {
			c.Message = &chatMessageJSON{Role: "assistant", Content: text}
			if j.logprobs >= 0 {
				c.Logprobs = s.chatLogprobs(j, o.entries)
			}
		} else {
			c.Text = &text
			if j.logprobs >= 0 {
				c.Logprobs = s.completionLogprobs(j, o.entries, 0)
			}
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
}

// stream answers with server-sent events: one chunk per piece of text, a final chunk per
// choice, an optional usage chunk, then [DONE]. A failed write cancels generation at once.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, j *job, st *sched.Stream) {
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
		for i := 0; i < j.g.n; i++ {
			if !send(chunk(chunkChoiceJSON{Index: i, Delta: &deltaJSON{Role: "assistant", Content: &empty}})) {
				st.Cancel()
				for range st.Events() {
				}
				return
			}
		}
	}
	queues := make([]logprobQueue, j.g.n)
	offsets := make([]int, j.g.n)
	textChunk := func(seq int, text string, es []logprobEntry) bool {
		c := chunkChoiceJSON{Index: seq}
		if j.chat {
			c.Delta = &deltaJSON{Content: &text}
			if j.logprobs >= 0 {
				c.Logprobs = s.chatLogprobs(j, es)
			}
		} else {
			c.Text = &text
			if j.logprobs >= 0 {
				c.Logprobs = s.completionLogprobs(j, es, offsets[seq])
				for _, e := range es {
					offsets[seq] += len(e.piece)
				}
			}
		}
		return send(chunk(c))
	}
	failed := false
	ok := s.pump(r.Context(), j, st, func(ev *sched.Event) bool {
		es := queues[ev.Seq].push(j, ev)
		if len(ev.Text) > 0 || len(es) > 0 {
			if !textChunk(ev.Seq, string(ev.Text), es) {
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
		c := chunkChoiceJSON{Index: ev.Seq, FinishReason: &fr}
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
		send(&chunkJSON{ID: j.responseID(), Object: object, Created: j.created, Model: j.m.Name, Choices: []chunkChoiceJSON{}, Usage: usageOf(st.Usage())})
	}
	if _, err := fmt.Fprint(w, "data: [DONE]\n\n"); err == nil {
		rc.Flush()
	}
}
