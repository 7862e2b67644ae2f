//go:build cuda && cgo && !nocgo

package tests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
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

// TestCUDAServe serves a Q8_0 model on the cuda backend, where one is usable (a GPU, or the
// emulation), to twelve clients at once: the scheduler then steps twelve sequences together,
// whose products against the quantised weights take the int8 tensor-core kernel, as do the
// prompt chunks of more than eight tokens. Each greedy completion must equal what `parley
// generate` gives on the CPU backend.
func TestCUDAServe(t *testing.T) {
	model := sharedtest.Path(t, "models/llm/stories260K-ffn192-q8_0.gguf")
	if r := parley(t, "", "generate", "--backend", "cuda", "-m", model, "-p", "Once", "-n", "1"); r.code != 0 {
		if os.Getenv("PARLEY_REQUIRE_GPU") == "1" {
			t.Fatalf("PARLEY_REQUIRE_GPU=1 but --backend cuda fails: %s", r.stderr)
		}
		t.Skipf("no usable GPU: %s", strings.TrimSpace(r.stderr))
	}
	prompts := []string{
		"Once upon a time", "The little dog ran to the park and saw a big red ball under the tree",
		"Lily wanted to play", "One day, a boy named Tim found a shiny stone near the river and he",
		"The sun was", "Mom said", "There was a small bird who could not fly, so every morning it",
		"Ben and his sister", "A cat sat on the mat and looked at the rain outside the window",
		"The old man", "Sara had a red hat", "In the big forest there lived a kind bear who liked honey and",
	}
	const n = 24
	want := make([]string, len(prompts))
	for i, p := range prompts {
		r := parley(t, "", "generate", "--backend", "cpu", "-m", model, "-p", p, "-n", fmt.Sprint(n), "--temp", "0", "--ignore-eos", "--json")
		if r.code != 0 {
			t.Fatalf("generate: exit %d: %s", r.code, r.stderr)
		}
		var g struct {
			Text string `json:"text"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &g); err != nil {
			t.Fatal(err)
		}
		want[i] = g.Text
	}
	srv := startServer(t, "--backend", "cuda", "-m", "stories="+model, "--parallel", "16", "--ctx", "256")
	got := make([]string, len(prompts))
	errs := make([]error, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, _ := json.Marshal(map[string]any{"model": "stories", "prompt": p, "max_tokens": n, "temperature": 0, "ignore_eos": true})
			resp, err := http.Post(srv.base+"/v1/completions", "application/json", bytes.NewReader(body))
			if err != nil {
				errs[i] = err
				return
			}
			defer resp.Body.Close()
			raw, _ := io.ReadAll(resp.Body)
			var r struct {
				Choices []struct {
					Text string `json:"text"`
				} `json:"choices"`
			}
			if err := json.Unmarshal(raw, &r); err != nil || resp.StatusCode != 200 || len(r.Choices) != 1 {
				errs[i] = fmt.Errorf("status %d: %s", resp.StatusCode, raw)
				return
			}
			got[i] = r.Choices[0].Text
		}()
	}
	wg.Wait()
	for i := range prompts {
		if errs[i] != nil {
			t.Errorf("%q: %v", prompts[i], errs[i])
		} else if got[i] != want[i] {
			t.Errorf("%q: served on cuda %q, generated on cpu %q", prompts[i], got[i], want[i])
		}
	}
}
