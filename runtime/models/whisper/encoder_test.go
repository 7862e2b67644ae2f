package whisper_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/parleyhq/parley/runtime/ggml"
	"github.com/parleyhq/parley/runtime/models/whisper"
)

// TestEncodeBatch: windows encoded together in one call give each the cross-attention keys and
// values it gets encoded alone, on every backend, whether the call fills the encoder or not; and
// the batch's bad arguments are refused.
func TestEncodeBatch(t *testing.T) {
	path := synthModel(t, ggml.Shape{Name: "mini", State: 64, Head: 2, AudioLayer: 2, TextLayer: 2}, "tiny.en")
	for _, be := range backendsUnderTest(t) {
		t.Run(be.Name(), func(t *testing.T) {
			m, err := whisper.Open(be, path)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			rng := rand.New(rand.NewPCG(7, uint64(len(be.Name()))))
			mels := make([][]float32, 3)
			for i := range mels {
				mels[i] = make([]float32, m.Mels*whisper.WindowFrames)
				for k := range mels[i] {
					mels[i][k] = float32(rng.Float64()*2.5 - 1)
				}
			}
			crosses := make([]*whisper.Cross, len(mels))
			for i := range crosses {
				if crosses[i], err = m.NewCross(); err != nil {
					t.Fatal(err)
				}
				defer crosses[i].Close()
			}
			one, err := m.NewEncoder()
			if err != nil {
				t.Fatal(err)
			}
			defer one.Close()
			want := make([][]float32, len(mels))
			for i, mel := range mels {
				if err := one.Encode(mel, crosses[i], nil); err != nil {
					t.Fatal(err)
				}
				if want[i], err = m.ReadCross(crosses[i]); err != nil {
					t.Fatal(err)
				}
			}
			batch, err := m.NewBatchEncoder(4)
			if err != nil {
				t.Fatal(err)
			}
			defer batch.Close()
			if _, err := batch.Next(); err == nil {
				t.Error("Next before Begin: no error")
			}
			check := func(what string, c *whisper.Cross, want []float32) {
				t.Helper()
				got, err := m.ReadCross(c)
				if err != nil {
					t.Fatal(err)
				}
				worst := 0.0
				for k := range got {
					worst = max(worst, math.Abs(float64(got[k]-want[k])))
				}
				// The same operations on the same rows: only a kernel that blocks its rows
				// differently could change the rounding, by an F16 ulp at most.
				if worst > 1e-3 {
					t.Errorf("%s differs from encoding it alone by %g", what, worst)
				}
			}
			for _, n := range []int{3, 2} { // fewer windows than the encoder holds
				for i := range crosses {
					if err := one.Encode(mels[(i+1)%len(mels)], crosses[i], nil); err != nil { // overwrite
						t.Fatal(err)
					}
				}
				if err := batch.EncodeBatch(mels[:n], crosses[:n]); err != nil {
					t.Fatal(err)
				}
				for i := range n {
					check(fmt.Sprintf("%d windows: window %d", n, i), crosses[i], want[i])
				}
			}
			// Stage by stage: an output dropped during the call keeps what it held, the others
			// are stored.
			for i := range crosses {
				if err := one.Encode(mels[(i+1)%len(mels)], crosses[i], nil); err != nil {
					t.Fatal(err)
				}
			}
			held, err := m.ReadCross(crosses[1])
			if err != nil {
				t.Fatal(err)
			}
			outs := slices.Clone(crosses)
			if err := batch.Begin(mels, outs); err != nil {
				t.Fatal(err)
			}
			for s := 1; ; s++ {
				if s == 2 {
					outs[1] = nil
				}
				done, err := batch.Next()
				if err != nil {
					t.Fatalf("stage %d: %v", s, err)
				}
				if done {
					if s != batch.Stages() {
						t.Errorf("the call completed after %d stages, Stages() says %d", s, batch.Stages())
					}
					break
				}
				if s > batch.Stages() {
					t.Fatalf("the call is not complete after %d stages", s)
				}
			}
			check("in stages: window 0", crosses[0], want[0])
			check("in stages: window 2", crosses[2], want[2])
			check("in stages: the dropped output", crosses[1], held)
			if _, err := batch.Next(); err == nil {
				t.Error("Next after the call completed: no error")
			}
			bad := []struct {
				name string
				mels [][]float32
				outs []*whisper.Cross
			}{
				{"no windows", nil, nil},
				{"more windows than the encoder holds", [][]float32{mels[0], mels[1], mels[2], mels[0], mels[1]}, append(crosses, crosses...)[:5]},
				{"outputs missing", mels[:2], crosses[:1]},
				{"short mel", [][]float32{mels[0][:100]}, crosses[:1]},
				{"nil output", mels[:1], []*whisper.Cross{nil}},
			}
			for _, c := range bad {
				if err := batch.EncodeBatch(c.mels, c.outs); err == nil {
					t.Errorf("%s: accepted", c.name)
				}
			}
			if _, err := m.NewBatchEncoder(0); err == nil {
				t.Error("an encoder of 0 windows was made")
			}
		})
	}
}
