package parakeet

import (
	"errors"
	"fmt"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// The prediction network and the joint (parakeet_build_graph_lstm_layer, _prediction and
// _joint, parakeet.cpp:2144-2315), batched over the hypotheses of many streams.

// Decoder holds prediction-network states in Slots slots, and computes batches of prediction
// steps (Predict) and joint rows (Joint, JointMulti) of up to MaxRows requests. A slot holds one
// hypothesis's state: each LSTM layer's h and c and the joint's prediction input
// joint.pred(h_top) + bias. The caller (a scheduler, a beam search) decides which slot holds
// what; requests name slots, so the hypotheses of many streams share one call. A Decoder is not
// safe for concurrent use; Predict and Joint allocate nothing, nor JointMulti once the row ranges
// of its groups have been seen.
type Decoder struct {
	m              *Model
	slots, maxRows int
	p, width       int

	// The states live in two sets of tensors of slots+1+maxRows rows: rows [0, slots) the slots,
	// row slots the initial (zero) state, and the rows after it a step's new states. A step
	// reads the current set, writes its new states after its zero row, then gathers every slot,
	// changed or not, into the other set, which becomes current.
	h, c   [2][]backend.Tensor // [layers] each
	pred   [2]backend.Tensor
	cur    int
	tables [2][]backend.Tensor // per set: views of rows [0, slots+1) of h, c of each layer and pred
	slotV  [2][]backend.Tensor // per set: views of rows [0, slots) of the same
	all    [2][]backend.Tensor // per set: the tensors themselves, in the same order

	x, hPrev    backend.Tensor // [maxRows, P]
	gi, gh      backend.Tensor // [maxRows, 4P]
	encG, predG backend.Tensor // [maxRows, P]
	logits      backend.Tensor // [maxRows, V+1+D]
	from, merge []int32
	// batches[n] are the views of the scratch a call of n requests uses, made on its first use
	// and kept, so that a call allocates nothing once the batch sizes in use have been seen.
	batches []*batchViews
	owned   []backend.Tensor
	changed []bool
	// live is the number of leading slots a step carries into the other set (SetLive); liveV[n]
	// are the views of rows [0, n) of both sets, made on first use.
	live  int
	liveV [][2][]backend.Tensor
	// encV are the views of rows [at, at+n) of encG that JointMulti gathers a group's encoder
	// rows into, made on first use; jSlots gathers the groups' slots; one is Joint's group.
	encV   map[[2]int32]backend.Tensor
	jSlots []int32
	one    [1]JointGroup
}

// batchViews are the first n rows of the scratch and of the new-state rows of both sets.
type batchViews struct {
	x, hp, gi, gh, eg, pg, lg backend.Tensor
	hNew, cNew                [2][]backend.Tensor // [set][layer]
	pNew                      [2]backend.Tensor
	owned                     []backend.Tensor
}

// NewDecoder makes a decoder with slots state slots and batches of up to maxRows requests.
// Every slot starts in the prediction network's initial state (zeros: a first Predict from
// slot -1 on the blank makes the state the TDT loop starts from).
func (m *Model) NewDecoder(slots, maxRows int) (*Decoder, error) {
	h := m.HParams
	if slots < 1 || maxRows < 1 || slots > 1<<24 || maxRows > 1<<20 {
		return nil, fmt.Errorf("parakeet: decoder of %d slots and batches of %d", slots, maxRows)
	}
	d := &Decoder{m: m, slots: slots, maxRows: maxRows, p: h.NPredDim, width: h.JointOutputs()}
	var err error
	alloc := func(rows, cols int) backend.Tensor {
		if err != nil {
			return nil
		}
		var t backend.Tensor
		if t, err = m.be.Alloc(tensor.F32, rows, cols); err == nil {
			d.owned = append(d.owned, t)
		}
		return t
	}
	rows := slots + 1 + maxRows
	for s := range 2 {
		for range h.NPredLayers {
			d.h[s] = append(d.h[s], alloc(rows, d.p))
			d.c[s] = append(d.c[s], alloc(rows, d.p))
		}
		d.pred[s] = alloc(rows, d.p)
	}
	d.x, d.hPrev = alloc(maxRows, d.p), alloc(maxRows, d.p)
	d.gi, d.gh = alloc(maxRows, 4*d.p), alloc(maxRows, 4*d.p)
	d.encG, d.predG = alloc(maxRows, d.p), alloc(maxRows, d.p)
	d.logits = alloc(maxRows, d.width)
	if err == nil {
		for s := range 2 {
			for l := range h.NPredLayers {
				d.all[s] = append(d.all[s], d.h[s][l], d.c[s][l])
			}
			d.all[s] = append(d.all[s], d.pred[s])
			for _, t := range d.all[s] {
				var tv, sv backend.Tensor
				if tv, err = m.be.View(t, 0, slots+1); err != nil {
					break
				}
				d.owned = append(d.owned, tv)
				if sv, err = m.be.View(t, 0, slots); err != nil {
					break
				}
				d.owned = append(d.owned, sv)
				d.tables[s], d.slotV[s] = append(d.tables[s], tv), append(d.slotV[s], sv)
			}
		}
	}
	if err != nil {
		d.Close()
		return nil, fmt.Errorf("parakeet: decoder: %w", err)
	}
	d.from, d.merge = make([]int32, 0, maxRows), make([]int32, slots)
	d.changed = make([]bool, slots)
	d.encV, d.jSlots = map[[2]int32]backend.Tensor{}, make([]int32, 0, maxRows)
	d.batches = make([]*batchViews, maxRows+1)
	d.live, d.liveV = slots, make([][2][]backend.Tensor, slots+1)
	d.liveV[slots] = d.slotV
	return d, nil
}

// Slots is the number of state slots.
func (d *Decoder) Slots() int { return d.slots }

// MaxRows is the most requests of one Predict or Joint call.
func (d *Decoder) MaxRows() int { return d.maxRows }

// Width is the length of a joint row: V+1 token logits (the blank last), then the durations'.
func (d *Decoder) Width() int { return d.width }

// Close releases the decoder's tensors.
func (d *Decoder) Close() error {
	var errs []error
	for _, b := range d.batches {
		if b != nil {
			for _, v := range b.owned {
				errs = append(errs, v.Close())
			}
		}
	}
	d.batches = nil
	for i := len(d.owned) - 1; i >= 0; i-- {
		errs = append(errs, d.owned[i].Close())
	}
	d.owned = nil
	return errors.Join(errs...)
}

// SetLive says that only slots [0, n) hold states the caller will read again: a Predict then
// carries those (and the slots it writes) into its new states, not every slot, and leaves the
// others' contents undefined until a Predict or LoadState writes them. n is Slots() at first.
func (d *Decoder) SetLive(n int) error {
	if n < 0 || n > d.slots {
		return fmt.Errorf("parakeet: %d live slots of %d", n, d.slots)
	}
	d.live = n
	return nil
}

// liveViews returns the views of rows [0, n) of both sets, making them the first time.
func (d *Decoder) liveViews(n int) ([2][]backend.Tensor, error) {
	if v := d.liveV[n]; v[0] != nil {
		return v, nil
	}
	var v [2][]backend.Tensor
	for s := range 2 {
		for _, t := range d.all[s] {
			tv, err := d.m.be.View(t, 0, n)
			if err != nil {
				return v, err
			}
			d.owned = append(d.owned, tv)
			v[s] = append(v[s], tv)
		}
	}
	d.liveV[n] = v
	return v, nil
}

// batch returns the views of a call of n requests (1 to maxRows), making them the first time.
func (d *Decoder) batch(n int) (*batchViews, error) {
	if b := d.batches[n]; b != nil {
		return b, nil
	}
	b := &batchViews{}
	var err error
	view := func(t backend.Tensor, row0 int) backend.Tensor {
		if err != nil {
			return nil
		}
		var v backend.Tensor
		if v, err = d.m.be.View(t, row0, n); err == nil {
			b.owned = append(b.owned, v)
		}
		return v
	}
	b.x, b.hp, b.gi, b.gh = view(d.x, 0), view(d.hPrev, 0), view(d.gi, 0), view(d.gh, 0)
	b.eg, b.pg, b.lg = view(d.encG, 0), view(d.predG, 0), view(d.logits, 0)
	for s := range 2 {
		for l := range d.h[s] {
			b.hNew[s] = append(b.hNew[s], view(d.h[s][l], d.slots+1))
			b.cNew[s] = append(b.cNew[s], view(d.c[s][l], d.slots+1))
		}
		b.pNew[s] = view(d.pred[s], d.slots+1)
	}
	if err != nil {
		for _, v := range b.owned {
			v.Close()
		}
		return nil, err
	}
	d.batches[n] = b
	return b, nil
}

// Predict runs one prediction-network step for each request i: the state in slot from[i] (-1:
// the initial state) advanced by token tokens[i] (0 to V; V is the blank, whose embedding starts
// a stream), written with its joint input to slot to[i]. No to may repeat, or be another
// request's from (a request may write the slot it reads).
func (d *Decoder) Predict(tokens, from, to []int32) error {
	n := len(tokens)
	if len(from) != n || len(to) != n || n > d.maxRows {
		return fmt.Errorf("parakeet: predict: %d tokens, %d sources, %d destinations (at most %d)", n, len(from), len(to), d.maxRows)
	}
	if n == 0 {
		return nil
	}
	blank := int32(d.m.HParams.NVocab)
	clear(d.changed)
	d.from = d.from[:0]
	for i := range tokens {
		switch {
		case tokens[i] < 0 || tokens[i] > blank:
			return fmt.Errorf("parakeet: predict: token %d is outside 0..%d", tokens[i], blank)
		case from[i] < -1 || from[i] >= int32(d.slots) || to[i] < 0 || to[i] >= int32(d.slots):
			return fmt.Errorf("parakeet: predict: request %d goes from slot %d to %d of %d", i, from[i], to[i], d.slots)
		case d.changed[to[i]]:
			return fmt.Errorf("parakeet: predict: slot %d is written twice", to[i])
		}
		d.changed[to[i]] = true
		f := from[i]
		if f < 0 {
			f = int32(d.slots)
		}
		d.from = append(d.from, f)
	}
	for i, f := range from {
		if f >= 0 && d.changed[f] && to[i] != f {
			for j := range to {
				if j != i && to[j] == f {
					return fmt.Errorf("parakeet: predict: slot %d is read by one request and written by another", f)
				}
			}
		}
	}
	if err := d.predict(tokens, to); err != nil {
		return fmt.Errorf("parakeet: predict: %w", err)
	}
	return nil
}

func (d *Decoder) predict(tokens, to []int32) error {
	be, m, n := d.m.be, d.m, len(tokens)
	b, err := d.batch(n)
	if err != nil {
		return err
	}
	cur, next := d.cur, 1-d.cur
	if err := be.GetRows(b.x, m.embed, tokens); err != nil {
		return err
	}
	in := b.x
	for l, w := range m.lstm {
		hNew, cNew := b.hNew[cur][l], b.cNew[cur][l]
		if err := be.GetRows(b.hp, d.tables[cur][2*l], d.from); err != nil {
			return err
		}
		if err := be.GetRows(cNew, d.tables[cur][2*l+1], d.from); err != nil {
			return err
		}
		if err := be.MatMul(b.gi, in, w.wih); err != nil {
			return err
		}
		if err := be.MatMul(b.gh, b.hp, w.whh); err != nil {
			return err
		}
		if err := be.AddRows(b.gi, b.gi, b.gh); err != nil {
			return err
		}
		if err := be.AddRows(b.gi, b.gi, w.b); err != nil {
			return err
		}
		if err := be.LSTMCell(hNew, cNew, b.gi); err != nil {
			return err
		}
		in = hNew
	}
	pNew := b.pNew[cur]
	if err := be.MatMul(pNew, in, m.jPred); err != nil {
		return err
	}
	if err := be.AddRows(pNew, pNew, m.jPredB); err != nil {
		return err
	}
	// Every live slot into the other set: unchanged ones from their row, the new ones from
	// theirs.
	live := d.live
	for _, t := range to {
		live = max(live, int(t)+1)
	}
	views, err := d.liveViews(live)
	if err != nil {
		return err
	}
	merge := d.merge[:live]
	for s := range merge {
		merge[s] = int32(s)
	}
	for i, t := range to {
		merge[t] = int32(d.slots + 1 + i)
	}
	for i, t := range d.all[cur] {
		if err := be.GetRows(views[next][i], t, merge); err != nil {
			return err
		}
	}
	d.cur = next
	return nil
}

// Joint computes the joint rows of n = len(frames) requests into dst (n rows of Width()): row i
// joins the encoder projection enc[frames[i]] (a table of ProjectEncoder's rows, [*, P]) with
// the prediction input in slot slots[i], z = joint_net(ReLU(enc + pred)) + bias: the token
// logits (the blank last), then the duration logits.
func (d *Decoder) Joint(dst []float32, enc backend.Tensor, frames, slots []int32) error {
	d.one[0] = JointGroup{Enc: enc, Frames: frames, Slots: slots}
	err := d.JointMulti(dst, d.one[:])
	d.one[0] = JointGroup{}
	return err
}

// JointGroup is the requests of one encoder projection in a JointMulti call: row i joins
// Enc[Frames[i]] with the prediction input in slot Slots[i].
type JointGroup struct {
	Enc           backend.Tensor // a table of ProjectEncoder's rows, [*, P]
	Frames, Slots []int32
}

// JointMulti computes the joint rows of the requests of every group, in one pass over the
// joint's weights, into dst: the groups' rows one after another, in order (at most MaxRows in
// all), each as Joint computes it. Groups of different encoder projections (the streams of a
// batch) so share one product with the joint's output matrix.
func (d *Decoder) JointMulti(dst []float32, groups []JointGroup) error {
	n, used := 0, 0
	for gi, g := range groups {
		if len(g.Slots) != len(g.Frames) {
			return fmt.Errorf("parakeet: joint: group %d has %d frames and %d slots", gi, len(g.Frames), len(g.Slots))
		}
		if len(g.Frames) == 0 {
			continue
		}
		if g.Enc == nil {
			return fmt.Errorf("parakeet: joint: group %d has no encoder projection", gi)
		}
		for i, s := range g.Slots {
			if s < 0 || s >= int32(d.slots) {
				return fmt.Errorf("parakeet: joint: request %d of group %d reads slot %d of %d", i, gi, s, d.slots)
			}
		}
		n += len(g.Frames)
		used++
	}
	if n > d.maxRows || len(dst) < n*d.width {
		return fmt.Errorf("parakeet: joint: %d requests, room for %d values (at most %d rows of %d)", n, len(dst), d.maxRows, d.width)
	}
	if n == 0 {
		return nil
	}
	if err := d.joint(dst[:n*d.width], groups, n, used); err != nil {
		return fmt.Errorf("parakeet: joint: %w", err)
	}
	return nil
}

// joint computes n rows of checked groups, used of them not empty.
func (d *Decoder) joint(dst []float32, groups []JointGroup, n, used int) error {
	be, m := d.m.be, d.m
	b, err := d.batch(n)
	if err != nil {
		return err
	}
	slots := d.jSlots[:0]
	at := 0
	for _, g := range groups {
		k := len(g.Frames)
		if k == 0 {
			continue
		}
		eg := b.eg
		if used > 1 {
			if eg, err = d.encRows(at, k); err != nil {
				return err
			}
			slots = append(slots, g.Slots...)
		} else {
			slots = g.Slots
		}
		if err := be.GetRows(eg, g.Enc, g.Frames); err != nil {
			return err
		}
		at += k
	}
	if err := be.GetRows(b.pg, d.slotV[d.cur][len(d.all[d.cur])-1], slots); err != nil {
		return err
	}
	if err := be.AddRows(b.eg, b.eg, b.pg); err != nil {
		return err
	}
	if err := be.Unary(b.eg, b.eg, tensor.ReLU); err != nil {
		return err
	}
	if err := be.MatMul(b.lg, b.eg, m.jOut); err != nil {
		return err
	}
	if err := be.AddRows(b.lg, b.lg, m.jOutB); err != nil {
		return err
	}
	return be.Read(b.lg, 0, dst)
}

// encRows returns the view of rows [at, at+n) of the joint's encoder scratch, making it the
// first time.
func (d *Decoder) encRows(at, n int) (backend.Tensor, error) {
	key := [2]int32{int32(at), int32(n)}
	if v, ok := d.encV[key]; ok {
		return v, nil
	}
	v, err := d.m.be.View(d.encG, at, n)
	if err != nil {
		return nil, err
	}
	d.owned = append(d.owned, v)
	d.encV[key] = v
	return v, nil
}

// PredictionOutput copies the joint's prediction input held in slot (joint.pred(h_top) + bias,
// [P]) into dst, for tests and analysis.
func (d *Decoder) PredictionOutput(slot int32, dst []float32) error {
	if slot < 0 || slot >= int32(d.slots) || len(dst) != d.p {
		return fmt.Errorf("parakeet: prediction output: slot %d of %d into %d values", slot, d.slots, len(dst))
	}
	return d.m.be.Read(d.pred[d.cur], int(slot), dst)
}

// StateSize is the length of a slot's state as SaveState writes it: each LSTM layer's h and c,
// then the joint's prediction input, P values each.
func (d *Decoder) StateSize() int { return len(d.all[0]) * d.p } // both sets alike: safe beside Predict

// SaveState copies the state held in slot into dst (StateSize values), so that a stream can give
// its slot up between calls and continue later from LoadState.
func (d *Decoder) SaveState(slot int32, dst []float32) error {
	if slot < 0 || slot >= int32(d.slots) || len(dst) != d.StateSize() {
		return fmt.Errorf("parakeet: save state: slot %d of %d into %d values (want %d)", slot, d.slots, len(dst), d.StateSize())
	}
	for i, t := range d.all[d.cur] {
		if err := d.m.be.Read(t, int(slot), dst[i*d.p:(i+1)*d.p]); err != nil {
			return fmt.Errorf("parakeet: save state: %w", err)
		}
	}
	return nil
}

// LoadState makes slot hold the state src (StateSize values, as SaveState wrote them).
func (d *Decoder) LoadState(slot int32, src []float32) error {
	if slot < 0 || slot >= int32(d.slots) || len(src) != d.StateSize() {
		return fmt.Errorf("parakeet: load state: slot %d of %d from %d values (want %d)", slot, d.slots, len(src), d.StateSize())
	}
	for i, t := range d.all[d.cur] {
		if err := d.m.be.Write(t, int(slot), src[i*d.p:(i+1)*d.p]); err != nil {
			return fmt.Errorf("parakeet: load state: %w", err)
		}
	}
	return nil
}
