package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/models"
	"github.com/parleyhq/parley/runtime/models/parakeet"
	"github.com/parleyhq/parley/runtime/sched/asr"
)

// parakeetBenchResult is what `parley bench` measures of a Parakeet model.
type parakeetBenchResult struct {
	Model        string           `json:"model"`
	Backend      string           `json:"backend"`
	Threads      int              `json:"threads"`
	HParams      parakeet.HParams `json:"hparams"`
	WeightType   string           `json:"weight_type"`
	Reps         int              `json:"reps"`
	LoadMS       float64          `json:"load_ms"`
	Files        int              `json:"files"`
	AudioSeconds float64          `json:"audio_seconds"`
	RTF          float64          `json:"rtf"`
	RTFAll       []float64        `json:"rtf_runs"`
	TotalMS      float64          `json:"total_ms"`
	EncodeMS     float64          `json:"encode_ms"`
	EncodeAll    []float64        `json:"encode_runs_ms"`
	DecodeMS     float64          `json:"decode_ms"`
	DecodeAll    []float64        `json:"decode_runs_ms"`
	OtherMS      float64          `json:"other_ms"`
	Tokens       int              `json:"tokens"`
	PeakRSSMiB   float64          `json:"peak_rss_mib"`
}

// benchParakeet measures a Parakeet model on audio files: the load, then reps whole greedy
// transcriptions of every file (after one that warms up) through the scheduler `parley
// transcribe` runs, as a real-time factor (processing time ÷ audio duration), split into the
// encoder (with the joint's encoder projection), the decoding (prediction network, joint, greedy
// search) and the rest (log-mel front end, queueing); medians of the runs.
func benchParakeet(e *env, bf backendFlags, path string, reps int, files []string, asJSON bool) error {
	if len(files) == 0 {
		return usagef("a Parakeet model is measured on audio: give --audio FILE (repeatable)")
	}
	pcm, secs, err := readBenchAudio(files)
	if err != nil {
		return err
	}
	t0 := time.Now()
	r, be, err := openOn(e, bf, path, func(p string, b backend.Backend) (*models.Recognizer, error) {
		return models.OpenRecognizer(p, b, asr.Config{MaxActive: 1})
	})
	if err != nil {
		return err
	}
	defer be.Close()
	defer r.Close()
	load := time.Since(t0)
	pk, ok := r.Recognizer.(*asr.Parakeet)
	if !ok {
		return fmt.Errorf("%s: not a Parakeet model", path)
	}
	h := pk.Model().HParams
	wt, _ := h.WeightType()
	res := parakeetBenchResult{Model: path, Backend: be.Name(), Threads: *bf.threads, HParams: h, WeightType: wt.String(),
		Reps: reps, LoadMS: ms(load), Files: len(pcm), AudioSeconds: secs}
	var totals []float64
	p := asr.DefaultParams()
	for rep := 0; rep <= reps; rep++ { // repetition 0 warms up
		s0 := pk.Stats()
		t0 := time.Now()
		tokens := 0
		for _, s := range pcm {
			out, err := pk.Transcribe(context.Background(), s, p, nil)
			if err != nil {
				return err
			}
			for _, seg := range out.Segments {
				tokens += len(seg.Tokens)
			}
		}
		el := time.Since(t0)
		s1 := pk.Stats()
		if rep == 0 {
			continue
		}
		res.Tokens = tokens
		totals = append(totals, ms(el))
		res.RTFAll = append(res.RTFAll, el.Seconds()/secs)
		res.EncodeAll = append(res.EncodeAll, ms(s1.EncodeTime-s0.EncodeTime))
		res.DecodeAll = append(res.DecodeAll, ms(s1.DecodeTime-s0.DecodeTime))
	}
	res.RTF, res.TotalMS = median(res.RTFAll), median(totals)
	res.EncodeMS, res.DecodeMS = median(res.EncodeAll), median(res.DecodeAll)
	res.OtherMS = res.TotalMS - res.EncodeMS - res.DecodeMS
	res.PeakRSSMiB = peakRSSMiB()
	if asJSON {
		return json.NewEncoder(e.stdout).Encode(res)
	}
	fmt.Fprintf(e.stdout, "model %s (parakeet: %d layers, width %d, %d mels, vocabulary %d, %s weights), backend %s, threads %d\n",
		path, h.NAudioLayer, h.NAudioState, h.NMels, h.NVocab, res.WeightType, res.Backend, res.Threads)
	fmt.Fprintf(e.stdout, "load     %10.1f ms\n", res.LoadMS)
	fmt.Fprintf(e.stdout, "RTF      %10.4f  (%d files, %.1f s of audio, greedy, %d tokens; runs: %s)\n", res.RTF, res.Files, secs, res.Tokens, joinf(res.RTFAll, "%.4f"))
	fmt.Fprintf(e.stdout, "total    %10.1f ms  encoder %.1f ms (runs: %s), decoder %.1f ms (runs: %s), front end and other %.1f ms\n",
		res.TotalMS, res.EncodeMS, rates(res.EncodeAll), res.DecodeMS, rates(res.DecodeAll), res.OtherMS)
	fmt.Fprintf(e.stdout, "peak RSS %.1f MiB\n", res.PeakRSSMiB)
	return nil
}

// readBenchAudio decodes the audio files and returns their samples and their total duration.
func readBenchAudio(files []string) ([][]float32, float64, error) {
	var pcm [][]float32
	secs := 0.0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, 0, err
		}
		s, _, err := audio.Decode(b)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", f, err)
		}
		if len(s) == 0 {
			return nil, 0, fmt.Errorf("%s: no audio samples", f)
		}
		pcm = append(pcm, s)
		secs += float64(len(s)) / asr.SampleRate
	}
	return pcm, secs, nil
}

// ms is d in milliseconds.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
