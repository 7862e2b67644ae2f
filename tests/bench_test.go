package tests

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkServeStreams measures aggregate generated tokens/s of `parley serve` with 1, 4, 8
// and 16 concurrent streaming clients, each generating 128 tokens, over real HTTP and SSE.
//
//	go test ./tests -run '^$' -bench ServeStreams -benchtime 3x
//
// $PARLEY_BENCH_MODEL names the model (default: a synthetic stories15M-shape Q8_0 model made
// with parley synth); $PARLEY_BENCH_SHAPE and $PARLEY_BENCH_TYPE change the synthetic one.
// $PARLEY_BENCH_URL (e.g. http://127.0.0.1:8081) measures another OpenAI-compatible server
// instead, such as llama-server, with the same clients; $PARLEY_BENCH_SAMPLING replaces the
// requests' greedy sampling (see benchSampling).
func BenchmarkServeStreams(b *testing.B) {
	base := os.Getenv("PARLEY_BENCH_URL")
	if base == "" {
		model := os.Getenv("PARLEY_BENCH_MODEL")
		if model == "" {
			shape, typ := envOr("PARLEY_BENCH_SHAPE", "15M"), envOr("PARLEY_BENCH_TYPE", "q8_0")
			model = filepath.Join(b.TempDir(), "bench.gguf")
			if res := parley(b, "", "synth", "--shape", shape, "--type", typ, "-o", model); res.code != 0 {
				b.Fatalf("synth: %s", res.stderr)
			}
		}
		srv := startServer(b, "-m", "bench="+model, "--parallel", "16", "--ctx", "256", "-t", "2")
		base = srv.base
	}
	const gen = 128
	for _, n := range []int{1, 4, 8, 16} {
		b.Run(fmt.Sprintf("streams=%d", n), func(b *testing.B) {
			var total time.Duration
			var firsts []time.Duration
			for i := 0; i < b.N; i++ {
				var wg sync.WaitGroup
				errs := make(chan error, n)
				start := time.Now()
				var mu sync.Mutex
				for c := 0; c < n; c++ {
					wg.Add(1)
					go func(c int) {
						defer wg.Done()
						ttft, err := streamOnce(base, fmt.Sprintf("Once upon a time %d", c), gen)
						if err != nil {
							errs <- err
							return
						}
						mu.Lock()
						firsts = append(firsts, ttft)
						mu.Unlock()
					}(c)
				}
				wg.Wait()
				total += time.Since(start)
				close(errs)
				for err := range errs {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n*gen*b.N)/total.Seconds(), "tokens/s")
			b.ReportMetric(float64(n*gen*b.N)/total.Seconds()/float64(n), "tokens/s/stream")
			var sum time.Duration
			for _, f := range firsts {
				sum += f
			}
			b.ReportMetric(float64(sum.Milliseconds())/float64(len(firsts)), "ms-to-first-token")
		})
	}
}

// benchSampling is the sampling fields of every request: greedy, unless $PARLEY_BENCH_SAMPLING
// gives others as JSON members ("temperature":1,"top_p":0.9, for instance; empty: the API's
// defaults, temperature 1 and top_p 1).
var benchSampling = func() string {
	v, ok := os.LookupEnv("PARLEY_BENCH_SAMPLING")
	if !ok {
		return `"temperature":0,`
	}
	if v == "" {
		return ""
	}
	return v + ","
}()

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// benchClient opens a connection per request: a kept-alive connection that the server closes
// while idle (llama-server does) fails the next POST with "server closed idle connection", which
// net/http does not retry for non-idempotent requests. On loopback a connection costs well under
// a millisecond against a request of 128 tokens.
var benchClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// streamOnce runs one streaming completion of exactly gen tokens and returns the time to its
// first token.
func streamOnce(base, prompt string, gen int) (time.Duration, error) {
	body := fmt.Sprintf(`{"model":"bench","prompt":%q,"max_tokens":%d,%s"stream":true,"ignore_eos":true}`, prompt, gen, benchSampling)
	t0 := time.Now()
	resp, err := benchClient.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return 0, fmt.Errorf("status %d", resp.StatusCode)
	}
	br := bufio.NewReader(resp.Body)
	var first time.Duration
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return 0, fmt.Errorf("stream ended without [DONE]: %v", err)
		}
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		if strings.HasPrefix(line, "data: [DONE]") {
			return first, nil
		}
		if first == 0 {
			first = time.Since(t0)
		}
	}
}
