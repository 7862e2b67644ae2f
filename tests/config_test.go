package tests

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// writeConfig writes a config file named name into a temporary directory.
func writeConfig(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

var generatedRE = regexp.MustCompile(`generated: (\d+) tokens`)

// TestConfigPrecedence: a config file's keys set the flags of the command run; a table named
// after the command wins over the top level; $PARLEY_* wins over the file, and the command line
// over both. The tokens generate writes (--n-predict, with --ignore-eos) tell which source won.
func TestConfigPrecedence(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	toml := writeConfig(t, "parley.toml", fmt.Sprintf(`
model = %q
backend = "go"
n-predict = 9 # the [generate] table's value wins
[generate]
n-predict = 2
temp = 0
ignore-eos = true
prompt = "Once"
[serve]
port = 2
`, model))
	yaml := writeConfig(t, "parley.yaml", fmt.Sprintf(`
generate:
  model: %q
  backend: go
  n-predict: 2
  temp: 0.0
  ignore-eos: true
  prompt: Once
  stop: ["never", "nowhere"]
`, model))
	for _, cfg := range []string{toml, yaml} {
		for _, c := range []struct {
			name string
			env  []string
			args []string
			want string
		}{
			{"the file", nil, nil, "2"},
			{"a variable over the file", []string{"PARLEY_N_PREDICT=3"}, nil, "3"},
			{"the command line over the file", nil, []string{"-n", "4"}, "4"},
			{"the command line over a variable and the file", []string{"PARLEY_N_PREDICT=3"}, []string{"--n-predict", "5"}, "5"},
			{"the config file from its variable", []string{"PARLEY_CONFIG=" + cfg, "PARLEY_N_PREDICT=6"}, nil, "6"},
		} {
			t.Run(filepath.Ext(cfg)+"/"+c.name, func(t *testing.T) {
				args := append([]string{"generate"}, c.args...)
				if !strings.HasPrefix(strings.Join(c.env, " "), "PARLEY_CONFIG") {
					args = append(args, "--config", cfg)
				}
				res := parleyEnv(t, c.env, args...)
				m := generatedRE.FindStringSubmatch(res.stderr)
				if res.code != 0 || m == nil || m[1] != c.want {
					t.Errorf("exit %d, generated %v, want %s tokens\n%s", res.code, m, c.want, res.stderr)
				}
			})
		}
	}
}

// TestConfigErrors: an unknown key, a value of the wrong type or out of range, a models entry's
// unknown key, a missing file and an unknown format are usage errors (exit status 2) that name
// the file and the key.
func TestConfigErrors(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	for _, c := range []struct {
		name, file, body string
		args             []string
		says             []string
	}{
		{"unknown key", "p.toml", "prot = 8080\n", nil, []string{`p.toml: unknown key "prot"`, "port"}},
		{"unknown key, YAML", "p.yaml", "port: 8080\nkv_mem: 10\n", nil, []string{`p.yaml: unknown key "kv_mem"`, "kv-mem"}},
		{"unknown key in the command's table", "p.toml", "[serve]\nverbose = true\n", nil, []string{`p.toml: serve: unknown key "verbose"`}},
		{"a one-letter flag is no key", "p.toml", "t = 2\n", nil, []string{`unknown key "t"`, "threads"}},
		{"not a number", "p.toml", "port = \"high\"\n", []string{"-m", model}, []string{`p.toml: invalid value "high" for key port`}},
		{"out of range", "p.yaml", "port: 99999\n", []string{"-m", model}, []string{"p.yaml: port 99999: want a port number from 0 to 65535"}},
		{"a list for one value", "p.toml", "host = [\"a\", \"b\"]\n", nil, []string{"p.toml: host: a list, for a flag that takes one value"}},
		{"a command's table not a table", "p.toml", "serve = 1\n", nil, []string{"p.toml: serve: want a table of serve's flags"}},
		{"models entry's unknown key", "p.toml", "[[models]]\npath = \"" + model + "\"\ncontext = 64\n", nil, []string{`p.toml: models[0]: unknown key "context"`, "ctx"}},
		{"models entry without path", "p.yaml", "models:\n  - alias: x\n", nil, []string{"p.yaml: models[0]: path is required"}},
		{"models entry out of range", "p.yaml", "models:\n  - path: " + model + "\n    parallel: 0\n", nil, []string{"p.yaml: models[0]: parallel and step-tokens must be positive"}},
		{"models entry's kv-type", "p.yaml", "models:\n  - path: " + model + "\n    kv-type: q4_0\n", nil, []string{`p.yaml: models[0]: kv-type "q4_0"`}},
		{"aliases twice", "p.yaml", "models:\n  - {path: " + model + ", alias: a}\n  - {path: " + model + ", alias: a}\n", nil, []string{`p.yaml: models[1]: model alias "a" given twice`}},
		{"syntax", "p.toml", "port = \n", nil, []string{"p.toml:"}},
		{"format", "p.json", "{}", nil, []string{"want a .toml, .yaml or .yml file"}},
		{"missing", "", "", []string{"--config", "/nonexistent/parley.toml"}, []string{"--config /nonexistent/parley.toml: no such file"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"serve"}, c.args...)
			if !strings.Contains(c.body, "port") {
				args = append(args, "--port", "0") // should a case pass, its server is on a free port
			}
			if c.file != "" {
				dir := t.TempDir()
				p := filepath.Join(dir, c.file)
				if err := os.WriteFile(p, []byte(c.body), 0o644); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--config", c.file)
				res := parleyDir(t, dir, args...)
				checkUsage(t, res, c.says)
				return
			}
			checkUsage(t, parley(t, "", args...), c.says)
		})
	}
}

