package parakeet_test

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"

	"github.com/parleyhq/parley/internal/npy"
	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/models/parakeet"
	"github.com/parleyhq/parley/runtime/quant"
	"github.com/parleyhq/parley/runtime/tensor"
)

// hostNet is the prediction network and the joint in plain Go, float32 weights and activations
// (dot products accumulated in float64), written from the README's description of whisper.cpp's
// graphs (parakeet_build_graph_lstm_layer, _prediction and _joint, parakeet.cpp:2144-2315). It
// pins down the weights' layout (gate order, folded bias, the blank's embedding row, the joint's
// output rows) before the backends compute the same thing.
type hostNet struct {
	p, d, out int
	embed     []float32 // [V+1, P]
	lstm      []hostLSTM
	predW     []float32 // [P, P]
	predB     []float32 // [P]
	encW      []float32 // [P, d]
	encB      []float32 // [P]
	outW      []float32 // [out, P]
	outB      []float32 // [out]
}

type hostLSTM struct {
	wih, whh []float32 // [4P, P], gate blocks [i, f, o, g]
	b        []float32 // [4P] bias_ih + bias_hh
}

// hostState is one hypothesis's prediction-network state.
type hostState struct {
	h, c [][]float32 // [layers][P]
	pred []float32   // [P] joint.pred(h_top), the joint's prediction input
}

func f32s(t *testing.T, x *ggml.Tensor) []float32 {
	t.Helper()
	out := make([]float32, x.Elements())
	if err := quant.Dequantize(x.Type, x.Data, out); err != nil {
		t.Fatalf("%s: %v", x.Name, err)
	}
	return out
}

func newHostNet(t *testing.T, f *parakeet.File) *hostNet {
	w := f.Weights
	n := &hostNet{p: f.HParams.NPredDim, d: f.HParams.NAudioState, out: f.HParams.JointOutputs(),
		embed: f32s(t, w.Embed), predW: f32s(t, w.JointPred), predB: f32s(t, w.JointPredBias),
		encW: f32s(t, w.JointEnc), encB: f32s(t, w.JointEncBias), outW: f32s(t, w.JointOut), outB: f32s(t, w.JointOutBias)}
	for _, l := range w.LSTM {
		n.lstm = append(n.lstm, hostLSTM{wih: f32s(t, l.WIH), whh: f32s(t, l.WHH), b: f32s(t, l.Bias)})
	}
	return n
}

// matVec sets y = W·x (+ b), W [len(y), len(x)].
func matVec(y, w, x, b []float32) {
	k := len(x)
	for i := range y {
		s := 0.0
		for j, v := range w[i*k : (i+1)*k] {
			s += float64(v) * float64(x[j])
		}
		if b != nil {
			s += float64(b[i])
		}
		y[i] = float32(s)
	}
}

func sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

func (n *hostNet) newState() *hostState {
	s := &hostState{pred: make([]float32, n.p)}
	for range n.lstm {
		s.h = append(s.h, make([]float32, n.p))
		s.c = append(s.c, make([]float32, n.p))
	}
	return s
}

// predict advances s by token tok (the blank's id for the first call).
func (n *hostNet) predict(s *hostState, tok int32) {
	p := n.p
	x := n.embed[int(tok)*p : int(tok+1)*p]
	gi, gh := make([]float32, 4*p), make([]float32, 4*p)
	for l, L := range n.lstm {
		matVec(gi, L.wih, x, nil)
		matVec(gh, L.whh, s.h[l], L.b)
		h, c := s.h[l], s.c[l]
		for j := 0; j < p; j++ {
			i := sigmoid(gi[j] + gh[j])
			f := sigmoid(gi[p+j] + gh[p+j])
			o := sigmoid(gi[2*p+j] + gh[2*p+j])
			g := float32(math.Tanh(float64(gi[3*p+j] + gh[3*p+j])))
			c[j] = f*c[j] + i*g
			h[j] = o * float32(math.Tanh(float64(c[j])))
		}
		x = h
	}
	matVec(s.pred, n.predW, x, n.predB)
}

// joint writes z = W_out·relu(W_enc·enc + b_enc + pred) + b_out into z ([out]).
func (n *hostNet) joint(z, enc, pred []float32) {
	hid := make([]float32, n.p)
	matVec(hid, n.encW, enc, n.encB)
	for j := range hid {
		hid[j] = max(hid[j]+pred[j], 0)
	}
	matVec(z, n.outW, hid, n.outB)
}

