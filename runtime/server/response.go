package server

import (
	"net/http"

	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/sched"
)

type usageJSON struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func usageOf(u sched.Usage) *usageJSON {
	return &usageJSON{u.PromptTokens, u.CompletionTokens, u.PromptTokens + u.CompletionTokens}
}

type chatMessageJSON struct {
	Role      string     `json:"role"`
	Content   *string    `json:"content"` // null for an answer of tool calls alone
	Refusal   *string    `json:"refusal"` // always null, as OpenAI's when the model did not refuse
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
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
			c.Message = &chatMessageJSON{Role: "assistant", Content: &text}
			if j.tools != nil {
				content, calls := j.tools.parse(text)
				if len(calls) > 0 {
					c.Message.Content, c.Message.ToolCalls = nil, calls
					if content != "" {
						c.Message.Content = &content
					}
					if o.reason != sched.ReasonTimeout {
						fr = "tool_calls"
					}
				}
			}
			if j.logprobs >= 0 {
				c.Logprobs = newChatLogprobs(o.entries)
			}
		} else {
			switch {
			case j.echo:
				text = j.echoes[i/j.g.n].text + text
				if j.logprobs >= 0 {
					c.Logprobs = j.echoLogprobs(i, j.echoEntries(i/j.g.n, o.prompt), o.entries)
				}
			case j.logprobs >= 0:
				c.Logprobs = newCompletionLogprobs(o.entries, &charOffsets{j.promptChars[i/j.g.n]})
			}
			c.Text = &text
		}
		resp.Choices = append(resp.Choices, c)
	}
	writeJSON(w, resp)
}
