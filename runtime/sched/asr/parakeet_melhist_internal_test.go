package asr

import (
	"slices"
	"testing"

	"github.com/parleyhq/parley/runtime/models/parakeet"
)

// TestMelHistory: windows normalised as a stream's are (1.6 s chunks, 2 s of left context, 480
// ms of look-ahead) have, at each window, every frame before the window's start in their
// history and no other; a window encoded again (a chunk that failed) is normalised as the first
// time; and the first window, without history, as parakeet.FrontEnd.LogMel normalises it.
func TestMelHistory(t *testing.T) {
	e := openParakeetSmall(t, Config{MaxActive: 1})
	fe := e.m.FrontEnd
	pcm := testWAV(t, "jfk")
	chunk, left, right := samples(DefaultChunk), samples(DefaultLeftContext), samples(DefaultRightContext)
	once, twice := newMelHistory(fe), newMelHistory(fe)
	for next := 0; next+chunk <= len(pcm); next += chunk {
		w0, w1 := max(0, next-left), min(len(pcm), next+chunk+right)
		nw0 := max(0, next+chunk-left)
		a, err := once.logMel(fe, nil, pcm[w0:w1], w0, nw0, false)
		if err != nil {
			t.Fatal(err)
		}
		if got := once.stats.Frames(); got != w0/parakeet.HopLength {
			t.Fatalf("window at sample %d: %d frames of history, want %d", w0, got, w0/parakeet.HopLength)
		}
		if _, err := twice.logMel(fe, nil, pcm[w0:w1], w0, nw0, false); err != nil {
			t.Fatal(err)
		}
		b, err := twice.logMel(fe, nil, pcm[w0:w1], w0, nw0, false)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(a, b) || twice.stats.Frames() != once.stats.Frames() {
			t.Fatalf("window at sample %d encoded again: normalised otherwise (%d frames of history, once %d)", w0, twice.stats.Frames(), once.stats.Frames())
		}
		if next == 0 {
			want, err := fe.LogMel(nil, pcm[w0:w1])
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(a, want) {
				t.Fatal("the first window is not normalised as LogMel normalises it")
			}
		}
	}
	once.reset()
	if once.stats.Frames() != 0 {
		t.Errorf("%d frames after reset", once.stats.Frames())
	}
}
