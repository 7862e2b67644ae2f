//go:build race

package tts

const raceEnabled = true
