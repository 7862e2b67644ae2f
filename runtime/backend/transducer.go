package backend

// GreedyTransducer is implemented by backends that can keep a transducer's greedy decoding on
// the device (the CUDA backend): each row's frame, its run of zero-duration tokens and the
// tokens it emits stay where the joint's logits are, so that a decoding step reads nothing
// back and can be recorded (Recorder). Other backends do not implement it; their callers decide
// on the host (runtime/decode's TDT rule, which this one follows exactly).
type GreedyTransducer interface {
	NewGreedyDecoding(cfg GreedyDecodingConfig) (GreedyDecoding, error)
}

// GreedyDecodingConfig is the rule and size of a GreedyDecoding.
type GreedyDecodingConfig struct {
	Rows       int   // decoding rows (streams), 1 to 65535
	Blank      int32 // the blank's id, the last token logit: a joint row starts with Blank+1 token logits
	Durations  []int // frames each duration logit advances (at most 16); empty for an RNN-T
	MaxSymbols int   // zero-duration tokens emitted at one frame before the frame is forced on
	Ring       int   // tokens kept per row between two Reads: at least the decisions made between them
}

// GreedyDecoding is the device state of the greedy decoding of Rows rows. Row i's operations
// use row i of their tensors, which have Rows rows. A row not started is done. Calls are issued
// in order with the backend's other operations; only Read waits.
type GreedyDecoding interface {
	// Start restarts row at frame 0 of a clip of frames frames: the prediction network's next
	// input is the blank (Emitted reports it), and no token is emitted yet.
	Start(row, frames int) error
	// Resume restarts row at frame frame (0 <= frame; done when frame >= frames) of a clip of
	// frames frames, going on from a decision made before it: tok (at most Blank) is the last
	// token decided, which the prediction network is to take when emit is set. No zero-duration
	// token is counted at frame, and no token emitted yet. Start(row, frames) is
	// Resume(row, 0, frames, Blank, true).
	Resume(row, frame, frames int, tok int32, emit bool) error
	// Stop makes row done.
	Stop(row int) error
	// Decide applies the greedy rule to each row of logits [Rows, Blank+1+len(Durations)] F32
	// whose row is not done, as runtime/decode's TDT.Step does: the first maxima of the token
	// and the duration logits, the frame moved on, an emitted token (its frame, duration index,
	// p and plog) kept for Read. A row whose frame reaches its clip's end is done; a row whose
	// token or duration logits are all NaN is done and failed.
	Decide(logits Tensor) error
	// Frames gathers each row's encoder row: dst[i] = enc[i][frame of row i] (the last frame once
	// the row is done). dst [Rows, P] F32, enc[i] F32 [*, P] with a row for each frame of row i's
	// clip.
	Frames(dst Tensor, enc []Tensor) error
	// Tokens gathers the embedding of each row's last decision: dst[i] = table[token of row i]
	// (the blank when it emitted nothing). dst [Rows, P] F32, table [Blank+1, P] F32 or F16.
	Tokens(dst, table Tensor) error
	// Keep copies src[i] into dst[i] for each row i whose last decision emitted a token (or that
	// was just started): the prediction network's new state is kept only for them. dst, src
	// [Rows, *] F32.
	Keep(dst, src Tensor) error
	// Read waits for the work issued, then reports every row's state and the tokens emitted
	// since it started; the Ring last of them are held.
	Read(r *GreedyReport) error
	// Close releases the state.
	Close() error
}

// GreedyReport is what GreedyDecoding.Read reports, in slices it reuses.
type GreedyReport struct {
	Count  []int32 // [Rows] tokens row i emitted since it started
	Done   []bool  // [Rows] row i reached its end (or failed)
	Failed []bool  // [Rows] row i's logits were all NaN
	// Where each row stands: At[i] the frame of row i's next decision (its clip's end or past it
	// once done), Last[i] its last token decided (the blank when none), Emit[i] whether the
	// prediction network has yet to take Last[i] (a Resume's arguments going on from here).
	At, Last []int32
	Emit     []bool
	// Row i's token number c (counting from 0 at its start) is at i*Ring + c%Ring.
	Token, Frame, DurIdx []int32
	P, PLog              []float32
}

