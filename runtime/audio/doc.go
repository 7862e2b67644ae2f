// Package audio turns audio files into what a Whisper encoder reads: Decode sniffs the container
// (WAV in its RIFF, RIFX, RF64 and BW64 forms; FLAC; MP3; Ogg Vorbis; Ogg Opus), decodes it,
// mixes all channels down to mono by averaging and resamples to 16 kHz float32; LogMel computes
// the log-mel spectrogram exactly as whisper.cpp does; PowerSpectrum is the FFT under it, for
// front ends with other frame lengths (Parakeet's 512 points); Resampler is the band-limited
// (Kaiser-windowed sinc, polyphase) sample-rate converter Decode uses, usable on its own for
// streams; PCM16ToFloat converts raw 16-bit frames such as WebSocket audio messages. For
// synthesised speech it writes too: FloatToPCM16, WAV headers (WAVHeader, and WAVStreamHeader
// of unknown length) and FLACEncoder, a streaming 16-bit mono FLAC encoder.
//
// Every decoder is bounded: Options.MaxDuration caps the decoded length before anything is
// allocated for it, no allocation is sized from a header that the input's own length does not
// confirm, and a panic inside a third-party codec is reported as ErrCorrupt. Errors wrap
// ErrUnsupported (not an audio format this package decodes), ErrCorrupt (malformed or truncated)
// or ErrTooLong (over the duration limit).
package audio
