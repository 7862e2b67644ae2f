package parakeet

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/tensor"
)

// The device beam search against the host one (Decoder.Predict and Joint driven by
// decode.TDTBeamSearch, as the scheduler drives them): the same best tokens, frames and
// durations, p and plog within greedyTol, the score within beamScoreTol relative.
const beamScoreTol = 1e-6

// beamResult is one clip's best hypothesis.
type beamResult struct {
	toks  []Token
	score float64
}

// hostBeam searches c on the host.
func hostBeam(t *testing.T, m *Model, c greedyClip, cfg decode.TDTBeam) beamResult {
	t.Helper()
	s, err := decode.NewTDTBeamSearch(cfg)
	if err != nil {
		t.Fatal(err)
	}
	d, err := m.NewDecoder(s.Slots(), cfg.Width)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	rows := make([]float32, cfg.Width*d.Width())
	var tokens, from, to, frames, slots []int32
	if err := s.AddFrames(c.frames); err != nil {
		t.Fatal(err)
	}
	s.Finish()
	for !s.Done() {
		if !s.Ready() {
			t.Fatal("a search neither done nor ready")
		}
		tokens, from, to = tokens[:0], from[:0], to[:0]
		for _, p := range s.Predictions() {
			tokens, from, to = append(tokens, p.Token), append(from, p.From), append(to, p.To)
		}
		if len(tokens) > 0 {
			if err := d.Predict(tokens, from, to); err != nil {
				t.Fatal(err)
			}
		}
		frames, slots = frames[:0], slots[:0]
		for _, j := range s.Joints() {
			frames, slots = append(frames, int32(j.Frame)), append(slots, j.Slot)
		}
		n := len(frames) * d.Width()
		if err := d.Joint(rows[:n], c.proj, frames, slots); err != nil {
			t.Fatal(err)
		}
		if err := s.Advance(rows[:n]); err != nil {
			t.Fatal(err)
		}
	}
	var r beamResult
	for _, st := range s.Tokens(0, nil) {
		r.toks = append(r.toks, Token{ID: st.Token, Frame: st.Frame, DurIdx: st.DurIdx, Dur: st.Dur, P: st.P, PLog: st.PLog})
	}
	r.score = s.Hyp(0).Score
	return r
}

// deviceBeam searches clips with beams of width on a beam loop (of cfg's streams and rows, read
// every cfg.K rounds): the first
// half of the streams start at once, the others join after the first read, and each stream
// takes the next clip when its own is done. It checks that the loop copies from the device
// once a Read and once a Result of a stream with tokens, never a round.
func deviceBeam(t *testing.T, m *Model, clips []greedyClip, cfg BeamLoopConfig, width int) []beamResult {
	t.Helper()
	for _, c := range clips {
		cfg.MaxFrames = max(cfg.MaxFrames, c.frames)
	}
	l, err := m.NewBeamLoop(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rows := cfg.Streams
	dl, _ := m.Backend().(downloads)
	var before int64
	if dl != nil {
		if before, err = dl.Downloads(); err != nil {
			t.Fatal(err)
		}
	}
	out := make([]beamResult, len(clips))
	done := make([]bool, rows)
	clipOf := make([]int, rows)
	next := 0
	start := func(r int) {
		if next == len(clips) {
			clipOf[r] = -1
			return
		}
		c := clips[next]
		if err := l.Start(r, c.proj, c.frames, width); err != nil {
			t.Fatal(err)
		}
		clipOf[r] = next
		next++
	}
	for r := range rows {
		clipOf[r] = -1
		if r < (rows+1)/2 {
			start(r)
		}
	}
	reads, rounds, results := 0, 0, 0
	for {
		for range cfg.K {
			if err := l.Round(); err != nil {
				t.Fatal(err)
			}
			rounds++
		}
		if err := l.Read(done); err != nil {
			t.Fatal(err)
		}
		reads++
		busy := false
		for r := range rows {
			if clipOf[r] >= 0 && done[r] {
				toks, score, err := l.Result(r, nil)
				if err != nil {
					t.Fatal(err)
				}
				if len(toks) > 0 {
					results++
				}
				out[clipOf[r]] = beamResult{toks: toks, score: score}
				clipOf[r] = -1
			}
			if clipOf[r] < 0 && (reads > 1 || r >= (rows+1)/2) {
				start(r)
			}
			busy = busy || clipOf[r] >= 0
		}
		if !busy {
			break
		}
		if rounds > 1<<20 {
			t.Fatal("the loop does not end")
		}
	}
	if dl != nil {
		after, err := dl.Downloads()
		if err != nil {
			t.Fatal(err)
		}
		if after-before != int64(reads+results) {
			t.Errorf("%d device-to-host copies in %d rounds, %d reads, %d results: want one a read and a result", after-before, rounds, reads, results)
		}
		t.Logf("%d rounds, %d reads, %d results, %d device-to-host copies", rounds, reads, results, after-before)
	}
	return out
}

// sameTokens reports how got differs from want: the first token that differs in id, frame or
// duration, or the largest p and plog differences beyond greedyTol.
func sameTokens(got, want []Token) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d tokens, want %d", len(got), len(want))
	}
	var mp, ml float64
	for k, w := range want {
		g := got[k]
		if g.ID != w.ID || g.Frame != w.Frame || g.DurIdx != w.DurIdx || g.Dur != w.Dur {
			return fmt.Errorf("token %d: %+v, want %+v", k, g, w)
		}
		mp, ml = max(mp, math.Abs(float64(g.P-w.P))), max(ml, math.Abs(float64(g.PLog-w.PLog)))
	}
	if mp > greedyTol || ml > greedyTol {
		return fmt.Errorf("max |Δ| p %.3g, plog %.3g (≤ %g)", mp, ml, greedyTol)
	}
	return nil
}