type refClip struct {
	NEncFrames int    `json:"n_enc_frames"`
	BlankID    int32  `json:"blank_id"`
	Text       string `json:"text"`
	Tokens     []struct {
		ID      int32  `json:"id"`
		Frame   int    `json:"frame"`
		DurIdx  int    `json:"dur_idx"`
		DurVal  int    `json:"dur_val"`
		PStr    string `json:"p_str"`
		PLogStr string `json:"plog_str"`
	} `json:"tokens"`
	Trace struct {
		Steps [][]float64 `json:"steps"`
	} `json:"decode_trace"`
}

// TestPredictionAndJoint runs the host prediction network and joint on whisper.cpp's encoder
// output (tensors/<tag>/<clip>/encoder_out.npy) under the greedy TDT rule, and requires whisper.cpp's
// run: every joint call's logits within 1e-4 of joint_logits.npy and every prediction output
// within 1e-4 of pred_proj.npy (README §7: the prediction network and joint alone must match to
// 1e-4; numpy measured 3e-6), the same decision at every joint call, and the same tokens, frames,
// durations and text; p and plog within 1e-4 (they follow from the logits). The small model is
// generated; the 0.6b-v2 one only where sharedtest.ParakeetRandomModel allows it.
func TestPredictionAndJoint(t *testing.T) {
	for _, m := range []struct{ tag, shape string }{{"small-f32", "small"}, {"0.6b-v2-f32", "0.6b-v2"}} {
		t.Run(m.tag, func(t *testing.T) {
			f, err := parakeet.Open(sharedtest.ParakeetRandomModel(t, m.shape, false))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			net := newHostNet(t, f)
			rule := decode.TDT{Blank: f.Vocab.Blank(), Durations: f.Durations, MaxSymbols: f.HParams.NMaxTokens}
			for _, clip := range []string{"psx-cards-001", "jfk"} {
				checkClip(t, f, net, rule, m.tag, clip)
			}
		})
	}
}

