package decode

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/parleyhq/parley/internal/npy"
	"github.com/parleyhq/parley/internal/sharedtest"
)

// row builds a joint row of 4 tokens (id 3 the blank) and 3 durations.
func row(tok [4]float32, dur [3]float32) []float32 {
	return append(tok[:], dur[:]...)
}

var rule = TDT{Blank: 3, Durations: []int{0, 1, 2}, MaxSymbols: 3}

func TestTDTStep(t *testing.T) {
	if err := rule.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name         string
		row          []float32
		tok, di, dur int
		emit         bool
		frame        int
	}{
		{"blank, duration 0 moves one frame", row([4]float32{0, 1, 2, 5}, [3]float32{3, 1, 0}), 3, 0, 0, false, 11},
		{"blank, duration 2", row([4]float32{0, 1, 2, 5}, [3]float32{0, 1, 3}), 3, 2, 2, false, 12},
		{"token, duration 1", row([4]float32{0, 4, 2, 1}, [3]float32{0, 3, 1}), 1, 1, 1, true, 11},
		{"token, duration 0 stays", row([4]float32{4, 0, 2, 1}, [3]float32{3, 1, 1}), 0, 0, 0, true, 10},
		{"ties go to the first", row([4]float32{2, 2, 1, 2}, [3]float32{1, 1, 1}), 0, 0, 0, true, 10},
		{"NaN never wins", row([4]float32{float32(math.NaN()), 1, 0, 0}, [3]float32{float32(math.NaN()), 0, 2}), 1, 2, 2, true, 12},
		{"-Inf is a value", row([4]float32{float32(math.Inf(-1)), float32(math.NaN()), float32(math.NaN()), float32(math.NaN())}, [3]float32{0, 0, 0}), 0, 0, 0, true, 10},
	} {
		s := TDTState{Frame: 10}
		st, err := rule.Step(&s, c.row)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if int(st.Token) != c.tok || st.DurIdx != c.di || st.Dur != c.dur || st.Emit != c.emit || st.Frame != 10 || s.Frame != c.frame {
			t.Errorf("%s: step %+v, frame %d; want token %d, duration %d (%d), emit %v, frame %d",
				c.name, st, s.Frame, c.tok, c.di, c.dur, c.emit, c.frame)
		}
	}
}

// TestTDTProbabilities compares P and PLog with float64 softmaxes.
func TestTDTProbabilities(t *testing.T) {
	r := row([4]float32{1.5, -2, 0.25, 1}, [3]float32{0.5, 3, -1})
	s := TDTState{}
	st, err := rule.Step(&s, r)
	if err != nil {
		t.Fatal(err)
	}
	var tok, all float64
	for i, v := range r {
		e := math.Exp(float64(v))
		all += e
		if i < 4 {
			tok += e
		}
	}
	p := math.Exp(1.5) / tok
	plog := 1.5 - math.Log(all)
	if math.Abs(float64(st.P)-p) > 1e-6 || math.Abs(float64(st.PLog)-plog) > 1e-6 {
		t.Errorf("p %v plog %v, want %v %v", st.P, st.PLog, p, plog)
	}
}

// TestTDTMaxSymbols: zero-duration tokens at one frame force the frame on at MaxSymbols; a blank
// or a duration resets the count.
func TestTDTMaxSymbols(t *testing.T) {
	tok0 := row([4]float32{5, 0, 0, 0}, [3]float32{5, 0, 0})
	tok1 := row([4]float32{0, 5, 0, 0}, [3]float32{0, 5, 0})
	blank0 := row([4]float32{0, 0, 0, 5}, [3]float32{5, 0, 0})
	s := TDTState{}
	frames := []int{}
	for _, r := range [][]float32{tok0, tok0, tok0, tok0, tok0, blank0, tok0, tok0, tok1, tok0, tok0, tok0} {
		if _, err := rule.Step(&s, r); err != nil {
			t.Fatal(err)
		}
		frames = append(frames, s.Frame)
	}
	want := []int{0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4}
	for i := range want {
		if frames[i] != want[i] {
			t.Fatalf("frames %v, want %v", frames, want)
		}
	}
}

