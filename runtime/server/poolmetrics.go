package server

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// The metrics of the model server protocol of the Kubernetes Gateway API Inference Extension: what
// its endpoint picker scrapes from every server of an InferencePool to choose the server a request
// goes to (docs/proposals/003-model-server-protocol/README.md of
// github.com/kubernetes-sigs/gateway-api-inference-extension, the same text at v1.5.0 and v1.6.0,
// commit 992e5c292afb248801ce8d9234eb5b9d28eea231). The protocol fixes types and meanings and
// lets names vary; the picker reads a pod by the names of its engine-type label's mapping and,
// without that label, by vLLM's, so the series carry vLLM's names: a Parley pod needs no label and
// no picker configuration.
//
// Each is one series for the whole server, summed over its language models (speech models are
// not routed by the picker), since the picker reads the first series of a family it finds.
const (
	// MetricRequestsWaiting (gauge): requests waiting for admission (the protocol's
	// TotalQueuedRequests).
	MetricRequestsWaiting = "vllm:num_requests_waiting"
	// MetricRequestsRunning (gauge): sequences being generated; a request with n choices counts n
	// (TotalRunningRequests).
	MetricRequestsRunning = "vllm:num_requests_running"
	// MetricKVCacheUsage (gauge, 0 to 1): the fraction of KV-cache blocks that sequences hold
	// (KVCacheUtilization). Blocks the prefix cache keeps that no sequence shares count as free,
	// as in vLLM: admission frees them when it needs them.
	MetricKVCacheUsage = "vllm:kv_cache_usage_perc"
	// MetricCacheConfigInfo (gauge, always 1): the KV cache's geometry in the labels block_size
	// (positions per block) and num_gpu_blocks (blocks in all; host memory on the CPU backends),
	// the protocol's optional BlockSize and NumGPUBlocks, which size the picker's estimate of the
	// prefix cache.
	MetricCacheConfigInfo = "vllm:cache_config_info"
)

var (
	descPoolWaiting = prometheus.NewDesc(MetricRequestsWaiting, "Requests waiting for admission, over every language model (vLLM's name, read by the Gateway API Inference Extension's endpoint picker).", nil, nil)
	descPoolRunning = prometheus.NewDesc(MetricRequestsRunning, "Sequences being generated, over every language model (vLLM's name, read by the Gateway API Inference Extension's endpoint picker).", nil, nil)
	descPoolKVUsage = prometheus.NewDesc(MetricKVCacheUsage, "Fraction of KV-cache blocks held by sequences, over every language model; 1 is full (vLLM's name, read by the Gateway API Inference Extension's endpoint picker).", nil, nil)
	descPoolCache   = prometheus.NewDesc(MetricCacheConfigInfo, "KV-cache geometry: positions per block and blocks in all, over every language model (vLLM's name, read by the Gateway API Inference Extension's endpoint picker).", []string{"block_size", "num_gpu_blocks"}, nil)
)

// poolCollector reads the language models' scheduler Stats at scrape time. A server of speech
// models alone has none of these series.
type poolCollector struct {
	models []*served
}

func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descPoolWaiting, descPoolRunning, descPoolKVUsage, descPoolCache} {
		ch <- d
	}
}

func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	if len(c.models) == 0 {
		return
	}
	var waiting, running, held, total, blockSize int
	sameSize := true
	for i, m := range c.models {
		st := m.Sched.Stats()
		waiting += st.Queued
		running += st.Active
		// Used and idle blocks are published one after the other: clamp a snapshot taken between.
		held += min(max(st.KVBlocksUsed-st.IdleBlocks, 0), st.KVBlocksUsed)
		total += st.KVBlocksUsed + st.KVBlocksFree
		if i == 0 {
			blockSize = st.BlockSize
		} else if st.BlockSize != blockSize {
			sameSize = false
		}
	}
	usage := 0.0
	if total > 0 {
		usage = min(float64(held)/float64(total), 1)
	}
	ch <- prometheus.MustNewConstMetric(descPoolWaiting, prometheus.GaugeValue, float64(waiting))
	ch <- prometheus.MustNewConstMetric(descPoolRunning, prometheus.GaugeValue, float64(running))
	ch <- prometheus.MustNewConstMetric(descPoolKVUsage, prometheus.GaugeValue, usage)
	if sameSize && blockSize > 0 {
		ch <- prometheus.MustNewConstMetric(descPoolCache, prometheus.GaugeValue, 1, strconv.Itoa(blockSize), strconv.Itoa(total))
	}
}
