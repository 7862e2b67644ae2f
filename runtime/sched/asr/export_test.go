package asr

// RaceEnabled tells the external tests whether the race detector is on.
const RaceEnabled = raceEnabled

// LoadWAV reads a shared recording as 16 kHz samples (the internal tests' helper).
var LoadWAV = testWAV
