package server

import (
	"crypto/rand"
	"errors"
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"time"

	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/decode/grammar"
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
	grammar     *grammar.Automaton // every choice's output is in its language; nil: free
	tools       *tools             // chat: the answers may call these functions; nil: none
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

// choices is the number of choices the response carries: g.n for each prompt, choice
// k*g.n+i being choice i of prompt k.
func (j *job) choices() int { return len(j.prompts) * j.g.n }

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
			Grammar:        j.grammar,
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

// randomSeed is the sampling seed of a request that gives none.
func randomSeed() uint64 {
	n, err := rand.Int(rand.Reader, new(big.Int).SetUint64(1<<63))
	if err != nil {
		return uint64(time.Now().UnixNano())
	}
	return n.Uint64()
}
