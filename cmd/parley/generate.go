package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/sched"
)

func runGenerate(e *env, args []string) error {
	fs := newFlags(e, "generate", "-m MODEL (-p PROMPT | -f FILE) [flags]")
	bf := addBackendFlags(fs)
	model := fs.String("m", "", "model file (GGUF)")
	prompt := fs.String("p", "", "prompt text")
	file := fs.String("f", "", "read the prompt from FILE (- for standard input)")
	n := fs.Int("n", 128, "most tokens to generate (0: until the context is full)")
	ctxLen := fs.Int("c", 0, "context size in tokens (0: the model's)")
	def := decode.DefaultParams()
	temp := fs.Float64("temp", shortest(def.Temperature), "temperature (0: greedy)")
	topK := fs.Int("top-k", def.TopK, "top-k sampling (0: off)")
	topP := fs.Float64("top-p", shortest(def.TopP), "top-p sampling (1: off)")
	minP := fs.Float64("min-p", shortest(def.MinP), "min-p sampling (0: off)")
	repPen := fs.Float64("repeat-penalty", shortest(def.RepeatPenalty), "repetition penalty (1: off)")
	repLast := fs.Int("repeat-last-n", def.RepeatLastN, "tokens the repetition penalty looks back over")
	presPen := fs.Float64("presence-penalty", 0, "presence penalty (OpenAI semantics)")
	freqPen := fs.Float64("frequency-penalty", 0, "frequency penalty (OpenAI semantics)")
	seed := fs.Int64("seed", -1, "random seed (-1: random)")
	bias := biasFlag{}
	fs.Var(bias, "logit-bias", "TOKEN_ID=BIAS added to a token's logit (repeatable; -inf bans)")
	var stops multiFlag
	fs.Var(&stops, "stop", "stop string (repeatable)")
	ignoreEOS := fs.Bool("ignore-eos", false, "keep generating after an end-of-generation token")
	noBOS := fs.Bool("no-bos", false, "do not add the vocabulary's BOS token")
	kvType := fs.String("kv-type", "f16", kvTypeUsage)
	asJSON := fs.Bool("json", false, "print one JSON object with token ids, text and top-5 log-probabilities")
	fs.alias("m", "model")
	fs.alias("p", "prompt")
	fs.alias("f", "file")
	fs.alias("n", "n-predict")
	fs.alias("c", "ctx")
	pos, err := fs.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("unexpected arguments %q", pos)
	}
	text, err := promptText(e, *prompt, *file)
	if err != nil {
		return err
	}
	if *n < 0 {
		return usagef("-n %d: must not be negative", *n)
	}
	if *ctxLen < 0 || *ctxLen > llama.MaxContextSlots {
		return usagef("-c %d: want 0 (the model's context) to %d", *ctxLen, llama.MaxContextSlots)
	}
	kv, err := parseKVType(*kvType)
	if err != nil {
		return err
	}
	params := decode.Params{
		Temperature: float32(*temp), TopK: *topK, TopP: float32(*topP), MinP: float32(*minP),
		RepeatPenalty: float32(*repPen), RepeatLastN: *repLast,
		PresencePenalty: float32(*presPen), FrequencyPenalty: float32(*freqPen),
		LogitBias: bias,
	}
	if *seed < 0 {
		params.Seed = rand.Uint64()
	} else {
		params.Seed = uint64(*seed)
	}
	if err := params.Check(0); err != nil { // the server's checks of a request's parameters
		return samplingError(fs, err)
	}

	llm, be, err := openModel(e, bf, *model)
	if err != nil {
		return err
	}
	defer be.Close()
	defer llm.Close()
	if err := params.Check(llm.Model.Vocab); err != nil {
		return samplingError(fs, err)
	}
	ids, err := llm.Tokenizer.Encode(text, !*noBOS, true)
	if err != nil {
		return err
	}
	// -c as given (past the training context too, as llama.cpp allows); without it, the model's
	// training context, cut (with a note) to what the memory holds.
	ctxN := *ctxLen
	if ctxN == 0 {
		trained := llm.TrainingContext()
		perPos := kvBytesPerPos(llm.Model, kv)
		plan := planKV(0, 0, 1, trained, perPos, kvBudget(be))
		if plan.capped {
			fmt.Fprintf(e.stderr, "parley generate: context cut from the model's %d positions to %d, what half the memory available holds; -c chooses\n", trained, plan.ctx)
		}
		ctxN = plan.ctx
	}
	// One sequence at a time, its prompt in chunks of up to 512 tokens.
	c, err := llm.Model.NewContext(llama.ContextConfig{StepTokens: min(512, ctxN), MaxSeqs: 1, KVSlots: ctxN, KVType: kv})
	if err != nil {
		return err
	}
	defer c.Close()
	nCtx := c.Pool().Slots() // ctxN in whole KV blocks
	switch {
	case len(ids) == 0:
		return errors.New("empty prompt")
	case len(ids) >= nCtx:
		return fmt.Errorf("prompt does not fit the context: %d prompt tokens, context of %d", len(ids), nCtx)
	}
	maxTokens := nCtx - len(ids) // -n 0: until the context is full
	if *n > 0 {
		maxTokens = min(*n, maxTokens)
	}
	s, err := sched.New(sched.NewLlamaModel(c), llm.Text(), sched.Config{MaxQueue: 1})
	if err != nil {
		return err
	}
	defer s.Close()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	req := &sched.Request{Prompt: ids, MaxTokens: maxTokens, Sampling: params, Stop: stops, IgnoreEOS: *ignoreEOS}
	if *asJSON {
		req.TopLogprobs = 5
	}
	w := bufio.NewWriter(e.stdout)
	defer w.Flush()
	st, err := s.Submit(ctx, req)
	if err != nil {
		return err
	}
	res, err := generate(s, st, func(ev *sched.Event) error {
		if *asJSON {
			return nil
		}
		if _, err := w.Write(ev.Text); err != nil {
			return err
		}
		return w.Flush()
	})
	if err != nil {
		return err
	}
	if res.Reason == sched.ReasonCancelled {
		// Interrupted: what was generated is printed as usual, with stop "cancelled", and the
		// command fails.
		err = errors.New("interrupted")
	}
	if !*asJSON {
		fmt.Fprintln(w)
		w.Flush()
		if len(res.Tokens) > 0 {
			fmt.Fprintf(e.stderr, "\nprompt: %d tokens in %v (%s); generated: %d tokens in %v (%s); stop: %s\n",
				len(ids), res.PromptTime.Round(1e5), rate(len(ids), res.PromptTime),
				len(res.Tokens), res.GenTime.Round(1e5), rate(len(res.Tokens), res.GenTime), res.Reason)
		}
		return err
	}
	type lp struct {
		ID      int32   `json:"id"`
		Logprob float64 `json:"logprob"`
	}
	out := struct {
		PromptTokens []int32 `json:"prompt_tokens"`
		Tokens       []int32 `json:"tokens"`
		Text         string  `json:"text"`
		Logprobs     [][]lp  `json:"logprobs"`
		FinishReason string  `json:"finish_reason"`
	}{PromptTokens: ids, Tokens: res.Tokens, Text: res.Text, Logprobs: [][]lp{}, FinishReason: string(res.Reason)}
	if out.Tokens == nil {
		out.Tokens = []int32{}
	}
	for _, s := range res.Top {
		row := make([]lp, len(s))
		for i, t := range s {
			row[i] = lp{t.ID, t.Logprob}
		}
		out.Logprobs = append(out.Logprobs, row)
	}
	enc := json.NewEncoder(w)
	if e := enc.Encode(out); e != nil {
		return e
	}
	return err
}

