package parakeet

import (
	"errors"
	"fmt"

	"github.com/parleyhq/parley/runtime/backend"
)

// BeamLoop is the beam search of runtime/decode's TDTBeamSearch over up to Streams clips kept
// on a backend that can search on the device (backend.BeamTransducer). Each stream has Width
// hypothesis rows, each with its own prediction-network state. A round runs, for every row of
// every stream at once, the prediction network on the token the row's hypothesis emitted last
// (its new state kept only for the rows that emitted one), the joint at the hypothesis's frame,
// then the search's round (scores, each expanded hypothesis's best pairs, merging, selection)
// and the copy of the kept hypotheses' states into their new rows, with nothing read back.
// Rows whose hypotheses wait at later frames are computed and not read: the search costs Width
// joint rows per stream a round, for results equal to the host search's. Read reports which
// streams are done once for many rounds; Result reads a done stream's best hypothesis. Rounds,
// Read and Result allocate nothing in steady state. A BeamLoop is not safe for concurrent use.
type BeamLoop struct {
	m                 *Model
	be                backend.Backend
	d                 backend.BeamDecoding
	streams, width, k int
	rounds            int // rounds since the last Read

	loopRows                  // each hypothesis row's state, a round's scratch (hNew, cNew: then the gathered states)
	enc      []backend.Tensor // each stream's encoder projection (dummy when none)
	zero     []float32        // [P]
	rec      backend.Recording
	rep      backend.BeamReport
	res      backend.BeamResult
	roundOps func() error
}

// ErrNoBeamLoop is NewBeamLoop's answer on a backend that searches on the host only.
var ErrNoBeamLoop = fmt.Errorf("parakeet: the backend has no device beam search: %w", backend.ErrUnsupported)

// BeamLoopConfig sizes a BeamLoop.
type BeamLoopConfig struct {
	Streams   int  // clips searched at once
	Width     int  // the widest beam a stream may start, 1 to backend.MaxBeamWidth
	LogSumExp bool // merge hypotheses in the same state by log-sum-exp (decode.MergeLogSumExp), else keep the better (decode.MergeMax)
	MaxFrames int  // the longest clip: the tokens kept per stream are sized for it
	K         int  // rounds between two Reads at most
}

// NewBeamLoop makes a beam loop. It fails with ErrNoBeamLoop where the backend is not a
// backend.BeamTransducer.
func (m *Model) NewBeamLoop(cfg BeamLoopConfig) (*BeamLoop, error) {
	bt, ok := m.be.(backend.BeamTransducer)
	if !ok {
		return nil, ErrNoBeamLoop
	}
	h := m.HParams
	if cfg.Streams < 1 || cfg.Width < 1 || cfg.Width > backend.MaxBeamWidth || cfg.Streams*cfg.Width > 65535 || cfg.MaxFrames < 1 ||
		cfg.MaxFrames > 1<<20 || cfg.K < 1 || cfg.K > 1<<16 {
		return nil, fmt.Errorf("parakeet: beam loop of %d streams of width %d, clips of %d frames, read every %d rounds",
			cfg.Streams, cfg.Width, cfg.MaxFrames, cfg.K)
	}
	// A round keeps at most Width new tokens, and a frame takes at most MaxSymbols rounds.
	nodes := int64(cfg.Width) * int64(cfg.MaxFrames) * int64(max(h.NMaxTokens, 1))
	if nodes > 1<<26 {
		nodes = 1 << 26
	}
	d, err := bt.NewBeamDecoding(backend.BeamDecodingConfig{Streams: cfg.Streams, Width: cfg.Width, Blank: int32(h.NVocab),
		Durations: m.Durations, MaxSymbols: h.NMaxTokens, LogSumExp: cfg.LogSumExp, Nodes: int(nodes)})
	if err != nil {
		return nil, fmt.Errorf("parakeet: beam loop: %w", err)
	}
	rows := cfg.Streams * cfg.Width
	l := &BeamLoop{m: m, be: m.be, d: d, streams: cfg.Streams, width: cfg.Width, k: cfg.K, zero: make([]float32, h.NPredDim)}
	err = l.alloc(m, rows)
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("parakeet: beam loop: %w", err)
	}
	l.enc = make([]backend.Tensor, cfg.Streams)
	for i := range l.enc {
		l.enc[i] = l.dummy
	}
	l.roundOps = l.ops
	return l, nil
}

// Streams is the number of streams; Width the hypotheses of each.
func (l *BeamLoop) Streams() int { return l.streams }

// Width is the widest beam a stream may start.
func (l *BeamLoop) Width() int { return l.width }

// Close releases the loop's tensors and state.
func (l *BeamLoop) Close() error {
	var errs []error
	if l.d != nil {
		errs = append(errs, l.d.Close())
		l.d = nil
	}
	errs = append(errs, l.close())
	return errors.Join(errs...)
}

// Start makes stream s search a clip of frames frames whose joint encoder projections are proj
// (ProjectEncoder's rows, at least frames of them) with a beam of width hypotheses (1 to the
// loop's Width), from the prediction network's initial state. proj must stay unchanged until
// the stream is done or stopped.
func (l *BeamLoop) Start(s int, proj backend.Tensor, frames, width int) error {
	if s < 0 || s >= l.streams || proj == nil || frames < 0 || proj.Rows() < frames || width < 1 || width > l.width {
		return fmt.Errorf("parakeet: beam loop: stream %d of %d, %d frames, width %d of %d", s, l.streams, frames, width, l.width)
	}
	// The first hypothesis's state; the other rows take theirs from it before they are read.
	for i := range l.h {
		if err := l.be.Write(l.h[i], s*l.width, l.zero); err != nil {
			return fmt.Errorf("parakeet: beam loop: %w", err)
		}
		if err := l.be.Write(l.c[i], s*l.width, l.zero); err != nil {
			return fmt.Errorf("parakeet: beam loop: %w", err)
		}
	}
	l.enc[s] = proj
	if s < len(l.rep.Done) {
		l.rep.Done[s], l.rep.Failed[s], l.rep.Full[s] = false, false, false // until a Read sees it
	}
	if frames == 0 {
		l.enc[s] = l.dummy
	}
	if err := l.d.Start(s, frames, width); err != nil {
		return fmt.Errorf("parakeet: beam loop: %w", err)
	}
	return nil
}

