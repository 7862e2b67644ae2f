package parakeet

import (
	"errors"
	"fmt"

	"github.com/parleyhq/parley/runtime/backend"
)

// GreedyLoop is greedy TDT (or RNN-T) decoding of up to Rows clips kept on a backend that can
// decide on the device (backend.GreedyTransducer): a Step runs, for every row at once, the
// prediction network on the token the row emitted last (keeping the new state only for the
// rows that emitted one), the joint at each row's frame and the greedy rule (decode.TDT's),
// with nothing read back. Read collects the emitted tokens once for many steps. Rows are
// independent: each has its own prediction-network state, clip and frame. A row can also go on
// from where a clip before it left off (Continue, Save: a live stream's chunks), the state moving
// to and from a Decoder's slot. Step and Read allocate nothing. A GreedyLoop is not safe for
// concurrent use.
type GreedyLoop struct {
	m          *Model
	be         backend.Backend
	g          backend.GreedyDecoding
	rows, ring int
	steps      int // steps since the last Read

	loopRows                   // each row's state and a step's scratch
	enc       []backend.Tensor // each row's encoder projection (dummy when none)
	zero      []float32        // [P]
	rec       backend.Recording
	rep       backend.GreedyReport
	read      []int32 // tokens of each row collected by Read
	origin    []int   // [row] the frame of the row's count at its projection's row 0 (Continue)
	fresh     []bool  // [row] continued from the initial state, no step since
	stateSize int
	stepOps   func() error
}

// ErrNoGreedyLoop is NewGreedyLoop's answer on a backend that decides on the host only.
var ErrNoGreedyLoop = fmt.Errorf("parakeet: the backend has no device greedy decoding: %w", backend.ErrUnsupported)

// NewGreedyLoop makes a greedy loop of rows rows whose Read comes at most every ring steps.
// It fails with ErrNoGreedyLoop where the backend is not a backend.GreedyTransducer.
func (m *Model) NewGreedyLoop(rows, ring int) (*GreedyLoop, error) {
	gt, ok := m.be.(backend.GreedyTransducer)
	if !ok {
		return nil, ErrNoGreedyLoop
	}
	h := m.HParams
	if rows < 1 || rows > 65535 || ring < 1 || ring > 1<<16 {
		return nil, fmt.Errorf("parakeet: greedy loop of %d rows read every %d steps", rows, ring)
	}
	g, err := gt.NewGreedyDecoding(backend.GreedyDecodingConfig{Rows: rows, Blank: int32(h.NVocab), Durations: m.Durations,
		MaxSymbols: h.NMaxTokens, Ring: ring})
	if err != nil {
		return nil, fmt.Errorf("parakeet: greedy loop: %w", err)
	}
	l := &GreedyLoop{m: m, be: m.be, g: g, rows: rows, ring: ring, read: make([]int32, rows), zero: make([]float32, h.NPredDim),
		origin: make([]int, rows), fresh: make([]bool, rows), stateSize: (2*h.NPredLayers + 1) * h.NPredDim}
	err = l.alloc(m, rows)
	if err != nil {
		l.Close()
		return nil, fmt.Errorf("parakeet: greedy loop: %w", err)
	}
	l.enc = make([]backend.Tensor, rows)
	for i := range l.enc {
		l.enc[i] = l.dummy
	}
	l.stepOps = l.ops
	return l, nil
}

// Rows is the number of rows.
func (l *GreedyLoop) Rows() int { return l.rows }

// Close releases the loop's tensors and state.
func (l *GreedyLoop) Close() error {
	var errs []error
	if l.g != nil {
		errs = append(errs, l.g.Close())
		l.g = nil
	}
	errs = append(errs, l.close())
	return errors.Join(errs...)
}

// Start makes row decode a clip of frames frames whose joint encoder projections are proj
// (ProjectEncoder's rows, at least frames of them), from the prediction network's initial
// state. proj must stay unchanged until the row is done or stopped.
func (l *GreedyLoop) Start(row int, proj backend.Tensor, frames int) error {
	if row < 0 || row >= l.rows || proj == nil || frames < 0 || proj.Rows() < frames {
		return fmt.Errorf("parakeet: greedy loop: row %d of %d, %d frames", row, l.rows, frames)
	}
	for i := range l.h {
		if err := l.be.Write(l.h[i], row, l.zero); err != nil {
			return fmt.Errorf("parakeet: greedy loop: %w", err)
		}
		if err := l.be.Write(l.c[i], row, l.zero); err != nil {
			return fmt.Errorf("parakeet: greedy loop: %w", err)
		}
	}
	l.enc[row], l.read[row], l.origin[row], l.fresh[row] = proj, 0, 0, false
	if frames == 0 {
		l.enc[row] = l.dummy
	}
	if err := l.g.Start(row, frames); err != nil {
		return fmt.Errorf("parakeet: greedy loop: %w", err)
	}
	return nil
}

