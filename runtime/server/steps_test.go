package server

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestStepMetrics(t *testing.T) {
	sm := NewStepMetrics()
	reg := prometheus.NewRegistry()
	if err := registerAll(reg, sm.collectors()); err != nil {
		t.Fatal(err)
	}
	hook := sm.OnStep("m")
	hook(3*time.Millisecond, 4, 37)
	hook(5*time.Millisecond, 8, 8)
	if n := testutil.CollectAndCount(sm.dur); n != 1 {
		t.Fatalf("%d duration series", n)
	}
	want := `
# HELP parley_step_batch_sequences Sequences in each scheduler step's batch.
# TYPE parley_step_batch_sequences histogram
parley_step_batch_sequences_bucket{model="m",le="1"} 0
parley_step_batch_sequences_bucket{model="m",le="2"} 0
parley_step_batch_sequences_bucket{model="m",le="4"} 1
parley_step_batch_sequences_bucket{model="m",le="8"} 2
parley_step_batch_sequences_bucket{model="m",le="16"} 2
parley_step_batch_sequences_bucket{model="m",le="32"} 2
parley_step_batch_sequences_bucket{model="m",le="64"} 2
parley_step_batch_sequences_bucket{model="m",le="128"} 2
parley_step_batch_sequences_bucket{model="m",le="256"} 2
parley_step_batch_sequences_bucket{model="m",le="+Inf"} 2
parley_step_batch_sequences_sum{model="m"} 12
parley_step_batch_sequences_count{model="m"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "parley_step_batch_sequences"); err != nil {
		t.Fatal(err)
	}
	if a := testing.AllocsPerRun(100, func() { hook(time.Millisecond, 2, 2) }); a != 0 {
		t.Fatalf("the step hook allocates %v times", a)
	}
}