// TestRNNT: without durations a blank moves one frame and tokens stay until MaxSymbols.
func TestRNNT(t *testing.T) {
	r := TDT{Blank: 2, MaxSymbols: 2}
	if r.Width() != 3 {
		t.Fatalf("width %d", r.Width())
	}
	s := TDTState{}
	var got []int
	for _, z := range [][]float32{{0, 0, 1}, {1, 0, 0}, {0, 1, 0}, {1, 0, 0}, {0, 0, 1}} {
		st, err := r.Step(&s, z)
		if err != nil {
			t.Fatal(err)
		}
		if st.Dur != 0 || st.DurIdx != 0 {
			t.Errorf("duration %d/%d without durations", st.DurIdx, st.Dur)
		}
		got = append(got, s.Frame)
	}
	want := []int{1, 1, 2, 2, 3}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("frames %v, want %v", got, want)
		}
	}
}

func TestTDTErrors(t *testing.T) {
	s := TDTState{Frame: 4}
	nan := float32(math.NaN())
	for _, r := range [][]float32{
		make([]float32, 6),
		make([]float32, 8),
		row([4]float32{nan, nan, nan, nan}, [3]float32{0, 0, 0}),
		row([4]float32{0, 1, 0, 0}, [3]float32{nan, nan, nan}),
	} {
		if _, err := rule.Step(&s, r); err == nil {
			t.Errorf("row %v accepted", r)
		}
		if s.Frame != 4 || s.run != 0 {
			t.Errorf("a failed step moved the state: %+v", s)
		}
	}
	for _, r := range []TDT{{Blank: -1, MaxSymbols: 1}, {Blank: 1}, {Blank: 1, MaxSymbols: 1, Durations: []int{0, -1}}} {
		if err := r.Validate(); err == nil {
			t.Errorf("%+v validated", r)
		}
	}
	z := row([4]float32{1, 0, 0, 0}, [3]float32{0, 1, 0})
	if a := testing.AllocsPerRun(100, func() { s := TDTState{}; _, _ = rule.Step(&s, z) }); a != 0 {
		t.Errorf("Step allocates %v times", a)
	}
}

// refDecode is the part of a decode/<tag>/<clip>.json reference that the decision rule fixes.
type refDecode struct {
	NEncFrames int   `json:"n_enc_frames"`
	BlankID    int32 `json:"blank_id"`
	Tokens     []struct {
		ID      int32  `json:"id"`
		Frame   int    `json:"frame"`
		DurIdx  int    `json:"dur_idx"`
		DurVal  int    `json:"dur_val"`
		PStr    string `json:"p_str"`
		PLogStr string `json:"plog_str"`
	} `json:"tokens"`
	Trace struct {
		Steps      [][]float64 `json:"steps"`
		MaxSymbols int         `json:"max_symbols_rule_fired"`
	} `json:"decode_trace"`
}

