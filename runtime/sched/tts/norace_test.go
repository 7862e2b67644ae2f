//go:build !race

package tts

const raceEnabled = false
