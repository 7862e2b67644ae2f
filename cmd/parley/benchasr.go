package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/whisper"
	"github.com/parleyhq/parley/runtime/sched/asr"
)

// asrBenchResult is what `parley bench` measures of a Whisper model.
type asrBenchResult struct {
	Model         string           `json:"model"`
	Backend       string           `json:"backend"`
	Threads       int              `json:"threads"`
	HParams       whisper.HParams  `json:"hparams"`
	Reps          int              `json:"reps"`
	EncodeMS      float64          `json:"encode_ms_per_window"`
	EncodeAll     []float64        `json:"encode_runs_ms"`
	GenTokens     int              `json:"n_gen"`
	TG            float64          `json:"tg_tokens_per_s"`
	TGAll         []float64        `json:"tg_runs"`
	AllocsPerStep float64          `json:"allocs_per_decode_step"`
	Parallel      []parallelResult `json:"parallel,omitempty"`
	AudioSeconds  float64          `json:"audio_seconds,omitempty"`
	RTF           float64          `json:"rtf,omitempty"`
	RTFAll        []float64        `json:"rtf_runs,omitempty"`
	PeakRSSMiB    float64          `json:"peak_rss_mib"`
}

// benchASR measures a Whisper model: one 30 s window through the encoder, greedy decoder steps
// of one sequence (tg of them, after the start-of-transcript prompt), the same for n sequences a
// step each against its own window (--parallel), and with audio files, whole greedy
// transcriptions as a real-time factor (processing time ÷ audio duration).
func benchASR(e *env, bf backendFlags, path string, reps, tg int, seqCounts []int, files []string, asJSON bool) error {
	m, be, err := openWhisper(e, bf, path)
	if err != nil {
		return err
	}
	defer be.Close()
	defer m.Close()
	var pcm [][]float32
	secs := 0.0
	if len(files) > 0 {
		if pcm, secs, err = readBenchAudio(files); err != nil {
			return err
		}
	}
	// A decoder context holds the prompt (start of transcript, language, task, no timestamps)
	// and the generated tokens.
	const prompt = 4
	if tg > m.TextCtx-prompt {
		return usagef("-n %d: a Whisper decoder holds %d positions, %d of them its prompt: -n up to %d", tg, m.TextCtx, prompt, m.TextCtx-prompt)
	}
	maxSeqs := 1
	for _, n := range seqCounts {
		maxSeqs = max(maxSeqs, n)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	mel := make([]float32, m.Mels*whisper.WindowFrames)
	for i := range mel {
		mel[i] = float32(rng.Float64()*2 - 1) // log-mel values lie in about [-1, 1.5]
	}
	enc, err := m.NewEncoder()
	if err != nil {
		return err
	}
	defer enc.Close()
	crosses := make([]*whisper.Cross, maxSeqs)
	for i := range crosses {
		if crosses[i], err = m.NewCross(); err != nil {
			return err
		}
		defer crosses[i].Close()
	}
	res := asrBenchResult{Model: path, Backend: be.Name(), Threads: *bf.threads, HParams: m.HParams, Reps: reps, GenTokens: tg}
	for r := 0; r <= reps; r++ { // repetition 0 warms up
		t0 := time.Now()
		if err := enc.Encode(mel, crosses[0], nil); err != nil {
			return err
		}
		if r > 0 {
			res.EncodeAll = append(res.EncodeAll, float64(time.Since(t0).Microseconds())/1000)
		}
	}
	res.EncodeMS = median(res.EncodeAll)
	for _, c := range crosses[1:] { // every sequence of a batched step reads its own window
		if err := enc.Encode(mel, c, nil); err != nil {
			return err
		}
	}
	dec, err := m.NewDecoder(whisper.DecoderConfig{StepTokens: maxSeqs * prompt, MaxSeqs: maxSeqs,
		KVSlots: maxSeqs * m.TextCtx, BlockSize: 16})
	if err != nil {
		return err
	}
	defer dec.Close()
	if tg > 0 {
		for r := 0; r <= reps; r++ {
			rate, allocs, err := benchDecodeASR(dec, crosses[:1], tg, prompt)
			if err != nil {
				return err
			}
			if r > 0 {
				res.TGAll = append(res.TGAll, rate)
				res.AllocsPerStep = allocs
			}
		}
		res.TG = median(res.TGAll)
		for _, n := range seqCounts {
			var rs []float64
			for r := 0; r <= reps; r++ {
				rate, _, err := benchDecodeASR(dec, crosses[:n], tg, prompt)
				if err != nil {
					return err
				}
				if r > 0 {
					rs = append(rs, rate)
				}
			}
			res.Parallel = append(res.Parallel, parallelResult{Seqs: n, TG: median(rs), TGAll: rs})
		}
	}
	if len(pcm) > 0 {
		eng, err := asr.NewWhisper(m, asr.Config{MaxActive: 1})
		if err != nil {
			return err
		}
		defer eng.Close()
		p := asr.DefaultParams()
		p.TemperatureInc = 0 // no fallback: every run does the same work
		if m.Multilingual() {
			p.Language = "en"
		}
		for r := 0; r <= reps; r++ {
			t0 := time.Now()
			for _, s := range pcm {
				if _, err := eng.Transcribe(context.Background(), s, p, nil); err != nil {
					return err
				}
			}
			if r > 0 {
				res.RTFAll = append(res.RTFAll, time.Since(t0).Seconds()/secs)
			}
		}
		res.AudioSeconds, res.RTF = secs, median(res.RTFAll)
	}
	res.PeakRSSMiB = peakRSSMiB()
	if asJSON {
		return json.NewEncoder(e.stdout).Encode(res)
	}
	h := m.HParams
	fmt.Fprintf(e.stdout, "model %s (whisper: %d+%d layers, width %d, %d mels, vocabulary %d), backend %s, threads %d\n",
		path, h.AudioLayer, h.TextLayer, h.AudioState, h.Mels, h.NVocab, res.Backend, res.Threads)
	fmt.Fprintf(e.stdout, "encode   %10.1f ms a 30 s window  (runs: %s)\n", res.EncodeMS, rates(res.EncodeAll))
	if tg > 0 {
		fmt.Fprintf(e.stdout, "tg%-5d %10.1f tokens/s  (runs: %s)  allocs/step %.1f\n", tg, res.TG, rates(res.TGAll), res.AllocsPerStep)
	}
	for _, p := range res.Parallel {
		fmt.Fprintf(e.stdout, "tg%-5d x %-3d %7.1f tokens/s  (%d sequences a step, each against its own window; runs: %s)\n", tg, p.Seqs, p.TG, p.Seqs, rates(p.TGAll))
	}
	if len(pcm) > 0 {
		fmt.Fprintf(e.stdout, "RTF      %10.3f  (%d files, %.1f s of audio, greedy; runs: %s)\n", res.RTF, len(pcm), secs, joinf(res.RTFAll, "%.3f"))
	}
	fmt.Fprintf(e.stdout, "peak RSS %.1f MiB\n", res.PeakRSSMiB)
	return nil
}

// benchDecodeASR runs the prompt for each of len(crosses) sequences, then times tg decoder steps
// in which every sequence advances by its greedy token; it returns the aggregate tokens/s and
// the allocations per step.
func benchDecodeASR(dec *whisper.Decoder, crosses []*whisper.Cross, tg, prompt int) (float64, float64, error) {
	m := dec.Model()
	n := len(crosses)
	seqs := make([]*kvcache.Seq, n)
	for i := range seqs {
		seqs[i] = dec.Pool().NewSeq(m.TextCtx)
	}
	defer func() {
		for _, s := range seqs {
			s.Release()
		}
	}()
	logits := make([]float32, n*m.NVocab)
	rows := make([]int32, n)
	toks := make([]int32, 0, n*prompt)
	var bb kvcache.BatchBuilder
	// The English-only start of transcript and <|notimestamps|>, padded with a text token, as a
	// prompt: its ids do not change the arithmetic.
	for i := range n {
		toks = append(toks, 50257, 50362, 50362, 220)
		rows[i] = int32((i+1)*prompt - 1)
	}
	forward := func(width int) error {
		bb.Reset()
		for _, s := range seqs {
			if err := s.Reserve(width); err != nil {
				return err
			}
			if err := bb.Add(s, width); err != nil {
				return err
			}
		}
		if err := dec.Forward(toks, bb.Batch(), crosses, rows, logits); err != nil {
			return err
		}
		for _, s := range seqs {
			if err := s.Advance(width); err != nil {
				return err
			}
		}
		toks = toks[:n]
		for i := range n {
			toks[i] = argmax32(logits[i*m.NVocab : (i+1)*m.NVocab])
			rows[i] = int32(i)
		}
		return nil
	}
	if err := forward(prompt); err != nil {
		return 0, 0, err
	}
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	t0 := time.Now()
	for range tg {
		if err := forward(1); err != nil {
			return 0, 0, err
		}
	}
	el := time.Since(t0)
	runtime.ReadMemStats(&ms1)
	return float64(n*tg) / el.Seconds(), float64(ms1.Mallocs-ms0.Mallocs) / float64(tg), nil
}
