package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/parleyhq/parley/runtime/sched"
)

// TestPoolMetrics scrapes /metrics while one model's scheduler is held inside a step with one
// sequence running and one request waiting, and another model idles, and checks the model server
// protocol's series: their names and types, and values equal to the schedulers' Stats summed.
func TestPoolMetrics(t *testing.T) {
	p := modelPath(t)
	gate := make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(gate) }) }
	held := sched.Config{MaxActive: 1, PrefixCache: true, OnStep: func(time.Duration, int, int) { <-gate }}
	busyLLM, idleLLM := openLLM(t, p), openLLM(t, p)
	busy, _ := newSched(t, busyLLM, held, true)
	idle, _ := newSched(t, idleLLM, sched.Config{PrefixCache: true}, true)
	t.Cleanup(release) // before the schedulers close (cleanups run last first)
	s, err := New(Config{}, []*Model{
		llmModel("busy", busyLLM, busy, testCtx),
		llmModel("idle", idleLLM, idle, testCtx),
	})
	if err != nil {
		t.Fatal(err)
	}
	s.SetReady(true)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	// A finished request leaves its prompt's blocks in the idle model's prefix cache, shared by no
	// sequence: they count as free.
	h := &harness{srv: srv, s: s}
	if resp, b := h.post(t, "/v1/completions", map[string]any{"model": "idle", "prompt": strings.Repeat(storyPrompt+" ", 4), "max_tokens": 2}); resp.StatusCode != 200 {
		t.Fatalf("idle model: %d %s", resp.StatusCode, b)
	}
	deadline := time.Now().Add(30 * time.Second)
	for st := idle.Stats(); st.Active != 0 || st.IdleBlocks == 0; st = idle.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("no idle cached blocks after a finished request: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	body := `{"model":"busy","prompt":"` + storyPrompt + `","max_tokens":50,"ignore_eos":true,"stream":true}`
	for range 2 {
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/completions", strings.NewReader(body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		if resp.StatusCode != 200 {
			t.Fatalf("stream: %d", resp.StatusCode)
		}
	}
	// The held scheduler publishes its Stats at the end of its first step, before it blocks.
	deadline = time.Now().Add(30 * time.Second)
	for st := busy.Stats(); st.Active != 1 || st.Queued != 1; st = busy.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("scheduler never held one running and one waiting: %+v", st)
		}
		time.Sleep(5 * time.Millisecond)
	}
	b, a := busy.Stats(), idle.Stats()

	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	gauge := func(name string) *dto.Metric {
		t.Helper()
		f := fams[name]
		if f == nil {
			t.Fatalf("/metrics has no %s", name)
		}
		if f.GetType() != dto.MetricType_GAUGE || len(f.Metric) != 1 {
			t.Fatalf("%s: %s with %d series, want one gauge", name, f.GetType(), len(f.Metric))
		}
		return f.Metric[0]
	}
	if v := gauge(MetricRequestsWaiting).GetGauge().GetValue(); v != 1 {
		t.Errorf("%s = %v, want 1", MetricRequestsWaiting, v)
	}
	if v := gauge(MetricRequestsRunning).GetGauge().GetValue(); v != 1 {
		t.Errorf("%s = %v, want 1", MetricRequestsRunning, v)
	}
	total := b.KVBlocksUsed + b.KVBlocksFree + a.KVBlocksUsed + a.KVBlocksFree
	heldBlocks := b.KVBlocksUsed - b.IdleBlocks + a.KVBlocksUsed - a.IdleBlocks
	if heldBlocks <= 0 || a.KVBlocksUsed == 0 || a.IdleBlocks != a.KVBlocksUsed {
		t.Fatalf("busy model holds %d blocks (%+v); idle one %d used, %d idle", heldBlocks, b, a.KVBlocksUsed, a.IdleBlocks)
	}
	want := float64(heldBlocks) / float64(total)
	if v := gauge(MetricKVCacheUsage).GetGauge().GetValue(); v != want || v <= 0 || v >= 1 {
		t.Errorf("%s = %v, want %d/%d = %v", MetricKVCacheUsage, v, heldBlocks, total, want)
	}
	info := gauge(MetricCacheConfigInfo)
	labels := map[string]string{}
	for _, l := range info.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	if info.GetGauge().GetValue() != 1 || labels["block_size"] != strconv.Itoa(b.BlockSize) || labels["num_gpu_blocks"] != strconv.Itoa(total) || b.BlockSize <= 0 {
		t.Errorf("%s: %v %v, want block_size %d, num_gpu_blocks %d", MetricCacheConfigInfo, info.GetGauge().GetValue(), labels, b.BlockSize, total)
	}
	release()
}

// TestPoolMetricsSpeechOnly: a server without language models has none of the series, so that
// the endpoint picker never takes it for an idle one.
func TestPoolMetricsSpeechOnly(t *testing.T) {
	if n := testutil.CollectAndCount(&poolCollector{}); n != 0 {
		t.Errorf("%d series without language models", n)
	}
}
