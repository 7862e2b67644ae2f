package tests

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// echoResponse is the part of a completion an evaluation harness reads when it scores text.
type echoResponse struct {
	Choices []struct {
		Text     string `json:"text"`
		Logprobs *struct {
			Tokens        []string             `json:"tokens"`
			TokenLogprobs []*float64           `json:"token_logprobs"`
			TopLogprobs   []map[string]float64 `json:"top_logprobs"`
			TextOffset    []int                `json:"text_offset"`
		} `json:"logprobs"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// TestServeEcho scores text as lm-evaluation-harness's local-completions model does
// ({"prompt", "echo": true, "logprobs": 1, "max_tokens": 0}) against `parley serve`, over HTTP
// and through the official openai client: the text comes back with a log-probability for every
// prompt token but the BOS the tokenizer added, and a prompt's scores are those of its prefixes
// (the model is causal), however the server chunks the prompts.
func TestServeEcho(t *testing.T) {
	model := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	srv := startServer(t, "--backend", "go", "-m", "stories="+model, "--parallel", "4", "--ctx", "256")
	const long = "Once upon a time, there was a little girl named Lily. She loved to play outside."
	const short = "Once upon a time, there was a little girl"
	score := func(prompt string) *echoResponse {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": "stories", "prompt": prompt, "echo": true, "logprobs": 1, "max_tokens": 0})
		code, b, _ := postJSON(t, srv.base+"/v1/completions", string(body))
		if code != 200 {
			t.Fatalf("status %d: %s", code, b)
		}
		var r echoResponse
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err, string(b))
		}
		c := r.Choices
		if len(c) != 1 || c[0].Text != prompt || c[0].FinishReason != "length" || c[0].Logprobs == nil || r.Usage.CompletionTokens != 0 {
			t.Fatalf("scoring %q: %s", prompt, b)
		}
		lp := c[0].Logprobs
		if n := len(lp.Tokens); n != r.Usage.PromptTokens-1 || len(lp.TokenLogprobs) != n || len(lp.TopLogprobs) != n || len(lp.TextOffset) != n {
			t.Fatalf("scoring %q: %d prompt tokens, logprobs %+v", prompt, r.Usage.PromptTokens, lp)
		}
		if strings.Join(lp.Tokens, "") != " "+prompt || lp.TextOffset[0] != 0 {
			t.Errorf("tokens %q, offsets %v", lp.Tokens, lp.TextOffset)
		}
		for i, v := range lp.TokenLogprobs {
			if v == nil || *v > 0 || len(lp.TopLogprobs[i]) == 0 || len(lp.TopLogprobs[i]) > 2 {
				t.Fatalf("token %d %q: logprob %v, top %v", i, lp.Tokens[i], v, lp.TopLogprobs[i])
			}
			if top := lp.TopLogprobs[i][lp.Tokens[i]]; top != *v {
				t.Errorf("token %d %q: top_logprobs %v lack it", i, lp.Tokens[i], lp.TopLogprobs[i])
			}
		}
		return &r
	}
	l, s := score(long), score(short)
	ll, sl := l.Choices[0].Logprobs, s.Choices[0].Logprobs
	for i := range sl.Tokens {
		if sl.Tokens[i] != ll.Tokens[i] || *sl.TokenLogprobs[i] != *ll.TokenLogprobs[i] {
			t.Errorf("token %d: %q %v in the short prompt, %q %v in the long one", i, sl.Tokens[i], *sl.TokenLogprobs[i], ll.Tokens[i], *ll.TokenLogprobs[i])
		}
	}
	// Without echo, max_tokens 0 is refused.
	if code, b, _ := postJSON(t, srv.base+"/v1/completions", `{"model":"stories","prompt":"Hi","max_tokens":0}`); code != 400 {
		t.Errorf("max_tokens 0 without echo: %d %s", code, b)
	}

	t.Run("openai node client", func(t *testing.T) {
		node := openAINode(t, "")
		const script = `import OpenAI from "openai";
const [baseURL, prompt] = process.argv.slice(1);
const client = new OpenAI({ baseURL, apiKey: "none", maxRetries: 0 });
const r = await client.completions.create({ model: "stories", prompt, echo: true, logprobs: 1, max_tokens: 0 });
process.stdout.write(JSON.stringify(r) + "\n");`
		cmd := exec.Command(node, "--input-type=module", "-e", script, srv.base+"/v1", long)
		cmd.Dir = "node" // where node_modules/openai is
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("client: %v\n%s", err, out)
		}
		var r echoResponse
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatal(err, string(out))
		}
		if len(r.Choices) != 1 || r.Choices[0].Text != long || r.Choices[0].Logprobs == nil {
			t.Fatalf("client got %s", out)
		}
		got := r.Choices[0].Logprobs
		if len(got.Tokens) != len(ll.Tokens) {
			t.Fatalf("client got %d tokens, HTTP %d", len(got.Tokens), len(ll.Tokens))
		}
		for i := range got.Tokens {
			if got.Tokens[i] != ll.Tokens[i] || got.TokenLogprobs[i] == nil || *got.TokenLogprobs[i] != *ll.TokenLogprobs[i] || got.TextOffset[i] != ll.TextOffset[i] {
				t.Errorf("token %d: client %q %v @%d, HTTP %q %v @%d", i, got.Tokens[i], got.TokenLogprobs[i], got.TextOffset[i], ll.Tokens[i], *ll.TokenLogprobs[i], ll.TextOffset[i])
			}
		}
	})
}
