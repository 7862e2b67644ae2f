//go:build race

package pockettts

// raceEnabled: the race detector slows the pure-Go kernels about tenfold, so the long parity
// comparisons run without it (in the other builds).
const raceEnabled = true
