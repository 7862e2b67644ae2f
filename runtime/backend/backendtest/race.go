//go:build race

package backendtest

const raceEnabled = true
