//go:build race

package asr

// raceEnabled: the race detector slows the pure-Go kernels about tenfold, so the parity tests
// over whole 30-second windows run without it (they run in the other builds); the concurrency
// tests run under it.
const raceEnabled = true