// compareBeam requires the device search's best hypotheses to be the host search's. A search of
// width 1 runs in rows of width 3: a stream uses only its own width's rows.
func compareBeam(t *testing.T, m *Model, clips []greedyClip, width int, merge decode.BeamMerge, streams, k int) []beamResult {
	t.Helper()
	h := m.HParams
	rows := width
	if width == 1 {
		rows = 3
	}
	got := deviceBeam(t, m, clips, BeamLoopConfig{Streams: streams, Width: rows, LogSumExp: merge == decode.MergeLogSumExp, K: k}, width)
	cfg := decode.TDTBeam{Rule: decode.TDT{Blank: int32(h.NVocab), Durations: m.Durations, MaxSymbols: h.NMaxTokens}, Width: width, Merge: merge}
	for i, c := range clips {
		want := hostBeam(t, m, c, cfg)
		g := got[i]
		if err := sameTokens(g.toks, want.toks); err != nil {
			t.Errorf("%s: width %d, merge %d: %v", c.name, width, merge, err)
			continue
		}
		if d := math.Abs(g.score - want.score); d > beamScoreTol*math.Max(1, math.Abs(want.score)) {
			t.Errorf("%s: width %d, merge %d: score %.9g, want %.9g", c.name, width, merge, g.score, want.score)
		}
	}
	return got
}

// beamBackends are the backends under test that search on the device.
func beamBackends(t *testing.T) []backend.Backend {
	var bs []backend.Backend
	for _, be := range sharedtest.Backends(t, 2) {
		if _, ok := be.(backend.BeamTransducer); ok {
			bs = append(bs, be)
		} else {
			t.Logf("%s searches on the host: no device beam to test", be.Name())
		}
	}
	return bs
}

// TestBeamLoop searches the encoder outputs of the reference clips and random ones on the device
// beam loop, three streams at once, streams joining as others finish, at widths 1, 4 and 8
// keeping the better of merged hypotheses, and on the host; the random ones also at width 2,
// and at width 4 adding the merged hypotheses' probabilities. Width 1 is also the device greedy
// loop.
func TestBeamLoop(t *testing.T) {
	f, err := Open(sharedtest.ParakeetRandomModel(t, "small", false))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bes := beamBackends(t)
	if len(bes) == 0 {
		return
	}
	encoded := encodeOnHost(t, f)
	for _, be := range bes {
		t.Run(be.Name(), func(t *testing.T) {
			m, err := Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			var clips []greedyClip
			for _, e := range encoded {
				clips = append(clips, projectClip(t, m, e.name, e.enc, e.frames))
			}
			random := randomClips(t, m, 5, 60, 1)
			clips = append(clips, random...)
			for _, w := range []int{1, 4, 8} {
				got := compareBeam(t, m, clips, w, decode.MergeMax, 3, 8)
				if w == 1 {
					greedy := deviceGreedy(t, m, clips, 3, 8)
					for i, c := range clips {
						if err := sameTokens(got[i].toks, greedy[i]); err != nil {
							t.Errorf("%s: width 1 against the greedy loop: %v", c.name, err)
						}
					}
				}
			}
			compareBeam(t, m, random, 2, decode.MergeMax, 2, 5)
			compareBeam(t, m, random, 4, decode.MergeLogSumExp, 3, 8)
		})
	}
}

