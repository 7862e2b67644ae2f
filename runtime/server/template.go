package server

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
)

// templateRoot names the chat template inside its loader; no other name resolves, so a template
// cannot include, import or extend anything (in particular not files on disk).
const templateRoot = "/chat_template"

// chatTemplate is a parsed tokenizer.chat_template (Jinja, as Hugging Face renders it).
type chatTemplate struct {
	mu  sync.Mutex // the template engine's evaluation state is not documented as safe to share
	tpl *exec.Template
	bos string // text of the BOS and EOS tokens, as the template variables bos_token/eos_token
	eos string
}

// templateError is raised by a template's raise_exception: the conversation is one the template
// refuses (for example roles that do not alternate). It is the client's error, not the server's.
type templateError struct{ msg string }

func (e *templateError) Error() string { return e.msg }

// message is one chat message as passed to the template: role and text content.
type message struct {
	Role    string
	Content string
}

// parseChatTemplate parses src with Hugging Face's settings (trim_blocks and lstrip_blocks on,
// loop controls available) and the globals HF templates rely on: raise_exception and
// strftime_now, with bos_token and eos_token supplied per render.
func parseChatTemplate(src, bos, eos string) (*chatTemplate, error) {
	loader, err := loaders.NewMemoryLoader(map[string]string{templateRoot: src})
	if err != nil {
		return nil, err
	}
	cfg := config.New()
	cfg.TrimBlocks = true
	cfg.LeftStripBlocks = true
	globals := exec.EmptyContext().
		Update(builtins.GlobalFunctions).
		Update(builtins.GlobalVariables).
		Update(exec.NewContext(map[string]any{
			"raise_exception": func(msg string) (string, error) {
				return "", errors.New(templateErrorMarker + msg)
			},
			"strftime_now": func(format string) string {
				return strftime(time.Now(), format)
			},
		}))
	env := &exec.Environment{
		Context:           globals,
		Filters:           builtins.Filters,
		Tests:             builtins.Tests,
		ControlStructures: builtins.ControlStructures,
		Methods:           builtins.Methods,
	}
	tpl, err := exec.NewTemplate(templateRoot, cfg, loader, env)
	if err != nil {
		return nil, err
	}
	return &chatTemplate{tpl: tpl, bos: bos, eos: eos}, nil
}

// render applies the template to msgs with add_generation_prompt set. A raise_exception in the
// template is returned as a *templateError.
func (t *chatTemplate) render(msgs []message) (string, error) {
	list := make([]any, len(msgs))
	for i, m := range msgs {
		list[i] = map[string]any{"role": m.Role, "content": m.Content}
	}
	data := exec.NewContext(map[string]any{
		"messages":              list,
		"add_generation_prompt": true,
		"bos_token":             t.bos,
		"eos_token":             t.eos,
	})
	t.mu.Lock()
	defer t.mu.Unlock()
	out, err := t.tpl.ExecuteToString(data)
	if err != nil {
		// The engine flattens the error chain into text; recover the template's own message.
		if i := strings.Index(err.Error(), templateErrorMarker); i >= 0 {
			return "", &templateError{msg: err.Error()[i+len(templateErrorMarker):]}
		}
		return "", fmt.Errorf("chat template: %w", err)
	}
	return out, nil
}

// templateErrorMarker prefixes the message of raise_exception so that it can be found in the
// engine's error text.
const templateErrorMarker = "\x00raise_exception: "

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
