package audio

import (
	"crypto/md5"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
)

// FLACEncoder writes 16-bit mono native FLAC (https://www.rfc-editor.org/rfc/rfc9639) a block
// at a time, for streaming: fixed-size blocks, each channel coded with the best of a constant, a
// verbatim, or a fixed-predictor subframe of order 0 to 4 whose residual is Rice-coded in up to
// 2⁸ partitions, each with its own parameter. It writes no LPC subframes and no seek table.
//
// Header is the stream's start. A stream whose length is not known yet (sent while it is made)
// has a STREAMINFO with 0 total samples and an MD5 of zeros, both "unknown" in the format;
// a stream written whole may give both (Samples and MD5 once the last block is written).
type FLACEncoder struct {
	rate, block int
	frame       uint64
	total       int64
	pending     []int32 // samples of the block being filled
	res         []int32 // a residual, for the chosen order
	cost        []int64 // [riceParams][partitions at the finest order] bits
	pmax        int     // the finest partition order of cost
	bw          bitWriter
	md5         hash.Hash
}

// FLACBlockMax is the largest block a FLACEncoder writes (the format allows 65,535 samples).
const FLACBlockMax = 65535

const (
	flacRiceMax     = 14 // 4-bit parameters; 15 is the escape code, which is not written
	flacPartOrdMax  = 8
	flacFixedOrders = 5
)

// NewFLACEncoder makes an encoder of 16-bit mono audio at rate Hz in blocks of block samples
// (16 to FLACBlockMax; the last block of a stream may be shorter).
func NewFLACEncoder(rate, block int) (*FLACEncoder, error) {
	if rate <= 0 || rate >= 1<<20 {
		return nil, fmt.Errorf("audio: flac: sample rate %d Hz outside (0, %d)", rate, 1<<20)
	}
	if block < 16 || block > FLACBlockMax {
		return nil, fmt.Errorf("audio: flac: block of %d samples outside [16, %d]", block, FLACBlockMax)
	}
	return &FLACEncoder{rate: rate, block: block, pending: make([]int32, 0, block),
		res:  make([]int32, block),
		cost: make([]int64, (flacRiceMax+1)<<flacPartOrdMax), md5: md5.New()}, nil
}

// Header returns the "fLaC" marker and the STREAMINFO block: total samples and the MD5 of the
// samples as little-endian 16-bit (nil: unknown, written as zeros).
func (e *FLACEncoder) Header(total int64, sum []byte) ([]byte, error) {
	if total < 0 || total >= 1<<36 {
		return nil, fmt.Errorf("audio: flac: %d samples do not fit a STREAMINFO", total)
	}
	if sum != nil && len(sum) != md5.Size {
		return nil, errors.New("audio: flac: an MD5 has 16 bytes")
	}
	h := make([]byte, 0, 42)
	h = append(h, "fLaC"...)
	h = append(h, 0x80, 0, 0, 34) // last metadata block, STREAMINFO, 34 bytes
	h = binary.BigEndian.AppendUint16(h, uint16(e.block))
	h = binary.BigEndian.AppendUint16(h, uint16(e.block))
	h = append(h, 0, 0, 0, 0, 0, 0) // frame sizes unknown
	// 20 bits rate, 3 bits channels-1 (0), 5 bits bits-per-sample-1 (15), 36 bits total
	v := uint64(e.rate)<<44 | 15<<36 | uint64(total)
	h = binary.BigEndian.AppendUint64(h, v)
	if sum == nil {
		sum = make([]byte, md5.Size)
	}
	return append(h, sum...), nil
}

// Samples is the number of samples encoded so far (written in frames).
func (e *FLACEncoder) Samples() int64 { return e.total }

// MD5 is the MD5 of the samples encoded so far, as STREAMINFO holds it.
func (e *FLACEncoder) MD5() []byte { return e.md5.Sum(nil) }

// Append appends to dst the frames of every whole block that pcm (little-endian signed 16-bit
// samples, FloatToPCM16's bytes) completes; the rest waits for more samples or Flush.
func (e *FLACEncoder) Append(dst, pcm []byte) ([]byte, error) {
	if len(pcm)%2 != 0 {
		return dst, fmt.Errorf("audio: flac: %d bytes are not whole 16-bit samples", len(pcm))
	}
	for i := 0; i < len(pcm); i += 2 {
		e.pending = append(e.pending, int32(int16(binary.LittleEndian.Uint16(pcm[i:]))))
		if len(e.pending) == e.block {
			dst = e.encode(dst)
		}
	}
	e.md5.Write(pcm)
	return dst, nil
}

// Flush appends the frame of the samples waiting for a whole block, if any: the stream's last.
func (e *FLACEncoder) Flush(dst []byte) []byte {
	if len(e.pending) == 0 {
		return dst
	}
	return e.encode(dst)
}

