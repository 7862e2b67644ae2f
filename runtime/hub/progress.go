package hub

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// progress draws a single-line bar on w, redrawn with \r at most every redrawEvery. It counts the
// bytes written to it; a nil *progress ignores everything.
type progress struct {
	w           io.Writer
	label       string
	start, done int64 // bytes already present before this request; bytes now present
	total       int64 // -1 when unknown
	began, last time.Time
	drawn       bool
}

const redrawEvery = 100 * time.Millisecond

func newProgress(w io.Writer, label string, start, total int64) *progress {
	if w == nil {
		return nil
	}
	t := time.Now()
	return &progress{w: w, label: label, start: start, done: start, total: total, began: t}
}

func (p *progress) Write(b []byte) (int, error) {
	if p == nil {
		return len(b), nil
	}
	p.done += int64(len(b))
	if t := time.Now(); !p.drawn || t.Sub(p.last) >= redrawEvery {
		p.draw(t)
	}
	return len(b), nil
}

// finish draws the last state and ends the line.
func (p *progress) finish() {
	if p == nil {
		return
	}
	p.draw(time.Now())
	fmt.Fprint(p.w, "\n")
}

func (p *progress) draw(t time.Time) {
	p.last, p.drawn = t, true
	el := t.Sub(p.began).Seconds()
	rate := 0.0
	if el > 0 {
		rate = float64(p.done-p.start) / el
	}
	line := fmt.Sprintf("\r%s  %s", p.label, size(p.done))
	if p.total > 0 {
		frac := min(float64(p.done)/float64(p.total), 1)
		line += fmt.Sprintf(" / %s  %s %5.1f%%", size(p.total), bar(frac), 100*frac)
	}
	line += fmt.Sprintf("  %s/s", size(int64(rate)))
	if p.total > 0 && rate > 0 && p.done < p.total {
		line += "  ETA " + eta(time.Duration(float64(p.total-p.done)/rate*float64(time.Second)))
	}
	// Pad so that a shorter line fully covers the previous one.
	fmt.Fprintf(p.w, "%-80s", line)
}

// size formats n bytes with a binary unit.
func size(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n), -1
	for f >= unit && i < 5 {
		f /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", f, "KMGTPE"[i])
}

func eta(d time.Duration) string {
	s := int64(d.Round(time.Second) / time.Second)
	if s >= 3600 {
		return fmt.Sprintf("%d:%02d:%02d", s/3600, s/60%60, s%60)
	}
	return fmt.Sprintf("%d:%02d", s/60, s%60)
}

// bar renders frac in [0, 1] as a fixed-width bar.
func bar(frac float64) string {
	const width = 20
	b := []byte("[" + strings.Repeat(" ", width) + "]")
	for i := range int(frac * width) {
		b[1+i] = '='
	}
	return string(b)
}
