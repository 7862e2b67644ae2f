package server

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/parleyhq/parley/runtime/decode"
)

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
	m, e := s.genModel(r, req.Model, req.KeepAlive)
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
	cons, e := parseConstraint(&req.commonRequest, req.ResponseFormat)
	if e != nil {
		writeError(w, e)
		return
	}
	tl, e := parseTools(req.Tools, req.ToolChoice, req.ParallelToolCalls)
	if e != nil {
		writeError(w, e)
		return
	}
	if tl != nil {
		tl.format = toolFormatOf(m.ChatTemplate)
	}
	if tl.forced() {
		if cons != nil {
			writeError(w, invalid("tool_choice", fmt.Sprintf("Invalid 'tool_choice': a call cannot be forced together with '%s'.", cons.param)))
			return
		}
		gbnf, e := tl.grammar()
		if e != nil {
			writeError(w, e)
			return
		}
		cons = &constraint{param: "tools", gbnf: gbnf}
	}
	if !tl.active() {
		tl = nil
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
	var offered []any
	if tl != nil {
		offered = tl.raw
	}
	text, err := m.tmpl.renderTools(msgs, offered, kw)
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
	gram, e := s.compile(m, cons)
	if e != nil {
		writeError(w, e)
		return
	}
	s.generate(w, r, &job{m: m, g: g, prompts: [][]int32{toks}, promptChars: []int{0}, logprobs: lp, chat: true, grammar: gram, tools: tl})
}
