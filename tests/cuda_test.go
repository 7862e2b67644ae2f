//go:build cuda && cgo && !nocgo

package tests

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestCUDABuild runs the binary built with the CUDA backend as a user would. Without a usable
// GPU (CI): --backend cuda fails with a message that says why, and --backend auto notes why it
// skipped cuda and generates on the CPU exactly what the CPU backend generates (llama.cpp's
// tokens). With one: the cuda backend's greedy generation equals the CPU backend's (and auto
// picks cuda).
func TestCUDABuild(t *testing.T) {
	model, refs := llamaCppGenerations(t)
	gen := func(be, prompt string) result {
		return parley(t, "", "generate", "--backend", be, "-m", model, "-p", prompt, "-n", "64", "--temp", "0", "--ignore-eos", "--json")
	}
	probe := gen("cuda", refs[0].Prompt)
	gpu := probe.code == 0
	if !gpu {
		if os.Getenv("PARLEY_REQUIRE_GPU") == "1" {
			t.Fatalf("PARLEY_REQUIRE_GPU=1 but --backend cuda fails: %s", probe.stderr)
		}
		if probe.code != 1 || !strings.Contains(probe.stderr, "cuda") || strings.Contains(probe.stderr, "panic") {
			t.Fatalf("--backend cuda without a GPU: exit %d, stderr %q; want exit 1 and a message naming cuda", probe.code, probe.stderr)
		}
		t.Logf("--backend cuda: %s", strings.TrimSpace(probe.stderr))
	}
	for _, r := range refs {
		cpu := gen("cpu", r.Prompt)
		if cpu.code != 0 {
			t.Fatalf("cpu: exit %d: %s", cpu.code, cpu.stderr)
		}
		auto := gen("auto", r.Prompt)
		if auto.code != 0 {
			t.Fatalf("auto: exit %d: %s", auto.code, auto.stderr)
		}
		if gpu {
			cuda := gen("cuda", r.Prompt)
			if cuda.code != 0 {
				t.Fatalf("cuda: exit %d: %s", cuda.code, cuda.stderr)
			}
			// Log-probabilities may differ in their last digits; the tokens and text may not.
			if a, b := tokensOf(t, cuda.stdout), tokensOf(t, cpu.stdout); a != b {
				t.Errorf("%q: cuda generated %s, cpu %s", r.Prompt, a, b)
			}
			continue
		}
		if !strings.Contains(auto.stderr, "backend cuda unavailable") {
			t.Errorf("auto without a GPU: stderr %q, want a note saying why cuda was skipped", auto.stderr)
		}
		if auto.stdout != cpu.stdout {
			t.Errorf("%q: auto without a GPU printed\n%s\nthe cpu backend\n%s", r.Prompt, auto.stdout, cpu.stdout)
		}
	}
}

// tokensOf returns the generated ids and text of generate --json's output.
func tokensOf(t *testing.T, out string) string {
	t.Helper()
	var got struct {
		Tokens []int32 `json:"tokens"`
		Text   string  `json:"text"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatalf("generate --json printed %q: %v", out, err)
	}
	return fmt.Sprintf("%v %q", got.Tokens, got.Text)
}
