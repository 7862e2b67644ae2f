package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/parleyhq/parley/internal/vec"
	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/models"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/sched"
)

// runBench measures prompt processing (one batch of -p tokens) and generation (-n single-token
// steps after a one-token prompt) with random token ids, as llama-bench does; --parallel adds
// batched generation: S sequences advancing one token each per step, in one forward pass (what a
// server's step does with S streams), reported as aggregate tokens/s.
func runBench(e *env, args []string) error {
	fs := newFlags(e, "bench", "-m MODEL [-p 512] [-n 128] [-t THREADS] [-r 3] [--parallel 1,4,8,16] [--audio FILE]... [--json]\n       parley bench -m POCKET_TTS_MODEL [--voice VOICE] [--text TEXT | --text-file FILE] [-c N] [-r 3] [--json]")
	bf := addBackendFlags(fs)
	model := fs.String("m", "", "model file (GGUF; or a Whisper model: encoder, decoder steps and, with --audio, real-time factor; or a Parakeet model: real-time factor, encoder and decoder time over --audio; or a Pocket TTS model: load, first-chunk latency, real-time factor of -c syntheses at once)")
	var audioFiles multiFlag
	fs.Var(&audioFiles, "audio", "speech recognition models: an audio file to transcribe for the real-time factor (repeatable; Parakeet models need one)")
	pp := fs.Int("p", 512, "prompt tokens to process in one batch (0: skip)")
	tg := fs.Int("n", 128, "tokens to generate one at a time (0: skip)")
	reps := fs.Int("r", 3, "repetitions (the median is reported)")
	kvType := fs.String("kv-type", "f16", kvTypeUsage)
	asJSON := fs.Bool("json", false, "print JSON")
	parallel := fs.String("parallel", "", "comma-separated sequence counts for batched generation of -n tokens each (e.g. 1,4,8,16)")
	voice := fs.String("voice", "", "Pocket TTS models: a voice `NAME` in the checkpoint (default: its first), a voice-state .safetensors file, or an audio file to clone")
	text := fs.String("text", "", "Pocket TTS models: the text each synthesis speaks (default: two English sentences)")
	textFile := fs.String("text-file", "", "Pocket TTS models: a `FILE` holding the text to speak")
	concurrency := fs.Int("c", 1, "Pocket TTS models: syntheses run at once, batched together")
	tokPath := fs.String("tokenizer", "", "Pocket TTS models: SentencePiece tokenizer.model (default: the checkpoint's, or tokenizer.model beside it)")
	fs.alias("m", "model")
	fs.alias("c", "concurrency")
	fs.alias("p", "n-prompt")
	fs.alias("n", "n-gen")
	fs.alias("r", "repetitions")
	pos, err := fs.parse(args)
	if err != nil {
		return err
	}
	var seqCounts []int
	if *parallel != "" {
		for _, f := range strings.Split(*parallel, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 || n > 256 {
				return usagef("--parallel %q: want sequence counts from 1 to 256, comma-separated", *parallel)
			}
			seqCounts = append(seqCounts, n)
		}
		if *tg < 1 {
			return usagef("--parallel needs -n >= 1")
		}
	}
	if len(pos) != 0 {
		return usagef("unexpected arguments %q", pos)
	}
	if *pp < 0 || *tg < 0 || *reps < 1 || *pp+*tg == 0 || *pp > llama.MaxStepTokens || *tg >= llama.MaxStepTokens {
		return usagef("need -p from 0 to %d, -n from 0 to %d, one of them positive, and -r >= 1", llama.MaxStepTokens, llama.MaxStepTokens-1)
	}
	kv, err := parseKVType(*kvType)
	if err != nil {
		return err
	}
	if *model == "" {
		return usagef("-m MODEL is required")
	}
	if *model, err = resolveModel(e, *model); err != nil {
		return err
	}
	kind, err := models.Probe(*model)
	if err != nil {
		return err
	}
	ttsOnly := []string{"voice", "text", "text-file", "c", "tokenizer"}
	if kind == models.KindSpeechSynthesis {
		var bad []string
		for _, n := range []string{"p", "n", "kv-type", "parallel", "audio"} {
			if fs.isSet(n) {
				bad = append(bad, fs.from(n))
			}
		}
		if len(bad) > 0 {
			return usagef("%s: not for a Pocket TTS model (it is measured on --text with -c syntheses at once)", strings.Join(bad, " and "))
		}
		if *concurrency < 1 || *concurrency > 256 {
			return usagef("-c %d: want 1 to 256 syntheses at once", *concurrency)
		}
		t, err := readBenchText(*text, *textFile)
		if err != nil {
			return err
		}
		if err := bf.check(); err != nil {
			return err
		}
		return benchTTS(e, bf, *model, ttsBenchOptions{voice: *voice, tokenizer: *tokPath, text: t,
			concurrency: *concurrency, reps: *reps, asJSON: *asJSON})
	}
	for _, n := range ttsOnly {
		if fs.isSet(n) {
			return usagef("%s is for Pocket TTS models", fs.from(n))
		}
	}
	if kind == models.KindSpeechRecognition {
		// A Whisper decoder's prompt is its fixed start of transcript and its caches are F16:
		// say so rather than measure something other than what was asked.
		var bad []string
		for _, n := range []string{"p", "kv-type"} {
			if fs.isSet(n) {
				bad = append(bad, fs.from(n))
			}
		}
		if len(bad) > 0 {
			return usagef("%s: for language models only (a Whisper model's decoder prompt is its start of transcript and its caches are F16)", strings.Join(bad, " and "))
		}
		if family, _ := models.SpeechFamily(*model); family == models.FamilyParakeet {
			// A transducer's decoding follows its audio: it is measured on whole files.
			for _, n := range []string{"n", "parallel"} {
				if fs.isSet(n) {
					bad = append(bad, fs.from(n))
				}
			}
			if len(bad) > 0 {
				return usagef("%s: for language and Whisper models only (a Parakeet model is measured on --audio files)", strings.Join(bad, " and "))
			}
			return benchParakeet(e, bf, *model, *reps, audioFiles, *asJSON)
		}
		return benchASR(e, bf, *model, *reps, *tg, seqCounts, audioFiles, *asJSON)
	}
	if len(audioFiles) > 0 {
		return usagef("--audio is for speech recognition models")
	}
	llm, be, err := openModel(e, bf, *model)
	if err != nil {
		return err
	}
	defer be.Close()
	defer llm.Close()
	m := llm.Model
	ctxLen := max(*pp, *tg+1)
	maxSeqs := 1
	for _, n := range seqCounts {
		maxSeqs = max(maxSeqs, n)
	}
	const blockSize = 16
	perSeq := (*tg + 1 + blockSize - 1) / blockSize * blockSize // whole blocks
	c, err := m.NewContext(llama.ContextConfig{StepTokens: max(*pp, maxSeqs), MaxSeqs: maxSeqs,
		KVSlots: max(ctxLen+blockSize, maxSeqs*perSeq), BlockSize: blockSize, KVType: kv, SeqContext: ctxLen})
	if err != nil {
		return err
	}
	defer c.Close()
	b, err := newBenchSched(c, llm.Text(), maxSeqs)
	if err != nil {
		return err
	}
	defer b.s.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []int32 {
		t := make([]int32, n)
		for i := range t {
			t[i] = rng.Int32N(int32(m.Vocab))
		}
		return t
	}
	var ppRates, tgRates []float64
	var allocsPerStep float64
	for r := 0; r <= *reps; r++ { // repetition 0 warms up
		if *pp > 0 {
			run, err := b.run([][]int32{random(*pp)}, 1)
			if err != nil {
				return err
			}
			if r > 0 {
				ppRates = append(ppRates, float64(*pp)/run.first.Seconds())
			}
		}
		if *tg > 0 {
			run, err := b.run([][]int32{random(1)}, *tg+1)
			if err != nil {
				return err
			}
			if r > 0 {
				tgRates = append(tgRates, float64(*tg)/run.rest.Seconds())
				allocsPerStep = float64(run.allocs) / float64(*tg)
			}
		}
	}
	var par []parallelResult
	for _, n := range seqCounts {
		var rs []float64
		for r := 0; r <= *reps; r++ {
			prompts := make([][]int32, n)
			for i := range prompts {
				prompts[i] = random(1)
			}
			run, err := b.run(prompts, *tg+1)
			if err != nil {
				return err
			}
			if r > 0 {
				rs = append(rs, float64(n**tg)/run.rest.Seconds())
			}
		}
		par = append(par, parallelResult{Seqs: n, TG: median(rs), TGAll: rs})
	}
	res := benchResult{
		Model: *model, Backend: be.Name(), Threads: *bf.threads, Params: llm.Params(),
		FileBytes: llm.WeightBytes(), PromptTokens: *pp, GenTokens: *tg, Reps: *reps,
		PP: median(ppRates), TG: median(tgRates), PPAll: ppRates, TGAll: tgRates,
		AllocsPerStep: allocsPerStep, Parallel: par, PeakRSSMiB: peakRSSMiB(),
	}
	if *asJSON {
		return json.NewEncoder(e.stdout).Encode(res)
	}
	fmt.Fprintf(e.stdout, "model %s (%s, %.1fM params, %.1f MiB), backend %s, threads %d\n", *model, m.Arch, float64(res.Params)/1e6, float64(res.FileBytes)/(1<<20), res.Backend, res.Threads)
	if *pp > 0 {
		fmt.Fprintf(e.stdout, "pp%-5d %10.1f tokens/s  (runs: %s)\n", *pp, res.PP, rates(ppRates))
	}
	if *tg > 0 {
		fmt.Fprintf(e.stdout, "tg%-5d %10.1f tokens/s  (runs: %s)  allocs/step %.1f\n", *tg, res.TG, rates(tgRates), allocsPerStep)
	}
	for _, p := range par {
		fmt.Fprintf(e.stdout, "tg%-5d x %-3d %7.1f tokens/s  (%d sequences a step; runs: %s)\n", *tg, p.Seqs, p.TG, p.Seqs, rates(p.TGAll))
	}
	fmt.Fprintf(e.stdout, "peak RSS %.1f MiB\n", res.PeakRSSMiB)
	return nil
}

