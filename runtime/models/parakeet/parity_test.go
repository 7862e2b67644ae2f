package parakeet

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strconv"
	"testing"

	"github.com/parleyhq/parley/internal/npy"
	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	_ "github.com/parleyhq/parley/runtime/backend/all"
	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/tensor"
)

// Tolerances against whisper.cpp at full precision (README §7 of reference/asr-transducer):
// whisper.cpp computes the subsampling's convolutions in F16 (quirk 1), this code in F32.
const (
	tolStage  = 1.5e-2 // pre_encode_out, layer outputs, encoder_out (rms ≈ 1); numpy measured 7.2e-3
	tolLogits = 3e-2   // joint logits along the reference path (rms ≈ 2); numpy measured 1.4e-2
	tolAlone  = 1e-4   // prediction network and joint fed whisper.cpp's encoder_out; numpy 3e-6
	tolP      = 5e-3   // p; numpy measured 1.6e-3
	tolPLog   = 2e-2   // plog; numpy measured 5.9e-3
	// A greedy decision may differ from whisper.cpp's only after a step whose recorded top-1/top-2
	// margin is below twice the logit tolerance.
	tieMargin = 2 * tolLogits
)

// refTrace is a reference's decode trace and its p and plog strings (exact float32s).
type refTrace struct {
	Tokens []struct {
		PStr    string `json:"p_str"`
		PLogStr string `json:"plog_str"`
	} `json:"tokens"`
	Trace struct {
		Steps [][]float64 `json:"steps"`
	} `json:"decode_trace"`
}

