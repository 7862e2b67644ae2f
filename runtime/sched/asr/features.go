package asr

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/models/whisper"
)

// Whisper's features are computed by the transcription's own goroutine (its caller's, in
// submit) once the loop has admitted it, and read by the loop a window at a time.
//
// whisper.cpp clamps the log-mel at the maximum over the whole recording less 8 decades, so a
// window's values depend on all of the audio. To give the same values bit for bit without
// holding the spectrogram, the audio is read twice: the first pass (scan) computes every frame
// for the maximum, keeping the first featureRing frames (with the maximum known, they are
// clamped in place: a recording of up to 60 s is read once), the length, and which hops are
// loud (the silence gate); the second pass (fill) computes the frames again from featureRing on,
// clamping them, into a ring of featureRing frames that the window being decoded releases as
// seek moves on, waiting while the ring is full. The front end's work on a long recording
// doubles; what a transcription holds is the ring and the reader's buffers, whatever its length.
// The silence appended after the audio (LogMel's last 3000 frames and more) is not stored: its
// frames are all one value.

// featureRing is the frames of log-mel a transcription holds: two windows, the one at seek and
// the next, which begins at most a window later.
const featureRing = 2 * whisper.WindowFrames

// Sizes of the reads: samples per read of the audio (1 s), frames per MelStream read.
const (
	featureBlock  = SampleRate
	featureFrames = 500
)

// features is one transcription's log-mel as its windows read it.
type features struct {
	src     audio.Source
	m       *whisper.Model
	threads int
	nMel    int
	wake    func() // the loop's Wake

	mu      sync.Mutex
	scanned bool  // the first pass is over: what follows up to top is set, and read-only
	err     error // why the features cannot be had
	n       int   // samples of the audio
	nc      int   // frames that overlap the audio (computed); from it to nFrames, silence
	nFrames int   // LogMel's frames: nc, then silence up to 30 s after the audio
	top     float32
	pad     float32  // a silence frame's value, clamped
	loud    []uint64 // bit h: hop h holds a sample at silenceLevel or above
	ring    []float32
	lo, hi  int           // frames [lo, hi) are in the ring, frame f at ring[(f%featureRing)*nMel:], clamped
	space   chan struct{} // signalled when lo moves on
}

func (e *Whisper) newFeatures(src audio.Source) *features {
	return &features{src: src, m: e.m, threads: e.cfg.MelThreads, nMel: e.m.Mels, wake: e.q.loop.Wake,
		space: make(chan struct{}, 1)}
}

// run computes the features once the transcription is admitted (begin is closed), until they
// are complete, the transcription has ended (done) or ctx is done. It checks ctx and done
// between reads of a second of audio.
func (f *features) run(ctx context.Context, begin, done <-chan struct{}) {
	select {
	case <-begin:
	case <-done:
		return
	case <-ctx.Done():
		return
	}
	stop := func() bool {
		select {
		case <-done:
			return true
		case <-ctx.Done():
			return true
		default:
			return false
		}
	}
	f.mu.Lock()
	scanned := f.scanned
	f.mu.Unlock()
	if !scanned {
		f.scan(stop)
	}
	f.mu.Lock()
	more := f.err == nil && f.hi < f.nc
	f.mu.Unlock()
	if more {
		f.fill(ctx, done, stop)
	}
}

// scan is the first pass (see above). stop reports when to give up.
func (f *features) scan(stop func() bool) {
	err := f.scanAudio(stop)
	f.mu.Lock()
	f.scanned = true
	if err != nil && f.err == nil {
		f.err = err
	}
	f.mu.Unlock()
	f.wake()
}

func (f *features) scanAudio(stop func() bool) error {
	s, err := f.src.Open()
	if err != nil {
		return err
	}
	ms, err := whisper.NewMelStream(f.m, f.threads)
	if err != nil {
		return err
	}
	nMel := f.nMel
	f.ring = make([]float32, featureRing*nMel)
	blk := make([]float32, featureBlock)
	spare := make([]float32, featureFrames*nMel) // frames past the ring, for the maximum only
	var loud loudHops
	for {
		if stop() {
			return errStopped
		}
		n, rerr := s.Read(blk)
		if err := checkFinite(blk[:n], ms.Samples()); err != nil {
			return err
		}
		loud.add(blk[:n])
		ms.Write(blk[:n])
		if errors.Is(rerr, io.EOF) {
			ms.End()
		} else if rerr != nil {
			return rerr
		}
		for {
			dst := spare
			if next := ms.Next(); next < featureRing {
				dst = f.ring[next*nMel : min(featureRing, next+featureFrames)*nMel]
			}
			if ms.Read(dst) == 0 {
				break
			}
		}
		if rerr != nil {
			break
		}
	}
	top := ms.Max()
	kept := min(ms.Frames(), featureRing)
	audio.ClampMel(f.ring[:kept*nMel], top)
	pad := []float32{audio.MelFloor}
	audio.ClampMel(pad, top)
	// The loop reads what the first pass found once it is over (scanDone), under mu.
	f.mu.Lock()
	f.n, f.nc, f.nFrames, f.top = ms.Samples(), ms.Frames(), audio.MelFrames(ms.Samples()), top
	f.loud, f.pad, f.hi = loud.bits, pad[0], kept
	f.mu.Unlock()
	return nil
}

