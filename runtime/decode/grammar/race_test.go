//go:build race

package grammar

// raceEnabled: the race detector slows the property tests tenfold, so they run fewer cases, and
// it makes allocation counts meaningless.
const raceEnabled = true
