package server

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
)

// echoLogprobs is a choice's legacy logprobs as a client reads them: token_logprobs and
// top_logprobs may hold nulls.
type echoLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []*float64           `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// echoChoice is one choice assembled from a response or from the chunks of a stream.
type echoChoice struct {
	text   string
	finish string
	lp     *echoLogprobs // nil: logprobs null throughout
	chunks []string      // streamed: the text of each chunk
	lps    []*echoLogprobs
}

type echoUsage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

// echoPost posts a completion request (streamed when body says so, with usage) and assembles
// its choices by index.
func echoPost(t *testing.T, h *harness, body map[string]any) ([]*echoChoice, *echoUsage) {
	t.Helper()
	body["model"] = "stories"
	stream, _ := body["stream"].(bool)
	if stream {
		body["stream_options"] = map[string]any{"include_usage": true}
	}
	resp, b := h.post(t, "/v1/completions", body)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	chunks := responseChunks(t, b, stream)
	var out []*echoChoice
	var usage *echoUsage
	for _, c := range chunks {
		var r struct {
			Choices []struct {
				Index        int           `json:"index"`
				Text         *string       `json:"text"`
				Logprobs     *echoLogprobs `json:"logprobs"`
				FinishReason *string       `json:"finish_reason"`
			} `json:"choices"`
			Usage *echoUsage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(c), &r); err != nil {
			t.Fatalf("%v: %s", err, c)
		}
		if r.Usage != nil {
			usage = r.Usage
		}
		for _, ch := range r.Choices {
			for len(out) <= ch.Index {
				out = append(out, &echoChoice{})
			}
			o := out[ch.Index]
			o.text += deref(ch.Text)
			o.chunks = append(o.chunks, deref(ch.Text))
			o.lps = append(o.lps, ch.Logprobs)
			if ch.FinishReason != nil {
				o.finish = *ch.FinishReason
			}
			if lp := ch.Logprobs; lp != nil {
				if o.lp == nil {
					o.lp = &echoLogprobs{}
				}
				o.lp.Tokens = append(o.lp.Tokens, lp.Tokens...)
				o.lp.TokenLogprobs = append(o.lp.TokenLogprobs, lp.TokenLogprobs...)
				o.lp.TopLogprobs = append(o.lp.TopLogprobs, lp.TopLogprobs...)
				o.lp.TextOffset = append(o.lp.TextOffset, lp.TextOffset...)
			}
		}
	}
	if usage == nil {
		t.Fatalf("no usage: %s", b)
	}
	return out, usage
}

// slice returns the entries from..to of lp.
func (lp *echoLogprobs) slice(from, to int) *echoLogprobs {
	return &echoLogprobs{lp.Tokens[from:to], lp.TokenLogprobs[from:to], lp.TopLogprobs[from:to], lp.TextOffset[from:to]}
}

func (lp *echoLogprobs) len() int { return len(lp.Tokens) }

// equalLogprobs compares two logprobs entry by entry.
func equalLogprobs(t *testing.T, what string, a, b *echoLogprobs) {
	t.Helper()
	if a.len() != b.len() || len(a.TokenLogprobs) != a.len() || len(a.TopLogprobs) != a.len() || len(a.TextOffset) != a.len() {
		t.Fatalf("%s: %d tokens and %d, or ragged: %+v %+v", what, a.len(), b.len(), a, b)
	}
	for i := range a.Tokens {
		la, lb := a.TokenLogprobs[i], b.TokenLogprobs[i]
		if a.Tokens[i] != b.Tokens[i] || (la == nil) != (lb == nil) || (la != nil && *la != *lb) ||
			!maps.Equal(a.TopLogprobs[i], b.TopLogprobs[i]) || a.TextOffset[i] != b.TextOffset[i] {
			t.Errorf("%s: token %d: %q %v %v @%d, want %q %v %v @%d", what, i, a.Tokens[i], deref(la), a.TopLogprobs[i], a.TextOffset[i],
				b.Tokens[i], deref(lb), b.TopLogprobs[i], b.TextOffset[i])
		}
	}
}

// checkOffsets checks that the tokens of lp sit at their text_offset in text: each token's text
// (its first, the prompt's space prefix dropped) is the text there.
func checkOffsets(t *testing.T, text string, lp *echoLogprobs) {
	t.Helper()
	runes := []rune(text)
	for i, tok := range lp.Tokens {
		o := lp.TextOffset[i]
		if i == 0 {
			tok = strings.TrimPrefix(tok, " ")
			if o != 0 {
				t.Errorf("first text_offset %d", o)
			}
		}
		if o < 0 || o > len(runes) || !strings.HasPrefix(string(runes[o:]), tok) {
			t.Errorf("token %d %q at text_offset %d of %q", i, tok, o, text)
		}
	}
}

// TestEchoText: echo prepends the prompt, as given or detokenized from token ids, to what the
// same request without echo completes; usage is unchanged. max_tokens 0 needs echo, and gives the
// prompt alone.
func TestEchoText(t *testing.T) {
	h := newHarness(t, Config{})
	tk := h.plainLLM.Tokenizer
	toks, err := tk.Encode(logprobPrompt, true, true)
	if err != nil {
		t.Fatal(err)
	}
	plain, pu := echoPost(t, h, map[string]any{"prompt": logprobPrompt, "max_tokens": 10, "temperature": 0})
	for _, stream := range []bool{false, true} {
		for _, prompt := range []any{logprobPrompt, toks, toks[1:]} {
			got, u := echoPost(t, h, map[string]any{"prompt": prompt, "max_tokens": 10, "temperature": 0, "echo": true, "stream": stream})
			if len(got) != 1 || got[0].text != logprobPrompt+plain[0].text || got[0].finish != plain[0].finish || got[0].lp != nil {
				t.Errorf("stream %v, prompt %v: %+v, want %q", stream, prompt, got[0], logprobPrompt+plain[0].text)
			}
			if p, ok := prompt.([]int32); ok {
				if *u != (echoUsage{len(p), pu.CompletionTokens, len(p) + pu.CompletionTokens}) {
					t.Errorf("usage %+v, without echo %+v", u, pu)
				}
			} else if *u != *pu {
				t.Errorf("usage %+v, without echo %+v", u, pu)
			}
			if stream && (len(got[0].chunks) < 2 || got[0].chunks[0] != logprobPrompt) {
				t.Errorf("first chunk %q, want the prompt", got[0].chunks)
			}
		}
	}
	// max_tokens 0: the prompt alone.
	for _, stream := range []bool{false, true} {
		got, u := echoPost(t, h, map[string]any{"prompt": logprobPrompt, "max_tokens": 0, "echo": true, "stream": stream})
		if len(got) != 1 || got[0].text != logprobPrompt || got[0].finish != "length" || *u != (echoUsage{len(toks), 0, len(toks)}) {
			t.Errorf("max_tokens 0, stream %v: %+v, usage %+v", stream, got[0], u)
		}
	}
	h.expectError(t, "/v1/completions", `{"model":"stories","prompt":"a","max_tokens":0}`, "max_tokens", "")
	h.expectError(t, "/v1/completions", `{"model":"stories","prompt":"a","max_tokens":0,"echo":false}`, "max_tokens", "")
	h.expectError(t, "/v1/completions", `{"model":"stories","prompt":"a","max_tokens":-1,"echo":true}`, "max_tokens", "")
	h.expectError(t, "/v1/chat/completions", `{"model":"stories-chat","messages":[{"role":"user","content":"hi"}],"max_tokens":0,"echo":true}`, "max_tokens", "")
}

// TestEchoLogprobs: with echo and logprobs, the logprobs start with the prompt's tokens: the
// BOS the tokenizer added is left out, and the first token reported is given it; from a
// token-id prompt every token is reported, the first with null token_logprob and top_logprobs.
// Each prompt token's log-probability and alternatives are exactly what /v1/completions reports
// for it as the first generated token of the prompt before it (logit_bias forcing it: reported
// probabilities are the raw model's); the completion's logprobs are those of the same request
// without echo, text_offset running on from the prompt. max_tokens 0 reports the prompt alone.
func TestEchoLogprobs(t *testing.T) {
	h := newHarness(t, Config{})
	tk := h.plainLLM.Tokenizer
	toks, err := tk.Encode(logprobPrompt, true, true)
	if err != nil {
		t.Fatal(err)
	}
	bos := tk.Vocab().BOS
	if toks[0] != bos || len(toks) < 4 {
		t.Fatalf("prompt tokens %v, want BOS %d and a few more", toks, bos)
	}
	p := len(toks) - 1 // tokens reported of the text prompt
	const k, gen = 2, 6
	base := map[string]any{"prompt": logprobPrompt, "max_tokens": gen, "temperature": 0, "logprobs": k, "ignore_eos": true}
	plain, _ := echoPost(t, h, maps.Clone(base))
	echo := maps.Clone(base)
	echo["echo"] = true
	got, u := echoPost(t, h, echo)
	c := got[0]
	if c.text != logprobPrompt+plain[0].text || c.lp == nil || c.lp.len() != p+gen {
		t.Fatalf("echo: %q with %+v, want %q and %d tokens", c.text, c.lp, logprobPrompt+plain[0].text, p+gen)
	}
	if *u != (echoUsage{len(toks), gen, len(toks) + gen}) {
		t.Errorf("usage %+v", u)
	}
	if strings.Join(c.lp.Tokens, "") != " "+c.text {
		t.Errorf("tokens %q do not spell the text %q (with SentencePiece's space before it)", c.lp.Tokens, c.text)
	}
	equalLogprobs(t, "completion", c.lp.slice(p, p+gen), plain[0].lp)
	checkOffsets(t, c.text, c.lp)
	// Each prompt token as the first generated token of the prompt before it.
	for i := 1; i < len(toks); i++ {
		one, _ := echoPost(t, h, map[string]any{"prompt": toks[:i], "max_tokens": 1, "temperature": 0, "logprobs": k,
			"logit_bias": map[string]int{fmt.Sprint(toks[i]): 100}})
		want := one[0].lp
		if want.Tokens[0] != string(tk.Piece(toks[i])) {
			t.Fatalf("prompt %v: generated %q, not token %d", toks[:i], want.Tokens[0], toks[i])
		}
		// Its text_offset too: the prompt before it, in characters, in both.
		equalLogprobs(t, fmt.Sprintf("prompt token %d", i), c.lp.slice(i-1, i), want)
		if len(c.lp.TopLogprobs[i-1]) < 1 || len(c.lp.TopLogprobs[i-1]) > k+1 {
			t.Errorf("prompt token %d: top_logprobs %v", i, c.lp.TopLogprobs[i-1])
		}
	}

	// Token ids with BOS: BOS first, null; then as the text prompt's.
	echo["prompt"] = toks
	ids, _ := echoPost(t, h, echo)
	lp := ids[0].lp
	if ids[0].text != c.text || lp.len() != p+1+gen || lp.Tokens[0] != "" || lp.TokenLogprobs[0] != nil || lp.TopLogprobs[0] != nil || lp.TextOffset[0] != 0 {
		t.Fatalf("token ids: %q %+v", ids[0].text, lp)
	}
	equalLogprobs(t, "token ids", lp.slice(1, lp.len()), c.lp)
	// Token ids without BOS: the first (" Once", at offset 0) null.
	echo["prompt"] = toks[1:]
	ids, _ = echoPost(t, h, echo)
	lp = ids[0].lp
	if ids[0].text != c.text || lp.len() != p+gen || lp.TokenLogprobs[0] != nil || lp.TopLogprobs[0] != nil || lp.Tokens[0] != c.lp.Tokens[0] {
		t.Fatalf("token ids without BOS: %q %+v", ids[0].text, lp)
	}
	checkOffsets(t, ids[0].text, lp)
	// Its raw JSON says null.
	resp, b := h.do(t, "POST", "/v1/completions", fmt.Sprintf(`{"model":"stories","prompt":%s,"max_tokens":0,"echo":true,"logprobs":0}`, jsonOf(t, toks[1:])))
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"token_logprobs":[null,`) || !strings.Contains(string(b), `"top_logprobs":[null,`) {
		t.Errorf("token ids without BOS: %s", b)
	}

	// max_tokens 0: the prompt's logprobs alone, as with a completion.
	for _, stream := range []bool{false, true} {
		only, u := echoPost(t, h, map[string]any{"prompt": logprobPrompt, "max_tokens": 0, "logprobs": k, "echo": true, "stream": stream})
		if only[0].text != logprobPrompt || only[0].finish != "length" || *u != (echoUsage{len(toks), 0, len(toks)}) || only[0].lp == nil {
			t.Fatalf("max_tokens 0, stream %v: %+v usage %+v", stream, only[0], u)
		}
		equalLogprobs(t, "max_tokens 0", only[0].lp, c.lp.slice(0, p))
	}
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestEchoChoices: with n=2 and two prompts, every choice echoes its own prompt and its
// logprobs, then what the request without echo completes; max_tokens 0 gives each choice its
// prompt. Streamed, each choice's first chunk is its prompt and its logprobs.
func TestEchoChoices(t *testing.T) {
	h := newHarness(t, Config{})
	prompts := []string{logprobPrompt, "The little dog ran"}
	ntok := make([]int, len(prompts))
	for i, s := range prompts {
		toks, err := h.plainLLM.Tokenizer.Encode(s, true, true)
		if err != nil {
			t.Fatal(err)
		}
		ntok[i] = len(toks)
	}
	const gen = 5
	base := map[string]any{"prompt": prompts, "max_tokens": gen, "temperature": 0.9, "seed": 11, "n": 2, "logprobs": 1, "ignore_eos": true}
	plain, pu := echoPost(t, h, maps.Clone(base))
	// Each prompt's scores, alone.
	var alone []*echoLogprobs
	for _, s := range prompts {
		one, _ := echoPost(t, h, map[string]any{"prompt": s, "max_tokens": 0, "logprobs": 1, "echo": true})
		alone = append(alone, one[0].lp)
	}
	for _, stream := range []bool{false, true} {
		body := maps.Clone(base)
		body["echo"], body["stream"] = true, stream
		got, u := echoPost(t, h, body)
		if len(got) != 4 || *u != *pu {
			t.Fatalf("stream %v: %d choices, usage %+v (without echo %+v)", stream, len(got), u, pu)
		}
		for i, c := range got {
			k := i / 2
			np := ntok[k] - 1
			if c.text != prompts[k]+plain[i].text || c.lp == nil || c.lp.len() != np+gen {
				t.Fatalf("stream %v, choice %d: %q %+v, want %q", stream, i, c.text, c.lp, prompts[k]+plain[i].text)
			}
			equalLogprobs(t, fmt.Sprintf("choice %d prompt", i), c.lp.slice(0, np), alone[k])
			equalLogprobs(t, fmt.Sprintf("choice %d completion", i), c.lp.slice(np, np+gen), plain[i].lp)
			if stream && (c.chunks[0] != prompts[k] || c.lps[0] == nil || c.lps[0].len() != np) {
				t.Errorf("choice %d: first chunk %q with %+v, want the prompt and its logprobs", i, c.chunks[0], c.lps[0])
			}
		}
		// max_tokens 0.
		body["max_tokens"] = 0
		got, u = echoPost(t, h, body)
		if len(got) != 4 || *u != (echoUsage{ntok[0] + ntok[1], 0, ntok[0] + ntok[1]}) {
			t.Fatalf("max_tokens 0, stream %v: %d choices, usage %+v", stream, len(got), u)
		}
		for i, c := range got {
			if c.text != prompts[i/2] || c.finish != "length" || c.lp == nil {
				t.Fatalf("max_tokens 0, stream %v, choice %d: %+v", stream, i, c)
			}
			equalLogprobs(t, fmt.Sprintf("max_tokens 0, choice %d", i), c.lp, alone[i/2])
		}
	}
	// Without logprobs, n=2 and max_tokens 0: the prompt twice.
	got, _ := echoPost(t, h, map[string]any{"prompt": prompts[1], "max_tokens": 0, "n": 2, "echo": true})
	if len(got) != 2 || got[0].text != prompts[1] || got[1].text != prompts[1] || got[0].lp != nil {
		t.Fatalf("n=2 max_tokens 0: %+v %+v", got[0], got[1])
	}
	if !slices.Equal(got[0].chunks, []string{prompts[1]}) {
		t.Errorf("chunks %q", got[0].chunks)
	}
}