// errStopped ends features whose transcription ended or whose caller left; the transcription
// reports its own end.
var errStopped = errors.New("asr: features no longer wanted")

// fill is the second pass (see above).
func (f *features) fill(ctx context.Context, done <-chan struct{}, stop func() bool) {
	err := f.fillAudio(ctx, done, stop)
	if err == nil {
		return
	}
	f.mu.Lock()
	if f.err == nil {
		f.err = err
	}
	f.mu.Unlock()
	f.wake()
}

func (f *features) fillAudio(ctx context.Context, done <-chan struct{}, stop func() bool) error {
	s, err := f.src.Open()
	if err != nil {
		return err
	}
	ms, err := whisper.NewMelStream(f.m, f.threads)
	if err != nil {
		return err
	}
	nMel := f.nMel
	blk := make([]float32, featureBlock)
	eof := false
	for {
		f.mu.Lock()
		lo, hi := f.lo, f.hi
		f.mu.Unlock()
		if hi >= f.nc {
			return nil
		}
		if hi-lo >= featureRing { // full: wait for the loop to move seek on
			select {
			case <-f.space:
				continue
			case <-done:
				return errStopped
			case <-ctx.Done():
				return errStopped
			}
		}
		if stop() {
			return errStopped
		}
		ms.Skip(max(lo, hi))
		next := ms.Next()
		if next > hi { // frames no window will read again
			f.publish(next)
			continue
		}
		slot := next % featureRing
		k := min(featureRing-slot, lo+featureRing-next, f.nc-next)
		if k = ms.Read(f.ring[slot*nMel : (slot+k)*nMel]); k > 0 {
			audio.ClampMel(f.ring[slot*nMel:(slot+k)*nMel], f.top)
			f.publish(next + k)
			continue
		}
		if eof {
			return fmt.Errorf("asr: the audio ended after %d samples when read again, %d the first time", ms.Samples(), f.n)
		}
		n, rerr := s.Read(blk)
		ms.Write(blk[:n])
		if errors.Is(rerr, io.EOF) {
			ms.End()
			eof = true
		} else if rerr != nil {
			return rerr
		}
	}
}

// publish makes frames up to hi readable and wakes the loop.
func (f *features) publish(hi int) {
	f.mu.Lock()
	f.hi = min(hi, f.nc)
	f.mu.Unlock()
	f.wake()
}

// scanDone reports whether the first pass is over, and what it found: the number of samples,
// the loud hops, or why there are no features.
func (f *features) scanDone() (ok bool, n int, loud []uint64, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return true, 0, nil, f.err
	}
	if !f.scanned {
		return false, 0, nil, nil
	}
	return true, f.n, f.loud, nil
}

// ready reports whether the window at seek can be read (window), or why it cannot be had,
// releasing the frames before seek.
func (f *features) ready(seek int) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return false, f.err
	}
	if seek > f.lo {
		f.lo = seek
		select {
		case f.space <- struct{}{}:
		default:
		}
	}
	return f.scanned && f.hi >= min(seek+whisper.WindowFrames, f.nc), nil
}

// window writes the window of log-mel at seek into dst ([nMel, WindowFrames]): the frames that
// ready(seek) found, then silence, then zeros past LogMel's frames (as audio.MelWindow).
func (f *features) window(dst []float32, seek int) {
	const w = whisper.WindowFrames
	dst = dst[:f.nMel*w]
	for k := range w {
		switch i := seek + k; {
		case i < f.nc:
			src := f.ring[(i%featureRing)*f.nMel:][:f.nMel]
			for j, v := range src {
				dst[j*w+k] = v
			}
		case i < f.nFrames:
			for j := range f.nMel {
				dst[j*w+k] = f.pad
			}
		default:
			for j := range f.nMel {
				dst[j*w+k] = 0
			}
		}
	}
}

// checkFinite refuses a NaN or infinite sample (as checkAudio) among samples, the first of
// which is sample at of the audio.
func checkFinite(samples []float32, at int) error {
	for i, v := range samples {
		if v-v != 0 { // NaN or ±Inf
			return fmt.Errorf("asr: %w: sample %d is %v", ErrBadRequest, at+i, v)
		}
	}
	return nil
}

// loudHops marks, as samples arrive, the hops (10 ms, a mel frame's step) that hold a sample at
// silenceLevel or above (in magnitude): bit h of bits for hop h.
type loudHops struct {
	bits []uint64
	n    int // samples seen
}

func (l *loudHops) add(s []float32) {
	for len(s) > 0 {
		h := l.n / audio.HopLength
		take := min(len(s), audio.HopLength-l.n%audio.HopLength)
		for _, v := range s[:take] {
			if v >= silenceLevel || v <= -silenceLevel {
				for len(l.bits) <= h/64 {
					l.bits = append(l.bits, 0)
				}
				l.bits[h/64] |= 1 << (h % 64)
				break
			}
		}
		l.n += take
		s = s[take:]
	}
}

// anyLoud reports whether a hop in [a, b) is loud.
func anyLoud(bits []uint64, a, b int) bool {
	for h := a; h < b; {
		w := h / 64
		if w >= len(bits) {
			return false
		}
		word := bits[w] >> (h % 64)
		if n := min(64-h%64, b-h); n < 64 {
			word &= 1<<n - 1
		}
		if word != 0 {
			return true
		}
		h += 64 - h%64
	}
	return false
}