func checkUsage(t *testing.T, res result, says []string) {
	t.Helper()
	if res.code != 2 {
		t.Errorf("exit %d, want 2\n%s", res.code, res.stderr)
	}
	for _, s := range says {
		if !strings.Contains(res.stderr, s) {
			t.Errorf("stderr does not say %q:\n%s", s, res.stderr)
		}
	}
}

// TestConfigServe: serve takes its models from a config file's list, each with its alias and
// options (here a context of its own), and -m on the command line replaces the list.
func TestConfigServe(t *testing.T) {
	sameInBothBuilds(t)
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	cfg := writeConfig(t, "parley.toml", fmt.Sprintf(`
backend = "go"
ctx = 128
parallel = 2

[[models]]
path = %q
alias = "small"
ctx = 64

[[models]]
path = %q
alias = "big"
`, model, model))
	srv := startServer(t, "--config", cfg)
	status, b, _ := postJSON(t, srv.base+"/v1/completions", `{"model":"small","prompt":"Once","max_tokens":70}`)
	if status != 400 || !strings.Contains(string(b), "context of 64 tokens") {
		t.Errorf("small, 70 tokens: %d %s; want 400 naming its context of 64", status, b)
	}
	status, b, _ = postJSON(t, srv.base+"/v1/completions", `{"model":"big","prompt":"Once","max_tokens":70,"temperature":0}`)
	if status != 200 {
		t.Errorf("big, 70 tokens: %d %s", status, b)
	}

	srv = startServer(t, "--config", cfg, "-m", "only="+model)
	status, b, _ = postJSON(t, srv.base+"/v1/completions", `{"model":"small","prompt":"Once","max_tokens":1}`)
	if status != 404 {
		t.Errorf("with -m, the file's model small: %d %s; want 404", status, b)
	}
	if status, b, _ = postJSON(t, srv.base+"/v1/completions", `{"model":"only","prompt":"Once","max_tokens":1}`); status != 200 {
		t.Errorf("with -m, its model: %d %s", status, b)
	}
}

// parleyDir runs parley in the directory dir.
func parleyDir(t *testing.T, dir string, args ...string) result {
	t.Helper()
	cmd := exec.Command(parleyBin, args...)
	cmd.Dir = dir
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(errb.String(), "panic:") {
		t.Fatalf("parley %q panicked:\n%s", args, errb.String())
	}
	return result{code, out.String(), errb.String()}
}
