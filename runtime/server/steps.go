package server

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// StepMetrics records every scheduler step in histograms: its duration, and the sequences and
// tokens of its batch. Make it before the schedulers, give each scheduler OnStep(name) as its
// sched.Config.OnStep (a speech recogniser's asr.Config.OnStep), and pass it to the server
// in Config.Steps, which registers it.
type StepMetrics struct {
	dur, seqs, toks *prometheus.HistogramVec
}

// NewStepMetrics makes the step histograms.
func NewStepMetrics() *StepMetrics {
	return &StepMetrics{
		dur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "parley_step_seconds", Help: "Duration of each scheduler step: one batched forward pass and its sampling (for a speech model, plus the window it encoded, if any).",
			Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
		}, []string{"model"}),
		seqs: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "parley_step_batch_sequences", Help: "Sequences in each scheduler step's batch.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 9),
		}, []string{"model"}),
		toks: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "parley_step_batch_tokens", Help: "Tokens in each scheduler step's batch.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 13),
		}, []string{"model"}),
	}
}

// OnStep returns the hook for the scheduler of model. The label lookups happen here, once, so the
// hook allocates nothing per step.
func (s *StepMetrics) OnStep(model string) func(d time.Duration, seqs, tokens int) {
	dur, sq, tk := s.dur.WithLabelValues(model), s.seqs.WithLabelValues(model), s.toks.WithLabelValues(model)
	return func(d time.Duration, seqs, tokens int) {
		dur.Observe(d.Seconds())
		if tokens > 0 { // a speech model's step that only encoded audio has no batch
			sq.Observe(float64(seqs))
			tk.Observe(float64(tokens))
		}
	}
}

func (s *StepMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{s.dur, s.seqs, s.toks}
}

func registerAll(reg *prometheus.Registry, cs []prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