// encode appends the frame of e.pending and empties it.
func (e *FLACEncoder) encode(dst []byte) []byte {
	x := e.pending
	n := len(x)
	start := len(dst)
	// Frame header: sync, fixed blocking; block size code 0111 (16-bit size-1 at the end).
	dst = append(dst, 0xff, 0xf8, 0x70|flacRateCode(e.rate), 0x08) // mono, 16 bits
	dst = appendUTF8Number(dst, e.frame)
	dst = binary.BigEndian.AppendUint16(dst, uint16(n-1))
	dst = append(dst, crc8(dst[start:]))

	w := &e.bw
	w.reset(dst)
	e.subframe(w, x)
	dst = w.finish()
	dst = binary.BigEndian.AppendUint16(dst, crc16(dst[start:]))
	e.frame++
	e.total += int64(n)
	e.pending = e.pending[:0]
	return dst
}

// subframe writes x's subframe: constant, the cheapest fixed predictor, or verbatim.
func (e *FLACEncoder) subframe(w *bitWriter, x []int32) {
	n := len(x)
	constant := true
	for _, v := range x[1:] {
		if v != x[0] {
			constant = false
			break
		}
	}
	if constant {
		w.write(0, 8) // pad bit, type 000000, no wasted bits
		w.write(uint64(uint16(x[0])), 16)
		return
	}
	best, bestOrder, bestPart := int64(16*n), -1, 0
	for order := 0; order < flacFixedOrders && order < n; order++ {
		fixedResidual(e.res[:n], x, order)
		bitsUsed, part := e.riceCost(e.res[:n], order)
		if c := int64(16*order) + bitsUsed; c < best {
			best, bestOrder, bestPart = c, order, part
		}
	}
	if bestOrder < 0 {
		w.write(0x02, 8) // type 000001: verbatim
		for _, v := range x {
			w.write(uint64(uint16(v)), 16)
		}
		return
	}
	order := bestOrder
	w.write(uint64(0x08|order)<<1, 8) // type 001xxx: fixed predictor of order xxx
	for _, v := range x[:order] {
		w.write(uint64(uint16(v)), 16)
	}
	fixedResidual(e.res[:n], x, order)
	e.riceCost(e.res[:n], order) // refills e.cost for the chosen order
	w.write(0, 2)                // Rice coding with 4-bit parameters
	w.write(uint64(bestPart), 4)
	parts := 1 << bestPart
	size := n >> bestPart
	r := e.res[:n]
	for p := range parts {
		lo, hi := p*size, (p+1)*size
		if p == 0 {
			lo = order
		}
		k := e.bestParam(p, bestPart)
		w.write(uint64(k), 4)
		for _, v := range r[lo:hi] {
			u := uint64(uint32(v<<1) ^ uint32(v>>31)) // zigzag
			w.unary(u >> k)
			w.write(u&(1<<k-1), uint(k))
		}
	}
}

// maxPartOrder is the finest partition order a block of n samples allows with a predictor of
// order: the block splits evenly and the first partition holds more than the warm-up.
func maxPartOrder(n, order int) int {
	p := 0
	for p < flacPartOrdMax && n%(1<<(p+1)) == 0 && n>>(p+1) > order {
		p++
	}
	return p
}

// riceCost fills e.cost with the bits of r's residual (from order on) per Rice parameter and
// partition at the finest order, and returns the bits of the best partition order (parameters
// included) and that order.
func (e *FLACEncoder) riceCost(r []int32, order int) (int64, int) {
	n := len(r)
	pmax := maxPartOrder(n, order)
	parts := 1 << pmax
	size := n >> pmax
	clear(e.cost[:(flacRiceMax+1)*parts])
	for p := range parts {
		lo, hi := p*size, (p+1)*size
		if p == 0 {
			lo = order
		}
		var sum [flacRiceMax + 1]int64
		for _, v := range r[lo:hi] {
			u := uint32(v<<1) ^ uint32(v>>31)
			for k := range sum {
				sum[k] += int64(u >> k)
			}
		}
		cnt := int64(hi - lo)
		for k := range sum {
			e.cost[k*parts+p] = sum[k] + cnt*int64(1+k)
		}
	}
	e.pmax = pmax
	best, bestP := int64(-1), 0
	for po := pmax; po >= 0; po-- {
		total := int64(6) // coding method and partition order
		for p := range 1 << po {
			total += 4 + e.partCost(p, po, pmax)
		}
		if best < 0 || total < best {
			best, bestP = total, po
		}
	}
	return best, bestP
}

// partCost is the least bits of partition p at partition order po, over Rice parameters.
func (e *FLACEncoder) partCost(p, po, pmax int) int64 {
	c, _ := e.partBest(p, po, pmax)
	return c
}

