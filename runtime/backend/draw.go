package backend

import (
	"fmt"
	"math"
	"sort"

	"github.com/parleyhq/parley/runtime/tensor"
)

// Draw says how a row's token is chosen where the logits are (Drawer); see tensor.Draw, which
// the native bindings share.
type Draw = tensor.Draw

// Drawer is implemented by backends that choose tokens where the logits are (on a GPU, only the
// ids leave the device): Draw waits for the logits, then writes into ids[i] the token of row
// row0+i of logits (F32) as draws[i] says. Its answers are DrawRows', up to the order in which
// float sums are added (a draw whose u falls within rounding of a boundary between two tokens may
// take either).
type Drawer interface {
	Draw(logits Tensor, row0 int, draws []Draw, ids []int32) error
}

// CheckDraws reports an error for a draw whose parameters are out of range (tensor.CheckDraws).
func CheckDraws(draws []Draw) error { return tensor.CheckDraws(draws) }

// drawKey maps floats to unsigned keys in the same order, -0 and +0 to one key (as the CUDA
// library's plc_key), so that comparing keys is comparing the floats.
func drawKey(v float32) uint32 {
	if v == 0 {
		return 0x80000000
	}
	b := math.Float32bits(v)
	if b&0x80000000 != 0 {
		return ^b
	}
	return b | 0x80000000
}

// DrawRows is Drawer's rule on the host, over len(ids) rows of cols values in x: ids[i] is the
// token of row i as draws[i] says. Sums are float64 (a device adds float32 in its own order).
func DrawRows(x []float32, cols int, draws []Draw, ids []int32) error {
	if cols <= 0 || len(x) != len(ids)*cols || len(draws) != len(ids) {
		return fmt.Errorf("draw: %d values and %d draws for %d rows of %d", len(x), len(draws), len(ids), cols)
	}
	if err := CheckDraws(draws); err != nil {
		return err
	}
	for i, d := range draws {
		row := x[i*cols : (i+1)*cols]
		if d.Temperature == 0 {
			if err := ArgmaxRows(row, cols, ids[i:i+1]); err != nil {
				return err
			}
			continue
		}
		ids[i] = drawRow(row, d)
	}
	return nil
}

func drawRow(x []float32, d Draw) int32 {
	m := float32(math.Inf(-1))
	for _, v := range x {
		if v != v || math.IsInf(float64(v), 1) {
			return -1
		}
		m = max(m, v)
	}
	if math.IsInf(float64(m), -1) {
		return -1
	}
	var t uint32 // candidates: drawKey(x) >= t
	if k := int(d.TopK); k > 0 && k < len(x) {
		keys := make([]uint32, len(x))
		for j, v := range x {
			keys[j] = drawKey(v)
		}
		sort.Slice(keys, func(a, b int) bool { return keys[a] > keys[b] })
		t = keys[k-1]
	}
	if d.TopP < 1 {
		type cand struct {
			key  uint32
			mass float64
		}
		var c []cand
		var zs float64
		for _, v := range x {
			if k := drawKey(v); k >= t {
				c = append(c, cand{k, math.Exp(float64(v - m))})
				zs += c[len(c)-1].mass
			}
		}
		sort.Slice(c, func(a, b int) bool { return c[a].key > c[b].key })
		// the largest key whose top set (all elements of that key or above) reaches the mass
		target, cum := float64(d.TopP)*zs, 0.0
		for a := 0; a < len(c); {
			b := a
			for b < len(c) && c[b].key == c[a].key {
				cum += c[b].mass
				b++
			}
			if cum >= target || b == len(c) {
				t = max(t, c[a].key)
				break
			}
			a = b
		}
	}
	if d.MinP > 0 {
		t = max(t, drawKey(m+float32(math.Log(float64(d.MinP)))))
	}
	inv := 1 / d.Temperature
	weight := func(v float32) float64 {
		if v == m {
			return 1
		}
		return math.Exp(float64((v - m) * inv))
	}
	var zt float64
	for _, v := range x {
		if drawKey(v) >= t {
			zt += weight(v)
		}
	}
	target := float64(float32(d.Random>>40)*0x1p-24) * zt
	last := int32(-1)
	var run float64
	for j, v := range x {
		if drawKey(v) < t {
			continue
		}
		e := weight(v)
		if e <= 0 {
			continue
		}
		last = int32(j)
		if run += e; run > target {
			return int32(j)
		}
	}
	return last
}
