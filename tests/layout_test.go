package tests

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The layers of docs/architecture.md, bottom first. A package may import packages of lower
// layers and of its own; the rules below the table forbid the exceptions.
var layers = []struct {
	name     string
	prefixes []string // package paths below the module, a trailing "/" meaning the subtree
}{
	{"base", []string{"runtime/tensor", "internal/"}},
	{"bindings", []string{"bindings/"}},
	{"formats", []string{"runtime/quant", "runtime/gguf", "runtime/ggml", "runtime/safetensors", "runtime/audio", "runtime/tokenizer", "runtime/tokenizer/", "runtime/hub"}},
	{"backend", []string{"runtime/backend", "runtime/backend/"}},
	{"model support", []string{"runtime/kvcache", "runtime/pooling"}},
	{"model", []string{"runtime/models/"}},
	{"decode", []string{"runtime/decode", "runtime/decode/"}},
	{"sched", []string{"runtime/sched", "runtime/sched/"}},
	{"opener", []string{"runtime/models"}},
	{"server", []string{"runtime/server"}},
	{"test support", []string{"internal/sharedtest", "internal/modeltest"}},
	{"cmd", []string{"cmd/"}},
}

const module = "github.com/parleyhq/parley/"

// layerOf returns the index of p's layer (p below the module), the longest prefix winning, or
// -1.
func layerOf(p string) int {
	best, bestLen := -1, -1
	for i, l := range layers {
		for _, pre := range l.prefixes {
			ok := p == pre || strings.HasSuffix(pre, "/") && strings.HasPrefix(p, pre)
			if ok && len(pre) > bestLen {
				best, bestLen = i, len(pre)
			}
		}
	}
	return best
}

// family is the model family a package under runtime/models/ belongs to ("" for others).
func family(p string) string {
	rest, ok := strings.CutPrefix(p, "runtime/models/")
	if !ok {
		return ""
	}
	f, _, _ := strings.Cut(rest, "/")
	return f
}

// sameBinding reports whether two packages under bindings/ belong to one binding (bindings/cpu
// and its internal packages).
func sameBinding(a, b string) bool {
	top := func(p string) string {
		parts := strings.SplitN(p, "/", 3)
		return strings.Join(parts[:min(2, len(parts))], "/")
	}
	return top(a) == top(b)
}

type listed struct {
	ImportPath string
	Imports    []string
	Deps       []string
	GoFiles    []string
	CgoFiles   []string
	Standard   bool
}

func goList(t *testing.T, tags string) []listed {
	t.Helper()
	args := []string{"list", "-deps=false", "-json"}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	args = append(args, "../...")
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []listed
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p listed
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// TestLayout holds the import graph to docs/architecture.md (its table of layers): no package imports a higher layer;
// only bindings/ imports "C", and bindings/ imports no module package but runtime/tensor (and
// its own internals); a model family imports no other family; the server reaches no model
// family, backend implementation or file format directly; decoding policies import no model.
func TestLayout(t *testing.T) {
	sameInBothBuilds(t)
	for _, tags := range []string{"", "nocgo", "cuda"} {
		t.Run("tags="+tags, func(t *testing.T) {
			for _, p := range goList(t, tags) {
				self, ok := strings.CutPrefix(p.ImportPath, module)
				if !ok || strings.HasPrefix(self, "tests") || len(p.GoFiles)+len(p.CgoFiles) == 0 { // the harness, and packages of tests alone
					continue
				}
				ls := layerOf(self)
				if ls < 0 {
					t.Errorf("%s belongs to no layer of docs/architecture.md", self)
					continue
				}
				for _, imp := range p.Imports {
					if imp == "C" && !strings.HasPrefix(self, "bindings/") {
						t.Errorf("%s imports \"C\": only bindings/ may", self)
					}
					dep, ok := strings.CutPrefix(imp, module)
					if !ok {
						continue
					}
					ld := layerOf(dep)
					switch {
					case ld > ls:
						t.Errorf("%s (%s) imports %s (%s), a higher layer", self, layers[ls].name, dep, layers[ld].name)
					case strings.HasPrefix(self, "bindings/") && dep != "runtime/tensor" && !sameBinding(self, dep):
						t.Errorf("%s imports %s: bindings import no module package but runtime/tensor", self, dep)
					case family(self) != "" && family(dep) != "" && family(self) != family(dep):
						t.Errorf("model family %s imports family %s", self, dep)
					case layers[ls].name == "server" && slices.Contains([]string{"model", "formats"}, layers[ld].name) && !strings.HasPrefix(dep, "runtime/audio") && !strings.HasPrefix(dep, "runtime/tokenizer"):
						t.Errorf("%s imports %s: the server talks to sched and the opener, not to a model or a file format", self, dep)
					case layers[ls].name == "server" && strings.HasPrefix(dep, "runtime/backend/"):
						t.Errorf("%s imports the backend implementation %s", self, dep)
					case layers[ls].name == "decode" && layers[ld].name == "model":
						t.Errorf("%s imports the model %s: decoding policies serve every family", self, dep)
					}
				}
			}
		})
	}
}
