package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// TestChatTemplatesAgainstJinja2 renders the templates of testdata/chat (each a construct that
// real chat templates use: conditionals inside brackets and calls, negative indices, str methods
// with Python's defaults, tojson of text with markup and non-ASCII, namespaces, loop controls,
// the generation block, whitespace control) with every conversation of
// testdata/chat/conversations.json, and compares each result byte for byte with Python's jinja2
// set up as Hugging Face transformers sets it up (testdata/chat/render_jinja2.py). A template
// that raises must raise in both, with the same message; one that fails must fail in both.
//
// Constructs known to differ from jinja2 in the template engine, and so not here: str.split's
// maxsplit argument (ignored), a dict literal nested in {{ }}, the "in" test (is in [...]),
// tests with an argument but no parentheses (is divisibleby 2), \u escapes in string literals,
// {%+ %}, printing none as None, and the indentation before a {{ }} that a block tag follows on
// the same line (stripped).
func TestChatTemplatesAgainstJinja2(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "chat", "*.jinja"))
	if err != nil || len(files) < 50 {
		t.Fatalf("templates: %d found, %v", len(files), err)
	}
	var srcs []namedTemplate
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		srcs = append(srcs, namedTemplate{filepath.Base(f), string(src)})
	}
	compareWithJinja2(t, srcs)
}

// namedTemplate is a chat template's source and the name a test reports it under.
type namedTemplate struct{ name, src string }

// compareWithJinja2 renders every template with every conversation of
// testdata/chat/conversations.json, here and with jinja2 (testdata/chat/render_jinja2.py), and
// reports every difference.
func compareWithJinja2(t *testing.T, templates []namedTemplate) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 is not installed: the jinja2 reference cannot run")
	}
	if out, err := exec.Command(py, "-c", "import jinja2").CombinedOutput(); err != nil {
		t.Skipf("python3 has no jinja2 (Debian: python3-jinja2), the reference renderer: %s", out)
	}
	var convs map[string][]map[string]string
	b, err := os.ReadFile(filepath.Join("testdata", "chat", "conversations.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &convs); err != nil {
		t.Fatal(err)
	}
	convNames := make([]string, 0, len(convs))
	for n := range convs {
		convNames = append(convNames, n)
	}
	sort.Strings(convNames)

	type refMessage struct { // role before content, as the messages of a request
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	type job struct {
		Template string       `json:"template"`
		Messages []refMessage `json:"messages"`
	}
	type result struct {
		Out   *string `json:"out"`
		Raise *string `json:"raise"`
		Error *string `json:"error"`
	}
	type ours struct {
		name string
		out  string
		err  error
	}
	var jobs []job
	var got []ours
	for _, nt := range templates {
		src := nt.src
		tm, perr := parseChatTemplate(src, "<s>", "</s>")
		for _, cn := range convNames {
			msgs := make([]message, len(convs[cn]))
			ref := make([]refMessage, len(convs[cn]))
			for i, m := range convs[cn] {
				msgs[i] = message{Role: m["role"], Content: m["content"]}
				role := m["role"]
				if role == "developer" && !strings.Contains(src, "developer") {
					role = "system" // what render does for such a template
				}
				ref[i] = refMessage{Role: role, Content: m["content"]}
			}
			o := ours{name: nt.name + " / " + cn, err: perr}
			if perr == nil {
				o.out, o.err = tm.render(msgs, nil)
			}
			got = append(got, o)
			jobs = append(jobs, job{Template: src, Messages: ref})
		}
	}
	in, err := json.Marshal(map[string]any{"bos": "<s>", "eos": "</s>", "jobs": jobs})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, filepath.Join("testdata", "chat", "render_jinja2.py"))
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("reference renderer: %v\n%s", err, stderr.String())
	}
	var want []result
	if err := json.Unmarshal(out, &want); err != nil || len(want) != len(got) {
		t.Fatalf("reference renderer: %d results for %d renders, %v", len(want), len(got), err)
	}
	for i, g := range got {
		w := want[i]
		var te *templateError
		switch {
		case w.Out != nil:
			if g.err != nil {
				t.Errorf("%s: %v; jinja2 renders %q", g.name, g.err, *w.Out)
			} else if g.out != *w.Out {
				t.Errorf("%s:\n got %q\nwant %q", g.name, g.out, *w.Out)
			}
		case w.Raise != nil:
			if !errors.As(g.err, &te) || te.msg != *w.Raise {
				t.Errorf("%s: got %q, %v; jinja2 raises %q", g.name, g.out, g.err, *w.Raise)
			}
		default:
			if g.err == nil {
				t.Errorf("%s: rendered %q; jinja2 fails: %s", g.name, g.out, *w.Error)
			}
		}
	}
}

// TestChatTemplateRender: the variables render passes, the developer role, the newline Jinja
// drops at the end of a template, and failures of the template engine reported as errors.
func TestChatTemplateRender(t *testing.T) {
	render := func(src string, msgs ...message) (string, error) {
		t.Helper()
		tm, err := parseChatTemplate(src, "<s>", "</s>")
		if err != nil {
			t.Fatalf("%q: %v", src, err)
		}
		return tm.render(msgs, nil)
	}
	user := message{Role: "user", Content: "hi"}
	dev := message{Role: "developer", Content: "be brief"}
	for _, c := range []struct {
		src  string
		msgs []message
		want string
	}{
		{"{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools is none }}|{{ documents is none }}", []message{user}, "<s>|</s>|True|True|True"},
		{"{% for m in messages %}{{ m.role }}:{{ m['content'] }};{% endfor %}", []message{dev, user}, "system:be brief;user:hi;"},
		{"{% for m in messages %}{{ m.role }};{% endfor %}{# developer is a role of its own here #}", []message{dev, user}, "developer;user;"},
		{"{{ messages | tojson }}", []message{user}, `[{"role": "user", "content": "hi"}]`},
		{"{% for i in range(3) %}{{ i }}{% endfor %}|{{ range(1, 7, 2)|list }}|{{ range(5, 0, -2)|list }}|{{ range(0)|list }}|{{ range(3, 1)|list }}", nil, "012|[1, 3, 5]|[5, 3, 1]|[]|[]"},
		{"a\n", nil, "a"},
		{"a\n\n", nil, "a\n"},
		{"a\r\n", nil, "a"},
	} {
		got, err := render(c.src, c.msgs...)
		if err != nil || got != c.want {
			t.Errorf("%q: got %q, %v; want %q", c.src, got, err, c.want)
		}
	}
	_, err := render("{{ raise_exception('no system messages') }}", user)
	var te *templateError
	if !errors.As(err, &te) || te.msg != "no system messages" {
		t.Errorf("raise_exception: %v", err)
	}
	// A selectattr with the test left out panics inside the engine: an error, not a crash.
	if out, err := render("{{ messages | selectattr('missing') | list | length }}", user); err == nil || errors.As(err, &te) {
		t.Errorf("engine failure: %q, %v", out, err)
	}
	// A template cannot make the server allocate without bound through range.
	if out, err := render("{% for i in range(10000000000) %}{% endfor %}", user); err == nil {
		t.Errorf("range(1e10): %q", out)
	}
	if _, err := parseChatTemplate("{% for %}", "", ""); err == nil {
		t.Error("a template that does not parse was accepted")
	}
}
