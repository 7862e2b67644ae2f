package asr

import (
	"context"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/audio"
)

// BenchmarkParakeetStreams streams reference/asr-transducer/audio/concat-40s.wav through 1, 4
// and 8 live streams at once, each as fast as its chunks decode (default chunking: 1.6 s chunks,
// 2 s of left and 480 ms of right context), and reports the time of a chunk (submission to
// end: the batched encoder call and decoding steps its streams share) at the median and the
// 99th percentile, counting the chunks that have their whole left context, and the audio
// decoded per second of wall time by all streams together (x-realtime), on the fastest backend
// under test. The model is the small random-weight one; $PARLEY_BENCH_PARAKEET=0.6b-v2 takes
// that shape (see sharedtest.ParakeetRandomModel for where it is found), $PARLEY_BENCH_PARAKEET_FILE
// a model file of any weight type (Q8_0 from parakeet-quantize, say), and $PARLEY_BENCH_LEFT (a
// duration) another left context.
func BenchmarkParakeetStreams(b *testing.B) {
	shape := "small"
	if s := os.Getenv("PARLEY_BENCH_PARAKEET"); s != "" {
		shape = s
	}
	cfg := SessionConfig{Silence: -1}
	if s := os.Getenv("PARLEY_BENCH_LEFT"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			b.Fatal(err)
		}
		cfg.LeftContext = d
	}
	raw, err := os.ReadFile(sharedtest.Path(b, "reference/asr-transducer/audio/concat-40s.wav"))
	if err != nil {
		b.Fatal(err)
	}
	pcm, _, err := audio.Decode(raw)
	if err != nil {
		b.Fatal(err)
	}
	var e *Parakeet
	if p := os.Getenv("PARLEY_BENCH_PARAKEET_FILE"); p != "" {
		e = openParakeetFile(b, p, true, Config{MaxActive: 8})
	} else {
		e = openParakeetShape(b, shape, true, Config{MaxActive: 8})
	}
	for _, n := range []int{1, 4, 8} {
		b.Run("streams="+itoa(n), func(b *testing.B) {
			var mu sync.Mutex
			var times []time.Duration
			var audioSec float64
			b.ResetTimer()
			t0 := time.Now()
			for range b.N {
				var wg sync.WaitGroup
				for range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						c := cfg
						seen := 0
						var own []time.Duration
						c.OnChunk = func(d time.Duration) {
							if seen++; seen > 3 { // whole left context (up to 4.8 s) from the 4th chunk of 1.6 s on
								own = append(own, d)
							}
						}
						l, err := e.NewLive(c)
						if err != nil {
							b.Error(err)
							return
						}
						for i := 0; i < len(pcm); i += SampleRate / 5 {
							if _, err := l.Write(context.Background(), pcm[i:min(i+SampleRate/5, len(pcm))]); err != nil {
								b.Error(err)
								return
							}
						}
						mu.Lock()
						times = append(times, own...)
						audioSec += float64(len(pcm)) / SampleRate
						mu.Unlock()
					}()
				}
				wg.Wait()
			}
			wall := time.Since(t0)
			b.StopTimer()
			if len(times) == 0 {
				return
			}
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)/2].Microseconds())/1000, "p50-chunk-ms")
			b.ReportMetric(float64(times[min(len(times)-1, len(times)*99/100)].Microseconds())/1000, "p99-chunk-ms")
			b.ReportMetric(audioSec/wall.Seconds(), "x-realtime")
		})
	}
}

func itoa(n int) string {
	if n < 10 {
		return string(rune('0' + n))
	}
	return itoa(n/10) + itoa(n%10)
}