// TestBeamLoopRNNT: a file without durations (a plain RNN-T) searches on the device as on the
// host.
func TestBeamLoopRNNT(t *testing.T) {
	h := tinyHP
	h.NTDTDurations = 0
	f := loadableFile(t, h, 5)
	for _, be := range beamBackends(t) {
		t.Run(be.Name(), func(t *testing.T) {
			m, err := Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			clips := randomClips(t, m, 6, 40, 2)
			for _, w := range []int{1, 3, 8} {
				compareBeam(t, m, clips, w, decode.MergeMax, 4, 5)
				compareBeam(t, m, clips, w, decode.MergeLogSumExp, 2, 7)
			}
		})
	}
}

// TestBeamLoopTiny: the tiny TDT model, whose few tokens make merges and ties between
// hypotheses frequent, searches on the device as on the host.
func TestBeamLoopTiny(t *testing.T) {
	f := loadableFile(t, tinyHP, 7)
	for _, be := range beamBackends(t) {
		t.Run(be.Name(), func(t *testing.T) {
			m, err := Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			clips := randomClips(t, m, 6, 40, 8)
			for _, w := range []int{2, 5, 8} {
				compareBeam(t, m, clips, w, decode.MergeMax, 3, 4)
				compareBeam(t, m, clips, w, decode.MergeLogSumExp, 3, 4)
			}
		})
	}
}

