package quant

import (
	"math"
	"math/rand"
	"testing"

	"github.com/parleyhq/parley/runtime/tensor"
)

// Every half decodes to its defined value, and every non-NaN half survives a round trip.
func TestF16Exhaustive(t *testing.T) {
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		f := F16ToF32(h)
		want := refHalf(h)
		if math.IsNaN(want) {
			if !math.IsNaN(float64(f)) {
				t.Fatalf("F16ToF32(%#04x) = %g, want NaN", h, f)
			}
			if g := F32ToF16(f); g&0x7c00 != 0x7c00 || g&0x3ff == 0 || g&0x8000 != h&0x8000 || g&0x200 == 0 {
				t.Fatalf("F32ToF16(NaN from %#04x) = %#04x, want a quiet NaN of the same sign", h, g)
			}
			continue
		}
		if float64(f) != want || math.Signbit(float64(f)) != (h&0x8000 != 0) {
			t.Fatalf("F16ToF32(%#04x) = %g, want %g", h, f, want)
		}
		if g := F32ToF16(f); g != h {
			t.Fatalf("F32ToF16(F16ToF32(%#04x)) = %#04x", h, g)
		}
	}
}

// refF32ToF16 rounds to nearest even by comparing the two neighbouring halves in float64.
func refF32ToF16(f float32) uint16 {
	v := float64(f)
	var sign uint16
	if math.Signbit(v) {
		sign, v = 0x8000, -v
	}
	if v >= 65520 { // halfway between the largest half (65504) and 65536 rounds up to Inf
		return sign | 0x7c00
	}
	// Find the largest non-negative half h with value <= v by binary search over 0..0x7bff.
	lo, hi := 0, 0x7bff
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if refHalf(uint16(mid)) <= v {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	h := uint16(lo)
	below, above := refHalf(h), refHalf(h+1)
	switch {
	case v-below < above-v:
	case v-below > above-v:
		h++
	case h&1 == 1:
		h++
	}
	return sign | h
}

func TestF32ToF16Rounding(t *testing.T) {
	r := rand.New(rand.NewSource(4))
	check := func(f float32) {
		if got, want := F32ToF16(f), refF32ToF16(f); got != want {
			t.Fatalf("F32ToF16(%g = %#08x) = %#04x, want %#04x", f, math.Float32bits(f), got, want)
		}
	}
	// Exact midpoints between consecutive halves (and one float32 ulp either side): the ties
	// go to the even half, including into and out of the subnormal range and up to Inf.
	for h := uint16(0); h < 0x7c00; h++ {
		mid := float32((refHalf(h) + refHalf(h+1)) / 2)
		for _, f := range []float32{mid, math.Nextafter32(mid, 0), math.Nextafter32(mid, 1e9)} {
			check(f)
			check(-f)
		}
	}
	for range 200000 {
		check(math.Float32frombits(r.Uint32() & 0x47ffffff)) // magnitudes up to ~131072, both signs
	}
	cases := []struct {
		f float32
		h uint16
	}{
		{0, 0}, {float32(math.Copysign(0, -1)), 0x8000}, {1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff},
		{65519.996, 0x7bff}, {65520, 0x7c00}, {1e10, 0x7c00}, {float32(math.Inf(-1)), 0xfc00},
		{5.960464477539063e-08, 0x0001}, {2.9802322387695312e-08, 0x0000}, // 2^-24, 2^-25 (tie -> 0)
		{2.98023259e-08, 0x0001}, {6.103515625e-05, 0x0400}, {1e-10, 0}, {1.0009765625, 0x3c01},
		{1.00048828125, 0x3c00}, {1.00146484375, 0x3c02}, // ties: 1+2^-11 -> even 0x3c00, 1+3*2^-11 -> 0x3c02
	}
	for _, c := range cases {
		if got := F32ToF16(c.f); got != c.h {
			t.Errorf("F32ToF16(%g) = %#04x, want %#04x", c.f, got, c.h)
		}
	}
}

func TestBF16(t *testing.T) {
	cases := []struct {
		bits uint32
		h    uint16
	}{
		{0x3f800000, 0x3f80}, // 1
		{0x3f808000, 0x3f80}, // tie, even stays
		{0x3f818000, 0x3f82}, // tie, odd rounds up
		{0x3f808001, 0x3f81}, // above the tie
		{0x7f7fffff, 0x7f80}, // max float rounds to Inf
		{0xff800000, 0xff80}, // -Inf
		{0x7f800001, 0x7fc0}, // signalling NaN made quiet
		{0xffc00001, 0xffc0}, // quiet NaN kept
		{0x00000001, 0x0000}, // subnormal rounds to zero
		{0x80000000, 0x8000}, // -0
		{0x7fa00000, 0x7fe0}, // NaN payload kept, quiet bit set
	}
	for _, c := range cases {
		if got := F32ToBF16(math.Float32frombits(c.bits)); got != c.h {
			t.Errorf("F32ToBF16(%#08x) = %#04x, want %#04x", c.bits, got, c.h)
		}
	}
	for i := 0; i < 1<<16; i++ {
		h := uint16(i)
		f := BF16ToF32(h)
		if math.Float32bits(f) != uint32(h)<<16 {
			t.Fatalf("BF16ToF32(%#04x) = %#08x", h, math.Float32bits(f))
		}
		if f == f && F32ToBF16(f) != h {
			t.Fatalf("bf16 round trip of %#04x = %#04x", h, F32ToBF16(f))
		}
	}
}

// Quantize(F16) (vectorised where the CPU allows) agrees with F32ToF16 element by element,
// specials included.
func TestQuantizeF16MatchesScalar(t *testing.T) {
	r := rand.New(rand.NewSource(13))
	specials := []float32{0, float32(math.Copysign(0, -1)), float32(math.NaN()), math.Float32frombits(0x7f800001),
		math.Float32frombits(0xffa00000), float32(math.Inf(1)), float32(math.Inf(-1)), 65504, 65519.996, 65520,
		1e-8, 2.9802322387695312e-08, 5.960464477539063e-08, -6.1e-05, 1.00048828125, math.SmallestNonzeroFloat32}
	for _, n := range []int{1, 7, 8, 9, 64, 1001} {
		x := make([]float32, n)
		for i := range x {
			x[i] = math.Float32frombits(r.Uint32())
			if i%3 == 0 {
				x[i] = float32(r.NormFloat64() * math.Pow(2, float64(r.Intn(40)-25)))
			}
			if i%5 == 0 {
				x[i] = specials[r.Intn(len(specials))]
			}
		}
		got := make([]byte, 2*n)
		if err := Quantize(tensor.F16, x, got); err != nil {
			t.Fatal(err)
		}
		for i, v := range x {
			if h := uint16(got[2*i]) | uint16(got[2*i+1])<<8; h != F32ToF16(v) {
				t.Fatalf("n=%d element %d (%#08x): Quantize gives %#04x, F32ToF16 %#04x", n, i, math.Float32bits(v), h, F32ToF16(v))
			}
		}
	}
}