// TestTDTReplay drives the rule with the raw joint logits whisper.cpp's parakeet-cli recorded at
// every joint call (reference/asr-transducer/tensors/<tag>/<clip>/joint_logits.npy) and requires
// its decisions: the frame of every call, the token and duration argmaxes and their margins, and
// the emitted tokens with their p and plog. The random models' hyper-parameters: durations
// [0, 1, 2, 3, 4], 10 symbols per frame (the rule fires once, in 0.6b-v2-f32/psx-cards-001).
// Tolerances: margins are recorded to 6 decimals (1e-5);
// p and plog are recomputed from the recorded logits, which whisper.cpp's own arithmetic matches
// within 3e-7 (README §4): 1e-6.
func TestTDTReplay(t *testing.T) {
	dir := sharedtest.Dir(t)
	ref := filepath.Join(dir, "reference", "asr-transducer")
	for _, tag := range []string{"small-f32", "0.6b-v2-f32"} {
		for _, clip := range []string{"psx-cards-001", "jfk"} {
			t.Run(tag+"/"+clip, func(t *testing.T) {
				b, err := os.ReadFile(filepath.Join(ref, "decode", tag, clip+".json"))
				if err != nil {
					t.Skip(err)
				}
				var r refDecode
				if err := json.Unmarshal(b, &r); err != nil {
					t.Fatal(err)
				}
				logits, err := npy.ReadFile(filepath.Join(ref, "tensors", tag, clip, "joint_logits.npy"))
				if err != nil {
					t.Fatal(err)
				}
				rows, width := logits.Rows()
				rule := TDT{Blank: r.BlankID, Durations: []int{0, 1, 2, 3, 4}, MaxSymbols: 10}
				if width != rule.Width() || rows != len(r.Trace.Steps) {
					t.Fatalf("%d rows of %d logits, %d recorded steps, width %d", rows, width, len(r.Trace.Steps), rule.Width())
				}
				s := TDTState{}
				var emitted []TDTStep
				maxSym := 0
				for i := 0; i < rows; i++ {
					if s.Frame >= r.NEncFrames {
						t.Fatalf("step %d: the loop ended at frame %d of %d with %d recorded steps left", i, s.Frame, r.NEncFrames, rows-i)
					}
					z := logits.Data[i*width : (i+1)*width]
					want := r.Trace.Steps[i]
					before := s
					st, err := rule.Step(&s, z)
					if err != nil {
						t.Fatal(err)
					}
					if st.Frame != int(want[0]) || st.Token != int32(want[1]) || st.DurIdx != int(want[2]) {
						t.Fatalf("step %d: frame %d token %d duration %d, recorded %v", i, st.Frame, st.Token, st.DurIdx, want)
					}
					tm := margin(z[:rule.Blank+1])
					dm := margin(z[rule.Blank+1:])
					if math.Abs(tm-want[3]) > 1e-5 || math.Abs(dm-want[4]) > 1e-5 {
						t.Errorf("step %d: margins %.6f %.6f, recorded %v %v", i, tm, dm, want[3], want[4])
					}
					if st.Emit && st.Dur == 0 && s.Frame == before.Frame+1 {
						maxSym++
					}
					if st.Emit {
						emitted = append(emitted, st)
					}
				}
				if s.Frame < r.NEncFrames {
					t.Fatalf("the recorded steps end at frame %d of %d", s.Frame, r.NEncFrames)
				}
				if maxSym != r.Trace.MaxSymbols {
					t.Errorf("the max-symbols rule fired %d times, recorded %d", maxSym, r.Trace.MaxSymbols)
				}
				if len(emitted) != len(r.Tokens) {
					t.Fatalf("%d tokens emitted, %d recorded", len(emitted), len(r.Tokens))
				}
				var maxDP, maxDL float64
				for i, e := range emitted {
					w := r.Tokens[i]
					if e.Token != w.ID || e.Frame != w.Frame || e.DurIdx != w.DurIdx || e.Dur != w.DurVal {
						t.Fatalf("token %d: %+v, recorded %+v", i, e, w)
					}
					p, _ := strconv.ParseFloat(w.PStr, 32)
					pl, _ := strconv.ParseFloat(w.PLogStr, 32)
					maxDP = max(maxDP, math.Abs(float64(e.P)-p))
					maxDL = max(maxDL, math.Abs(float64(e.PLog)-pl))
				}
				if maxDP > 1e-6 || maxDL > 1e-6 {
					t.Errorf("max |Δp| %.3g, max |Δplog| %.3g, want ≤ 1e-6", maxDP, maxDL)
				}
				t.Logf("%d joint calls, %d tokens; max |Δp| %.3g, |Δplog| %.3g", rows, len(emitted), maxDP, maxDL)
			})
		}
	}
}

// margin is the top-1 minus top-2 value of x.
func margin(x []float32) float64 {
	a, b := math.Inf(-1), math.Inf(-1)
	for _, v := range x {
		f := float64(v)
		if f > a {
			a, b = f, a
		} else if f > b {
			b = f
		}
	}
	return a - b
}
