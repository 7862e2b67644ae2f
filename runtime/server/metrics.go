package server

import (
	"net/http"

	"github.com/parleyhq/parley/runtime/sched"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the server's Prometheus series, in a registry of its own.
type metrics struct {
	reg       *prometheus.Registry
	handler   http.Handler
	requests  *prometheus.CounterVec   // endpoint, code
	duration  *prometheus.HistogramVec // endpoint
	ttft      *prometheus.HistogramVec // model
	itl       *prometheus.HistogramVec // model
	prompt    *prometheus.CounterVec   // model
	generated *prometheus.CounterVec   // model
	audioSec  *prometheus.CounterVec   // model, kind
	asrTime   *prometheus.HistogramVec // model, kind
	streams   prometheus.Gauge
	sched     *schedCollector
	speechSec *prometheus.CounterVec // model, kind
	speakers  prometheus.Gauge
}

func newMetrics(models []*served, speech []*speechServed) *metrics {
	m := &metrics{
		reg:   prometheus.NewRegistry(),
		sched: &schedCollector{models: models, speech: speech},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_http_requests_total", Help: "HTTP requests by endpoint and status code.",
		}, []string{"endpoint", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "parley_http_request_duration_seconds", Help: "HTTP request duration, streams included.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"endpoint"}),
		ttft: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "parley_time_to_first_token_seconds", Help: "From request arrival to its first generated token.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}, []string{"model"}),
		itl: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "parley_inter_token_latency_seconds", Help: "Between consecutive generated tokens of one sequence.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14),
		}, []string{"model"}),
		prompt: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_prompt_tokens_total", Help: "Prompt tokens of finished requests.",
		}, []string{"model"}),
		generated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_generated_tokens_total", Help: "Generated tokens of finished requests.",
		}, []string{"model"}),
		audioSec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_audio_seconds_total", Help: "Seconds of audio transcribed, by model and kind (transcription, translation, stream).",
		}, []string{"model", "kind"}),
		asrTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "parley_transcription_duration_seconds", Help: "Time one transcription took in the engine (queueing included); for streams, one pass over the live buffer, or one chunk of a streaming recogniser.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 14),
		}, []string{"model", "kind"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "parley_audio_streams", Help: "Open live transcription sessions (/v1/audio/stream).",
		}),
		speechSec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "parley_speech_seconds_total", Help: "Seconds of audio synthesised and sent, by model and kind (speech, stream).",
		}, []string{"model", "kind"}),
		speakers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "parley_speech_streams", Help: "Open live synthesis sessions (/v1/audio/speech/stream).",
		}),
	}
	m.reg.MustRegister(m.requests, m.duration, m.ttft, m.itl, m.prompt, m.generated, m.audioSec, m.asrTime, m.streams, m.speechSec, m.speakers,
		m.sched, &poolCollector{models: models},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
	return m
}

var (
	descQueue     = prometheus.NewDesc("parley_queue_depth", "Requests waiting for admission.", []string{"model"}, nil)
	descActive    = prometheus.NewDesc("parley_active_sequences", "Sequences in flight.", []string{"model"}, nil)
	descKVUsed    = prometheus.NewDesc("parley_kv_blocks_used", "KV-cache blocks in use.", []string{"model"}, nil)
	descKVFree    = prometheus.NewDesc("parley_kv_blocks_free", "KV-cache blocks free.", []string{"model"}, nil)
	descSteps     = prometheus.NewDesc("parley_steps_total", "Scheduler steps (batched forward passes).", []string{"model"}, nil)
	descStep      = prometheus.NewDesc("parley_step_duration_seconds", "Duration of the scheduler's last step.", []string{"model"}, nil)
	descBatchTok  = prometheus.NewDesc("parley_batch_tokens", "Tokens in the scheduler's last batch.", []string{"model"}, nil)
	descBatchSeqs = prometheus.NewDesc("parley_batch_size", "Sequences in the scheduler's last batch.", []string{"model"}, nil)
	descSPrompt   = prometheus.NewDesc("parley_sched_prompt_tokens_total", "Prompt tokens processed by the scheduler (re-fed tokens of forked sequences included).", []string{"model"}, nil)
	descSGen      = prometheus.NewDesc("parley_sched_generated_tokens_total", "Tokens sampled by the scheduler.", []string{"model"}, nil)
)

// schedCollector reads each scheduler's Stats at scrape time, the language models' and the speech
// models' recognisers alike (for those, active sequences are transcriptions in flight and the KV
// blocks are the decoder's). A scheduler keeps only its last step's duration and batch size, so
// those are gauges, not histograms; StepMetrics has the histograms.
type schedCollector struct {
	models []*served
	speech []*speechServed
	// loaded, when set, gives the on-demand models loaded now, reported beside them.
	loaded func() ([]*served, []*speechServed)
}

func (c *schedCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQueue, descActive, descKVUsed, descKVFree, descSteps, descStep, descBatchTok, descBatchSeqs, descSPrompt, descSGen} {
		ch <- d
	}
}

func (c *schedCollector) Collect(ch chan<- prometheus.Metric) {
	models, speech := c.models, c.speech
	if c.loaded != nil {
		lm, ls := c.loaded()
		models = append(models[:len(models):len(models)], lm...)
		speech = append(speech[:len(speech):len(speech)], ls...)
	}
	for _, m := range models {
		if m.Sched == nil {
			collectLoop(ch, m.Name, m.Embedder.Stats(), 0, 0, 0)
			continue
		}
		st := m.Sched.Stats()
		loop := sched.LoopStats{Queued: st.Queued, Steps: st.Steps, LastStep: st.LastStep,
			LastBatchSeqs: st.LastBatchSeqs, LastBatchTokens: st.LastBatchTokens}
		collectLoop(ch, m.Name, loop, st.Active, st.KVBlocksUsed, st.KVBlocksFree)
		ch <- prometheus.MustNewConstMetric(descSPrompt, prometheus.CounterValue, float64(st.PromptTokens), m.Name)
		ch <- prometheus.MustNewConstMetric(descSGen, prometheus.CounterValue, float64(st.GeneratedTokens), m.Name)
	}
	for _, m := range speech {
		st := m.Recognizer.Stats()
		collectLoop(ch, m.Name, st.LoopStats, st.Active, st.KVBlocksUsed, st.KVBlocksFree)
	}
}

// collectLoop sends the figures every scheduled model has: its loop's, the sequences (or
// transcriptions) in flight and its KV-cache blocks.
func collectLoop(ch chan<- prometheus.Metric, name string, l sched.LoopStats, active, kvUsed, kvFree int) {
	g := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, name)
	}
	g(descQueue, float64(l.Queued))
	g(descActive, float64(active))
	g(descKVUsed, float64(kvUsed))
	g(descKVFree, float64(kvFree))
	ch <- prometheus.MustNewConstMetric(descSteps, prometheus.CounterValue, float64(l.Steps), name)
	g(descStep, l.LastStep.Seconds())
	g(descBatchTok, float64(l.LastBatchTokens))
	g(descBatchSeqs, float64(l.LastBatchSeqs))
}
