package purego

import (
	"math"

	"github.com/parleyhq/parley/runtime/backend"
)

// AddRows: dst[i,:] = a[i,:] + b[i,:], or + b[0,:] when b has one row.
func (be *Backend) AddRows(dst, a, b backend.Tensor) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	d, at, bt, err := be.ops.AddRows(dst, a, b)
	if err != nil {
		return err
	}
	be.xqFrom = nil // writes activations
	rowPair(d, at, bt, func(dr, ar, br []float32) {
		for e := range dr {
			dr[e] = ar[e] + br[e]
		}
	})
	return nil
}

// rowPair calls f with each row of d, the same row of a, and the same row of b, or b's one row.
func rowPair(d, a, b *Tensor, f func(dr, ar, br []float32)) {
	c := a.cols
	for i := 0; i < a.rows; i++ {
		br := b.f32[:c]
		if b.rows != 1 {
			br = b.f32[i*c : (i+1)*c]
		}
		f(d.f32[i*c:(i+1)*c], a.f32[i*c:(i+1)*c], br)
	}
}

// RMSNorm: dst[i,:] = x[i,:] / sqrt(mean(x[i,:]²) + eps) * w[0,:]; a w narrower than x normalises
// groups of its width apart (see backend.Backend). The sum of squares is taken in float64.
func (be *Backend) RMSNorm(dst, x, w backend.Tensor, eps float32) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	d, xt, wt, err := be.ops.RMSNorm(dst, x, w, eps)
	if err != nil {
		return err
	}
	be.xqFrom = nil // writes activations
	c := wt.cols    // rows of x are normalised in groups of w's width
	if xt.cols == 0 {
		return nil
	}
	wr := wt.f32[:c]
	for i := 0; i < xt.rows*(xt.cols/c); i++ {
		xr, dr := xt.f32[i*c:(i+1)*c], d.f32[i*c:(i+1)*c]
		var s0, s1, s2, s3 float64
		e := 0
		for ; e+4 <= c; e += 4 {
			v := xr[e : e+4 : e+4]
			a, b, cc, dd := float64(v[0]), float64(v[1]), float64(v[2]), float64(v[3])
			s0 += a * a
			s1 += b * b
			s2 += cc * cc
			s3 += dd * dd
		}
		for ; e < c; e++ {
			a := float64(xr[e])
			s0 += a * a
		}
		s := float32(1 / math.Sqrt((s0+s1+s2+s3)/float64(c)+float64(eps)))
		for e := range dr {
			dr[e] = xr[e] * s * wr[e]
		}
	}
	return nil
}

// Scale: dst = x * s.
func (be *Backend) Scale(dst, x backend.Tensor, s float32) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	d, xt, err := be.ops.Scale(dst, x, s)
	if err != nil {
		return err
	}
	be.xqFrom = nil // writes activations
	o := d.f32[:len(xt.f32)]
	for i, v := range xt.f32 {
		o[i] = v * s
	}
	return nil
}

// yarnRamp is YaRN's share of the unscaled angle for pair k.
func yarnRamp(r backend.RoPE, k int) float64 {
	y := (float64(k) - float64(r.CorrDims[0])) / math.Max(0.001, float64(r.CorrDims[1])-float64(r.CorrDims[0]))
	return (1 - math.Min(1, math.Max(0, y))) * float64(r.ExtFactor)
}

// Rope rotates x [n, nHead*r.HeadDim] in place. Angles are computed in float64.
func (be *Backend) Rope(x backend.Tensor, nHead int, r backend.RoPE, b *backend.Batch) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	xt, err := be.ops.Rope(x, nHead, r, b)
	if err != nil {
		return err
	}
	be.xqFrom = nil // writes activations
	half, hd := r.Dims/2, r.HeadDim
	if be.ropeBase != r.Base || be.ropeDims != r.Dims {
		be.inv = grow(be.inv, half)
		for i := range be.inv {
			be.inv[i] = math.Pow(float64(r.Base), -2*float64(i)/float64(r.Dims))
		}
		be.ropeBase, be.ropeDims = r.Base, r.Dims
	}
	be.rope = grow(be.rope, 2*half)
	cs := be.rope
	m := 1.0
	if r.AttnFactor != 0 {
		m = float64(r.AttnFactor)
	}
	if r.ExtFactor != 0 {
		m *= 1 + 0.1*math.Log(1/float64(r.FreqScale))
	}
	for i, pos := range b.Pos {
		p := float64(pos)
		for k, f := range be.inv[:half] {
			if r.Factors != nil {
				f /= float64(r.Factors[k])
			}
			t := p * f * float64(r.FreqScale)
			if r.ExtFactor != 0 {
				mix := yarnRamp(r, k)
				t = t*(1-mix) + p*f*mix
			}
			s, c := math.Sincos(t)
			cs[2*k], cs[2*k+1] = m*c, m*s
		}
		row := xt.f32[i*xt.cols : (i+1)*xt.cols]
		for h := 0; h < nHead; h++ {
			hx := row[h*hd : (h+1)*hd]
			if r.Mode == backend.RoPENormal {
				for k := 0; k < half; k++ {
					c, s := cs[2*k], cs[2*k+1]
					x0, x1 := float64(hx[2*k]), float64(hx[2*k+1])
					hx[2*k] = float32(x0*c - x1*s)
					hx[2*k+1] = float32(x0*s + x1*c)
				}
			} else {
				lo, hi := hx[:half], hx[half:2*half]
				for k := range lo {
					c, s := cs[2*k], cs[2*k+1]
					x0, x1 := float64(lo[k]), float64(hi[k])
					lo[k] = float32(x0*c - x1*s)
					hi[k] = float32(x0*s + x1*c)
				}
			}
		}
	}
	return nil
}
