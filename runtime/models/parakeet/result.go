package parakeet

// Token is one token the transducer emitted, with its times. ID, Frame, DurIdx, Dur, P and PLog
// come from the decoder (decode.TDT); Transcript fills in the rest.
type Token struct {
	ID     int32
	Frame  int // encoder frame at which it was emitted
	DurIdx int // the duration output chosen (0 in an RNN-T)
	Dur    int // frames that duration advances (0 in an RNN-T)
	// P is the token's probability among the token logits; PLog its log-probability among all
	// joint outputs, durations included, as whisper.cpp reports it (see decode.TDT).
	P, PLog float32
	// T0 and T1 are in 10 ms units: Frame·8 and (Frame + Dur)·8, except that a punctuation piece
	// takes the T1 of the last token before it that is not punctuation, as both its times.
	T0, T1    int64
	WordStart bool
}

// Segment is a piece of transcript: times in 10 ms units, text and tokens.
type Segment struct {
	T0, T1 int64
	Text   string
	Tokens []Token
}

// Transcript sets the times and word starts of tokens in place as whisper.cpp does
// (create_token_data and refine_timestamps_tdt, parakeet.cpp:2447-2494) and returns their text
// (Vocab.Text).
func (v *Vocab) Transcript(tokens []Token) string {
	lastT1 := int64(-1)
	var text []byte
	for i := range tokens {
		t := &tokens[i]
		t.T0 = int64(t.Frame) * Subsampling
		t.T1 = int64(t.Frame+t.Dur) * Subsampling
		t.WordStart = v.IsWordStart(t.ID)
		if v.IsPunctuation(t.ID) {
			if lastT1 >= 0 {
				t.T0, t.T1 = lastT1, lastT1
			}
		} else {
			lastT1 = t.T1
		}
		text = v.AppendText(text, t.ID, len(text) == 0)
	}
	return string(text)
}

// Segment assembles the segment whisper.cpp reports for one pass over a clip: T0 = 0, T1 = end
// (SegmentEnd), the tokens' times and text as Transcript sets them. ok is false when the text is
// empty, where whisper.cpp reports no segment (parakeet.cpp:3756).
func (v *Vocab) Segment(tokens []Token, end int64) (s Segment, ok bool) {
	text := v.Transcript(tokens)
	if text == "" {
		return Segment{}, false
	}
	return Segment{T0: 0, T1: end, Text: text, Tokens: tokens}, true
}

// SegmentEnd is the T1 whisper.cpp gives the segment of a clip of melFrames mel frames and
// encFrames encoder frames: the mel frame count when the clip fits n_audio_ctx (parakeet_chunk,
// parakeet.cpp:3758), the encoder frame count when it does not (the dynamic path,
// parakeet.cpp:3660).
func (h HParams) SegmentEnd(melFrames, encFrames int) int64 {
	if melFrames <= h.NAudioCtx {
		return int64(melFrames)
	}
	return int64(encFrames)
}

// EncoderFrames is the number of encoder frames for melFrames mel frames: three stride-2
// convolutions with padding 1 each take n to ceil(n/2).
func EncoderFrames(melFrames int) int {
	n := melFrames
	for range 3 {
		n = (n + 1) / 2
	}
	return n
}