// Stop ends stream s's search.
func (l *BeamLoop) Stop(s int) error {
	if s < 0 || s >= l.streams {
		return fmt.Errorf("parakeet: beam loop: stream %d of %d", s, l.streams)
	}
	l.enc[s] = l.dummy
	if err := l.d.Stop(s); err != nil {
		return fmt.Errorf("parakeet: beam loop: %w", err)
	}
	return nil
}

// Round issues one round of every stream not done, without waiting. At most K rounds may come
// between two Reads.
func (l *BeamLoop) Round() error {
	if l.rounds >= l.k {
		return fmt.Errorf("parakeet: beam loop: %d rounds without a read", l.rounds)
	}
	if err := l.rec.Run(l.be, l.roundOps); err != nil {
		return fmt.Errorf("parakeet: beam loop: %w", err)
	}
	l.rounds++
	return nil
}

func (l *BeamLoop) ops() error {
	d := l.d
	if err := l.logits(l.m, d, l.enc); err != nil {
		return err
	}
	if err := d.Round(l.lg); err != nil {
		return err
	}
	// State gather: each new hypothesis row takes its parent's state, through the scratch rows.
	for i := range l.h {
		if err := l.gather(l.h[i], l.hNew[i]); err != nil {
			return err
		}
		if err := l.gather(l.c[i], l.cNew[i]); err != nil {
			return err
		}
	}
	return l.gather(l.pred, l.pNew)
}

// gather moves the rows of t to their new hypotheses, through scratch.
func (l *BeamLoop) gather(t, scratch backend.Tensor) error {
	if err := l.d.Gather(scratch, t); err != nil {
		return err
	}
	return l.be.Copy(t, scratch)
}

// Read waits for the rounds issued and writes into done[s] whether stream s has finished. It
// fails, after filling done, when a stream's joint row held a NaN or +Inf or had no finite
// maximum (a *NonFiniteError names the first), or emitted more tokens than the loop keeps.
func (l *BeamLoop) Read(done []bool) error {
	if len(done) != l.streams {
		return fmt.Errorf("parakeet: beam loop: read into %d streams of %d", len(done), l.streams)
	}
	if err := l.d.Read(&l.rep); err != nil {
		return fmt.Errorf("parakeet: beam loop: %w", err)
	}
	l.rounds = 0
	var failed error
	for s := range l.streams {
		done[s] = l.rep.Done[s]
		switch {
		case failed != nil:
		case l.rep.Failed[s]:
			failed = &NonFiniteError{Row: s}
		case l.rep.Full[s]:
			failed = fmt.Errorf("%w: stream %d", ErrBeamFull, s)
		}
	}
	return failed
}

// ErrBeamFull is the failure of a stream that emitted more tokens than the loop keeps.
var ErrBeamFull = errors.New("parakeet: beam loop: a stream emitted more tokens than its clip length allows")

// Failed reports how stream s failed at the last Read: a *NonFiniteError where a joint row held
// a NaN or +Inf or had no finite maximum, ErrBeamFull where it emitted more tokens than the
// loop keeps; nil where it did not fail (or has not been read since its start).
func (l *BeamLoop) Failed(s int) error {
	switch {
	case s < 0 || s >= len(l.rep.Done):
		return nil
	case l.rep.Failed[s]:
		return &NonFiniteError{Row: s}
	case l.rep.Full[s]:
		return fmt.Errorf("%w: stream %d", ErrBeamFull, s)
	}
	return nil
}

// Rounds reports the rounds stream s has made since its start, at the last Read.
func (l *BeamLoop) Rounds(s int) int {
	if s < 0 || s >= len(l.rep.Rounds) {
		return 0
	}
	return int(l.rep.Rounds[s])
}

// Result appends to dst the tokens of the best hypothesis of stream s, done at the last Read,
// and returns it with the hypothesis's score.
func (l *BeamLoop) Result(s int, dst []Token) ([]Token, float64, error) {
	if s < 0 || s >= l.streams || s >= len(l.rep.Done) || !l.rep.Done[s] {
		return dst, 0, fmt.Errorf("parakeet: beam loop: stream %d is not done", s)
	}
	if l.rep.Failed[s] || l.rep.Full[s] {
		return dst, 0, fmt.Errorf("parakeet: beam loop: stream %d failed", s)
	}
	if err := l.d.Result(s, &l.res); err != nil {
		return dst, 0, fmt.Errorf("parakeet: beam loop: %w", err)
	}
	r := &l.res
	for i := range r.Token {
		t := Token{ID: r.Token[i], Frame: int(r.Frame[i]), DurIdx: int(r.DurIdx[i]), P: r.P[i], PLog: r.PLog[i]}
		if len(l.m.Durations) > 0 {
			if t.DurIdx < 0 || t.DurIdx >= len(l.m.Durations) {
				return dst, 0, fmt.Errorf("parakeet: beam loop: stream %d: duration index %d", s, t.DurIdx)
			}
			t.Dur = l.m.Durations[t.DurIdx]
		}
		dst = append(dst, t)
	}
	return dst, r.Score, nil
}
