package tests

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// exampleMark is the line before a README code block that runs against the server the README's
// first command starts.
const exampleMark = "<!-- example: serve-first -->"

// readmeBlock is a fenced code block of the README.
type readmeBlock struct {
	lang, body string
	marked     bool // exampleMark precedes it
}

var fenceRE = regexp.MustCompile("(?ms)^```([a-z]*)\n(.*?)^```$")

func readmeBlocks(src string) []readmeBlock {
	var out []readmeBlock
	for _, m := range fenceRE.FindAllStringSubmatchIndex(src, -1) {
		before := strings.TrimRight(src[:m[0]], "\n")
		out = append(out, readmeBlock{
			lang:   src[m[2]:m[3]],
			body:   src[m[4]:m[5]],
			marked: strings.HasSuffix(before, exampleMark),
		})
	}
	return out
}

// TestREADMEExamples: the README's first command starts a server (the binary built here stands
// for the one it builds, on a free port instead of 8080), and every example marked
// "<!-- example: serve-first -->" then runs as written against it: each shell command with
// bash, each JavaScript block with node and tests/node's pinned openai package. A command
// must succeed and print an answer, not an error.
func TestREADMEExamples(t *testing.T) {
	sameInBothBuilds(t)
	src, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := readmeBlocks(string(src))
	if len(blocks) == 0 || blocks[0].lang != "sh" {
		t.Fatalf("the README does not begin with a shell block")
	}
	var serve []string
	for _, line := range strings.Split(blocks[0].body, "\n") {
		line, _, _ = strings.Cut(line, " #")
		f := strings.Fields(line)
		if len(f) >= 2 && strings.HasSuffix(f[0], "parley") && f[1] == "serve" {
			serve = f[2:]
			break
		}
	}
	if serve == nil {
		t.Fatalf("no `parley serve` in the README's first block:\n%s", blocks[0].body)
	}
	shared := sharedtest.Dir(t)
	for i, a := range serve {
		serve[i] = strings.ReplaceAll(a, "../shared/", shared+"/")
		if a == "--port" || strings.HasPrefix(a, "--port=") {
			t.Fatalf("the README's first command names a port; this test gives it a free one")
		}
	}
	srv := startServer(t, serve...)
	const readmeBase = "http://127.0.0.1:8080"

	var sh, js int
	for i, b := range blocks {
		if !b.marked {
			continue
		}
		if !strings.Contains(b.body, readmeBase) {
			t.Errorf("example block %d does not call %s", i, readmeBase)
		}
		body := strings.ReplaceAll(b.body, readmeBase, srv.base)
		switch b.lang {
		case "sh":
			for _, cmd := range shellCommands(body) {
				sh++
				t.Run(fmt.Sprintf("sh %d", sh), func(t *testing.T) {
					if _, err := exec.LookPath(strings.Fields(cmd)[0]); err != nil {
						t.Skipf("%s is not installed", strings.Fields(cmd)[0])
					}
					c := exec.Command("bash", "-c", cmd)
					c.Dir = ".."
					out, err := c.CombinedOutput()
					if err != nil || len(strings.TrimSpace(string(out))) == 0 || strings.Contains(string(out), `"error"`) {
						t.Errorf("%s\n%v: %s", cmd, err, out)
					}
					if strings.Contains(cmd, `"stream":true`) && !strings.Contains(string(out), "data: [DONE]") {
						t.Errorf("%s: the stream did not end with [DONE]:\n%s", cmd, out)
					}
				})
			}
		case "js":
			js++
			t.Run(fmt.Sprintf("js %d", js), func(t *testing.T) {
				node := openAINode(t, " to run the README's JavaScript")
				// Beside tests/node's package.json, so that "openai" resolves to its pinned copy.
				f, err := os.CreateTemp("node", "readme-example-*.mjs")
				if err != nil {
					t.Fatal(err)
				}
				defer os.Remove(f.Name())
				if _, err := f.WriteString(body); err != nil {
					t.Fatal(err)
				}
				f.Close()
				out, err := exec.Command(node, f.Name()).CombinedOutput()
				if err != nil || len(strings.TrimSpace(string(out))) == 0 {
					t.Errorf("%v:\n%s\n%s", err, out, body)
				}
			})
		default:
			t.Errorf("example block %d: language %q is neither sh nor js", i, b.lang)
		}
	}
	if sh == 0 || js == 0 {
		t.Errorf("the README marks %d shell commands and %d JavaScript blocks as examples; want both", sh, js)
	}
}

// shellCommands splits a shell block into its commands: lines joined where they end with a
// backslash, blank lines and comments left out.
func shellCommands(body string) []string {
	var out []string
	var cur strings.Builder
	for _, line := range strings.Split(body, "\n") {
		if strings.HasSuffix(line, "\\") {
			cur.WriteString(strings.TrimSuffix(line, "\\"))
			continue
		}
		cur.WriteString(line)
		if cmd := strings.TrimSpace(cur.String()); cmd != "" && !strings.HasPrefix(cmd, "#") {
			out = append(out, cmd)
		}
		cur.Reset()
	}
	return out
}