// BeamTransducer is implemented by backends that can keep a transducer's beam search on the
// device (the CUDA backend): every hypothesis's frame, score and emitted tokens stay where the
// joint's logits are, the round (scores, top-k, merging, selection) runs there for all streams
// at once, and the hypotheses' prediction states are copied there, so that a round reads
// nothing back and can be recorded (Recorder). It follows runtime/decode's TDTBeamSearch, round
// for round, from the start of a clip to its end.
type BeamTransducer interface {
	NewBeamDecoding(cfg BeamDecodingConfig) (BeamDecoding, error)
}

// BeamDecodingConfig is the search and size of a BeamDecoding.
type BeamDecodingConfig struct {
	Streams    int   // streams searched at once; Streams·Width is at most 65535
	Width      int   // hypothesis rows per stream, 1 to MaxBeamWidth: the widest beam a stream may start
	Blank      int32 // the blank's id, the last token logit
	Durations  []int // frames each duration logit advances (at most 16); empty for an RNN-T
	MaxSymbols int   // zero-duration tokens emitted at one frame before the frame is forced on
	LogSumExp  bool  // merge hypotheses in the same state by log-sum-exp (else keep the better)
	Nodes      int   // emitted tokens kept per stream, over all its hypotheses, from its start to its end
}

// MaxBeamWidth is the widest device beam.
const MaxBeamWidth = 8

// BeamDecoding is the device state of the beam searches of Streams streams of Width
// hypotheses. Hypothesis j of stream s is row s·Width+j of the tensors its operations take,
// which have Streams·Width rows; the rows of a stream are its beam, best first. A stream not
// started is done. Calls are issued in order with the backend's other operations; only Read and
// Result wait.
type BeamDecoding interface {
	// Start restarts stream s at frame 0 of a clip of frames frames with a beam of width
	// hypotheses (1 to Width; the stream's other rows are unused): one hypothesis, no tokens,
	// whose prediction network is to take the blank (Tokens, Keep).
	Start(s, frames, width int) error
	// Stop makes stream s done.
	Stop(s int) error
	// Tokens gathers the embedding of each row's next prediction input: dst[r] = table[token].
	// dst [Streams·Width, P] F32, table [Blank+1, P] F32 or F16.
	Tokens(dst, table Tensor) error
	// Keep copies src[r] into dst[r] for each row whose hypothesis emitted a token in the last
	// round (or was just started): the prediction network's new state is kept only for them.
	Keep(dst, src Tensor) error
	// Frames gathers each row's encoder row: dst[r] = enc[s][frame of r's hypothesis] (clamped
	// to the clip), enc[s] F32 [*, P] with a row for each frame of stream s's clip.
	Frames(dst Tensor, enc []Tensor) error
	// Round makes one round of decode.TDTBeamSearch for each stream not done, reading each
	// expanded hypothesis's joint row in logits [Streams·Width, Blank+1+len(Durations)] F32.
	// The new hypotheses replace the old ones; Gather then moves the prediction states along.
	Round(logits Tensor) error
	// Gather copies into dst[r] the row src[p] of the hypothesis that row r's new hypothesis
	// continues. dst and src [Streams·Width, *] F32 must not overlap.
	Gather(dst, src Tensor) error
	// Read waits for the work issued and reports every stream's state.
	Read(r *BeamReport) error
	// Result reads the best hypothesis of stream s, which is done: its tokens, first to last,
	// into r (slices reused).
	Result(s int, r *BeamResult) error
	// Close releases the state.
	Close() error
}

// BeamReport is what BeamDecoding.Read reports, in slices it reuses.
type BeamReport struct {
	Done   []bool    // [Streams] every hypothesis of stream s has finished (or the stream failed)
	Failed []bool    // [Streams] an expanded joint row held a NaN or +Inf, or no finite maximum
	Full   []bool    // [Streams] the stream emitted more tokens than the state keeps (Nodes)
	Rounds []int32   // [Streams] rounds made since the stream started
	Score  []float64 // [Streams] the best hypothesis's score
	Tokens []int32   // [Streams] the best hypothesis's token count
}

// BeamResult is the best hypothesis of a stream, as decode.TDTStep reports its tokens.
type BeamResult struct {
	Score                float64
	Token, Frame, DurIdx []int32
	P, PLog              []float32
}
