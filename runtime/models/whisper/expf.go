package whisper

import "math"

// expf returns e^x in float32 for x ≤ 88 (0 below -87.3, where float32 underflows to
// subnormals), within 2 ulp: x = k·ln2 + r with |r| ≤ ln2/2, e^r by its Taylor polynomial to
// degree 6 (truncation error below 1.2e-7 relative), times 2^k. About five times faster than
// math.Exp, and the per-token loops over the vocabulary are made of it.
func expf(x float32) float32 {
	if x < -87.3 {
		return 0
	}
	if x > 88 {
		return float32(math.Inf(1))
	}
	const (
		log2e = 1.44269504088896341
		ln2hi = 0.693145751953125 // ln2 split so that k*ln2hi is exact
		ln2lo = 1.42860682030941723212e-6
	)
	t := x * log2e
	var k int32
	if t < 0 {
		k = int32(t - 0.5)
	} else {
		k = int32(t + 0.5)
	}
	fk := float32(k)
	r := (x - fk*ln2hi) - fk*ln2lo
	p := 1 + r*(1+r*(1.0/2+r*(1.0/6+r*(1.0/24+r*(1.0/120+r*(1.0/720))))))
	return p * math.Float32frombits(uint32(k+127)<<23)
}
