package asr

import "context"

// Live is one live transcription stream: samples in, events out. The server's live endpoint
// talks to it alone. Session is the Live of any Transcriber; a Streamer's sessions are its own.
// A Live is not safe for concurrent use.
type Live interface {
	// Write adds samples (16 kHz mono in [-1, 1]) and returns the events they produce, in order:
	// finals of utterances that ended inside them, then partials. A transcriber error is
	// returned as is; the stream stays usable.
	Write(ctx context.Context, pcm []float32) ([]Event, error)
	// Commit finalizes what the stream holds, as if the utterance had ended.
	Commit(ctx context.Context) ([]Event, error)
}

// Streamer is a recogniser that decodes audio incrementally by nature (a streaming transducer,
// whose encoder runs on chunks with left context and whose decoder emits tokens frame by frame):
// its live sessions keep their state between writes instead of transcribing a buffer again.
type Streamer interface {
	NewLive(cfg SessionConfig) (Live, error)
}

// NewLive opens a live stream over tr: its own session where it is a Streamer, else a Session
// that transcribes a sliding buffer again and again.
func NewLive(tr Transcriber, cfg SessionConfig) (Live, error) {
	if s, ok := tr.(Streamer); ok {
		return s.NewLive(cfg)
	}
	return NewSession(tr, cfg)
}

// Event is what a live stream reports.
type Event struct {
	Type     string        `json:"type"` // "partial" (may still change) or "final" (settled)
	Text     string        `json:"text"`
	Start    float64       `json:"start"` // seconds since the stream began
	End      float64       `json:"end"`
	Segments []LiveSegment `json:"segments,omitempty"` // final events: the text by transcriber segment
	// Stable, in the partial events of a stream whose hypotheses may still change (a Parakeet
	// stream with a beam), is the beginning of Text that every later partial of the utterance and
	// its final keep: the words of the tokens all hypotheses hold, but the last of them, which
	// the next token may continue.
	Stable string `json:"stable,omitempty"`
	// Tokens, in final events, are the text tokens of Text in order (special tokens left out):
	// their texts put together, trimmed of white space at both ends, are Text. A word's tokens
	// are all there or none; white space between words goes with the word after it.
	Tokens []LiveToken `json:"-"`
}

// LiveToken is a token of a final event: its text and the log of its probability.
type LiveToken struct {
	Text string
	PLog float32
}

// liveTokens copies the text tokens of segs (special tokens left out, as Words leaves them out)
// that begin in their first n bytes of text: the tokens of words whose spelling (spell) is n
// bytes long.
func liveTokens(segs []Segment, isSpecial func(id int32) bool, n int) []LiveToken {
	var out []LiveToken
	at := 0
	for _, s := range segs {
		for _, t := range s.Tokens {
			if at >= n {
				return out
			}
			if isSpecial == nil || !isSpecial(t.ID) {
				out = append(out, LiveToken{Text: t.Text, PLog: t.PLog})
				at += len(t.Text)
			}
		}
	}
	return out
}

// LiveSegment is a stretch of final text.
type LiveSegment struct {
	Text  string  `json:"text"`
	Start float64 `json:"start"`
	End   float64 `json:"end"`
}

// Session is a Live.
var _ Live = (*Session)(nil)