func readTrace(t *testing.T, tag, clip string) *refTrace {
	t.Helper()
	b, err := os.ReadFile(sharedtest.Path(t, "reference/asr-transducer/decode/"+tag+"/"+clip+".json"))
	if err != nil {
		t.Fatal(err)
	}
	var r refTrace
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

func readNpy(t *testing.T, tag, clip, name string) *npy.Array {
	t.Helper()
	a, err := npy.ReadFile(sharedtest.Path(t, "reference/asr-transducer/tensors/"+tag+"/"+clip+"/"+name))
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// maxDiff returns the largest |a-b| and the rms difference.
func maxDiff(a, b []float32) (mx, rms float64) {
	for i := range a {
		d := math.Abs(float64(a[i]) - float64(b[i]))
		mx = max(mx, d)
		rms += d * d
	}
	return mx, math.Sqrt(rms / float64(max(len(a), 1)))
}

func readTensor(t *testing.T, be backend.Backend, x backend.Tensor) []float32 {
	t.Helper()
	out := make([]float32, x.Rows()*x.Cols())
	if err := be.Read(x, 0, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// parityModels are the models the parity tests run: the small one always, the 0.6b-v2 one where
// sharedtest.ParakeetRandomModel allows it (PARLEY_PARAKEET_LARGE=1).
var parityModels = []struct{ tag, shape string }{{"small-f32", "small"}, {"0.6b-v2-f32", "0.6b-v2"}}

// parityClips is how many of refClips a backend decodes: all on the host backends; on the CUDA
// backend the two tensor clips only, which keeps its run on the CPU emulation to a few minutes
// (PARLEY_PARAKEET_ALL_CLIPS=1 decodes all ten there too).
func parityClips(be backend.Backend) []string {
	if be.Name() == "cuda" && os.Getenv("PARLEY_PARAKEET_ALL_CLIPS") != "1" {
		return refClips[:2]
	}
	return refClips
}

// TestParity runs the model on every backend against whisper.cpp's references: the encoder's
// stages on whisper.cpp's log-mel of the two tensor clips, the prediction network and joint fed
// whisper.cpp's encoder output, the joint along whisper.cpp's decision path after this
// encoder, and a greedy decode of every clip from its audio (all clips encoded in one batched
// call, decoded in batched prediction and joint calls): tokens, frames, durations, p, plog and
// text.
func TestParity(t *testing.T) {
	for _, pm := range parityModels {
		t.Run(pm.tag, func(t *testing.T) {
			f, err := Open(sharedtest.ParakeetRandomModel(t, pm.shape, false))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, be := range sharedtest.Backends(t, 2) {
				t.Run(be.Name(), func(t *testing.T) {
					m, err := Load(f, be)
					if err != nil {
						t.Fatal(err)
					}
					defer m.Close()
					parity(t, m, pm.tag, parityClips(be))
				})
			}
		})
	}
}

// parityClip is one clip of a parity run: its references and this front end's log-mel.
type parityClip struct {
	name    string
	ref     *refDecode
	trace   *refTrace
	mel     []float32
	melRows int
}

func parity(t *testing.T, m *Model, tag string, clips []string) {
	be, h := m.Backend(), m.HParams
	d, p := h.NAudioState, h.NPredDim
	var cs []parityClip
	maxMel, frames := 0, 0
	for _, c := range clips {
		r := readRef(t, tag, c)
		mel, err := m.FrontEnd.LogMel(nil, readWav(t, r.Wav))
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, parityClip{name: c, ref: r, trace: readTrace(t, tag, c), mel: mel, melRows: len(mel) / h.NMels})
		maxMel = max(maxMel, len(mel)/h.NMels)
		frames += EncoderFrames(len(mel) / h.NMels)
	}
	enc, err := m.NewEncoder(maxMel, frames)
	if err != nil {
		t.Fatal(err)
	}
	defer enc.Close()

	// The encoder's stages, on whisper.cpp's log-mel of the tensor clips.
	for _, c := range cs[:2] {
		want := map[string]*npy.Array{"pre_encode": readNpy(t, tag, c.name, "pre_encode_out.npy")}
		for l := 0; l < h.NAudioLayer; l++ {
			if _, err := os.Stat(sharedtest.Dir(t) + "/reference/asr-transducer/tensors/" + tag + "/" + c.name + fmt.Sprintf("/layer%d_out.npy", l)); err == nil {
				want[fmt.Sprintf("layer%d", l)] = readNpy(t, tag, c.name, fmt.Sprintf("layer%d_out.npy", l))
			}
		}
		want[fmt.Sprintf("layer%d", h.NAudioLayer-1)] = readNpy(t, tag, c.name, "encoder_out.npy")
		mel := readNpy(t, tag, c.name, "mel.npy")
		checked := 0
		enc.Tap = func(stage string, layer int, x backend.Tensor) {
			name := stage
			if layer >= 0 {
				name = fmt.Sprintf("layer%d", layer)
			}
			w, ok := want[name]
			if !ok {
				return
			}
			got := readTensor(t, be, x)
			if len(got) != len(w.Data) {
				t.Fatalf("%s %s: %d values, reference %d", c.name, name, len(got), len(w.Data))
			}
			mx, rms := maxDiff(got, w.Data)
			t.Logf("%s %s: max |Δ| %.3g, rms %.3g", c.name, name, mx, rms)
			if mx > tolStage {
				t.Errorf("%s %s: max |Δ| %.3g, want ≤ %g", c.name, name, mx, tolStage)
			}
			checked++
		}
		if _, err := enc.Encode([][]float32{mel.Data}); err != nil {
			t.Fatal(err)
		}
		enc.Tap = nil
		if checked != len(want) {
			t.Errorf("%s: %d of %d stages checked", c.name, checked, len(want))
		}
	}

	// The prediction network and the joint alone, on whisper.cpp's encoder output.
	for _, c := range cs[:2] {
		eo := readNpy(t, tag, c.name, "encoder_out.npy")
		rows := len(eo.Data) / d
		x, err := be.Alloc(tensor.F32, rows, d)
		if err != nil {
			t.Fatal(err)
		}
		defer x.Close()
		if err := be.Write(x, 0, eo.Data); err != nil {
			t.Fatal(err)
		}
		mxL, mxP := teacherForce(t, m, x, tag, c.name, c.trace)
		t.Logf("%s: prediction network and joint on whisper.cpp's encoder output: max |Δ| logits %.3g, prediction %.3g", c.name, mxL, mxP)
		if mxL > tolAlone || mxP > tolAlone {
			t.Errorf("%s: prediction network and joint alone: max |Δ| logits %.3g, prediction %.3g, want ≤ %g", c.name, mxL, mxP, tolAlone)
		}
	}

	// Every clip from its audio, encoded together.
	mels := make([][]float32, len(cs))
	for i, c := range cs {
		mels[i] = c.mel
	}
	out, err := enc.Encode(mels)
	if err != nil {
		t.Fatal(err)
	}
	proj, err := be.Alloc(tensor.F32, frames, p)
	if err != nil {
		t.Fatal(err)
	}
	defer proj.Close()
	if err := m.ProjectEncoder(proj, out); err != nil {
		t.Fatal(err)
	}
	starts := make([]int, len(cs))
	for i, at := 0, 0; i < len(cs); i++ {
		starts[i] = at
		at += EncoderFrames(cs[i].melRows)
	}
	// Along whisper.cpp's decisions, after this encoder.
	for i, c := range cs[:2] {
		eo := readNpy(t, tag, c.name, "encoder_out.npy")
		v, err := be.View(out, starts[i], len(eo.Data)/d)
		if err != nil {
			t.Fatal(err)
		}
		mx, rms := maxDiff(readTensor(t, be, v), eo.Data)
		v.Close()
		t.Logf("%s: encoder output from this front end, batched with the other clips: max |Δ| %.3g, rms %.3g", c.name, mx, rms)
		if mx > tolStage {
			t.Errorf("%s: encoder output: max |Δ| %.3g, want ≤ %g", c.name, mx, tolStage)
		}
	}
	decodeAll(t, m, proj, starts, cs, tag)
}

// teacherForce runs the prediction network and the joint along the reference's decisions on the
// encoder output enc [T, d], and returns the largest differences from whisper.cpp's joint logits
// and prediction outputs.
func teacherForce(t *testing.T, m *Model, enc backend.Tensor, tag, clip string, tr *refTrace) (mxLogits, mxPred float64) {
	be, h := m.Backend(), m.HParams
	proj, err := be.Alloc(tensor.F32, enc.Rows(), h.NPredDim)
	if err != nil {
		t.Fatal(err)
	}
	defer proj.Close()
	if err := m.ProjectEncoder(proj, enc); err != nil {
		t.Fatal(err)
	}
	dec, err := m.NewDecoder(1, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	logits, preds := readNpy(t, tag, clip, "joint_logits.npy"), readNpy(t, tag, clip, "pred_proj.npy")
	W, P := dec.Width(), h.NPredDim
	blank := int32(h.NVocab)
	row, pr := make([]float32, W), make([]float32, P)
	npred := 0
	predict := func(tok, from int32) {
		if err := dec.Predict([]int32{tok}, []int32{from}, []int32{0}); err != nil {
			t.Fatal(err)
		}
		if err := dec.PredictionOutput(0, pr); err != nil {
			t.Fatal(err)
		}
		mx, _ := maxDiff(pr, preds.Data[npred*P:(npred+1)*P])
		mxPred = max(mxPred, mx)
		npred++
	}
	predict(blank, -1)
	for s, step := range tr.Trace.Steps {
		if err := dec.Joint(row, proj, []int32{int32(step[0])}, []int32{0}); err != nil {
			t.Fatal(err)
		}
		mx, _ := maxDiff(row, logits.Data[s*W:(s+1)*W])
		mxLogits = max(mxLogits, mx)
		if tok := int32(step[1]); tok != blank {
			predict(tok, 0)
		}
	}
	return mxLogits, mxPred
}

// decodeAll decodes every clip greedily (decode.TDT), all clips' hypotheses in one prediction and
// one joint call per step, and compares with whisper.cpp: the tensor clips' joint logits along
// the way (tolLogits), every decision (identical until a step whose recorded margin is a near
// tie, after which the decodes may part), the emitted tokens' p and plog, and the text.
func decodeAll(t *testing.T, m *Model, proj backend.Tensor, starts []int, cs []parityClip, tag string) {
	h := m.HParams
	n := len(cs)
	dec, err := m.NewDecoder(n, n)
	if err != nil {
		t.Fatal(err)
	}
	defer dec.Close()
	rule := decode.TDT{Blank: int32(h.NVocab), Durations: m.Durations, MaxSymbols: h.NMaxTokens}
	W := dec.Width()
	var logits []*npy.Array
	for _, c := range cs[:2] {
		logits = append(logits, readNpy(t, tag, c.name, "joint_logits.npy"))
	}
	states := make([]decode.TDTState, n)
	toks := make([][]Token, n)
	calls := make([]int, n)
	parted := make([]int, n) // tokens emitted before the decodes parted at a near tie, -1 never
	mxLogits := make([]float64, n)
	tokIn, from, to := make([]int32, 0, n), make([]int32, 0, n), make([]int32, 0, n)
	for i := range cs {
		parted[i] = -1
		tokIn, from, to = append(tokIn, rule.Blank), append(from, -1), append(to, int32(i))
	}
	buf := make([]float32, n*W)
	var rows, slots []int32
	var active []int
	for step := 0; ; step++ {
		if err := dec.Predict(tokIn, from, to); err != nil {
			t.Fatal(err)
		}
		tokIn, from, to = tokIn[:0], from[:0], to[:0]
		rows, slots, active = rows[:0], slots[:0], active[:0]
		for i, c := range cs {
			if states[i].Frame < EncoderFrames(c.melRows) {
				active = append(active, i)
				rows, slots = append(rows, int32(starts[i]+states[i].Frame)), append(slots, int32(i))
			}
		}
		if len(active) == 0 {
			break
		}
		if err := dec.Joint(buf, proj, rows, slots); err != nil {
			t.Fatal(err)
		}
		for k, i := range active {
			c, row := &cs[i], buf[k*W:(k+1)*W]
			ref := c.trace.Trace.Steps
			if parted[i] < 0 && i < len(logits) && calls[i] < len(ref) {
				mx, _ := maxDiff(row, logits[i].Data[calls[i]*W:(calls[i]+1)*W])
				mxLogits[i] = max(mxLogits[i], mx)
			}
			st, err := rule.Step(&states[i], row)
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			if parted[i] < 0 {
				if calls[i] >= len(ref) {
					t.Fatalf("%s: more joint calls than the %d recorded", c.name, len(ref))
				}
				r := ref[calls[i]]
				switch {
				case st.Frame != int(r[0]):
					t.Fatalf("%s: joint call %d at frame %d, recorded %v", c.name, calls[i], st.Frame, r)
				case st.Token != int32(r[1]) || st.DurIdx != int(r[2]):
					margin := r[3]
					if st.Token == int32(r[1]) {
						margin = r[4]
					}
					if margin >= tieMargin {
						t.Fatalf("%s: joint call %d at frame %d: token %d duration %d, recorded %v (margin %.3g, not a near tie)",
							c.name, calls[i], st.Frame, st.Token, st.DurIdx, r, margin)
					}
					t.Logf("%s: joint call %d at frame %d: token %d duration %d, recorded %v: a near tie (margin %.3g); the decodes part here",
						c.name, calls[i], st.Frame, st.Token, st.DurIdx, r, margin)
					parted[i] = len(toks[i])
				}
			}
			calls[i]++
			if st.Emit {
				toks[i] = append(toks[i], Token{ID: st.Token, Frame: st.Frame, DurIdx: st.DurIdx, Dur: st.Dur, P: st.P, PLog: st.PLog})
				tokIn, from, to = append(tokIn, st.Token), append(from, int32(i)), append(to, int32(i))
			}
		}
	}
	for i, c := range cs {
		want := c.ref.Tokens
		got := toks[i]
		upTo := len(got)
		if parted[i] >= 0 {
			upTo = parted[i]
		} else if len(got) != len(want) {
			t.Errorf("%s: %d tokens, recorded %d", c.name, len(got), len(want))
			continue
		}
		var mxP, mxPL float64
		for k := 0; k < upTo && k < len(want); k++ {
			g, w := got[k], want[k]
			if g.ID != w.ID || g.Frame != w.Frame || g.DurIdx != w.DurIdx || g.Dur != w.DurVal {
				t.Errorf("%s: token %d: %+v, recorded %+v", c.name, k, g, w)
				break
			}
			wp, _ := strconv.ParseFloat(c.trace.Tokens[k].PStr, 32)
			wl, _ := strconv.ParseFloat(c.trace.Tokens[k].PLogStr, 32)
			mxP, mxPL = max(mxP, math.Abs(float64(g.P)-wp)), max(mxPL, math.Abs(float64(g.PLog)-wl))
		}
		if mxP > tolP || mxPL > tolPLog {
			t.Errorf("%s: max |Δ| p %.3g (≤ %g), plog %.3g (≤ %g)", c.name, mxP, tolP, mxPL, tolPLog)
		}
		text := m.Vocab.Transcript(got)
		if parted[i] < 0 && text != c.ref.Text {
			t.Errorf("%s: text %q, recorded %q", c.name, text, c.ref.Text)
		}
		note := ""
		if i < len(logits) {
			note = fmt.Sprintf(", logits along the path max |Δ| %.3g", mxLogits[i])
			if mxLogits[i] > tolLogits {
				t.Errorf("%s: joint logits along the reference path: max |Δ| %.3g, want ≤ %g", c.name, mxLogits[i], tolLogits)
			}
		}
		if parted[i] >= 0 {
			note += fmt.Sprintf(", parted at a near tie after %d tokens", parted[i])
		}
		t.Logf("%s: %d tokens in %d joint calls, max |Δ| p %.3g, plog %.3g%s", c.name, len(got), calls[i], mxP, mxPL, note)
	}
}
