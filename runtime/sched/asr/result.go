package asr

import "strings"

// SampleRate is the rate of the samples every recogniser takes: 16 kHz mono in [-1, 1].
const SampleRate = 16000

// Token is one decoded token with its probability after suppression, as whisper.cpp reports it.
type Token struct {
	ID   int32   `json:"id"`
	Text string  `json:"text"`
	P    float32 `json:"p"`
	PLog float32 `json:"plog"`
	// T0, T1 are the token's time span in seconds: aligned to the audio with
	// Params.WordTimestamps, otherwise interpolated within its segment by text length.
	T0 float64 `json:"t0"`
	T1 float64 `json:"t1"`
	// Frame and Duration are a transducer's (Parakeet's): the encoder frame at which the token
	// was emitted (in a live stream, counted from its start or its last commit) and the frames
	// its duration output advances (0 in an RNN-T), as whisper.cpp's parakeet-cli reports them.
	// HasFrame says they are set: a Whisper token has no encoder frame. They are not part of a
	// Segment's JSON; `parley transcribe --json` writes them in its list of tokens.
	Frame    int32 `json:"-"`
	Duration int32 `json:"-"`
	HasFrame bool  `json:"-"`
}

// Segment is a stretch of text with its time span.
type Segment struct {
	ID               int     `json:"id"`
	Start            float64 `json:"start"` // seconds
	End              float64 `json:"end"`
	Text             string  `json:"text"`
	Tokens           []Token `json:"tokens"`
	Temperature      float32 `json:"temperature"`
	AvgLogprob       float64 `json:"avg_logprob"`
	CompressionRatio float64 `json:"compression_ratio"`
	NoSpeechProb     float32 `json:"no_speech_prob"`
}

// Result is a finished transcription.
type Result struct {
	Text     string    `json:"text"`
	Language string    `json:"language"`
	Duration float64   `json:"duration"` // seconds of audio
	Segments []Segment `json:"segments"`
}

// LangProb is a language's probability in language detection.
type LangProb struct {
	Code string  `json:"language"`
	P    float64 `json:"probability"`
}

// newResult assembles a finished transcription of nSamples samples from its segments: their text
// joined, the audio's duration, and an empty list rather than none.
func newResult(nSamples int, segs []Segment, lang string) *Result {
	res := &Result{Duration: float64(nSamples) / SampleRate, Segments: segs, Language: lang}
	var b strings.Builder
	for _, s := range segs {
		b.WriteString(s.Text)
	}
	res.Text = b.String()
	if res.Segments == nil {
		res.Segments = []Segment{}
	}
	return res
}

// interpolate spreads a segment's time over its text tokens (isText) in proportion to their byte
// length. The other tokens (timestamps) take no time: they sit at the segment's start before its
// first text token, and where the text before them ends after it (at the segment's end after the
// last).
func interpolate(s *Segment, isText func(id int32) bool) {
	total := 0
	for _, t := range s.Tokens {
		if isText(t.ID) {
			total += len(t.Text)
		}
	}
	at, done := s.Start, 0
	for i := range s.Tokens {
		t := &s.Tokens[i]
		if !isText(t.ID) {
			t.T0, t.T1 = at, at
			continue
		}
		done += len(t.Text)
		end := s.End // the last text token ends exactly at the segment's end
		if total == 0 {
			end = at
		} else if done < total {
			end = s.Start + float64(done)/float64(total)*(s.End-s.Start)
		}
		t.T0, t.T1 = at, end
		at = end
	}
}
