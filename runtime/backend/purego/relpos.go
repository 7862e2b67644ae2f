package purego

import (
	"math"

	"github.com/parleyhq/parley/internal/vec"
	"github.com/parleyhq/parley/runtime/backend"
)

// relPosTile is the number of rows of one clip and head a unit of RelPosAttention computes.
const relPosTile = 8

// relPosScratch is one goroutine's working memory for RelPosAttention.
type relPosScratch struct {
	s      []float32 // [span+3] the scores of one row, then its weights
	qu, qv []float32 // [HeadDim] the query plus the content bias, plus the position bias
	acc    []float32 // [HeadDim]
}

// relPosJob computes RelPosAttention by units of (head, tile of relPosTile rows of one clip).
// A unit takes each row's scores over the rows it attends to, their exact softmax, and the sum of
// the values weighted by it: the scores of one row at a time, never a clip's matrix.
type relPosJob struct {
	a                 backend.RelPos
	width, half       int // NHead*HeadDim; L-1, the distance of p's row 0
	q, k, v, p, u, bv []float32
	dst               []float32
	tiles             []int32 // [units/NHead][2] first row and clip of each tile
	clipStart         []int32 // [clips+1] first row of each clip
	scratch           []relPosScratch
}

func (j *relPosJob) unit(w, u int) {
	nh := j.a.NHead
	h, t := u%nh, u/nh
	r0, ci := int(j.tiles[2*t]), int(j.tiles[2*t+1])
	s0, s1 := int(j.clipStart[ci]), int(j.clipStart[ci+1])
	for r := r0; r < min(r0+relPosTile, s1); r++ {
		j.row(&j.scratch[w], h, s0, s1-s0, r-s0)
	}
}

// row computes head h of row i of the clip of n rows that starts at row s0.
func (j *relPosJob) row(sc *relPosScratch, h, s0, n, i int) {
	hd, width := j.a.HeadDim, j.width
	off := h * hd
	gi := s0 + i
	q := j.q[gi*width+off : gi*width+off+hd]
	qu, qv := sc.qu[:hd], sc.qv[:hd]
	for d, x := range q {
		qu[d] = x + j.u[off+d]
		qv[d] = x + j.bv[off+d]
	}
	lo, hi := 0, n-1
	if wd := j.a.Window; wd > 0 {
		lo, hi = max(0, i-wd), min(n-1, i+wd)
	}
	m := hi - lo + 1
	s := sc.s[:m]
	// Key j sits at row s0+j of k; its position row is half-i+j of p: both advance by a row as j
	// does.
	key := func(x int) []float32 { o := (s0+lo+x)*width + off; return j.k[o : o+hd] }
	pos := func(x int) []float32 { o := (j.half-i+lo+x)*width + off; return j.p[o : o+hd] }
	x := 0
	for ; x+4 <= m; x += 4 {
		c0, c1, c2, c3 := dot4(qu, key(x), key(x+1), key(x+2), key(x+3))
		p0, p1, p2, p3 := dot4(qv, pos(x), pos(x+1), pos(x+2), pos(x+3))
		s[x], s[x+1], s[x+2], s[x+3] = c0+p0, c1+p1, c2+p2, c3+p3
	}
	for ; x < m; x++ {
		c, _, _, _ := dot4(qu, key(x), key(x), key(x), key(x))
		p, _, _, _ := dot4(qv, pos(x), pos(x), pos(x), pos(x))
		s[x] = c + p
	}
	mx := float32(math.Inf(-1))
	for x := range s {
		s[x] *= j.a.Scale
		mx = max(mx, s[x])
	}
	sum := vec.ExpSum(s, mx)
	acc := sc.acc[:hd]
	clear(acc)
	val := func(x int) []float32 { o := (s0+lo+x)*width + off; return j.v[o : o+hd] }
	for x = 0; x+4 <= m; x += 4 {
		axpy4(acc, s[x], s[x+1], s[x+2], s[x+3], val(x), val(x+1), val(x+2), val(x+3))
	}
	for ; x < m; x++ {
		axpy4(acc, s[x], 0, 0, 0, val(x), val(x), val(x), val(x))
	}
	inv := float32(1 / sum)
	out := j.dst[gi*width+off : gi*width+off+hd]
	for d, a := range acc {
		out[d] = a * inv
	}
}

// RelPosAttention is self-attention with relative positions within each clip (backend.Backend).
func (be *Backend) RelPosAttention(dst, q, k, v, p, u, bv backend.Tensor, a backend.RelPos, clips []int32) error {
	be.mu.Lock()
	defer be.mu.Unlock()
	ts, err := be.ops.RelPosAttention(dst, q, k, v, p, u, bv, a, clips)
	if err != nil {
		return err
	}
	be.xqFrom = nil // writes activations
	j := &be.rp
	j.a, j.width, j.half = a, ts[1].cols, (ts[4].rows-1)/2
	j.dst, j.q, j.k, j.v, j.p, j.u, j.bv = ts[0].f32, ts[1].f32, ts[2].f32, ts[3].f32, ts[4].f32, ts[5].f32, ts[6].f32
	j.clipStart = append(j.clipStart[:0], 0)
	j.tiles = j.tiles[:0]
	span, row := 0, int32(0)
	for ci, n := range clips {
		for r := row; r < row+n; r += relPosTile {
			j.tiles = append(j.tiles, r, int32(ci))
		}
		row += n
		j.clipStart = append(j.clipStart, row)
		span = max(span, int(n))
	}
	if a.Window > 0 {
		span = min(span, 2*a.Window+1)
	}
	for len(j.scratch) < be.pool.threads {
		j.scratch = append(j.scratch, relPosScratch{})
	}
	for w := range j.scratch {
		sc := &j.scratch[w]
		sc.s = grow(sc.s, span+3)
		sc.qu, sc.qv, sc.acc = grow(sc.qu, a.HeadDim), grow(sc.qv, a.HeadDim), grow(sc.acc, a.HeadDim)
	}
	if units := len(j.tiles) / 2 * a.NHead; units > 0 {
		be.pool.do(j, units)
	}
	j.q, j.k, j.v, j.p, j.u, j.bv, j.dst = nil, nil, nil, nil, nil, nil, nil
	return nil
}
