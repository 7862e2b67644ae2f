package parakeet

import (
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/tensor"
)

// The device greedy loop against the host one (Decoder.Joint and decode.TDT.Step, the
// scheduler's loop): the same tokens, frames and durations, p and plog within greedyTol.
const greedyTol = 1e-5

// greedyClip is one clip's joint encoder projection on a backend.
type greedyClip struct {
	name   string
	proj   backend.Tensor
	frames int
}

// projectClip projects encoder output enc [frames, d] into a clip of m's backend.
func projectClip(t *testing.T, m *Model, name string, enc []float32, frames int) greedyClip {
	t.Helper()
	be, h := m.Backend(), m.HParams
	e, err := be.Alloc(tensor.F32, frames, h.NAudioState)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if err := be.Write(e, 0, enc); err != nil {
		t.Fatal(err)
	}
	p, err := be.Alloc(tensor.F32, frames, h.NPredDim)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if err := m.ProjectEncoder(p, e); err != nil {
		t.Fatal(err)
	}
	return greedyClip{name: name, proj: p, frames: frames}
}

// randomClips makes n clips of random encoder output, 1 to maxFrames frames long.
func randomClips(t *testing.T, m *Model, n, maxFrames int, seed uint64) []greedyClip {
	rng := rand.New(rand.NewPCG(seed, 3))
	var cs []greedyClip
	for i := range n {
		frames := 1 + rng.IntN(maxFrames)
		enc := make([]float32, frames*m.HParams.NAudioState)
		for k := range enc {
			enc[k] = float32(rng.NormFloat64())
		}
		cs = append(cs, projectClip(t, m, "random"+string(rune('0'+i)), enc, frames))
	}
	return cs
}

