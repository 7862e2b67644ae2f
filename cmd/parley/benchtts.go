package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/parleyhq/parley/runtime/models/pockettts"
	"github.com/parleyhq/parley/runtime/sched/tts"
)

// benchTTSText is what `parley bench` speaks with a Pocket TTS model when given no text.
const benchTTSText = "The quick brown fox jumps over the lazy dog. A streaming voice answers as soon as the first words are ready."

// ttsBenchOptions are the flags of `parley bench` that a Pocket TTS model takes.
type ttsBenchOptions struct {
	voice, tokenizer string
	text             string
	concurrency      int
	reps             int
	asJSON           bool
}

// ttsBenchResult is what `parley bench` measures of a Pocket TTS model.
type ttsBenchResult struct {
	Model       string  `json:"model"`
	Backend     string  `json:"backend"`
	Threads     int     `json:"threads"`
	Voice       string  `json:"voice"`
	SampleRate  int     `json:"sample_rate"`
	ChunkSize   int     `json:"first_chunk_samples"`
	TextTokens  int     `json:"text_tokens"`
	Concurrency int     `json:"concurrency"`
	Reps        int     `json:"reps"`
	LoadMS      float64 `json:"load_ms"`
	VoiceMS     float64 `json:"voice_ms"`
	// FirstChunkMS is the median over the runs and the syntheses of the time from a synthesis's
	// submission to its first FirstChunkSamples samples.
	FirstChunkMS float64         `json:"first_chunk_ms"`
	RTF          float64         `json:"rtf"` // aggregate: wall time ÷ the audio of every synthesis, median of the runs
	RTFAll       []float64       `json:"rtf_runs"`
	FramesPerSec float64         `json:"frames_per_s"` // every synthesis's frames ÷ wall time, median of the runs
	AudioSeconds float64         `json:"audio_seconds"`
	Syntheses    []ttsBenchSynth `json:"syntheses"` // of the last run
	PeakRSSMiB   float64         `json:"peak_rss_mib"`
}

// ttsBenchSynth is one synthesis of a run.
type ttsBenchSynth struct {
	FirstChunkMS float64 `json:"first_chunk_ms"`
	Frames       int     `json:"frames"`
	AudioSeconds float64 `json:"audio_seconds"`
	TotalMS      float64 `json:"total_ms"`
	RTF          float64 `json:"rtf"`
}

