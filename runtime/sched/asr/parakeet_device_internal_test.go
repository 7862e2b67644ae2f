package asr

import (
	"context"
	"math"
	"sync"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/models/parakeet"
)

// TestParakeetDeviceLoop transcribes every reference clip at once (four decoding together, the
// others joining as they finish) on a backend that decides on the device, once on the device
// loop and once on the host loop, and requires the same text and tokens (ids and times, which
// come from the tokens' frames and durations), p and plog within 1e-5. A beam transcription
// among them decodes on the host loop in the same steps, the same both times.
func TestParakeetDeviceLoop(t *testing.T) {
	f, err := parakeet.Open(sharedtest.ParakeetRandomModel(t, "small", false))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var clips [][]float32
	for _, name := range beamClips {
		clips = append(clips, beamClipSamples(t, name))
	}
	for _, be := range sharedtest.Backends(t, 2) {
		if _, ok := be.(backend.GreedyTransducer); !ok {
			t.Logf("%s decides on the host: no device loop to test", be.Name())
			continue
		}
		t.Run(be.Name(), func(t *testing.T) {
			m, err := parakeet.Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			run := func(hostOnly bool) []*Result {
				hostLoopOnly = hostOnly
				e, err := NewParakeet(m, Config{MaxActive: 4, EncodeBatch: 2, MaxQueue: len(clips) + 1})
				hostLoopOnly = false
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				if (e.dev == nil) != hostOnly {
					t.Fatalf("host loop only %v, device loop %v", hostOnly, e.dev != nil)
				}
				res := make([]*Result, len(clips)+1)
				errs := make([]error, len(clips)+1)
				var wg sync.WaitGroup
				for i := range len(clips) + 1 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						p, c := DefaultParams(), clips[i%len(clips)]
						if i == len(clips) {
							p.BeamSize = 2
						}
						res[i], errs[i] = e.Transcribe(context.Background(), c, p, nil)
					}()
				}
				wg.Wait()
				for i, err := range errs {
					if err != nil {
						t.Fatalf("%s: %v", beamClips[i%len(clips)], err)
					}
				}
				return res
			}
			dev, host := run(false), run(true)
			if dev[len(clips)].Text != host[len(clips)].Text {
				t.Errorf("beam: %q, the host loop %q", dev[len(clips)].Text, host[len(clips)].Text)
			}
			for i, name := range beamClips {
				d, h := dev[i], host[i]
				if d.Text != h.Text || len(d.Segments) != len(h.Segments) {
					t.Errorf("%s: %q in %d segments, the host loop %q in %d", name, d.Text, len(d.Segments), h.Text, len(h.Segments))
					continue
				}
				var mp, ml float64
				n := 0
				for s := range d.Segments {
					dt, ht := d.Segments[s].Tokens, h.Segments[s].Tokens
					if len(dt) != len(ht) {
						t.Errorf("%s: segment %d: %d tokens, the host loop %d", name, s, len(dt), len(ht))
						break
					}
					for k := range dt {
						if dt[k].ID != ht[k].ID || dt[k].T0 != ht[k].T0 || dt[k].T1 != ht[k].T1 {
							t.Errorf("%s: token %d: %+v, the host loop %+v", name, k, dt[k], ht[k])
							break
						}
						mp, ml = max(mp, math.Abs(float64(dt[k].P-ht[k].P))), max(ml, math.Abs(float64(dt[k].PLog-ht[k].PLog)))
					}
					n += len(dt)
				}
				if mp > 1e-5 || ml > 1e-5 {
					t.Errorf("%s: max |Δ| p %.3g, plog %.3g (≤ 1e-5)", name, mp, ml)
				}
				t.Logf("%s: %d tokens, max |Δ| p %.3g, plog %.3g", name, n, mp, ml)
			}
		})
	}
}
