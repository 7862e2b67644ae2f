//go:build !race

package whisper

const raceEnabled = false