func (e *FLACEncoder) partBest(p, po, pmax int) (int64, int) {
	parts := 1 << pmax
	span := 1 << (pmax - po)
	best, bestK := int64(-1), 0
	for k := 0; k <= flacRiceMax; k++ {
		var c int64
		for q := p * span; q < (p+1)*span; q++ {
			c += e.cost[k*parts+q]
		}
		if best < 0 || c < best {
			best, bestK = c, k
		}
	}
	return best, bestK
}

// bestParam is the Rice parameter of partition p at partition order po, from e.cost.
func (e *FLACEncoder) bestParam(p, po int) int {
	_, k := e.partBest(p, po, e.pmax)
	return k
}

// fixedResidual writes to r, from order on, x less its fixed polynomial prediction of order
// (RFC 9639 section 9.2.5); r[:order] is left as it is.
func fixedResidual(r, x []int32, order int) {
	switch order {
	case 0:
		copy(r, x)
	case 1:
		for i := 1; i < len(x); i++ {
			r[i] = x[i] - x[i-1]
		}
	case 2:
		for i := 2; i < len(x); i++ {
			r[i] = x[i] - 2*x[i-1] + x[i-2]
		}
	case 3:
		for i := 3; i < len(x); i++ {
			r[i] = x[i] - 3*x[i-1] + 3*x[i-2] - x[i-3]
		}
	case 4:
		for i := 4; i < len(x); i++ {
			r[i] = x[i] - 4*x[i-1] + 6*x[i-2] - 4*x[i-3] + x[i-4]
		}
	}
}

// flacRateCode is a frame header's code of rate, 0 (STREAMINFO's) where the table has none.
func flacRateCode(rate int) byte {
	switch rate {
	case 88200:
		return 1
	case 176400:
		return 2
	case 192000:
		return 3
	case 8000:
		return 4
	case 16000:
		return 5
	case 22050:
		return 6
	case 24000:
		return 7
	case 32000:
		return 8
	case 44100:
		return 9
	case 48000:
		return 10
	case 96000:
		return 11
	}
	return 0
}

// appendUTF8Number appends v in the frame header's extended UTF-8 coding (up to 36 bits).
func appendUTF8Number(dst []byte, v uint64) []byte {
	if v < 0x80 {
		return append(dst, byte(v))
	}
	n := 2 // bytes: a leading byte and n-1 continuation bytes of 6 bits
	for n < 7 && v >= 1<<(5*n+1) {
		n++
	}
	lead := byte(0xff << (8 - n))
	if n == 7 {
		lead = 0xfe
	}
	dst = append(dst, lead|byte(v>>(6*(n-1))))
	for i := n - 2; i >= 0; i-- {
		dst = append(dst, 0x80|byte(v>>(6*i))&0x3f)
	}
	return dst
}

var crc8Table, crc16Table = func() (t8 [256]byte, t16 [256]uint16) {
	for i := range 256 {
		c8 := byte(i)
		c16 := uint16(i) << 8
		for range 8 {
			if c8&0x80 != 0 {
				c8 = c8<<1 ^ 0x07
			} else {
				c8 <<= 1
			}
			if c16&0x8000 != 0 {
				c16 = c16<<1 ^ 0x8005
			} else {
				c16 <<= 1
			}
		}
		t8[i], t16[i] = c8, c16
	}
	return
}()

// crc8 is the frame header's CRC: polynomial x⁸+x²+x+1, initial 0.
func crc8(b []byte) byte {
	var c byte
	for _, v := range b {
		c = crc8Table[c^v]
	}
	return c
}

// crc16 is the frame's CRC: polynomial x¹⁶+x¹⁵+x²+1, initial 0.
func crc16(b []byte) uint16 {
	var c uint16
	for _, v := range b {
		c = c<<8 ^ crc16Table[byte(c>>8)^v]
	}
	return c
}

// bitWriter appends bits, most significant first, to a byte slice.
type bitWriter struct {
	b   []byte
	acc uint64
	n   uint // bits in acc, fewer than 8 between calls
}

func (w *bitWriter) reset(b []byte) { w.b, w.acc, w.n = b, 0, 0 }

// write appends the low n bits of v (n ≤ 32).
func (w *bitWriter) write(v uint64, n uint) {
	if n == 0 {
		return
	}
	w.acc = w.acc<<n | v&(1<<n-1)
	w.n += n
	for w.n >= 8 {
		w.n -= 8
		w.b = append(w.b, byte(w.acc>>w.n))
	}
}

// unary appends q zeros and a one.
func (w *bitWriter) unary(q uint64) {
	for q >= 32 {
		w.write(0, 32)
		q -= 32
	}
	w.write(1, uint(q)+1)
}

// finish pads to a byte with zeros and returns the bytes.
func (w *bitWriter) finish() []byte {
	if w.n > 0 {
		w.write(0, 8-w.n)
	}
	b := w.b
	w.b = nil
	return b
}
