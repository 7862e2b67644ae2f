package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sort"
	"time"

	"github.com/parleyhq/parley/runtime/engine"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/tensor"
)

// runBench measures prompt processing (one batch of -p tokens) and generation (-n single-token
// steps after a one-token prompt) with random token ids, as llama-bench does.
func runBench(e *env, args []string) error {
	fs := newFlags(e, "bench", "-m MODEL [-p 512] [-n 128] [-t THREADS] [-r 3] [--json]")
	bf := addBackendFlags(fs)
	model := fs.String("m", "", "model file (GGUF)")
	pp := fs.Int("p", 512, "prompt tokens to process in one batch (0: skip)")
	tg := fs.Int("n", 128, "tokens to generate one at a time (0: skip)")
	reps := fs.Int("r", 3, "repetitions (the median is reported)")
	kvType := fs.String("kv-type", "f16", "KV cache type: f16 or f32")
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("unexpected arguments %q", pos)
	}
	if *pp < 0 || *tg < 0 || *reps < 1 || *pp+*tg == 0 {
		return usagef("need -p >= 0, -n >= 0, one of them positive, and -r >= 1")
	}
	kv, err := tensor.ParseDType(*kvType)
	if err != nil || (kv != tensor.F16 && kv != tensor.F32) {
		return usagef("--kv-type %q: want f16 or f32", *kvType)
	}
	eng, be, err := openModel(e, bf, *model)
	if err != nil {
		return err
	}
	defer be.Close()
	defer eng.Close()
	m := eng.Model
	ctxLen := max(*pp, *tg+1)
	c, err := m.NewContext(llama.ContextConfig{MaxTokens: max(*pp, 1), MaxSeqs: 1, KVSlots: ctxLen, KVType: kv})
	if err != nil {
		return err
	}
	defer c.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	toks := make([]int32, max(*pp, 1))
	logits := make([]float32, m.Vocab)
	out := []int32{0}
	var bb kvcache.BatchBuilder
	seq := c.Pool().NewSeq(ctxLen)
	run := func(t []int32) error {
		if err := seq.Reserve(len(t)); err != nil {
			return err
		}
		bb.Reset()
		if err := bb.Add(seq, len(t)); err != nil {
			return err
		}
		out[0] = int32(len(t) - 1)
		if err := c.Forward(t, bb.Batch(), out, logits); err != nil {
			return err
		}
		return seq.Advance(len(t))
	}
	var ppRates, tgRates []float64
	var allocsPerStep float64
	for r := 0; r <= *reps; r++ { // repetition 0 warms up
		if *pp > 0 {
			for i := range toks {
				toks[i] = rng.Int32N(int32(m.Vocab))
			}
			seq.Release()
			t0 := time.Now()
			if err := run(toks[:*pp]); err != nil {
				return err
			}
			if r > 0 {
				ppRates = append(ppRates, float64(*pp)/time.Since(t0).Seconds())
			}
		}
		if *tg > 0 {
			seq.Release()
			tok := []int32{rng.Int32N(int32(m.Vocab))}
			if err := run(tok); err != nil {
				return err
			}
			var ms0, ms1 runtime.MemStats
			runtime.ReadMemStats(&ms0)
			t0 := time.Now()
			for i := 0; i < *tg; i++ {
				tok[0] = argmax32(logits)
				if err := run(tok); err != nil {
					return err
				}
			}
			el := time.Since(t0)
			runtime.ReadMemStats(&ms1)
			if r > 0 {
				tgRates = append(tgRates, float64(*tg)/el.Seconds())
				allocsPerStep = float64(ms1.Mallocs-ms0.Mallocs) / float64(*tg)
			}
		}
	}
	seq.Release()
	res := benchResult{
		Model: *model, Backend: be.Name(), Threads: *bf.threads, Params: paramCount(eng),
		FileBytes: fileBytes(eng), PromptTokens: *pp, GenTokens: *tg, Reps: *reps,
		PP: median(ppRates), TG: median(tgRates), PPAll: ppRates, TGAll: tgRates,
		AllocsPerStep: allocsPerStep, PeakRSSMiB: peakRSSMiB(),
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
	fmt.Fprintf(e.stdout, "peak RSS %.1f MiB\n", res.PeakRSSMiB)
	return nil
}

type benchResult struct {
	Model         string    `json:"model"`
	Backend       string    `json:"backend"`
	Threads       int       `json:"threads"`
	Params        int64     `json:"params"`
	FileBytes     int64     `json:"file_bytes"`
	PromptTokens  int       `json:"n_prompt"`
	GenTokens     int       `json:"n_gen"`
	Reps          int       `json:"reps"`
	PP            float64   `json:"pp_tokens_per_s"`
	TG            float64   `json:"tg_tokens_per_s"`
	PPAll         []float64 `json:"pp_runs"`
	TGAll         []float64 `json:"tg_runs"`
	AllocsPerStep float64   `json:"allocs_per_decode_step"`
	PeakRSSMiB    float64   `json:"peak_rss_mib"`
}

func argmax32(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
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

func rates(x []float64) string {
	s := ""
	for i, v := range x {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%.1f", v)
	}
	return s
}

func paramCount(e *engine.Engine) int64 {
	var n int64
	for _, t := range e.File.Tensors {
		p := int64(1)
		for _, d := range t.Shape {
			p *= d
		}
		n += p
	}
	return n
}

func fileBytes(e *engine.Engine) int64 {
	var n int64
	for _, t := range e.File.Tensors {
		n += t.Size
	}
	return n
}
