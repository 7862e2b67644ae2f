package server

// Scratch audit test (to be deleted): renders /tmp/tplaudit templates with Parley's chat-template
// code, exactly as the server does, and writes the results to /tmp/tplaudit/out/go.

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/parleyhq/parley/runtime/sched"
)

const auditRoot = "/tmp/tplaudit"

func auditConvs(t *testing.T) (map[string][]message, []string) {
	raw, err := os.ReadFile(filepath.Join(auditRoot, "convs.json"))
	if err != nil {
		t.Skip(err)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	out := map[string][]message{}
	var names []string
	for k, v := range m {
		msgs, e := parseMessages(v) // as the server parses a request's messages
		if e != nil {
			t.Fatalf("%s: %+v", k, e)
		}
		out[k] = msgs
		names = append(names, k)
	}
	sort.Strings(names)
	return out, names
}

func TestZZAuditRender(t *testing.T) {
	convs, names := auditConvs(t)
	files, _ := filepath.Glob(filepath.Join(auditRoot, "all", "*.jinja"))
	feats, _ := filepath.Glob(filepath.Join(auditRoot, "features", "*.jinja"))
	files = append(files, feats...)
	outdir := filepath.Join(auditRoot, "out", "go")
	os.MkdirAll(outdir, 0o755)
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".jinja")
		src, _ := os.ReadFile(f)
		var tm *chatTemplate
		var perr error
		func() {
			defer func() {
				if r := recover(); r != nil {
					perr = fmt.Errorf("PANIC in parse: %v", r)
				}
			}()
			tm, perr = parseChatTemplate(string(src), "<s>", "</s>")
		}()
		for _, c := range names {
			base := filepath.Join(outdir, name+"__"+c)
			os.Remove(base + ".txt")
			os.Remove(base + ".err")
			if perr != nil {
				os.WriteFile(base+".err", []byte("PARSE: "+perr.Error()), 0o644)
				continue
			}
			var out string
			var err error
			func() {
				defer func() {
					if r := recover(); r != nil {
						err = fmt.Errorf("PANIC: %v", r)
					}
				}()
				out, err = tm.render(convs[c])
			}()
			if err != nil {
				var te *templateError
				kind := "ERROR: "
				if errorsAs(err, &te) {
					kind = "RAISE: "
				}
				os.WriteFile(base+".err", []byte(kind+err.Error()), 0o644)
				continue
			}
			os.WriteFile(base+".txt", []byte(out), 0o644)
		}
	}
}

func errorsAs(err error, te **templateError) bool {
	e, ok := err.(*templateError)
	if ok {
		*te = e
	}
	return ok
}

// TestZZAuditTiming: parse and per-request render cost of the largest templates.
func TestZZAuditTiming(t *testing.T) {
	convs, _ := auditConvs(t)
	for _, name := range []string{"all/openai-gpt-oss-120b.jinja", "all/meta-llama-Llama-3.1-8B-Instruct.jinja", "all/Qwen-Qwen3-0.6B.jinja", "all/google-gemma-4-31B-it.jinja", "all/hf-zephyr.jinja"} {
		src, err := os.ReadFile(filepath.Join(auditRoot, name))
		if err != nil {
			t.Log(err)
			continue
		}
		t0 := time.Now()
		tm, err := parseChatTemplate(string(src), "<s>", "</s>")
		parse := time.Since(t0)
		if err != nil {
			t.Logf("%s: parse error %v", name, err)
			continue
		}
		// a long conversation: 40 turns
		var long []message
		for i := 0; i < 20; i++ {
			long = append(long, message{Role: "user", Content: strings.Repeat("question text ", 50)}, message{Role: "assistant", Content: strings.Repeat("answer text ", 50)})
		}
		long = append(long, message{Role: "user", Content: "last"})
		for _, c := range []struct {
			n    string
			msgs []message
		}{{"sys_multi", convs["sys_multi"]}, {"41 msgs", long}} {
			const N = 200
			t1 := time.Now()
			var rerr error
			for i := 0; i < N; i++ {
				_, rerr = tm.render(c.msgs)
			}
			t.Logf("%-50s %6d B  parse %8v  render(%s) %8v/op  err=%v", name, len(src), parse, c.n, time.Since(t1)/N, rerr)
		}
	}
}

// TestZZAuditHTTP: what a client gets when the model's template fails in the engine.
func TestZZAuditHTTP(t *testing.T) {
	p := modelPath(t)
	for _, tc := range []struct{ name, tpl string }{
		{"undefined-method", `{{ messages[0].content.nosuchmethod() }}`},
		{"undef-chain", `{{ foo.bar }}{{ messages[0].content }}`},
		{"parse-error", `{% for m in messages %}{{ m.content }}`},
		{"raise", `{{ raise_exception('nope') }}`},
		{"lstrip-default", `{{ messages[0].content.rstrip() }}|`},
	} {
		e := openEngine(t, withTemplate(t, p, tc.tpl))
		sc, _ := newSched(t, e, sched.Config{}, true)
		s, err := New(Config{}, []*Model{{Name: "m", Engine: e, Sched: sc, Ctx: testCtx}})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(s.Handler())
		h := &harness{srv: srv, s: s}
		resp, b := h.post(t, "/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "user", "content": "hi 32  "}}, "max_tokens": 2})
		t.Logf("%-18s -> %d %s", tc.name, resp.StatusCode, strings.TrimSpace(string(b)))
		srv.Close()
	}
}