// GreedyCarry is where a row's decoding stands between two clips of one stream (the chunks of
// a live stream): what Save reports and Continue goes on from, the state the host loop keeps
// between chunks (a decoder slot, decode.TDTState, the last token). A row ends a clip where its
// frame moves on, which counts no zero-duration token at the frame it reaches, so none is
// carried.
type GreedyCarry struct {
	Frame   int   // the frame of the next decision, in the stream's count (at or past the clip's end)
	Token   int32 // the last token decided (the blank when none)
	Pending bool  // the prediction network has yet to take Token
	// Started: State holds the prediction network's state. Without it the row goes on from the
	// initial state, where the prediction network is to take the blank (Token the blank,
	// Pending).
	Started bool
	// State is the prediction network's state in Decoder.SaveState's layout (StateSize values):
	// each LSTM layer's h and c, then the joint's prediction input. A stream moves between the
	// loop and a Decoder's slot with it.
	State []float32
}

// StateSize is the length of GreedyCarry.State, Decoder.StateSize.
func (l *GreedyLoop) StateSize() int { return l.stateSize }

// Continue makes row go on from c with a clip whose joint encoder projections are proj, whose
// row 0 is frame first of the stream's count: the row decodes the frames from c.Frame (at least
// first) to end, which proj must hold (end-first rows at least), and reports its tokens' frames
// in the stream's count. A c.Frame at or past end decodes nothing; the prediction network
// still takes a pending token at the next step. proj must stay unchanged until the row is
// done or stopped.
func (l *GreedyLoop) Continue(row int, proj backend.Tensor, first, end int, c *GreedyCarry) error {
	if c == nil {
		return fmt.Errorf("parakeet: greedy loop: row %d continued from nothing", row)
	}
	if row < 0 || row >= l.rows || proj == nil || first < 0 || end < first || proj.Rows() < end-first ||
		c.Frame < first || c.Frame-first > 1<<30 || (c.Started && len(c.State) != l.stateSize) {
		return fmt.Errorf("parakeet: greedy loop: row %d of %d continued at frame %d of [%d, %d), a state of %d values (want %d)",
			row, l.rows, c.Frame, first, end, len(c.State), l.stateSize)
	}
	blank := int32(l.m.HParams.NVocab)
	tok, pending := c.Token, c.Pending
	if !c.Started {
		tok, pending = blank, true
	}
	if tok < 0 || tok > blank {
		return fmt.Errorf("parakeet: greedy loop: row %d continued after token %d (0..%d)", row, tok, blank)
	}
	P := l.m.HParams.NPredDim
	state := func(k int) []float32 {
		if !c.Started {
			return l.zero
		}
		return c.State[k*P : (k+1)*P]
	}
	for i := range l.h {
		if err := l.be.Write(l.h[i], row, state(2*i)); err != nil {
			return fmt.Errorf("parakeet: greedy loop: %w", err)
		}
		if err := l.be.Write(l.c[i], row, state(2*i+1)); err != nil {
			return fmt.Errorf("parakeet: greedy loop: %w", err)
		}
	}
	if err := l.be.Write(l.pred, row, state(2*len(l.h))); err != nil {
		return fmt.Errorf("parakeet: greedy loop: %w", err)
	}
	l.enc[row], l.read[row], l.origin[row], l.fresh[row] = proj, 0, first, !c.Started
	if end == first {
		l.enc[row] = l.dummy
	}
	if err := l.g.Resume(row, c.Frame-first, end-first, tok, pending); err != nil {
		return fmt.Errorf("parakeet: greedy loop: %w", err)
	}
	return nil
}

