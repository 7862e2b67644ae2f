package asr

import (
	"context"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/audio"
)

// BenchmarkParakeetClips transcribes data/asr/wav/ljs-LJ001-0001.wav (9.6 s) greedily as 1 and
// 4 concurrent transcriptions, decoded on the host loop, and reports the decoding time of a
// step that decodes (the prediction-network call and the joint rounds up to every
// transcription's next token; the encoder's time is not counted), its mean and median, and the
// mean of an emitted token, on
// the fastest backend under test. The model is the small random-weight one;
// $PARLEY_BENCH_PARAKEET=0.6b-v2 takes that shape (see sharedtest.ParakeetRandomModel for where
// it is found).
func BenchmarkParakeetClips(b *testing.B) {
	shape := "small"
	if s := os.Getenv("PARLEY_BENCH_PARAKEET"); s != "" {
		shape = s
	}
	raw, err := os.ReadFile(sharedtest.Path(b, "data/asr/wav/ljs-LJ001-0001.wav"))
	if err != nil {
		b.Fatal(err)
	}
	pcm, _, err := audio.Decode(raw)
	if err != nil {
		b.Fatal(err)
	}
	var ep atomic.Pointer[Parakeet]
	var lastDecode time.Duration
	var steps, toks atomic.Int64
	var decodeNS atomic.Int64
	var mu sync.Mutex
	var perStep []time.Duration
	cfg := Config{MaxActive: 4, EncodeBatch: 4, OnStep: func(_ time.Duration, seqs, tokens int) {
		e := ep.Load()
		if e == nil {
			return
		}
		d := e.Stats().DecodeTime // the loop's goroutine: no step runs beside this call
		if seqs > 0 {
			steps.Add(1)
			toks.Add(int64(tokens))
			decodeNS.Add(int64(d - lastDecode))
			mu.Lock()
			perStep = append(perStep, d-lastDecode)
			mu.Unlock()
		}
		lastDecode = d
	}}
	hostLoopOnly = true
	e := openParakeetShape(b, shape, true, cfg)
	hostLoopOnly = false
	ep.Store(e)
	for _, n := range []int{1, 4} {
		b.Run("clips="+itoa(n), func(b *testing.B) {
			steps.Store(0)
			toks.Store(0)
			decodeNS.Store(0)
			mu.Lock()
			perStep = perStep[:0]
			mu.Unlock()
			for range b.N {
				var wg sync.WaitGroup
				errs := make([]error, n)
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						_, errs[i] = e.Transcribe(context.Background(), pcm, DefaultParams(), nil)
					}()
				}
				wg.Wait()
				for _, err := range errs {
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			if s := steps.Load(); s > 0 {
				b.ReportMetric(float64(decodeNS.Load())/float64(s)/1e6, "decode-ms/step")
				b.ReportMetric(float64(s)/float64(b.N), "steps/op")
				mu.Lock()
				slices.Sort(perStep)
				b.ReportMetric(float64(perStep[len(perStep)/2])/1e6, "p50-decode-ms/step")
				mu.Unlock()
			}
			if t := toks.Load(); t > 0 {
				b.ReportMetric(float64(decodeNS.Load())/float64(t)/1e6, "decode-ms/token")
			}
		})
	}
}
