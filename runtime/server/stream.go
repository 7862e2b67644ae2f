package server

import (
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/parleyhq/parley/runtime/sched"
)

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
	Role      string          `json:"role,omitempty"`
	Content   *string         `json:"content,omitempty"`
	ToolCalls []toolCallDelta `json:"tool_calls,omitempty"`
}

// toolCallDelta is a piece of a streamed tool call, as OpenAI streams them: the call's index,
// id, type and name first, then its arguments.
type toolCallDelta struct {
	Index    int               `json:"index"`
	ID       string            `json:"id,omitempty"`
	Type     string            `json:"type,omitempty"`
	Function toolCallFuncDelta `json:"function"`
}

type toolCallFuncDelta struct {
	Name      string `json:"name,omitempty"`
	Arguments string `json:"arguments"`
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
				c.Logprobs = newChatLogprobs(es)
			}
		} else {
			c.Text = &text
			if j.logprobs >= 0 {
				c.Logprobs = newCompletionLogprobs(es, &offsets[choice])
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
	// With tools, a choice's answer is held back until it ends, then sent as content or as
	// tool calls, whichever it turns out to be.
	var held []string
	var heldLP [][]logprobEntry
	if j.tools != nil {
		held, heldLP = make([]string, j.choices()), make([][]logprobEntry, j.choices())
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
				c.Logprobs = newCompletionLogprobs(j.echoEntries(k, prompts[choice]), &charOffsets{})
				prompts[choice] = nil
			}
			if !send(chunk(c)) {
				return false
			}
		}
		es := queues[choice].push(j, ev)
		if held != nil {
			held[choice] += string(ev.Text)
			heldLP[choice] = append(heldLP[choice], es...)
		} else if len(ev.Text) > 0 || len(es) > 0 {
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
		if held != nil {
			content, calls := j.tools.parse(held[choice])
			if len(calls) == 0 {
				content = held[choice]
			}
			if content != "" || len(heldLP[choice]) > 0 {
				if !textChunk(choice, content, heldLP[choice]) {
					return false
				}
			}
			for k, tc := range calls {
				start := toolCallDelta{Index: k, ID: tc.ID, Type: "function", Function: toolCallFuncDelta{Name: tc.Function.Name}}
				if !send(chunk(chunkChoiceJSON{Index: choice, Delta: &deltaJSON{ToolCalls: []toolCallDelta{start}}})) {
					return false
				}
				args := toolCallDelta{Index: k, Function: toolCallFuncDelta{Arguments: tc.Function.Arguments}}
				if !send(chunk(chunkChoiceJSON{Index: choice, Delta: &deltaJSON{ToolCalls: []toolCallDelta{args}}})) {
					return false
				}
			}
			if len(calls) > 0 && ev.Reason != sched.ReasonTimeout {
				fr = "tool_calls"
			}
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