// samplingFlags are generate's flags of decode's parameters, by the parameters' API names.
var samplingFlags = map[string]string{
	"temperature": "temp", "top_p": "top-p", "min_p": "min-p", "repeat_penalty": "repeat-penalty",
	"repeat_last_n": "repeat-last-n", "presence_penalty": "presence-penalty",
	"frequency_penalty": "frequency-penalty", "logit_bias": "logit-bias",
}

// samplingError is the usage error of a sampling parameter that decode's checks refuse: the
// flag (or variable) and its value, then the message the server gives a request.
func samplingError(fs *flags, err error) error {
	var pe *decode.ParamError
	if errors.As(err, &pe) {
		if name, ok := samplingFlags[pe.Param]; ok {
			if name == "logit-bias" {
				return usagef("%s: %v", fs.from(name), err)
			}
			return usagef("%s %s: %v", fs.from(name), fs.Lookup(name).Value, err)
		}
	}
	return usageError{err}
}

// generation is one sequence generated by `parley generate`.
type generation struct {
	Tokens     []int32                 // generated, an end-of-generation token left out
	Top        [][]decode.TokenLogprob // each token's most likely alternatives (Request.TopLogprobs)
	Text       string
	Reason     decode.StopReason
	PromptTime time.Duration // the steps up to the first token
	GenTime    time.Duration // from the first token to the end
}

