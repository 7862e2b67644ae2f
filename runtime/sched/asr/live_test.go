package asr

import (
	"context"
	"testing"
)

// streamer is a Transcriber with sessions of its own (Streamer).
type streamer struct {
	transcriberFunc
	cfg SessionConfig
}

type ownLive struct{ Live }

func (s *streamer) NewLive(cfg SessionConfig) (Live, error) {
	s.cfg = cfg
	return ownLive{}, nil
}

// TestNewLive: a Streamer's own session is opened with the configuration given; any other
// Transcriber gets a Session that transcribes through it.
func TestNewLive(t *testing.T) {
	calls := 0
	tr := transcriberFunc(func(ctx context.Context, pcm []float32, p Params) (*Result, error) {
		calls++
		return &Result{Segments: []Segment{}}, nil
	})
	st := &streamer{transcriberFunc: tr}
	l, err := NewLive(st, SessionConfig{PromptBytes: 7})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := l.(ownLive); !ok || st.cfg.PromptBytes != 7 {
		t.Errorf("a Streamer's stream is %T (configured with %+v), want its own", l, st.cfg)
	}
	l, err = NewLive(tr, SessionConfig{Silence: -1})
	if err != nil {
		t.Fatal(err)
	}
	s, ok := l.(*Session)
	if !ok {
		t.Fatalf("a Transcriber's stream is %T, want *Session", l)
	}
	if _, err := s.Write(context.Background(), toneSec(2)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Commit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if calls == 0 || s.Stats().Transcriptions != calls {
		t.Errorf("%d transcriptions, the session counted %d", calls, s.Stats().Transcriptions)
	}
	if _, err := NewLive(nil, SessionConfig{}); err == nil {
		t.Error("a stream over no transcriber")
	}
}
