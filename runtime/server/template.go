package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
)

// chatTemplate is a parsed tokenizer.chat_template: Jinja, rendered as Hugging Face's
// apply_chat_template renders it (trim_blocks and lstrip_blocks on, one newline at the end of
// the source dropped, loop controls, raise_exception and strftime_now; tools and documents
// defined as none). A compiled template is safe for concurrent renders.
type chatTemplate struct {
	tpl       *jinja.Template
	bos       jinja.Value // text of the BOS and EOS tokens, as the template variables bos_token/eos_token
	eos       jinja.Value
	developer bool // the template handles the developer role itself
}

// templateError is raised by a template's raise_exception: the conversation is one the template
// refuses (for example roles that do not alternate). It is the client's error, not the server's.
type templateError struct{ msg string }

func (e *templateError) Error() string { return e.msg }

// message is one chat message as passed to the template: role and text content, an
// assistant's tool calls, a tool message's call id, and a name where one is given.
type message struct {
	Role       string
	Content    string
	Name       string
	ToolCalls  []toolCall
	ToolCallID string
}

var (
	raiseException = jinja.NewCallable("raise_exception", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		msg := "the chat template raised an exception"
		if len(args) > 0 && args[0].IsString() {
			msg = args[0].AsString()
		} else if len(args) > 0 {
			msg = args[0].String()
		}
		return jinja.Undefined(), &templateError{msg: msg}
	})
	// rangeFn is Python's range, refusing more than maxRange items instead of taking the memory
	// (a template is part of a model file, not of the request).
	rangeFn = jinja.NewCallable("range", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		var a [3]int64
		for i, v := range args {
			if i >= 3 || !v.IsInt() {
				return jinja.Undefined(), errors.New("range takes one to three integers")
			}
			a[i] = v.AsInt()
		}
		start, stop, step := int64(0), a[0], int64(1)
		switch len(args) {
		case 0:
			return jinja.Undefined(), errors.New("range takes one to three integers")
		case 2:
			start, stop = a[0], a[1]
		case 3:
			start, stop, step = a[0], a[1], a[2]
		}
		if step == 0 {
			return jinja.Undefined(), errors.New("range: step must not be zero")
		}
		n := int64(0)
		if step > 0 && stop > start {
			n = (stop - start + step - 1) / step
		} else if step < 0 && stop < start {
			n = (start - stop - step - 1) / -step
		}
		if n > maxRange || n < 0 {
			return jinja.Undefined(), fmt.Errorf("range of %d items: more than %d", n, maxRange)
		}
		items := make([]jinja.Value, n)
		for i := range items {
			items[i] = jinja.NewInt(start + int64(i)*step)
		}
		return jinja.NewList(items), nil
	})
	strftimeNow = jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 || !args[0].IsString() {
			return jinja.Undefined(), errors.New("strftime_now takes one format string")
		}
		return jinja.NewString(strftime(time.Now(), args[0].AsString())), nil
	})
)

// maxRange bounds the items of one range() in a template.
const maxRange = 1 << 20

// parseChatTemplate compiles src. The template engine cannot read files or anything outside the
// variables it is given.
func parseChatTemplate(src, bos, eos string) (t *chatTemplate, err error) {
	defer func() {
		if r := recover(); r != nil { // the engine's own defect, not the server's
			t, err = nil, fmt.Errorf("chat template: %v", r)
		}
	}()
	// Jinja drops a single newline at the end of a template (keep_trailing_newline off).
	if strings.HasSuffix(src, "\r\n") {
		src = src[:len(src)-2]
	} else {
		src = strings.TrimSuffix(src, "\n")
	}
	tpl, err := jinja.Compile(src)
	if err != nil {
		return nil, err
	}
	return &chatTemplate{tpl: tpl, bos: jinja.NewString(bos), eos: jinja.NewString(eos), developer: strings.Contains(src, "developer")}, nil
}

// templateVars are the variables render sets itself; a request's chat_template_kwargs may not
// replace them.
var templateVars = []string{"messages", "add_generation_prompt", "bos_token", "eos_token", "tools", "documents", "raise_exception", "strftime_now", "range"}

