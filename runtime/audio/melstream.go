package audio

import (
	"math"
	"runtime"
	"sync"
)

// MelStream computes LogMel's frames from samples that arrive in pieces, holding only the
// samples the frames still to come read (a frame's 400, 2.5 hops before and after its hop). It
// yields the frames before LogMel's last step: ClampMel needs the maximum over the whole
// spectrogram, which Max gives once the stream has ended, so a reader that wants LogMel's values
// bit for bit without holding the spectrogram reads the recording twice (once for Max, once for
// the frames), or holds the frames of a recording short enough to keep. Frames are LogMel's:
// computed by the same code, equal bit for bit, whatever the pieces and the threads.
//
// Write adds samples, End ends the recording, Read computes the frames the samples written so far
// complete. A MelStream is not safe for concurrent use.
type MelStream struct {
	sf      *sparseFilters
	sh      *melShared
	scratch []*melScratch // one per worker
	maxes   []float32
	buf     []float32 // samples [off, off+len(buf)) of the audio
	off     int
	n       int // samples written
	ended   bool
	next    int // the next frame Read computes
	top     float32
}

// NewMelStream starts a stream with filter bank f, computing frames with up to threads goroutines
// (GOMAXPROCS when threads ≤ 0).
func NewMelStream(f MelFilters, threads int) (*MelStream, error) {
	sf, err := f.sparse()
	if err != nil {
		return nil, err
	}
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	m := &MelStream{sf: sf, sh: melConsts(), maxes: make([]float32, threads), top: float32(math.Inf(-1))}
	m.scratch = make([]*melScratch, threads)
	for i := range m.scratch {
		m.scratch[i] = newMelScratch()
	}
	return m, nil
}

// NMel is the number of mel bins of a frame.
func (m *MelStream) NMel() int { return m.sf.nMel }

// Write adds samples (16 kHz mono) to the recording. After End it does nothing.
func (m *MelStream) Write(samples []float32) {
	if m.ended {
		return
	}
	m.buf = append(m.buf, samples...)
	m.n += len(samples)
}

// End ends the recording: the frames its last samples complete become readable.
func (m *MelStream) End() {
	if !m.ended {
		m.ended = true
		m.top = max(m.top, logFloorValue) // LogMel appends silence frames, of MelFloor
	}
}

// Samples is the number of samples written.
func (m *MelStream) Samples() int { return m.n }

// Frames is the number of frames Read yields in all once the stream has ended (those that
// overlap the audio); LogMel's frames from it to MelFrames(Samples()) are silence, MelFloor in
// every bin.
func (m *MelStream) Frames() int {
	return min((m.n+padReflect)/HopLength+1, MelFrames(m.n))
}

// Next is the index of the next frame Read computes.
func (m *MelStream) Next() int { return m.next }

// Max is the maximum of the frames computed so far, and once the stream has ended of the
// silence frames too: after End and every frame read, the top ClampMel takes to give LogMel's
// values. Frames skipped are not counted.
func (m *MelStream) Max() float32 { return m.top }

// ready is the number of frames from next on that the samples written complete.
func (m *MelStream) ready() int {
	if m.ended {
		return max(0, m.Frames()-m.next)
	}
	// Frame i reads up to sample i·160 + 199, and frame 0 sample 200 (reflected).
	if m.n <= padReflect {
		return 0
	}
	return max(0, (m.n-padReflect)/HopLength+1-m.next)
}

// Skip moves past the frames before frame to without computing them (nor counting them in Max)
// and returns Next.
func (m *MelStream) Skip(to int) int {
	if to > m.next {
		m.next = to
		m.drop()
	}
	return m.next
}

// Read computes the frames the samples written so far complete, from Next on, as many as dst
// holds ([k, NMel], frame-major: frame f's bin j at dst[f·NMel+j]), and returns how many it
// computed.
func (m *MelStream) Read(dst []float32) int {
	nMel := m.sf.nMel
	k := min(len(dst)/nMel, m.ready())
	if k == 0 {
		return 0
	}
	workers := max(1, min(len(m.scratch), k/minChunk))
	per := (k + workers - 1) / workers
	run := func(w int) {
		i0, i1 := w*per, min(k, (w+1)*per)
		top := float32(math.Inf(-1))
		for i := i0; i < i1; i++ {
			top = max(top, m.scratch[w].frame(dst[i*nMel:], 1, m.buf, m.off, m.n, m.next+i, m.sf, m.sh))
		}
		m.maxes[w] = top
	}
	if workers == 1 {
		run(0)
	} else {
		var wg sync.WaitGroup
		for w := 1; w < workers; w++ {
			wg.Add(1)
			go func() { defer wg.Done(); run(w) }()
		}
		run(0)
		wg.Wait()
	}
	for _, t := range m.maxes[:workers] {
		m.top = max(m.top, t)
	}
	m.next += k
	m.drop()
	return k
}

// drop forgets the samples no frame from next on reads, moving what is left to the front of buf
// once it is at most half of it.
func (m *MelStream) drop() {
	keep := max(0, m.next*HopLength-padReflect)
	if m.next < 2 {
		keep = 0 // the first frames reflect samples 1..200
	}
	d := min(keep-m.off, len(m.buf))
	if d <= 0 || d < len(m.buf)/2 {
		return
	}
	n := copy(m.buf, m.buf[d:])
	m.buf = m.buf[:n]
	m.off += d
}
