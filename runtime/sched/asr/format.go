package asr

import (
	"fmt"
	"math"
	"strings"
)

// RoundTime rounds seconds to milliseconds, the precision every time is written with (JSON of
// segments, tokens and words, as SRT and WebVTT have it): sums of float64 seconds otherwise print
// as 0.30000000000000004.
func RoundTime(sec float64) float64 { return math.Round(sec*1000) / 1000 }

// Rounded returns s with its times and its tokens' times rounded to milliseconds (RoundTime),
// for output; s's tokens are not changed.
func (s Segment) Rounded() Segment {
	s.Start, s.End = RoundTime(s.Start), RoundTime(s.End)
	s.Tokens = append([]Token(nil), s.Tokens...)
	for i := range s.Tokens {
		s.Tokens[i].T0, s.Tokens[i].T1 = RoundTime(s.Tokens[i].T0), RoundTime(s.Tokens[i].T1)
	}
	return s
}

// SRT renders the segments as SubRip subtitles.
func (r *Result) SRT() string {
	var b strings.Builder
	for i, s := range r.Segments {
		fmt.Fprintf(&b, "%d\n%s --> %s\n%s\n\n", i+1, clock(s.Start, ","), clock(s.End, ","), strings.TrimSpace(s.Text))
	}
	return b.String()
}

// VTT renders the segments as WebVTT.
func (r *Result) VTT() string {
	var b strings.Builder
	b.WriteString("WEBVTT\n\n")
	for _, s := range r.Segments {
		fmt.Fprintf(&b, "%s --> %s\n%s\n\n", clock(s.Start, "."), clock(s.End, "."), strings.TrimSpace(s.Text))
	}
	return b.String()
}

// clock formats seconds as HH:MM:SS,mmm (sep "," for SRT, "." for WebVTT).
func clock(sec float64, sep string) string {
	if sec < 0 {
		sec = 0
	}
	ms := int64(sec*1000 + 0.5)
	return fmt.Sprintf("%02d:%02d:%02d%s%03d", ms/3600000, ms/60000%60, ms/1000%60, sep, ms%1000)
}