type benchResult struct {
	Model         string           `json:"model"`
	Backend       string           `json:"backend"`
	Threads       int              `json:"threads"`
	Params        int64            `json:"params"`
	FileBytes     int64            `json:"file_bytes"`
	PromptTokens  int              `json:"n_prompt"`
	GenTokens     int              `json:"n_gen"`
	Reps          int              `json:"reps"`
	PP            float64          `json:"pp_tokens_per_s"`
	TG            float64          `json:"tg_tokens_per_s"`
	PPAll         []float64        `json:"pp_runs"`
	TGAll         []float64        `json:"tg_runs"`
	AllocsPerStep float64          `json:"allocs_per_decode_step"`
	Parallel      []parallelResult `json:"parallel,omitempty"`
	PeakRSSMiB    float64          `json:"peak_rss_mib"`
}

// parallelResult is batched generation with Seqs sequences: aggregate tokens/s.
type parallelResult struct {
	Seqs  int       `json:"seqs"`
	TG    float64   `json:"tg_tokens_per_s"`
	TGAll []float64 `json:"tg_runs"`
}

// benchSched runs the measured requests through a scheduler, as `parley serve` and `parley
// generate` run theirs, stepping it on this goroutine as `parley generate` does.
type benchSched struct {
	s   *sched.Scheduler
	sts []*sched.Stream
}

