package asr

import (
	"context"
	"errors"
	"io"
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/models/whisper"
)

// speechLike is n samples of seeded noise under an envelope spanning 100 dB, with silent runs:
// the clamp at the recording's maximum less 8 decades changes many values.
func speechLike(n int, seed uint64) []float32 {
	rng := rand.New(rand.NewPCG(seed, 3))
	s := make([]float32, n)
	for i := range s {
		env := math.Pow(10, -5*float64(i%70000)/70000)
		if i%90000 > 80000 {
			env = 0
		}
		s[i] = float32(env * (rng.Float64()*2 - 1) * 0.5)
	}
	return s
}

// countingSource is a Source that counts its opens and the samples its streams have read.
type countingSource struct {
	audio.Source
	opens, read atomic.Int64
}

func (c *countingSource) Open() (audio.Stream, error) {
	c.opens.Add(1)
	s, err := c.Source.Open()
	return countingStream{s, c}, err
}

type countingStream struct {
	audio.Stream
	c *countingSource
}

func (s countingStream) Read(dst []float32) (int, error) {
	n, err := s.Stream.Read(dst)
	s.c.read.Add(int64(n))
	return n, err
}

// TestFeaturesEqualLogMel: the windows a transcription's features give, at seeks moving on as
// a transcription's do (by less than a window, by a window, past silence, to the end), are those
// of the whole recording's log-mel bit for bit, for a recording short enough to be read once and
// for recordings read twice; and the features never hold more than their ring, the second pass
// waiting while the window at seek is still needed.
func TestFeaturesEqualLogMel(t *testing.T) {
	m := testModel(t, "tiny.en")
	const w = whisper.WindowFrames
	for _, c := range []struct {
		sec   float64
		seeks []int
	}{
		{25.3, []int{0, 1234}},
		{59.9, []int{0, 2990, 5900}},
		{61, []int{0, 3000, 6000}},
		{147.77, []int{0, 2000, 4400, 7000, 10000, 13500, 14700}},
	} {
		samples := speechLike(int(c.sec*SampleRate), uint64(c.sec))
		want, nFrames, err := whisper.LogMel(samples, m, 2)
		if err != nil {
			t.Fatal(err)
		}
		woke := make(chan struct{}, 1)
		src := &countingSource{Source: audio.Samples(samples)}
		f := &features{src: src, m: m, threads: 2, nMel: m.Mels, space: make(chan struct{}, 1),
			wake: func() {
				select {
				case woke <- struct{}{}:
				default:
				}
			}}
		ctx, cancel := context.WithCancel(context.Background())
		begin, done := make(chan struct{}), make(chan struct{})
		close(begin)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); f.run(ctx, begin, done) }()
		got := make([]float32, m.Mels*w)
		for _, seek := range c.seeks {
			for {
				ok, err := f.ready(seek)
				if err != nil {
					t.Fatal(err)
				}
				if ok {
					break
				}
				select {
				case <-woke:
				case <-time.After(time.Minute):
					t.Fatalf("%.2f s: the window at %d was not ready within a minute", c.sec, seek)
				}
			}
			f.mu.Lock()
			held := f.hi - f.lo
			f.mu.Unlock()
			if held > featureRing {
				t.Errorf("%.2f s at seek %d: %d frames held, more than the ring's %d", c.sec, seek, held, featureRing)
			}
			f.window(got, seek)
			ref, _ := audio.MelWindow(nil, want, m.Mels, nFrames, seek, w)
			for i := range ref {
				if math.Float32bits(got[i]) != math.Float32bits(ref[i]) {
					t.Fatalf("%.2f s, window at %d: bin %d frame %d is %v, the whole log-mel's %v", c.sec, seek, i/w, i%w, got[i], ref[i])
				}
			}
		}
		close(done)
		wg.Wait()
		cancel()
		passes := int64(1)
		if f.nc > featureRing {
			passes = 2
		}
		if got := src.opens.Load(); got != passes {
			t.Errorf("%.2f s (%d frames): read %d times, want %d", c.sec, f.nc, got, passes)
		}
	}
}

