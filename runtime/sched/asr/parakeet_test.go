package asr_test

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"sync"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/models/parakeet"
	"github.com/parleyhq/parley/runtime/sched/asr"
)

// Parakeet's tolerances against whisper.cpp (reference/asr-transducer README §7, at full
// precision): p and plog of every emitted token; ids, times and text must be identical on the
// small model, whose ten decodes the model's own parity test reproduces exactly.
const (
	parakeetTolP    = 5e-3
	parakeetTolPLog = 2e-2
)

// parakeetClips are the clips of reference/asr-transducer.
var parakeetClips = []string{"psx-cards-001", "jfk", "psx-cards-002", "ls-tc-1089-134686-0001", "ami-ES2011a-headset0-40s-46s",
	"psx-librivox-0870", "ljs-LJ001-0005", "ljs-LJ001-0014", "ls-dc-2412-153948-0000", "concat-40s"}

type parakeetRef struct {
	Wav        string `json:"wav"`
	NMelFrames int    `json:"n_mel_frames"`
	Text       string `json:"text"`
	Tokens     []struct {
		ID   int32   `json:"id"`
		P    float64 `json:"p"`
		PLog float64 `json:"plog"`
		T0   int64   `json:"t0"`
		T1   int64   `json:"t1"`
		// Frame and Dur are the encoder frame and the frames advanced.
		Frame int32 `json:"frame"`
		Dur   int32 `json:"dur_val"`
	} `json:"tokens"`
}

// openParakeet loads the small random-weight Parakeet model on every backend under test.
func openParakeet(t *testing.T) (*parakeet.File, string) {
	t.Helper()
	path := sharedtest.ParakeetRandomModel(t, "small", false)
	f, err := parakeet.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f, path
}

// TestParakeetTranscribe transcribes every reference clip at once through one Parakeet
// scheduler (four decoded together, two clips per encoder call) and compares each result with
// whisper.cpp's: text, token ids and times, p and plog.
func TestParakeetTranscribe(t *testing.T) {
	f, _ := openParakeet(t)
	type clip struct {
		ref     parakeetRef
		samples []float32
	}
	var clips []clip
	for _, name := range parakeetClips {
		b, err := os.ReadFile(sharedtest.Path(t, "reference/asr-transducer/decode/small-f32/"+name+".json"))
		if err != nil {
			t.Fatal(err)
		}
		var c clip
		if err := json.Unmarshal(b, &c.ref); err != nil {
			t.Fatal(err)
		}
		wav, err := os.ReadFile(sharedtest.Path(t, c.ref.Wav))
		if err != nil {
			t.Fatal(err)
		}
		if c.samples, _, err = audio.Decode(wav); err != nil {
			t.Fatal(err)
		}
		clips = append(clips, c)
	}
	for _, be := range backendsUnderTest(t) {
		t.Run(be.Name(), func(t *testing.T) {
			m, err := parakeet.Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			eng, err := asr.NewParakeet(m, asr.Config{MaxActive: 4, EncodeBatch: 2, MaxQueue: len(clips)})
			if err != nil {
				t.Fatal(err)
			}
			defer eng.Close()
			results := make([]*asr.Result, len(clips))
			errs := make([]error, len(clips))
			segs := make([]int, len(clips))
			var wg sync.WaitGroup
			for i := range clips {
				wg.Add(1)
				go func() {
					defer wg.Done()
					results[i], errs[i] = eng.Transcribe(context.Background(), clips[i].samples, asr.DefaultParams(), func(asr.Segment) { segs[i]++ })
				}()
			}
			wg.Wait()
			for i, c := range clips {
				name := parakeetClips[i]
				if errs[i] != nil {
					t.Errorf("%s: %v", name, errs[i])
					continue
				}
				res := results[i]
				if res.Text != c.ref.Text || len(res.Segments) != 1 || segs[i] != 1 {
					t.Errorf("%s: text %q in %d segments (%d reported), recorded %q", name, res.Text, len(res.Segments), segs[i], c.ref.Text)
					continue
				}
				s := res.Segments[0]
				if s.Start != 0 || s.End != float64(c.ref.NMelFrames)/100 {
					t.Errorf("%s: segment %v..%v s, want 0..%v", name, s.Start, s.End, float64(c.ref.NMelFrames)/100)
				}
				if len(s.Tokens) != len(c.ref.Tokens) {
					t.Errorf("%s: %d tokens, recorded %d", name, len(s.Tokens), len(c.ref.Tokens))
					continue
				}
				var mxP, mxPL float64
				for k, w := range c.ref.Tokens {
					g := s.Tokens[k]
					if g.ID != w.ID || g.T0 != float64(w.T0)/100 || g.T1 != float64(w.T1)/100 {
						t.Errorf("%s: token %d: id %d at %v..%v s, recorded id %d at %d..%d (10 ms)", name, k, g.ID, g.T0, g.T1, w.ID, w.T0, w.T1)
						break
					}
					if !g.HasFrame || g.Frame != w.Frame || g.Duration != w.Dur {
						t.Errorf("%s: token %d: frame %d duration %d (set: %v), recorded %d %d", name, k, g.Frame, g.Duration, g.HasFrame, w.Frame, w.Dur)
						break
					}
					mxP, mxPL = max(mxP, math.Abs(float64(g.P)-w.P)), max(mxPL, math.Abs(float64(g.PLog)-w.PLog))
				}
				if mxP > parakeetTolP || mxPL > parakeetTolPLog {
					t.Errorf("%s: max |Δ| p %.3g (≤ %g), plog %.3g (≤ %g)", name, mxP, parakeetTolP, mxPL, parakeetTolPLog)
				}
				t.Logf("%s: %d tokens, max |Δ| p %.3g, plog %.3g", name, len(s.Tokens), mxP, mxPL)
			}
		})
	}
}