// newBenchSched makes the scheduler of c, for requests of up to maxSeqs sequences at once.
func newBenchSched(c *llama.Context, text sched.Text, maxSeqs int) (*benchSched, error) {
	s, err := sched.New(sched.NewLlamaModel(c), text, sched.Config{MaxQueue: maxSeqs, MaxActive: maxSeqs})
	if err != nil {
		return nil, err
	}
	return &benchSched{s: s}, nil
}

// benchRun is what a run's steps took: the first (the prompts), and the rest (one token of every
// sequence each), with the heap allocations made in them.
type benchRun struct {
	first, rest time.Duration
	allocs      uint64
}

// run generates maxTokens greedy tokens from each of prompts, submitted together: the first step
// admits them all and processes every prompt; each of the maxTokens-1 steps after it advances
// every sequence by one token.
func (b *benchSched) run(prompts [][]int32, maxTokens int) (benchRun, error) {
	var res benchRun
	s := b.s
	sp := decode.DefaultParams()
	sp.Temperature = 0
	sts := b.sts[:0]
	for _, p := range prompts {
		st, err := s.Submit(context.Background(), &sched.Request{Prompt: p, MaxTokens: maxTokens, Sampling: sp, IgnoreEOS: true})
		if err != nil {
			return res, err // the caller closes the scheduler, ending what was submitted
		}
		sts = append(sts, st)
	}
	b.sts = sts
	// drain takes the events of a step; every sequence is to run to its token limit.
	drain := func() error {
		for _, st := range sts {
			for st.Ready() {
				ev, err := st.Next(context.Background())
				if err == io.EOF {
					break
				}
				if err == nil && ev.Done && ev.Reason != decode.StopLength {
					err = fmt.Errorf("bench: generation ended early (%s): %v", ev.Reason, ev.Err)
				}
				if err != nil {
					return err
				}
			}
		}
		return nil
	}
	t0 := time.Now()
	s.Step()
	res.first = time.Since(t0)
	if err := drain(); err != nil {
		return res, err
	}
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	t0 = time.Now()
	for range maxTokens - 1 {
		s.Step()
		if err := drain(); err != nil {
			return res, err
		}
	}
	res.rest = time.Since(t0)
	runtime.ReadMemStats(&ms1)
	res.allocs = ms1.Mallocs - ms0.Mallocs
	for _, st := range sts {
		if !st.Ready() {
			return res, fmt.Errorf("bench: a sequence runs past its %d tokens", maxTokens)
		}
	}
	return res, drain()
}

func argmax32(x []float32) int32 {
	m, _ := vec.Max(x) // the server's sampler finds a greedy token the same way
	return int32(max(vec.Index(x, m), 0))
}

func median(x []float64) float64 {
	if len(x) == 0 {
		return 0
	}
	s := append([]float64(nil), x...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func rates(x []float64) string { return joinf(x, "%.1f") }

// joinf formats every element of x with format, comma-separated.
func joinf(x []float64, format string) string {
	s := ""
	for i, v := range x {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf(format, v)
	}
	return s
}
