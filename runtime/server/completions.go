package server

import (
	"fmt"
	"net/http"
	"unicode/utf8"

	"github.com/parleyhq/parley/runtime/decode"
)

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
	m, e := s.genModel(r, req.Model, req.KeepAlive)
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
	cons, e := parseConstraint(&req.commonRequest, nil)
	if e != nil {
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
	gram, e := s.compile(m, cons)
	if e != nil {
		writeError(w, e)
		return
	}
	j := &job{m: m, g: g, logprobs: lp, echo: echo, grammar: gram}
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