// TestParakeetRequests checks what a Parakeet scheduler refuses or answers without decoding:
// bad audio, translation, language detection; audio too short for a frame gives no text.
func TestParakeetRequests(t *testing.T) {
	f, _ := openParakeet(t)
	be := backendsUnderTest(t)[0]
	m, err := parakeet.Load(f, be)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	eng, err := asr.NewParakeet(m, asr.Config{MaxActive: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	ctx := context.Background()
	p := asr.DefaultParams()
	if _, err := eng.Transcribe(ctx, nil, p, nil); !errors.Is(err, asr.ErrBadRequest) {
		t.Errorf("no samples: %v, want ErrBadRequest", err)
	}
	if _, err := eng.Transcribe(ctx, []float32{0, float32(math.NaN())}, p, nil); !errors.Is(err, asr.ErrBadRequest) {
		t.Errorf("NaN sample: %v, want ErrBadRequest", err)
	}
	tp := p
	tp.Translate = true
	if _, err := eng.Transcribe(ctx, make([]float32, 16000), tp, nil); !errors.Is(err, asr.ErrBadRequest) {
		t.Errorf("translate: %v, want ErrBadRequest", err)
	}
	if _, err := eng.DetectLanguage(ctx, make([]float32, 16000)); !errors.Is(err, asr.ErrBadRequest) {
		t.Errorf("detect language: %v, want ErrBadRequest", err)
	}
	res, err := eng.Transcribe(ctx, make([]float32, 10), p, nil)
	if err != nil || res.Text != "" || len(res.Segments) != 0 {
		t.Errorf("10 samples: %+v, %v; want no text", res, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := eng.Transcribe(cctx, make([]float32, 16000), p, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v, want context.Canceled", err)
	}
	if !eng.IsSpecial(int32(m.HParams.NVocab)) || eng.IsSpecial(1) {
		t.Error("IsSpecial: the blank is special, piece 1 is text")
	}
}

// blockingSource is a recording whose Open waits for release, counting its opens.
type blockingSource struct {
	opened  chan struct{}
	release chan struct{}
	opens   int32
	mu      sync.Mutex
}

func (s *blockingSource) Open() (audio.Stream, error) {
	s.mu.Lock()
	s.opens++
	s.mu.Unlock()
	s.opened <- struct{}{}
	<-s.release
	return audio.Samples(make([]float32, 16000)).Open()
}

// TestParakeetSourceAdmission: a Parakeet transcription of a source takes its place among those
// in flight before the source is opened, so a full recogniser refuses the next one without
// reading its audio, and gives the place back when it ends.
func TestParakeetSourceAdmission(t *testing.T) {
	f, _ := openParakeet(t)
	be := backendsUnderTest(t)[0]
	m, err := parakeet.Load(f, be)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	eng, err := asr.NewParakeet(m, asr.Config{MaxActive: 1}) // one in flight, none waiting
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	ctx := context.Background()
	p := asr.DefaultParams()
	held := &blockingSource{opened: make(chan struct{}, 1), release: make(chan struct{})}
	errc := make(chan error, 1)
	go func() { _, err := eng.TranscribeSource(ctx, held, p, nil); errc <- err }()
	<-held.opened
	refused := &blockingSource{opened: make(chan struct{}, 1), release: make(chan struct{})}
	close(refused.release)
	if _, err := eng.TranscribeSource(ctx, refused, p, nil); !errors.Is(err, asr.ErrQueueFull) {
		t.Errorf("second transcription while the first reads its audio: %v, want ErrQueueFull", err)
	}
	if refused.opens != 0 {
		t.Errorf("the refused transcription's source was opened %d times, want 0", refused.opens)
	}
	close(held.release)
	if err := <-errc; err != nil {
		t.Fatalf("first transcription: %v", err)
	}
	if _, err := eng.TranscribeSource(ctx, audio.Samples(make([]float32, 16000)), p, nil); err != nil {
		t.Errorf("a transcription after the first ended: %v", err)
	}
}