// generate steps s, which runs st's request alone, on this goroutine (a token costs no handoff
// between goroutines) until st ends, passing every event to show as soon as its step is done; an
// error of show cancels the generation and is returned once it has ended.
func generate(s *sched.Scheduler, st *sched.Stream, show func(*sched.Event) error) (*generation, error) {
	res := &generation{}
	var text []byte
	var showErr, genErr error
	start := time.Now()
	var first time.Time
	for ended := false; !ended; {
		if !s.Step() && !st.Ready() {
			return nil, errors.New("generate: the scheduler has nothing to run") // cannot happen: the request fits
		}
		for !ended && st.Ready() {
			ev, err := st.Next(context.Background())
			if err == io.EOF {
				ended = true
				break
			}
			if err != nil {
				return nil, err
			}
			if ev.Token >= 0 {
				if first.IsZero() {
					first = time.Now()
					res.PromptTime = first.Sub(start)
				}
				res.Tokens = append(res.Tokens, ev.Token)
				res.Top = append(res.Top, ev.Top)
			}
			text = append(text, ev.Text...)
			if showErr == nil {
				if showErr = show(&ev); showErr != nil {
					st.Cancel()
				}
			}
			if ev.Done {
				res.Reason = ev.Reason
				if ev.Reason == sched.ReasonError {
					genErr = ev.Err
				}
			}
		}
	}
	if !first.IsZero() {
		res.GenTime = time.Since(first)
	}
	res.Text = string(text)
	return res, errors.Join(showErr, genErr)
}

// rate formats n tokens in d as tokens/s; "-" when d is too short to measure.
func rate(n int, d time.Duration) string {
	if d <= 0 {
		return "- tokens/s"
	}
	return fmt.Sprintf("%.1f tokens/s", float64(n)/d.Seconds())
}

// promptText returns the prompt from -p or -f (exactly one).
func promptText(e *env, p, file string) (string, error) {
	switch {
	case p != "" && file != "":
		return "", usagef("give the prompt with -p or -f, not both")
	case file == "-":
		b, err := io.ReadAll(io.LimitReader(e.stdin, 64<<20))
		return string(b), err
	case file != "":
		b, err := os.ReadFile(file)
		return string(b), err
	case p == "":
		return "", usagef("a prompt is required (-p PROMPT or -f FILE)")
	}
	return p, nil
}

// shortest is x as the float64 with x's shortest decimal form (0.95, not 0.949999988079071), for
// flag defaults that the help prints.
func shortest(x float32) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(float64(x), 'g', -1, 32), 64)
	return v
}