// hostGreedy decodes c on the host, as the scheduler's host loop does.
func hostGreedy(t *testing.T, m *Model, c greedyClip) []Token {
	t.Helper()
	h := m.HParams
	rule := decode.TDT{Blank: int32(h.NVocab), Durations: m.Durations, MaxSymbols: h.NMaxTokens}
	d, err := m.NewDecoder(1, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	row := make([]float32, d.Width())
	if err := d.Predict([]int32{rule.Blank}, []int32{-1}, []int32{0}); err != nil {
		t.Fatal(err)
	}
	var toks []Token
	var s decode.TDTState
	for s.Frame < c.frames {
		if err := d.Joint(row, c.proj, []int32{int32(s.Frame)}, []int32{0}); err != nil {
			t.Fatal(err)
		}
		st, err := rule.Step(&s, row)
		if err != nil {
			t.Fatal(err)
		}
		if st.Emit {
			toks = append(toks, Token{ID: st.Token, Frame: st.Frame, DurIdx: st.DurIdx, Dur: st.Dur, P: st.P, PLog: st.PLog})
			if err := d.Predict([]int32{st.Token}, []int32{0}, []int32{0}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return toks
}

// downloads is the backend's count of device-to-host copies, where it keeps one.
type downloads interface{ Downloads() (int64, error) }

// deviceGreedy decodes clips on a greedy loop of rows rows read every ring steps: the first
// half of the rows start at once, the others join after the first read, and each row takes
// the next clip when its own is done. It checks that the loop reads the device once a Read.
func deviceGreedy(t *testing.T, m *Model, clips []greedyClip, rows, ring int) [][]Token {
	t.Helper()
	l, err := m.NewGreedyLoop(rows, ring)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dl, _ := m.Backend().(downloads)
	var before int64
	if dl != nil {
		if before, err = dl.Downloads(); err != nil {
			t.Fatal(err)
		}
	}
	out := make([][]Token, len(clips))
	bufs := make([][]Token, rows)
	done := make([]bool, rows)
	clipOf := make([]int, rows)
	next := 0
	start := func(r int) {
		if next == len(clips) {
			clipOf[r] = -1
			return
		}
		c := clips[next]
		if err := l.Start(r, c.proj, c.frames); err != nil {
			t.Fatal(err)
		}
		clipOf[r], bufs[r] = next, make([]Token, 0, c.frames*m.HParams.NMaxTokens)
		next++
	}
	for r := range rows {
		clipOf[r] = -1
		if r < (rows+1)/2 {
			start(r)
		}
	}
	reads, steps := 0, 0
	for {
		for range ring {
			if err := l.Step(); err != nil {
				t.Fatal(err)
			}
			steps++
		}
		if err := l.Read(bufs, done); err != nil {
			t.Fatal(err)
		}
		reads++
		busy := false
		for r := range rows {
			if clipOf[r] >= 0 && done[r] {
				out[clipOf[r]], bufs[r] = bufs[r], nil
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
		if steps > 1<<20 {
			t.Fatal("the loop does not end")
		}
	}
	if dl != nil {
		after, err := dl.Downloads()
		if err != nil {
			t.Fatal(err)
		}
		if after-before != int64(reads) {
			t.Errorf("%d device-to-host copies in %d steps, %d reads: want one a read", after-before, steps, reads)
		}
		t.Logf("%d steps, %d reads, %d device-to-host copies", steps, reads, after-before)
	}
	return out
}

// compareGreedy requires the device loop's tokens to be the host loop's.
func compareGreedy(t *testing.T, m *Model, clips []greedyClip, rows, ring int) {
	t.Helper()
	got := deviceGreedy(t, m, clips, rows, ring)
	for i, c := range clips {
		want := hostGreedy(t, m, c)
		g := got[i]
		if len(g) != len(want) {
			t.Errorf("%s: %d tokens, the host loop %d", c.name, len(g), len(want))
			continue
		}
		var mp, ml float64
		for k, w := range want {
			if g[k].ID != w.ID || g[k].Frame != w.Frame || g[k].DurIdx != w.DurIdx || g[k].Dur != w.Dur {
				t.Errorf("%s: token %d: %+v, the host loop %+v", c.name, k, g[k], w)
				break
			}
			mp, ml = max(mp, math.Abs(float64(g[k].P-w.P))), max(ml, math.Abs(float64(g[k].PLog-w.PLog)))
		}
		if mp > greedyTol || ml > greedyTol {
			t.Errorf("%s: max |Δ| p %.3g, plog %.3g (≤ %g)", c.name, mp, ml, greedyTol)
		}
		t.Logf("%s: %d frames, %d tokens, max |Δ| p %.3g, plog %.3g", c.name, c.frames, len(g), mp, ml)
	}
}

// greedyBackends are the backends under test that decide on the device.
func greedyBackends(t *testing.T) []backend.Backend {
	var bs []backend.Backend
	for _, be := range sharedtest.Backends(t, 2) {
		if _, ok := be.(backend.GreedyTransducer); ok {
			bs = append(bs, be)
		} else {
			t.Logf("%s decides on the host: no device loop to test", be.Name())
		}
	}
	return bs
}

// referenceClips are the clips of reference/asr-transducer.
var referenceClips = []string{"psx-cards-001", "jfk", "psx-cards-002", "ls-tc-1089-134686-0001", "ami-ES2011a-headset0-40s-46s",
	"psx-librivox-0870", "ljs-LJ001-0005", "ljs-LJ001-0014", "ls-dc-2412-153948-0000", "concat-40s"}

// hostEncoded is one clip's encoder output, computed on a host backend.
type hostEncoded struct {
	name   string
	enc    []float32
	frames int
}

// encodeOnHost encodes the reference clips with f's model on a host backend (the native CPU
// one where built, else the pure-Go one): the device loop's test needs encoder outputs, not
// the emulated encoder's own.
func encodeOnHost(t *testing.T, f *File) []hostEncoded {
	t.Helper()
	be, _, err := backend.New("cpu", backend.Options{Threads: 2})
	if err != nil {
		if be, _, err = backend.New("purego", backend.Options{Threads: 2}); err != nil {
			t.Fatal(err)
		}
	}
	defer be.Close()
	m, err := Load(f, be)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var out []hostEncoded
	for _, name := range referenceClips {
		path := "data/asr/wav/" + name + ".wav"
		if name == "concat-40s" {
			path = "reference/asr-transducer/audio/concat-40s.wav"
		}
		b, err := os.ReadFile(sharedtest.Path(t, path))
		if err != nil {
			t.Fatal(err)
		}
		samples, _, err := audio.Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		mel, err := m.FrontEnd.LogMel(nil, samples)
		if err != nil {
			t.Fatal(err)
		}
		melRows := len(mel) / m.HParams.NMels
		frames := EncoderFrames(melRows)
		enc, err := m.NewEncoder(melRows, frames)
		if err != nil {
			t.Fatal(err)
		}
		y, err := enc.Encode([][]float32{mel})
		if err != nil {
			t.Fatal(err)
		}
		h := hostEncoded{name: name, enc: make([]float32, frames*m.HParams.NAudioState), frames: frames}
		if err := be.Read(y, 0, h.enc); err != nil {
			t.Fatal(err)
		}
		enc.Close()
		out = append(out, h)
	}
	return out
}

// TestGreedyLoop decodes the encoder outputs of every reference clip and random ones on the
// device loop, three rows at once, rows joining as others finish, and on the host; then in
// chunks going on from one another (chunkedGreedy), as a live stream's are.
func TestGreedyLoop(t *testing.T) {
	f, err := Open(sharedtest.ParakeetRandomModel(t, "small", false))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	bes := greedyBackends(t)
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
			clips = append(clips, randomClips(t, m, 5, 60, 1)...)
			compareGreedy(t, m, clips, 3, 8)
			t.Run("chunks", func(t *testing.T) { compareChunked(t, m, clips, 3, 8, 12, 7) })
		})
	}
}

// TestGreedyLoopRNNT: a file without durations (a plain RNN-T) decodes on the device loop as
// on the host, whole or in chunks: a blank moves on one frame, MaxSymbols tokens at most a
// frame.
func TestGreedyLoopRNNT(t *testing.T) {
	h := tinyHP
	h.NTDTDurations = 0
	f := loadableFile(t, h, 5)
	for _, be := range greedyBackends(t) {
		t.Run(be.Name(), func(t *testing.T) {
			m, err := Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			clips := randomClips(t, m, 6, 40, 2)
			compareGreedy(t, m, clips, 4, 5)
			t.Run("chunks", func(t *testing.T) { compareChunked(t, m, clips, 4, 5, 6, 8) })
		})
	}
}

// TestGreedyLoopArgs: the loop refuses bad rows and too many steps between reads, and is
// refused by a backend that decides on the host.
func TestGreedyLoopArgs(t *testing.T) {
	f := loadableFile(t, tinyHP, 6)
	for _, be := range sharedtest.Backends(t, 1) {
		t.Run(be.Name(), func(t *testing.T) {
			m, err := Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			l, err := m.NewGreedyLoop(2, 2)
			if _, ok := be.(backend.GreedyTransducer); !ok {
				if !errors.Is(err, ErrNoGreedyLoop) {
					t.Fatalf("NewGreedyLoop on %s: %v, want ErrNoGreedyLoop", be.Name(), err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			c := randomClips(t, m, 1, 5, 3)[0]
			if l.Start(2, c.proj, c.frames) == nil || l.Start(0, c.proj, c.frames+1) == nil || l.Stop(-1) == nil {
				t.Error("a bad row or clip accepted")
			}
			if l.Save(0, &GreedyCarry{}) == nil {
				t.Error("a row saved before any read")
			}
			state := make([]float32, l.StateSize())
			blank := int32(m.HParams.NVocab)
			for _, bad := range []struct {
				first, end int
				c          *GreedyCarry
			}{
				{0, 1, nil},
				{2, 3, &GreedyCarry{Frame: 1}},                                      // before the clip's first frame
				{0, c.frames + 1, &GreedyCarry{}},                                   // past the projections
				{0, 1, &GreedyCarry{Started: true, State: state[1:]}},               // a state of the wrong size
				{0, 1, &GreedyCarry{Started: true, State: state, Token: blank + 1}}, // a token past the blank
			} {
				if l.Continue(0, c.proj, bad.first, bad.end, bad.c) == nil {
					t.Errorf("a row continued at [%d, %d) from %+v", bad.first, bad.end, bad.c)
				}
			}
			for range 2 {
				if err := l.Step(); err != nil {
					t.Fatal(err)
				}
			}
			if l.Step() == nil {
				t.Error("a third step without a read accepted")
			}
			if l.Read(make([][]Token, 1), make([]bool, 2)) == nil {
				t.Error("a read into too few rows accepted")
			}
			if l.Save(0, &GreedyCarry{}) == nil {
				t.Error("a row saved with steps since the last read")
			}
			// Steps and reads allocate nothing.
			toks, done := [][]Token{make([]Token, 0, 64), nil}, make([]bool, 2)
			if err := l.Read(toks, done); err != nil {
				t.Fatal(err)
			}
			c = randomClips(t, m, 1, 5, 4)[0]
			if err := l.Start(0, c.proj, c.frames); err != nil {
				t.Fatal(err)
			}
			if n := testing.AllocsPerRun(5, func() {
				toks[0] = toks[0][:0]
				for range 2 {
					if err := l.Step(); err != nil {
						t.Fatal(err)
					}
				}
				if err := l.Read(toks, done); err != nil {
					t.Fatal(err)
				}
			}); n != 0 {
				t.Errorf("%v allocations a step and read", n)
			}
		})
	}
}

// loadableFile is synthFile with positive batch-norm variances, which Load requires.
func loadableFile(t *testing.T, h HParams, seed uint64) *File {
	f := synthFile(t, h, seed)
	for _, x := range f.Tensors {
		if strings.HasSuffix(x.Name, "running_var") && x.Type == tensor.F32 {
			for i := 0; i+4 <= len(x.Data); i += 4 {
				v := math.Float32frombits(binary.LittleEndian.Uint32(x.Data[i:]))
				binary.LittleEndian.PutUint32(x.Data[i:], math.Float32bits(float32(math.Abs(float64(v)))+0.5))
			}
		}
	}
	return f
}

// chunkStream is one clip decoded in chunks, as a live stream's are.
type chunkStream struct {
	c      greedyClip
	bounds []int // the chunks' ends, the last the clip's
	next   int   // the next chunk
	carry  GreedyCarry
	toks   []Token
}

// hostChunk decodes frames [first, end) of s's clip on the host, as the scheduler's host loop
// decodes a live chunk: the carried state loaded into a slot of d, the pending token predicted
// first, each emitted token's prediction left pending until the next decision needs it, the
// state saved at the end.
func hostChunk(t *testing.T, m *Model, d *Decoder, s *chunkStream, first, end int) {
	t.Helper()
	h := m.HParams
	rule := decode.TDT{Blank: int32(h.NVocab), Durations: m.Durations, MaxSymbols: h.NMaxTokens}
	c := &s.carry
	if c.Started {
		if err := d.LoadState(0, c.State); err != nil {
			t.Fatal(err)
		}
	}
	row := make([]float32, d.Width())
	st := decode.TDTState{Frame: c.Frame}
	for {
		if c.Pending {
			from := int32(0)
			if !c.Started {
				from = -1
			}
			if err := d.Predict([]int32{c.Token}, []int32{from}, []int32{0}); err != nil {
				t.Fatal(err)
			}
			c.Started, c.Pending = true, false
		}
		for st.Frame < end && !c.Pending {
			if err := d.Joint(row, s.c.proj, []int32{int32(st.Frame)}, []int32{0}); err != nil {
				t.Fatal(err)
			}
			step, err := rule.Step(&st, row)
			if err != nil {
				t.Fatal(err)
			}
			if step.Emit {
				s.toks = append(s.toks, Token{ID: step.Token, Frame: step.Frame, DurIdx: step.DurIdx, Dur: step.Dur, P: step.P, PLog: step.PLog})
				c.Token, c.Pending = step.Token, true
			}
		}
		if st.Frame >= end {
			break
		}
	}
	c.Frame = st.Frame
	if len(c.State) != d.StateSize() {
		c.State = make([]float32, d.StateSize())
	}
	if err := d.SaveState(0, c.State); err != nil {
		t.Fatal(err)
	}
}

// chunkedGreedy decodes clips in chunks of 1 to maxChunk frames on a greedy loop of rows rows
// read every ring steps, the chunks of up to rows clips at once, a clip's rows changing from
// round to round, every third chunk of a clip on a host Decoder instead (the state moving
// between the loop and the decoder's slot), and each clip's second chunk first decoded for a
// few steps and dropped, then decoded again from the same carry (a failed chunk rolled back).
func chunkedGreedy(t *testing.T, m *Model, clips []greedyClip, rows, ring, maxChunk int, seed uint64) [][]Token {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, 5))
	l, err := m.NewGreedyLoop(rows, ring)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	d, err := m.NewDecoder(1, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	be := m.Backend()
	ss := make([]*chunkStream, len(clips))
	for i, c := range clips {
		s := &chunkStream{c: c, carry: GreedyCarry{Token: int32(m.HParams.NVocab), Pending: true}, toks: []Token{}}
		for end := 0; end < c.frames; {
			end = min(c.frames, end+1+rng.IntN(maxChunk))
			s.bounds = append(s.bounds, end)
		}
		ss[i] = s
	}
	bufs, done := make([][]Token, rows), make([]bool, rows)
	rowOf := make([]int, rows) // the stream on each row, -1 none
	// run decodes the chunks just continued to their ends.
	run := func(keep bool) {
		for steps := 0; ; {
			for range ring {
				if err := l.Step(); err != nil {
					t.Fatal(err)
				}
			}
			if err := l.Read(bufs, done); err != nil {
				t.Fatal(err)
			}
			busy := false
			for r := range rows {
				busy = busy || (rowOf[r] >= 0 && !done[r])
			}
			if steps += ring; !busy || (!keep && steps >= 2*ring) {
				return
			}
			if steps > 1<<20 {
				t.Fatal("the loop does not end")
			}
		}
	}
	// view is frames [first, end) of s's projections.
	view := func(s *chunkStream, first, end int) backend.Tensor {
		v, err := be.View(s.c.proj, first, end-first)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { v.Close() })
		return v
	}
	jumps, skips, pending := 0, 0, 0 // chunks on the loop that start past their first frame, past their end, with a token pending
	for round := 0; ; round++ {
		for r := range rows {
			rowOf[r] = -1
		}
		var batch []*chunkStream
		for _, s := range ss {
			if s.next < len(s.bounds) && len(batch) < rows {
				batch = append(batch, s)
			}
		}
		if len(batch) == 0 {
			break
		}
		onLoop := false
		for k, s := range batch {
			first := 0
			if s.next > 0 {
				first = s.bounds[s.next-1]
			}
			end := s.bounds[s.next]
			if s.next%3 == 2 {
				hostChunk(t, m, d, s, first, end)
				s.next++
				continue
			}
			r := (k + round) % rows
			if s.next == 1 { // a chunk that fails: dropped, its tokens too
				if err := l.Continue(r, view(s, first, end), first, end, &s.carry); err != nil {
					t.Fatal(err)
				}
				rowOf[r], bufs[r] = len(ss), nil
				run(false)
				if err := l.Stop(r); err != nil {
					t.Fatal(err)
				}
			}
			if err := l.Continue(r, view(s, first, end), first, end, &s.carry); err != nil {
				t.Fatal(err)
			}
			if s.carry.Frame > first {
				jumps++
			}
			if s.carry.Frame >= end {
				skips++
			}
			if s.carry.Pending && s.carry.Started {
				pending++
			}
			rowOf[r], bufs[r] = k, s.toks
			onLoop = true
		}
		if !onLoop {
			continue
		}
		run(true)
		for r, k := range rowOf {
			if k < 0 {
				continue
			}
			s := batch[k]
			s.toks = bufs[r]
			if err := l.Save(r, &s.carry); err != nil {
				t.Fatal(err)
			}
			s.next++
			if err := l.Stop(r); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Logf("chunks on the loop: %d start past their first frame, %d past their end, %d with a token pending", jumps, skips, pending)
	out := make([][]Token, len(ss))
	for i, s := range ss {
		out[i] = s.toks
	}
	return out
}

// compareChunked requires the tokens of clips decoded in chunks (chunkedGreedy) to be those of
// each whole clip decoded at once on the host.
func compareChunked(t *testing.T, m *Model, clips []greedyClip, rows, ring, maxChunk int, seed uint64) {
	t.Helper()
	got := chunkedGreedy(t, m, clips, rows, ring, maxChunk, seed)
	for i, c := range clips {
		want := hostGreedy(t, m, c)
		g := got[i]
		if len(g) != len(want) {
			t.Errorf("%s: %d tokens in chunks, %d at once", c.name, len(g), len(want))
			continue
		}
		var mp, ml float64
		for k, w := range want {
			if g[k].ID != w.ID || g[k].Frame != w.Frame || g[k].DurIdx != w.DurIdx || g[k].Dur != w.Dur {
				t.Errorf("%s: token %d: %+v in chunks, %+v at once", c.name, k, g[k], w)
				break
			}
			mp, ml = max(mp, math.Abs(float64(g[k].P-w.P))), max(ml, math.Abs(float64(g[k].PLog-w.PLog)))
		}
		if mp > greedyTol || ml > greedyTol {
			t.Errorf("%s: max |Δ| p %.3g, plog %.3g (≤ %g)", c.name, mp, ml, greedyTol)
		}
		t.Logf("%s: %d frames, %d tokens in chunks, max |Δ| p %.3g, plog %.3g", c.name, c.frames, len(g), mp, ml)
	}
}
