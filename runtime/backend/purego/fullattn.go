package purego

import (
	"fmt"

	"github.com/parleyhq/parley/internal/vec"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/tensor"
)

// fullTileRows is the number of query rows (tokens × the query heads of one kv head) a unit of
// FullAttention computes together: each key and value row is read from memory once per unit and
// then used for all of them from L1 cache.
const fullTileRows = 16

// fullScratch is one goroutine's working memory for FullAttention.
type fullScratch struct {
	s    []float32 // [R, stride] scores, then weights
	qr   []float32 // [R, HeadDim] the query rows rounded to F16 (F16 keys and values)
	norm []float32 // [R] 1/sum of each row's weights (F32 keys and values)
}

// fullAttnJob computes attention without a cache or a mask by units of (kv head, tile of
// tokens). A unit keeps the scores of its rows against every key (R rows of m+3), so it takes
// the exact softmax of each row before it weighs the values: in two passes over the keys and
// values, which is what the F16 contract needs (normalised weights rounded to F16) and costs
// F32 nothing more than an online softmax would.
type fullAttnJob struct {
	a        backend.Attn
	n, m     int
	tile     int // tokens a unit
	tiles    int // units a kv head
	q, dst   []float32
	k32, v32 []float32 // [m, NKVHead*HeadDim] F32 keys and values
	k16, v16 []uint16  // [m, NKVHead*HeadDim] F16 keys and values (bits)
	f16      bool
	stride   int // m+3: scores of a row, padded so that keys can be taken four at a time
	scratch  []fullScratch
}

func (j *fullAttnJob) unit(w, u int) {
	kh, t := u/j.tiles, u%j.tiles
	t0 := t * j.tile
	if j.a.HeadDim%pvWidth == 0 {
		j.attendBlocked(&j.scratch[w], kh, t0, min(t0+j.tile, j.n))
		return
	}
	j.attend(&j.scratch[w], kh, t0, min(t0+j.tile, j.n))
}

// fullKeyBlock is the number of keys (values) attendBlocked takes at a time: their rows stay in
// L1 cache while every pair of query rows passes over them.
const fullKeyBlock = 64

// attendBlocked is attend for head sizes that are multiples of pvWidth, by blocks of keys and
// pairs of query rows: scores2 dots two rows with four keys at a time, and pv2 keeps pvWidth
// elements of two rows' outputs in registers over a block of values.
func (j *fullAttnJob) attendBlocked(sc *fullScratch, kh, t0, t1 int) {
	a := j.a
	hd, group, m, stride := a.HeadDim, a.NHead/a.NKVHead, j.m, j.stride
	qw, kw := a.NHead*hd, a.NKVHead*hd
	rows := (t1 - t0) * group
	qoff := func(r int) int { return (t0+r/group)*qw + (kh*group+r%group)*hd }
	off := kh * hd
	s := sc.s[:rows*stride]
	qs := j.q
	if j.f16 {
		qr := sc.qr[:rows*hd]
		for r := 0; r < rows; r++ {
			o := qoff(r)
			scaleRoundF16(qr[r*hd:(r+1)*hd], j.q[o:o+hd], 1)
		}
		qs = qr
	}
	// qrow returns the offset of query row r in qs.
	qrow := func(r int) int {
		if j.f16 {
			return r * hd
		}
		return qoff(r)
	}

	// Pass 1: scores, by blocks of whole quads of keys; the last one to three keys four at a
	// time with the last repeated (their scores land in the row's padding).
	m4 := m &^ 3
	for j0 := 0; j0 < m4; j0 += fullKeyBlock {
		nk := min(fullKeyBlock, m4-j0)
		kb := j0*kw + off
		for r := 0; r < rows; r += 2 {
			r1 := min(r+1, rows-1)
			q0, q1 := qs[qrow(r):qrow(r)+hd], qs[qrow(r1):qrow(r1)+hd]
			s0, s1 := s[r*stride+j0:r*stride+j0+nk], s[r1*stride+j0:r1*stride+j0+nk]
			if j.f16 {
				scores2F16(q0, q1, j.k16[kb:], kw, nk, a.Scale, s0, s1)
			} else {
				scores2(q0, q1, j.k32[kb:], kw, nk, a.Scale, s0, s1)
			}
		}
	}
	if m4 < m {
		var o [4]int
		for i := range o {
			o[i] = min(m4+i, m-1)*kw + off
		}
		for r := 0; r < rows; r++ {
			q := qs[qrow(r) : qrow(r)+hd]
			var s0, s1, s2, s3 float32
			if j.f16 {
				k := j.k16
				s0, s1, s2, s3 = dot4F16(q, k[o[0]:o[0]+hd], k[o[1]:o[1]+hd], k[o[2]:o[2]+hd], k[o[3]:o[3]+hd])
			} else {
				k := j.k32
				s0, s1, s2, s3 = dot4(q, k[o[0]:o[0]+hd], k[o[1]:o[1]+hd], k[o[2]:o[2]+hd], k[o[3]:o[3]+hd])
			}
			ss := s[r*stride+m4 : r*stride+m4+4]
			ss[0], ss[1], ss[2], ss[3] = a.Scale*s0, a.Scale*s1, a.Scale*s2, a.Scale*s3
		}
	}

	j.softmax(sc, s, rows)

	// Pass 2: weighted values, by blocks of values, two rows and pvWidth elements at a time,
	// accumulated in dst.
	for r := 0; r < rows; r++ {
		o := qoff(r)
		clear(j.dst[o : o+hd])
	}
	for j0 := 0; j0 < m; j0 += fullKeyBlock {
		nk := min(fullKeyBlock, m-j0)
		vb := j0*kw + off
		for r := 0; r < rows; r += 2 {
			r1 := min(r+1, rows-1)
			o0, o1 := qoff(r), qoff(r1)
			p0, p1 := s[r*stride+j0:r*stride+j0+nk], s[r1*stride+j0:r1*stride+j0+nk]
			for d := 0; d < hd; d += pvWidth {
				if j.f16 {
					pv2F16(j.dst[o0+d:o0+d+pvWidth], j.dst[o1+d:o1+d+pvWidth], p0, p1, j.v16[vb+d:], kw, nk)
				} else {
					pv2(j.dst[o0+d:o0+d+pvWidth], j.dst[o1+d:o1+d+pvWidth], p0, p1, j.v32[vb+d:], kw, nk)
				}
			}
		}
	}
	if !j.f16 {
		for r := 0; r < rows; r++ {
			o := qoff(r)
			scale32(j.dst[o:o+hd], sc.norm[r])
		}
	}
}

