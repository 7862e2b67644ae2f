//go:build !race

package pockettts

const raceEnabled = false