// templateKwargs converts a request's chat_template_kwargs (a JSON object, or null) into template
// variables: JSON values as jinja2 sees them after json.loads (numbers without a fraction or
// exponent as integers). It refuses anything but an object, and names render sets itself.
func templateKwargs(raw json.RawMessage) (map[string]jinja.Value, *apiError) {
	if isNull(raw) {
		return nil, nil
	}
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	var kw map[string]any
	if err := d.Decode(&kw); err != nil || kw == nil {
		return nil, invalid("chat_template_kwargs", "Invalid 'chat_template_kwargs': expected an object of template variables.")
	}
	out := make(map[string]jinja.Value, len(kw))
	for k, v := range kw {
		if slices.Contains(templateVars, k) {
			return nil, invalid("chat_template_kwargs", fmt.Sprintf("Invalid 'chat_template_kwargs': %q is set by the server.", k))
		}
		out[k] = jinja.FromGoValue(v)
	}
	return out, nil
}

// render applies the template to msgs with add_generation_prompt set, and the variables of
// extra (chat_template_kwargs; none of templateVars). A raise_exception in the template is
// returned as a *templateError. A developer message goes to a template that does not name that
// role as a system message (OpenAI's newer name for it).
func (t *chatTemplate) render(msgs []message, extra map[string]jinja.Value) (out string, err error) {
	return t.renderTools(msgs, nil, extra)
}

// renderTools is render with tools (nil: none), the tools as sent, passed to the template as
// apply_chat_template(tools=...) passes them.
func (t *chatTemplate) renderTools(msgs []message, tools []any, extra map[string]jinja.Value) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("chat template: %v", r)
		}
	}()
	list := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		role := m.Role
		if role == "developer" && !t.developer {
			role = "system"
		}
		v := jinja.NewDict()
		d := v.AsDict()
		d.Set("role", jinja.NewString(role))
		d.Set("content", jinja.NewString(m.Content))
		if m.Name != "" {
			d.Set("name", jinja.NewString(m.Name))
		}
		if m.ToolCalls != nil {
			d.Set("tool_calls", toolCallsValue(m.ToolCalls))
		}
		if m.ToolCallID != "" {
			d.Set("tool_call_id", jinja.NewString(m.ToolCallID))
		}
		list[i] = v
	}
	vars := map[string]jinja.Value{
		"messages":              jinja.NewList(list),
		"add_generation_prompt": jinja.NewBool(true),
		"bos_token":             t.bos,
		"eos_token":             t.eos,
		"tools":                 toolsValue(tools),
		"documents":             jinja.None(),
		"raise_exception":       raiseException,
		"strftime_now":          strftimeNow,
		"range":                 rangeFn,
	}
	for k, v := range extra {
		if _, set := vars[k]; !set {
			vars[k] = v
		}
	}
	out, err = t.tpl.RenderValues(vars)
	if err != nil {
		var te *templateError
		if errors.As(err, &te) {
			return "", te
		}
		return "", fmt.Errorf("chat template: %w", err)
	}
	return out, nil
}

// toolsValue is tools as the template variable: none without any.
func toolsValue(tools []any) jinja.Value {
	if len(tools) == 0 {
		return jinja.None()
	}
	return jinja.FromGoValue(tools)
}

// strftime formats t with the C strftime directives chat templates use (%d %b %Y and friends).
func strftime(t time.Time, f string) string {
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		if f[i] != '%' || i+1 == len(f) {
			b.WriteByte(f[i])
			continue
		}
		i++
		switch f[i] {
		case 'd':
			fmt.Fprintf(&b, "%02d", t.Day())
		case 'm':
			fmt.Fprintf(&b, "%02d", int(t.Month()))
		case 'Y':
			fmt.Fprintf(&b, "%04d", t.Year())
		case 'y':
			fmt.Fprintf(&b, "%02d", t.Year()%100)
		case 'b':
			b.WriteString(t.Month().String()[:3])
		case 'B':
			b.WriteString(t.Month().String())
		case 'a':
			b.WriteString(t.Weekday().String()[:3])
		case 'A':
			b.WriteString(t.Weekday().String())
		case 'H':
			fmt.Fprintf(&b, "%02d", t.Hour())
		case 'M':
			fmt.Fprintf(&b, "%02d", t.Minute())
		case 'S':
			fmt.Fprintf(&b, "%02d", t.Second())
		case 'j':
			fmt.Fprintf(&b, "%03d", t.YearDay())
		case '%':
			b.WriteByte('%')
		default:
			b.WriteByte('%')
			b.WriteByte(f[i])
		}
	}
	return b.String()
}