// TestBeamLoopArgs: the loop refuses bad streams and too many rounds between reads, allocates
// nothing a round and read, and is refused by a backend that searches on the host.
func TestBeamLoopArgs(t *testing.T) {
	f := loadableFile(t, tinyHP, 6)
	for _, be := range sharedtest.Backends(t, 1) {
		t.Run(be.Name(), func(t *testing.T) {
			m, err := Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			cfg := BeamLoopConfig{Streams: 2, Width: 4, MaxFrames: 5, K: 2}
			l, err := m.NewBeamLoop(cfg)
			if _, ok := be.(backend.BeamTransducer); !ok {
				if !errors.Is(err, ErrNoBeamLoop) {
					t.Fatalf("NewBeamLoop on %s: %v, want ErrNoBeamLoop", be.Name(), err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			for _, bad := range []BeamLoopConfig{{Streams: 0, Width: 4, MaxFrames: 5, K: 2}, {Streams: 2, Width: 9, MaxFrames: 5, K: 2},
				{Streams: 2, Width: 4, MaxFrames: 0, K: 2}, {Streams: 2, Width: 4, MaxFrames: 5, K: 0}} {
				if l2, err := m.NewBeamLoop(bad); err == nil {
					l2.Close()
					t.Errorf("NewBeamLoop(%+v) accepted", bad)
				}
			}
			c := randomClips(t, m, 1, 5, 3)[0]
			if l.Start(2, c.proj, c.frames, 1) == nil || l.Start(0, c.proj, c.frames+1, 1) == nil || l.Start(0, c.proj, c.frames, 5) == nil ||
				l.Start(0, c.proj, c.frames, 0) == nil || l.Stop(-1) == nil {
				t.Error("a bad stream or clip accepted")
			}
			for range 2 {
				if err := l.Round(); err != nil {
					t.Fatal(err)
				}
			}
			if l.Round() == nil {
				t.Error("a third round without a read accepted")
			}
			if l.Read(make([]bool, 1)) == nil {
				t.Error("a read into too few streams accepted")
			}
			done := make([]bool, 2)
			if err := l.Read(done); err != nil {
				t.Fatal(err)
			}
			if _, _, err := l.Result(2, nil); err == nil {
				t.Error("the result of stream 2 of 2 accepted")
			}
			c = randomClips(t, m, 1, 5, 4)[0]
			if err := l.Start(0, c.proj, c.frames, 3); err != nil {
				t.Fatal(err)
			}
			if _, _, err := l.Result(0, nil); err == nil {
				t.Error("the result of a stream started after the last read accepted")
			}
			if n := testing.AllocsPerRun(5, func() {
				for range 2 {
					if err := l.Round(); err != nil {
						t.Fatal(err)
					}
				}
				if err := l.Read(done); err != nil {
					t.Fatal(err)
				}
			}); n != 0 {
				t.Errorf("%v allocations a round and read", n)
			}
		})
	}
}

// tieCase is a search over synthetic joint rows: the row of a hypothesis at frame f whose last
// token is k is enc[f] + tab[k], small integers, so that many pairs and candidates tie exactly,
// with some logits -Inf and, where nan is set, a NaN in frame 0 of stream 1 and in some frame
// of stream 2.
type tieCase struct {
	blank      int32
	durations  []int
	maxSymbols int
	nan        bool
}

// TestBeamRoundTies runs the device round (backend.BeamDecoding, without a model) and
// decode.TDTBeamSearch over the same synthetic rows: ties between tokens, durations, pairs and
// candidates, -Inf logits, merges, and NaN rows, which fail the stream as they fail the host
// search.
func TestBeamRoundTies(t *testing.T) {
	cases := []tieCase{
		{blank: 4, durations: []int{0, 1, 2, 3}, maxSymbols: 2},
		{blank: 6, durations: []int{0, 2}, maxSymbols: 3},
		{blank: 3, maxSymbols: 2},
		{blank: 4, durations: []int{0, 1, 2}, maxSymbols: 2, nan: true},
	}
	for _, be := range beamBackends(t) {
		t.Run(be.Name(), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(11, 12))
			for ci, tc := range cases {
				for _, w := range []int{1, 2, 3, 5, 8} {
					for _, merge := range []decode.BeamMerge{decode.MergeMax, decode.MergeLogSumExp} {
						name := fmt.Sprintf("case %d, width %d, merge %d", ci, w, merge)
						if failed := tieRound(t, be, rng, tc, w, merge, name); tc.nan != (failed > 0) {
							t.Errorf("%s: %d streams failed", name, failed)
						}
					}
				}
			}
		})
	}
}

// tieRound searches 3 streams of one tie case, of widths w, w-1 and w-2 (at least 1) in rows of
// width 8, on the device and on the host, and returns the number of streams that failed on both.
func tieRound(t *testing.T, be backend.Backend, rng *rand.Rand, tc tieCase, w int, merge decode.BeamMerge, name string) int {
	t.Helper()
	const streams = 3
	nTok := int(tc.blank) + 1
	width := nTok + len(tc.durations)
	value := func() float32 {
		if rng.IntN(9) == 0 {
			return float32(math.Inf(-1))
		}
		return float32(rng.IntN(4) - 1)
	}
	tab := make([]float32, nTok*width)
	for i := range tab {
		tab[i] = value()
	}
	// Every token and duration logit row has a finite entry: only the NaN fails a search.
	for k := range nTok {
		tab[k*width+nTok-1], tab[k*width+width-1] = 0, 0
	}
	frames := make([]int, streams)
	encs := make([][]float32, streams)
	for s := range streams {
		frames[s] = 1 + rng.IntN(12)
		encs[s] = make([]float32, frames[s]*width)
		for i := range encs[s] {
			if v := value(); !math.IsInf(float64(v), -1) {
				encs[s][i] = v
			}
		}
	}
	if tc.nan {
		// Frame 0 is always read; a later frame of stream 2 may be skipped over.
		encs[1][rng.IntN(width)] = float32(math.NaN())
		encs[2][rng.IntN(frames[2])*width+rng.IntN(width)] = float32(math.NaN())
	}
	alloc := func(rows int, data []float32) backend.Tensor {
		x, err := be.Alloc(tensor.F32, rows, width)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { x.Close() })
		if data != nil {
			if err := be.Write(x, 0, data); err != nil {
				t.Fatal(err)
			}
		}
		return x
	}
	table := alloc(nTok, tab)
	enc := make([]backend.Tensor, streams)
	for s := range streams {
		enc[s] = alloc(frames[s], encs[s])
	}
	const rowsW = 8
	lg, tk := alloc(streams*rowsW, nil), alloc(streams*rowsW, nil)
	d, err := be.(backend.BeamTransducer).NewBeamDecoding(backend.BeamDecodingConfig{Streams: streams, Width: rowsW, Blank: tc.blank,
		Durations: tc.durations, MaxSymbols: tc.maxSymbols, LogSumExp: merge == decode.MergeLogSumExp, Nodes: w * 12 * tc.maxSymbols})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for s := range streams {
		if err := d.Start(s, frames[s], max(w-s, 1)); err != nil {
			t.Fatal(err)
		}
	}
	var rep backend.BeamReport
	for rounds := 0; ; rounds++ {
		if rounds > 1000 {
			t.Fatalf("%s: the device search does not end", name)
		}
		if err := d.Frames(lg, enc); err != nil {
			t.Fatal(err)
		}
		if err := d.Tokens(tk, table); err != nil {
			t.Fatal(err)
		}
		if err := be.AddRows(lg, lg, tk); err != nil {
			t.Fatal(err)
		}
		if err := d.Round(lg); err != nil {
			t.Fatal(err)
		}
		if rounds%4 != 3 {
			continue
		}
		if err := d.Read(&rep); err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(rep.Done, false) {
			break
		}
	}
	cfg := decode.TDTBeam{Rule: decode.TDT{Blank: tc.blank, Durations: tc.durations, MaxSymbols: tc.maxSymbols}, Merge: merge}
	var res backend.BeamResult
	failed := 0
	for s := range streams {
		cfg.Width = max(w-s, 1)
		want, werr := tieHost(cfg, tab, encs[s], frames[s], width)
		if rep.Full[s] {
			t.Fatalf("%s: stream %d: the token pool is full", name, s)
		}
		if (werr != nil) != rep.Failed[s] {
			t.Errorf("%s: stream %d: device failed %v, host error %v", name, s, rep.Failed[s], werr)
			continue
		}
		if werr != nil {
			failed++
			continue
		}
		if err := d.Result(s, &res); err != nil {
			t.Fatal(err)
		}
		got := make([]Token, len(res.Token))
		for i := range got {
			got[i] = Token{ID: res.Token[i], Frame: int(res.Frame[i]), DurIdx: int(res.DurIdx[i]), P: res.P[i], PLog: res.PLog[i]}
			if len(tc.durations) > 0 {
				got[i].Dur = tc.durations[got[i].DurIdx]
			}
		}
		if err := sameTokens(got, want.toks); err != nil {
			t.Errorf("%s: stream %d: %v", name, s, err)
		} else if math.Abs(res.Score-want.score) > beamScoreTol*math.Max(1, math.Abs(want.score)) {
			t.Errorf("%s: stream %d: score %.9g, want %.9g", name, s, res.Score, want.score)
		}
	}
	return failed
}

