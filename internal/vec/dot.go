package vec

// Dots sets dst[i] to the dot product of q with the len(q) elements of k that start at i·stride,
// for every i < len(dst). k must hold them all (len(k) >= (len(dst)-1)·stride + len(q)). The
// products are summed in float32, in an order that depends on the implementation.
func Dots(dst, q, k []float32, stride int) {
	if len(dst) == 0 {
		return
	}
	if stride < len(q) || len(k) < len(q) || len(dst)-1 > (len(k)-len(q))/max(stride, 1) {
		panic("vec: Dots: k is too short for its rows")
	}
	dots(dst, q, k, stride)
}

var dots = dotsGo

// dotsGo sums each product in order, four rows at a time.
func dotsGo(dst, q, k []float32, stride int) {
	n := len(q)
	i := 0
	for ; i+4 <= len(dst); i += 4 {
		k0 := k[i*stride : i*stride+n]
		k1 := k[(i+1)*stride : (i+1)*stride+n]
		k2 := k[(i+2)*stride : (i+2)*stride+n]
		k3 := k[(i+3)*stride : (i+3)*stride+n]
		var s0, s1, s2, s3 float32
		for d, x := range q {
			s0 += x * k0[d]
			s1 += x * k1[d]
			s2 += x * k2[d]
			s3 += x * k3[d]
		}
		dst[i], dst[i+1], dst[i+2], dst[i+3] = s0, s1, s2, s3
	}
	for ; i < len(dst); i++ {
		kr := k[i*stride : i*stride+n]
		var s float32
		for d, x := range q {
			s += x * kr[d]
		}
		dst[i] = s
	}
}