// Save writes into c where row stands at the last Read, which must have found it done (at its
// clip's end, not failed) with no Step since: its frame, last token and the prediction
// network's state (c.State is reused when it has room, StateSize values).
func (l *GreedyLoop) Save(row int, c *GreedyCarry) error {
	switch {
	case row < 0 || row >= l.rows || c == nil:
		return fmt.Errorf("parakeet: greedy loop: save row %d of %d", row, l.rows)
	case l.steps > 0 || len(l.rep.Done) != l.rows:
		return fmt.Errorf("parakeet: greedy loop: save row %d: %d steps since the last read", row, l.steps)
	case !l.rep.Done[row] || l.rep.Failed[row]:
		return fmt.Errorf("parakeet: greedy loop: save row %d: not at its clip's end", row)
	}
	c.Frame = int(l.rep.At[row]) + l.origin[row]
	c.Token, c.Pending, c.Started = l.rep.Last[row], l.rep.Emit[row], !l.fresh[row]
	if !c.Started {
		c.Token, c.Pending = int32(l.m.HParams.NVocab), true
		return nil
	}
	if cap(c.State) < l.stateSize {
		c.State = make([]float32, l.stateSize)
	}
	c.State = c.State[:l.stateSize]
	P := l.m.HParams.NPredDim
	for i := range l.h {
		if err := l.be.Read(l.h[i], row, c.State[2*i*P:(2*i+1)*P]); err != nil {
			return fmt.Errorf("parakeet: greedy loop: %w", err)
		}
		if err := l.be.Read(l.c[i], row, c.State[(2*i+1)*P:(2*i+2)*P]); err != nil {
			return fmt.Errorf("parakeet: greedy loop: %w", err)
		}
	}
	if err := l.be.Read(l.pred, row, c.State[2*len(l.h)*P:]); err != nil {
		return fmt.Errorf("parakeet: greedy loop: %w", err)
	}
	return nil
}

// Stop ends row's decoding; its tokens not yet read are dropped.
func (l *GreedyLoop) Stop(row int) error {
	if row < 0 || row >= l.rows {
		return fmt.Errorf("parakeet: greedy loop: row %d of %d", row, l.rows)
	}
	l.enc[row] = l.dummy
	if err := l.g.Stop(row); err != nil {
		return fmt.Errorf("parakeet: greedy loop: %w", err)
	}
	return nil
}

// Step issues one decision of every row not done, without waiting: the prediction network on
// the rows' last emitted tokens, the joint at their frames, the greedy rule. At most ring
// steps may come between two Reads.
func (l *GreedyLoop) Step() error {
	if l.steps >= l.ring {
		return fmt.Errorf("parakeet: greedy loop: %d steps without a read", l.steps)
	}
	if err := l.rec.Run(l.be, l.stepOps); err != nil {
		return fmt.Errorf("parakeet: greedy loop: %w", err)
	}
	l.steps++
	clear(l.fresh)
	return nil
}

func (l *GreedyLoop) ops() error {
	g := l.g
	if err := l.logits(l.m, g, l.enc); err != nil {
		return err
	}
	return g.Decide(l.lg)
}

// Read waits for the steps issued, appends to toks[row] the tokens each row emitted since the
// last Read (toks has Rows entries; nil ones are skipped), and writes into done[row] whether the
// row has reached its clip's end. It fails, after collecting, when a row's logits were all NaN
// (errNonFinite names the first such row).
func (l *GreedyLoop) Read(toks [][]Token, done []bool) error {
	if len(toks) != l.rows || len(done) != l.rows {
		return fmt.Errorf("parakeet: greedy loop: read into %d and %d rows of %d", len(toks), len(done), l.rows)
	}
	if err := l.g.Read(&l.rep); err != nil {
		return fmt.Errorf("parakeet: greedy loop: %w", err)
	}
	l.steps = 0
	var failed error
	for i := range l.rows {
		done[i] = l.rep.Done[i]
		if l.rep.Failed[i] && failed == nil {
			failed = &NonFiniteError{Row: i}
		}
		for c := l.read[i]; c < l.rep.Count[i]; c++ {
			k := i*l.ring + int(c)%l.ring
			t := Token{ID: l.rep.Token[k], Frame: l.origin[i] + int(l.rep.Frame[k]), DurIdx: int(l.rep.DurIdx[k]), P: l.rep.P[k], PLog: l.rep.PLog[k]}
			if len(l.m.Durations) > 0 {
				t.Dur = l.m.Durations[t.DurIdx]
			}
			if toks[i] != nil {
				toks[i] = append(toks[i], t)
			}
		}
		l.read[i] = l.rep.Count[i]
	}
	return failed
}

// Failed reports whether row's joint logits were all NaN at the last Read.
func (l *GreedyLoop) Failed(row int) bool {
	return row >= 0 && row < len(l.rep.Failed) && l.rep.Failed[row]
}

// NonFiniteError is Read's error for a row whose joint logits were all NaN.
type NonFiniteError struct{ Row int }

func (e *NonFiniteError) Error() string {
	return fmt.Sprintf("parakeet: greedy loop: row %d: the joint's logits are all NaN", e.Row)
}