// TestAdmissionBeforeAudio: a transcription is refused for a full queue before its audio is
// opened, and one waiting in the queue does not read its audio until it is admitted.
func TestAdmissionBeforeAudio(t *testing.T) {
	e, err := NewWhisper(testModel(t, "tiny.en"), Config{MaxActive: 1, MaxQueue: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	p := DefaultParams()
	p.Language, p.NoTimestamps, p.TemperatureInc, p.MaxTokens = "en", true, 0, 4
	long := speechLike(10*60*SampleRate, 1) // 10 minutes: a pass over it takes seconds
	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	a := &countingSource{Source: audio.Samples(long)}
	errA := make(chan error, 1)
	go func() { _, err := e.TranscribeSource(ctxA, a, p, nil); errA <- err }()
	for a.read.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	b := &countingSource{Source: audio.Samples(long)}
	errB := make(chan error, 1)
	go func() { _, err := e.TranscribeSource(context.Background(), b, p, nil); errB <- err }()
	for e.Stats().Queued != 1 {
		time.Sleep(time.Millisecond)
	}
	c := &countingSource{Source: audio.Samples(long)}
	t0 := time.Now()
	if _, err := e.TranscribeSource(context.Background(), c, p, nil); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("a third transcription with one running and one queued: %v, want ErrQueueFull", err)
	}
	t.Logf("refused in %v", time.Since(t0))
	if c.opens.Load() != 0 {
		t.Error("the refused transcription's audio was opened")
	}
	time.Sleep(100 * time.Millisecond)
	if b.opens.Load() != 0 || b.read.Load() != 0 {
		t.Errorf("the queued transcription opened its audio %d times and read %d samples", b.opens.Load(), b.read.Load())
	}
	cancelA()
	if err := <-errA; !errors.Is(err, context.Canceled) {
		t.Errorf("the first transcription, cancelled: %v", err)
	}
	for b.read.Load() == 0 {
		select {
		case err := <-errB:
			t.Fatalf("the queued transcription ended without reading its audio: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	e.Close()
	if err := <-errB; !errors.Is(err, ErrClosed) {
		t.Errorf("the second transcription, closed: %v", err)
	}
}

// TestCancelStopsReading: a transcription whose caller leaves, while its audio is read for the
// first pass or while its windows are decoded, returns within a window's work, reads at most a
// window (30 s) of audio after the cancellation, and none after it has returned.
func TestCancelStopsReading(t *testing.T) {
	e, err := NewWhisper(testModel(t, "tiny.en"), Config{MaxActive: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	p := DefaultParams()
	p.Language, p.NoTimestamps, p.TemperatureInc, p.MaxTokens = "en", true, 0, 4
	long := speechLike(20*60*SampleRate, 2) // 20 minutes
	for _, c := range []struct {
		name  string
		ready func(src *countingSource, steps uint64) bool
	}{
		{"first pass", func(src *countingSource, _ uint64) bool { return src.read.Load() > 60*SampleRate }},
		{"decoding", func(_ *countingSource, steps uint64) bool { return e.Stats().Steps > steps+5 }},
	} {
		before := e.Stats().Steps
		src := &countingSource{Source: audio.Samples(long)}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { _, err := e.TranscribeSource(ctx, src, p, nil); errc <- err }()
		for !c.ready(src, before) {
			select {
			case err := <-errc:
				t.Fatalf("%s: ended before it was cancelled: %v", c.name, err)
			case <-time.After(time.Millisecond):
			}
		}
		atCancel := src.read.Load()
		cancel()
		t0 := time.Now()
		err := <-errc
		took := time.Since(t0)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("%s: %v, want context.Canceled", c.name, err)
		}
		read := src.read.Load()
		if more := read - atCancel; more > int64(audio.ChunkSamples) {
			t.Errorf("%s: %.1f s of audio read after the cancellation, more than a window", c.name, float64(more)/SampleRate)
		}
		time.Sleep(200 * time.Millisecond)
		if more := src.read.Load() - read; more > 0 {
			t.Errorf("%s: %d samples read after the transcription returned", c.name, more)
		}
		steps := e.Stats().Steps
		time.Sleep(200 * time.Millisecond)
		if e.Stats().Steps != steps || e.Stats().Active != 0 {
			t.Errorf("%s: the recogniser still steps after the transcription returned: %+v", c.name, e.Stats())
		}
		t.Logf("%s: returned %v after the cancellation (%d steps, %.1f s of audio read)", c.name, took, steps-before, float64(read)/SampleRate)
		if took > 5*time.Second {
			t.Errorf("%s: returned %v after the cancellation, more than a window's work", c.name, took)
		}
	}
}

// squareSource is n samples of a square wave at about 2 Hz and -30 dBFS, computed as they are
// read: a Source that holds nothing itself.
type squareSource int

func (n squareSource) Open() (audio.Stream, error) { return &squareStream{n: int(n)}, nil }

type squareStream struct{ n, pos int }

func (s *squareStream) Read(dst []float32) (int, error) {
	k := min(len(dst), s.n-s.pos)
	for i := range dst[:k] {
		dst[i] = 0.03
		if (s.pos+i)/4096%2 == 1 {
			dst[i] = -0.03
		}
	}
	s.pos += k
	if s.pos == s.n {
		return k, io.EOF
	}
	return k, nil
}

// TestFeaturesMemoryBounded: a two-hour transcription holds a bounded amount of memory. The live
// heap (after a collection), sampled every 50 ms over the first pass over its audio and its first
// windows, stays within 32 MiB of what it was after a short transcription. The features hold the
// ring of two windows of log-mel (1.9 MB for 80 bins), a second of samples, a MelStream's buffers
// and the loud-hop bits (90 kB for two hours): 2.3 MiB measured over the first pass; a step in
// progress adds the encoder's working buffers (up to 13 MiB measured with tiny). Holding the
// recording's log-mel would take 230 MB, its samples 460 MB.
func TestFeaturesMemoryBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: a bound on memory, not on concurrency (the features' goroutine runs in TestFeaturesEqualLogMel and TestCancelStopsReading); minutes under -race")
	}
	e, err := NewWhisper(testModel(t, "tiny.en"), Config{MaxActive: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	p := DefaultParams()
	p.Language, p.NoTimestamps, p.TemperatureInc, p.MaxTokens = "en", true, 0, 4
	if _, err := e.TranscribeSource(context.Background(), squareSource(40*SampleRate), p, nil); err != nil {
		t.Fatal(err)
	}
	live := func() int64 {
		var ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	base := live()
	steps0 := e.Stats().Steps
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { _, err := e.TranscribeSource(ctx, squareSource(2*3600*SampleRate), p, nil); errc <- err }()
	var peak int64
	t0 := time.Now()
	for e.Stats().Steps < steps0+100 {
		peak = max(peak, live()-base)
		select {
		case err := <-errc:
			t.Fatalf("the transcription ended after %d steps: %v", e.Stats().Steps-steps0, err)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Since(t0) > 5*time.Minute {
			t.Fatalf("%d steps in 5 minutes", e.Stats().Steps-steps0)
		}
	}
	peak = max(peak, live()-base)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("the transcription, cancelled: %v", err)
	}
	t.Logf("live heap %.1f MiB after a short transcription, at most %+.1f MiB over %v of a two-hour one",
		float64(base)/(1<<20), float64(peak)/(1<<20), time.Since(t0).Round(time.Second))
	if peak > 32<<20 {
		t.Errorf("a two-hour transcription raised the live heap by %.1f MiB, more than 32 MiB", float64(peak)/(1<<20))
	}
}