// softmax turns each of the rows of scores s (stride j.stride) into weights: exp(s - max),
// summed in float64. F16 weights are normalised and rounded to F16 now; the F32 normaliser
// 1/sum is kept in sc.norm for the end. Weights past the last key are zero.
func (j *fullAttnJob) softmax(sc *fullScratch, s []float32, rows int) {
	m, stride := j.m, j.stride
	for r := 0; r < rows; r++ {
		ss := s[r*stride : r*stride+m+3]
		mx := ss[0]
		for _, v := range ss[1:m] {
			if v > mx {
				mx = v
			}
		}
		sum := vec.ExpSum(ss[:m], mx)
		if j.f16 {
			scaleRoundF16(ss[:m], ss[:m], float32(1/sum))
		} else {
			sc.norm[r] = float32(1 / sum)
		}
		ss[m], ss[m+1], ss[m+2] = 0, 0, 0
	}
}

// attend computes the query heads of kv head kh for tokens [t0, t1), four keys at a time.
func (j *fullAttnJob) attend(sc *fullScratch, kh, t0, t1 int) {
	a := j.a
	hd, group, m, stride := a.HeadDim, a.NHead/a.NKVHead, j.m, j.stride
	qw, kw := a.NHead*hd, a.NKVHead*hd
	rows := (t1 - t0) * group
	// Query row r is head kh*group + r%group of token t0 + r/group; its slice of q and dst starts
	// at qoff(r).
	qoff := func(r int) int { return (t0+r/group)*qw + (kh*group+r%group)*hd }
	off := kh * hd
	last := (m - 1) * kw
	// row returns the offset of key/value row jj of the head, the last row for jj >= m.
	row := func(jj int) int {
		if jj >= m {
			return last + off
		}
		return jj*kw + off
	}
	s := sc.s[:rows*stride]

	// Pass 1: scores of every key for every row, four keys at a time.
	if j.f16 {
		qr := sc.qr[:rows*hd]
		for r := 0; r < rows; r++ {
			o := qoff(r)
			scaleRoundF16(qr[r*hd:(r+1)*hd], j.q[o:o+hd], 1)
		}
		k := j.k16
		for jj := 0; jj < m; jj += 4 {
			o0, o1, o2, o3 := row(jj), row(jj+1), row(jj+2), row(jj+3)
			k0, k1, k2, k3 := k[o0:o0+hd], k[o1:o1+hd], k[o2:o2+hd], k[o3:o3+hd]
			for r := 0; r < rows; r++ {
				s0, s1, s2, s3 := dot4F16(qr[r*hd:(r+1)*hd], k0, k1, k2, k3)
				ss := s[r*stride+jj : r*stride+jj+4]
				ss[0], ss[1], ss[2], ss[3] = a.Scale*s0, a.Scale*s1, a.Scale*s2, a.Scale*s3
			}
		}
	} else {
		k := j.k32
		for jj := 0; jj < m; jj += 4 {
			o0, o1, o2, o3 := row(jj), row(jj+1), row(jj+2), row(jj+3)
			k0, k1, k2, k3 := k[o0:o0+hd], k[o1:o1+hd], k[o2:o2+hd], k[o3:o3+hd]
			for r := 0; r < rows; r++ {
				o := qoff(r)
				s0, s1, s2, s3 := dot4(j.q[o:o+hd], k0, k1, k2, k3)
				ss := s[r*stride+jj : r*stride+jj+4]
				ss[0], ss[1], ss[2], ss[3] = a.Scale*s0, a.Scale*s1, a.Scale*s2, a.Scale*s3
			}
		}
	}

	j.softmax(sc, s, rows)

	// Pass 2: weighted values, four keys at a time, accumulated in dst.
	for r := 0; r < rows; r++ {
		o := qoff(r)
		clear(j.dst[o : o+hd])
	}
	for jj := 0; jj < m; jj += 4 {
		o0, o1, o2, o3 := row(jj), row(jj+1), row(jj+2), row(jj+3)
		if j.f16 {
			v := j.v16
			v0, v1, v2, v3 := v[o0:o0+hd], v[o1:o1+hd], v[o2:o2+hd], v[o3:o3+hd]
			for r := 0; r < rows; r++ {
				o := qoff(r)
				ss := s[r*stride+jj : r*stride+jj+4]
				axpy4F16(j.dst[o:o+hd], ss[0], ss[1], ss[2], ss[3], v0, v1, v2, v3)
			}
			continue
		}
		v := j.v32
		v0, v1, v2, v3 := v[o0:o0+hd], v[o1:o1+hd], v[o2:o2+hd], v[o3:o3+hd]
		for r := 0; r < rows; r++ {
			o := qoff(r)
			ss := s[r*stride+jj : r*stride+jj+4]
			axpy4(j.dst[o:o+hd], ss[0], ss[1], ss[2], ss[3], v0, v1, v2, v3)
		}
	}
	if !j.f16 {
		for r := 0; r < rows; r++ {
			o := qoff(r)
			scale32(j.dst[o:o+hd], sc.norm[r])
		}
	}
}