func checkClip(t *testing.T, f *parakeet.File, net *hostNet, rule decode.TDT, tag, clip string) {
	dir := "reference/asr-transducer/tensors/" + tag + "/" + clip + "/"
	b, err := os.ReadFile(sharedtest.Path(t, "reference/asr-transducer/decode/"+tag+"/"+clip+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var r refClip
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	load := func(name string) (*npy.Array, int, int) {
		a, err := npy.ReadFile(sharedtest.Path(t, dir+name))
		if err != nil {
			t.Fatal(err)
		}
		rows, cols := a.Rows()
		return a, rows, cols
	}
	enc, frames, d := load("encoder_out.npy")
	logits, calls, width := load("joint_logits.npy")
	preds, nPred, p := load("pred_proj.npy")
	if frames != r.NEncFrames || d != net.d || width != net.out || p != net.p || calls != len(r.Trace.Steps) || nPred != len(r.Tokens)+1 {
		t.Fatalf("%s: shapes: encoder [%d %d], logits [%d %d], pred [%d %d]", clip, frames, d, calls, width, nPred, p)
	}

	var maxLogit, maxPred float64
	cmp := func(got, want []float32) float64 {
		m := 0.0
		for i := range got {
			m = max(m, math.Abs(float64(got[i])-float64(want[i])))
		}
		return m
	}
	st := net.newState()
	net.predict(st, rule.Blank)
	maxPred = cmp(st.pred, preds.Data[:p])
	npred := 1
	z := make([]float32, width)
	var toks []parakeet.Token
	s := decode.TDTState{}
	for call := 0; s.Frame < frames; call++ {
		if call >= calls {
			t.Fatalf("%s: more joint calls than the %d recorded", clip, calls)
		}
		net.joint(z, enc.Data[s.Frame*d:(s.Frame+1)*d], st.pred)
		maxLogit = max(maxLogit, cmp(z, logits.Data[call*width:(call+1)*width]))
		step, err := rule.Step(&s, z)
		if err != nil {
			t.Fatal(err)
		}
		want := r.Trace.Steps[call]
		if step.Frame != int(want[0]) || step.Token != int32(want[1]) || step.DurIdx != int(want[2]) {
			t.Fatalf("%s: joint call %d: frame %d token %d duration %d, recorded %v", clip, call, step.Frame, step.Token, step.DurIdx, want)
		}
		if !step.Emit {
			continue
		}
		toks = append(toks, parakeet.Token{ID: step.Token, Frame: step.Frame, DurIdx: step.DurIdx, Dur: step.Dur, P: step.P, PLog: step.PLog})
		net.predict(st, step.Token)
		maxPred = max(maxPred, cmp(st.pred, preds.Data[npred*p:(npred+1)*p]))
		npred++
	}
	if len(toks) != len(r.Tokens) {
		t.Fatalf("%s: %d tokens, recorded %d", clip, len(toks), len(r.Tokens))
	}
	var maxP, maxPL float64
	for i, w := range r.Tokens {
		g := toks[i]
		if g.ID != w.ID || g.Frame != w.Frame || g.DurIdx != w.DurIdx || g.Dur != w.DurVal {
			t.Fatalf("%s: token %d: %+v, recorded %+v", clip, i, g, w)
		}
		wp, _ := strconv.ParseFloat(w.PStr, 32)
		wl, _ := strconv.ParseFloat(w.PLogStr, 32)
		maxP = max(maxP, math.Abs(float64(g.P)-wp))
		maxPL = max(maxPL, math.Abs(float64(g.PLog)-wl))
	}
	if text := f.Vocab.Transcript(toks); text != r.Text {
		t.Errorf("%s: text %q, recorded %q", clip, text, r.Text)
	}
	t.Logf("%s: %d joint calls, %d tokens: max |Δ| logits %.3g, prediction %.3g, p %.3g, plog %.3g",
		clip, calls, len(toks), maxLogit, maxPred, maxP, maxPL)
	if maxLogit > 1e-4 || maxPred > 1e-4 || maxP > 1e-4 || maxPL > 1e-4 {
		t.Errorf("%s: over the 1e-4 tolerance", clip)
	}
}

// TestDecoderState: SaveState gives a slot's state in the layout it documents (each LSTM
// layer's h and c, then the prediction output), equal within 1e-4 to the host network's after
// the same tokens; LoadState into another decoder's slot goes on exactly as the first decoder
// does; bad slots and lengths are errors.
func TestDecoderState(t *testing.T) {
	f, err := parakeet.Open(sharedtest.ParakeetRandomModel(t, "small", false))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	net := newHostNet(t, f)
	blank := f.Vocab.Blank()
	for _, be := range sharedtest.Backends(t, 2) {
		t.Run(be.Name(), func(t *testing.T) {
			m, err := parakeet.Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			a, err := m.NewDecoder(3, 2)
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			b, err := m.NewDecoder(2, 2)
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			st := net.newState()
			from := int32(-1)
			for _, tok := range []int32{blank, 5, 17} {
				if err := a.Predict([]int32{tok}, []int32{from}, []int32{1}); err != nil {
					t.Fatal(err)
				}
				net.predict(st, tok)
				from = 1
			}
			var want []float32
			for l := range st.h {
				want = append(append(want, st.h[l]...), st.c[l]...)
			}
			want = append(want, st.pred...)
			saved := make([]float32, a.StateSize())
			if len(saved) != len(want) {
				t.Fatalf("state of %d values, want %d", len(saved), len(want))
			}
			if err := a.SaveState(1, saved); err != nil {
				t.Fatal(err)
			}
			for i := range want {
				if math.Abs(float64(saved[i]-want[i])) > 1e-4 {
					t.Fatalf("state value %d: %v, host %v", i, saved[i], want[i])
				}
			}
			if err := b.LoadState(0, saved); err != nil {
				t.Fatal(err)
			}
			if err := a.Predict([]int32{9}, []int32{1}, []int32{1}); err != nil {
				t.Fatal(err)
			}
			if err := b.Predict([]int32{9}, []int32{0}, []int32{0}); err != nil {
				t.Fatal(err)
			}
			ga, gb := make([]float32, a.StateSize()), make([]float32, b.StateSize())
			if err := a.SaveState(1, ga); err != nil {
				t.Fatal(err)
			}
			if err := b.SaveState(0, gb); err != nil {
				t.Fatal(err)
			}
			for i := range ga {
				if ga[i] != gb[i] {
					t.Fatalf("after a loaded state, value %d: %v, the original decoder's %v", i, gb[i], ga[i])
				}
			}
			if a.SaveState(3, ga) == nil || a.SaveState(0, ga[1:]) == nil || b.LoadState(-1, gb) == nil || b.LoadState(0, nil) == nil {
				t.Error("a bad slot or length is no error")
			}
		})
	}
}

// TestDecoderSetLive: a decoder told that only its first slots are live (SetLive) carries those,
// and the slots its steps write beyond them, exactly as one that carries every slot; a slot
// written beyond the live ones is read back by the next step; a bad count is an error.
func TestDecoderSetLive(t *testing.T) {
	f, err := parakeet.Open(sharedtest.ParakeetRandomModel(t, "small", false))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	blank := f.Vocab.Blank()
	for _, be := range sharedtest.Backends(t, 2) {
		t.Run(be.Name(), func(t *testing.T) {
			m, err := parakeet.Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			var decs [2]*parakeet.Decoder
			for i := range decs {
				if decs[i], err = m.NewDecoder(8, 3); err != nil {
					t.Fatal(err)
				}
				defer decs[i].Close()
			}
			if err := decs[1].SetLive(2); err != nil {
				t.Fatal(err)
			}
			steps := []struct{ tok, from, to []int32 }{
				{[]int32{blank, blank}, []int32{-1, -1}, []int32{0, 1}},
				{[]int32{5, 7, 9}, []int32{0, 1, 0}, []int32{5, 1, 6}},
				{[]int32{11, 3}, []int32{5, 6}, []int32{0, 7}},
				{[]int32{4}, []int32{7}, []int32{1}},
			}
			for k, st := range steps {
				for _, d := range decs {
					if err := d.Predict(st.tok, st.from, st.to); err != nil {
						t.Fatal(err)
					}
				}
				for _, s := range []int32{0, 1} {
					a, b := make([]float32, decs[0].StateSize()), make([]float32, decs[1].StateSize())
					decs[0].SaveState(s, a)
					decs[1].SaveState(s, b)
					for i := range a {
						if a[i] != b[i] {
							t.Fatalf("step %d, slot %d, value %d: %v with 2 live slots, %v with all", k, s, i, b[i], a[i])
						}
					}
				}
			}
			if decs[1].SetLive(-1) == nil || decs[1].SetLive(9) == nil {
				t.Error("a bad live count is no error")
			}
		})
	}
}

// TestJointMulti: the joint rows of several encoder projections in one call (JointMulti) are
// those of one Joint call per projection, and near the host network's; a call of the
// same groups again allocates nothing; bad groups are errors. Pure Go computes a row alike
// whatever rows go with it: bit for bit. The native CPU backend multiplies one row by a
// matrix-vector kernel and several by a matrix product, which round differently: within 1e-6
// relative (|Δ| ≤ 1e-6·max(1, |z|)); rows of calls of two or more rows stay bit for bit. CUDA's
// products choose their kernels by shape: every row within 1e-5 relative.
func TestJointMulti(t *testing.T) {
	for _, f16 := range []bool{false, true} {
		t.Run(map[bool]string{false: "f32", true: "f16"}[f16], func(t *testing.T) { testJointMulti(t, f16) })
	}
}

func testJointMulti(t *testing.T, f16 bool) {
	f, err := parakeet.Open(sharedtest.ParakeetRandomModel(t, "small", f16))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	net := newHostNet(t, f)
	P, blank := f.HParams.NPredDim, f.Vocab.Blank()
	rng := rand.New(rand.NewPCG(3, 5))
	// Three projections of different lengths, random values of the scale of real ones.
	projRows := []int{7, 3, 5}
	proj := make([][]float32, len(projRows))
	for i, n := range projRows {
		proj[i] = make([]float32, n*P)
		for k := range proj[i] {
			proj[i][k] = float32(rng.NormFloat64())
		}
	}
	// Slot s holds the state after the blank and token s+1 (the host network's states[s]).
	const slots = 5
	states := make([]*hostState, slots)
	tokens, from, to := make([]int32, slots), make([]int32, slots), make([]int32, slots)
	for s := range slots {
		states[s] = net.newState()
		net.predict(states[s], blank)
		net.predict(states[s], int32(s+1))
		tokens[s], from[s], to[s] = int32(s+1), int32(s), int32(s)
	}
	type group struct {
		proj          int
		frames, slots []int32
	}
	calls := [][]group{
		{{0, []int32{2, 0, 6}, []int32{1, 4, 1}}, {1, nil, nil}, {2, []int32{4}, []int32{0}}, {0, []int32{5, 5}, []int32{2, 3}}},
		{{1, []int32{0, 1, 2}, []int32{3, 3, 3}}, {2, []int32{0, 1, 2, 3, 4}, []int32{0, 1, 2, 3, 4}}},
		{{2, []int32{3}, []int32{4}}},
		{{0, []int32{1}, []int32{0}}, {1, []int32{2}, []int32{1}}, {2, []int32{0}, []int32{2}}},
	}
	for _, be := range sharedtest.Backends(t, 2) {
		t.Run(be.Name(), func(t *testing.T) {
			m, err := parakeet.Load(f, be)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			d, err := m.NewDecoder(slots, 8)
			if err != nil {
				t.Fatal(err)
			}
			defer d.Close()
			blanks, none := make([]int32, slots), make([]int32, slots)
			for s := range slots {
				blanks[s], none[s] = blank, -1
			}
			if err := d.Predict(blanks, none, to); err != nil {
				t.Fatal(err)
			}
			if err := d.Predict(tokens, from, to); err != nil {
				t.Fatal(err)
			}
			encs := make([]backend.Tensor, len(proj))
			for i, p := range proj {
				if encs[i], err = be.Alloc(tensor.F32, projRows[i], P); err != nil {
					t.Fatal(err)
				}
				defer encs[i].Close()
				if err := be.Write(encs[i], 0, p); err != nil {
					t.Fatal(err)
				}
			}
			W := d.Width()
			got, want, host, hid := make([]float32, 8*W), make([]float32, 8*W), make([]float32, W), make([]float32, P)
			maxHost, maxRel := 0.0, 0.0
			tolRel := 1e-6
			if be.Name() == "cuda" {
				tolRel = 1e-5
			}
			for c, call := range calls {
				groups := make([]parakeet.JointGroup, len(call))
				at := 0
				for i, g := range call {
					groups[i] = parakeet.JointGroup{Enc: encs[g.proj], Frames: g.frames, Slots: g.slots}
					if err := d.Joint(want[at*W:], encs[g.proj], g.frames, g.slots); err != nil {
						t.Fatal(err)
					}
					for r := range g.frames {
						e, p := proj[g.proj][int(g.frames[r])*P:][:P], states[g.slots[r]].pred
						for k := range hid {
							hid[k] = max(e[k]+p[k], 0)
						}
						matVec(host, net.outW, hid, net.outB)
						for k := range host {
							maxHost = max(maxHost, math.Abs(float64(host[k]-want[(at+r)*W+k])))
						}
					}
					at += len(g.frames)
				}
				clear(got)
				if err := d.JointMulti(got, groups); err != nil {
					t.Fatal(err)
				}
				at = 0
				for _, g := range call {
					for r := range g.frames {
						for k := (at + r) * W; k < (at+r+1)*W; k++ {
							rel := math.Abs(float64(got[k]-want[k])) / max(1, math.Abs(float64(want[k])))
							maxRel = max(maxRel, rel)
							exact := be.Name() == "purego" || be.Name() == "cpu" && len(g.frames) > 1
							if got[k] != want[k] && (exact || rel > tolRel) {
								t.Fatalf("call %d: row %d value %d: %v in one call, %v a call per group", c, k/W, k%W, got[k], want[k])
							}
						}
					}
					at += len(g.frames)
				}
				if a := testing.AllocsPerRun(5, func() { d.JointMulti(got, groups) }); a != 0 {
					t.Errorf("call %d: %v allocations a call of the same groups", c, a)
				}
			}
			t.Logf("max |Δ| %.3g relative from a call per group, %.3g from the host network's joint", maxRel, maxHost)
			// F16 matrices multiply activations rounded to F16 (relative error up to 2⁻¹¹).
			tol := map[bool]float64{false: 1e-4, true: 5e-3}[f16]
			if maxHost > tol {
				t.Errorf("max |Δ| %.3g from the host network's joint, over %g", maxHost, tol)
			}
			bad := [][]parakeet.JointGroup{
				{{Enc: encs[0], Frames: []int32{0, 1}, Slots: []int32{0}}},
				{{Enc: encs[0], Frames: []int32{0}, Slots: []int32{slots}}},
				{{Enc: encs[0], Frames: []int32{0}, Slots: []int32{-1}}},
				{{Enc: nil, Frames: []int32{0}, Slots: []int32{0}}},
				{{Enc: encs[0], Frames: make([]int32, 5), Slots: make([]int32, 5)}, {Enc: encs[1], Frames: make([]int32, 4), Slots: make([]int32, 4)}},
			}
			for i, g := range bad {
				if err := d.JointMulti(got, g); err == nil {
					t.Errorf("bad call %d is no error", i)
				}
			}
			if err := d.JointMulti(got[:W], calls0(encs[0])); err == nil {
				t.Error("a destination too short is no error")
			}
		})
	}
}

// calls0 is two rows of enc, at frame 0 of slot 0.
func calls0(enc backend.Tensor) []parakeet.JointGroup {
	return []parakeet.JointGroup{{Enc: enc, Frames: []int32{0, 0}, Slots: []int32{0, 0}}}
}