// tieHost runs decode.TDTBeamSearch over the synthetic rows of one stream: a slot's last token
// is the token of the prediction request that wrote it.
func tieHost(cfg decode.TDTBeam, tab, enc []float32, frames, width int) (beamResult, error) {
	s, err := decode.NewTDTBeamSearch(cfg)
	if err != nil {
		return beamResult{}, err
	}
	slotTok := make([]int32, s.Slots())
	rows := make([]float32, cfg.Width*width)
	if err := s.AddFrames(frames); err != nil {
		return beamResult{}, err
	}
	s.Finish()
	for !s.Done() {
		for _, p := range s.Predictions() {
			slotTok[p.To] = p.Token
		}
		js := s.Joints()
		for i, j := range js {
			for k := range width {
				rows[i*width+k] = enc[j.Frame*width+k] + tab[int(slotTok[j.Slot])*width+k]
			}
		}
		if err := s.Advance(rows[:len(js)*width]); err != nil {
			return beamResult{}, err
		}
	}
	var r beamResult
	for _, st := range s.Tokens(0, nil) {
		r.toks = append(r.toks, Token{ID: st.Token, Frame: st.Frame, DurIdx: st.DurIdx, Dur: st.Dur, P: st.P, PLog: st.PLog})
	}
	r.score = s.Hyp(0).Score
	return r, nil
}