// FullAttention: dst[i, h] = softmax_j(Scale·q[i,h]·k[j,h']) · v[j,h'] over every row j of k
// and v. With F16 keys and values, q and the normalised weights are rounded to F16 before their
// products (backend.Backend.FullAttention).
func (be *Backend) FullAttention(dst, q, k, v backend.Tensor, a backend.Attn) error {
	const op = "full attention"
	be.mu.Lock()
	defer be.mu.Unlock()
	d, qt, kt, vt, err := be.ops.FullAttention(dst, q, k, v, a)
	if err != nil {
		return err
	}
	be.xqFrom = nil // writes activations
	n, m := qt.rows, kt.rows
	if n == 0 {
		return nil
	}
	j := &be.fa
	j.a, j.n, j.m, j.q, j.dst = a, n, m, qt.f32, d.f32
	j.f16 = kt.dt == tensor.F16
	if j.f16 {
		if kt.data == nil || vt.data == nil {
			return fmt.Errorf("purego: %s: F16 k or v without bytes: %w", op, backend.ErrUnsupported)
		}
		f16Once.Do(initF16Table)
		j.k16, j.v16 = u16View(kt.data), u16View(vt.data)
	} else {
		j.k32, j.v32 = kt.f32, vt.f32
	}
	group := a.NHead / a.NKVHead
	j.tile = max(1, fullTileRows/group)
	j.tiles = (n + j.tile - 1) / j.tile
	j.stride = m + 3
	rows := j.tile * group
	threads := be.pool.threads
	if len(j.scratch) < threads {
		j.scratch = make([]fullScratch, threads)
	}
	// Scratch grows to the largest shapes seen, and only then.
	for t := range j.scratch[:threads] {
		sc := &j.scratch[t]
		sc.s = grow(sc.s, rows*j.stride)
		if j.f16 {
			sc.qr = grow(sc.qr, rows*a.HeadDim)
		} else {
			sc.norm = grow(sc.norm, rows)
		}
	}
	be.pool.do(j, j.tiles*a.NKVHead)
	j.q, j.dst, j.k32, j.v32, j.k16, j.v16 = nil, nil, nil, nil, nil, nil
	return nil
}