// benchTTS measures a Pocket TTS model: the load (backend, checkpoint, model, synthesizer), then
// reps runs (after one that warms up) of o.concurrency syntheses of the text submitted at once
// to the scheduler `parley serve` runs, batched together: each synthesis's first-chunk latency
// (text in to its first 1,920 samples, one frame), its real-time factor, and the run's aggregate
// real-time factor (wall time ÷ the audio of every synthesis) and frames per second.
func benchTTS(e *env, bf backendFlags, path string, o ttsBenchOptions) error {
	t0 := time.Now()
	b, err := bf.open(e)
	if err != nil {
		return err
	}
	defer b.Close()
	ck, tok, err := openSpeechCheckpoint(path, o.tokenizer)
	if err != nil {
		return err
	}
	defer ck.Close()
	chunks, err := pockettts.SplitText(tok, o.text, ck.Text)
	if err != nil {
		return fmt.Errorf("the text: %w", err)
	}
	m, err := pockettts.New(b, ck.Weights)
	if err != nil {
		return err
	}
	defer m.Close()
	s, err := tts.New(m, tok, tts.Config{Text: ck.Text, MaxActive: o.concurrency, MaxQueue: o.concurrency})
	if err != nil {
		return err
	}
	defer s.Close()
	load := time.Since(t0)
	voiceArg := o.voice
	if voiceArg == "" {
		names := make([]string, 0, len(ck.Voices))
		for n := range ck.Voices {
			names = append(names, n)
		}
		if len(names) == 0 {
			return usagef("%s has no voices of its own: give --voice (a voice-state .safetensors file or audio to clone)", path)
		}
		sort.Strings(names)
		voiceArg = names[0]
	}
	t0 = time.Now()
	voice, err := speakVoice(s, ck, m.Config(), voiceArg)
	if err != nil {
		return err
	}
	res := ttsBenchResult{Model: path, Backend: b.Name(), Threads: *bf.threads, Voice: voiceArg, SampleRate: s.SampleRate(),
		ChunkSize: s.FrameSamples(), Concurrency: o.concurrency, Reps: o.reps, LoadMS: ms(load), VoiceMS: ms(time.Since(t0))}
	for _, c := range chunks {
		res.TextTokens += len(c.Tokens)
	}
	var firsts, fps []float64
	for rep := 0; rep <= o.reps; rep++ { // repetition 0 warms up
		syn, wall, err := benchSpeak(s, voice, o.text, o.concurrency)
		if err != nil {
			return err
		}
		if rep == 0 {
			continue
		}
		secs, frames := 0.0, 0
		for _, x := range syn {
			firsts = append(firsts, x.FirstChunkMS)
			secs += x.AudioSeconds
			frames += x.Frames
		}
		res.RTFAll = append(res.RTFAll, wall.Seconds()/secs)
		fps = append(fps, float64(frames)/wall.Seconds())
		res.Syntheses, res.AudioSeconds = syn, secs
	}
	res.FirstChunkMS, res.RTF, res.FramesPerSec = median(firsts), median(res.RTFAll), median(fps)
	res.PeakRSSMiB = peakRSSMiB()
	if o.asJSON {
		return json.NewEncoder(e.stdout).Encode(res)
	}
	c := m.Config()
	fmt.Fprintf(e.stdout, "model %s (pocket tts: %d layers, width %d, %d Hz, %d samples a frame), backend %s, threads %d\n",
		path, c.Layers, c.Dim, res.SampleRate, res.ChunkSize, res.Backend, res.Threads)
	fmt.Fprintf(e.stdout, "load     %10.1f ms  (voice %q: %.1f ms)\n", res.LoadMS, res.Voice, res.VoiceMS)
	fmt.Fprintf(e.stdout, "text     %d tokens in %d chunks; %d syntheses at once, %d runs\n", res.TextTokens, len(chunks), res.Concurrency, res.Reps)
	fmt.Fprintf(e.stdout, "%-9s %14s %8s %10s %10s %8s\n", "synthesis", "first chunk ms", "frames", "audio s", "total ms", "RTF")
	for i, x := range res.Syntheses {
		fmt.Fprintf(e.stdout, "%-9d %14.1f %8d %10.2f %10.1f %8.3f\n", i+1, x.FirstChunkMS, x.Frames, x.AudioSeconds, x.TotalMS, x.RTF)
	}
	fmt.Fprintf(e.stdout, "first chunk %.1f ms (median of every synthesis and run); aggregate RTF %.3f (runs: %s); %.1f frames/s\n",
		res.FirstChunkMS, res.RTF, joinf(res.RTFAll, "%.3f"), res.FramesPerSec)
	fmt.Fprintf(e.stdout, "peak RSS %.1f MiB\n", res.PeakRSSMiB)
	return nil
}

// benchSpeak runs n syntheses of text at once (seeds 1 to n) and returns what each took and the
// wall time of them all.
func benchSpeak(s *tts.Synthesizer, voice *pockettts.Voice, text string, n int) ([]ttsBenchSynth, time.Duration, error) {
	syn := make([]ttsBenchSynth, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			x := &syn[i]
			samples := 0
			r := tts.Request{Text: text, Voice: voice, Temperature: -1, Seed: uint64(i + 1)}
			errs[i] = s.Speak(context.Background(), r, func(a []float32) error {
				if samples == 0 {
					x.FirstChunkMS = ms(time.Since(t0))
				}
				samples += len(a)
				x.Frames++
				return nil
			})
			el := time.Since(t0)
			x.TotalMS = ms(el)
			x.AudioSeconds = float64(samples) / float64(s.SampleRate())
			if samples > 0 {
				x.RTF = el.Seconds() / x.AudioSeconds
			}
		}()
	}
	wg.Wait()
	wall := time.Since(t0)
	for i, err := range errs {
		if err != nil {
			return nil, 0, fmt.Errorf("synthesis %d: %w", i+1, err)
		}
		if syn[i].Frames == 0 {
			return nil, 0, fmt.Errorf("synthesis %d made no audio", i+1)
		}
	}
	return syn, wall, nil
}

// readBenchText is --text, or the file --text-file names, or benchTTSText.
func readBenchText(text, file string) (string, error) {
	switch {
	case text != "" && file != "":
		return "", usagef("give --text or --text-file, not both")
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--text-file: %w", err)
		}
		return string(b), nil
	case text != "":
		return text, nil
	}
	return benchTTSText, nil
}
