package models

import (
	"errors"
	"fmt"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/models/parakeet"
	"github.com/parleyhq/parley/runtime/models/whisper"
	"github.com/parleyhq/parley/runtime/sched/asr"
)

// Speech recognition families, as SpeechFamily names them.
const (
	FamilyWhisper  = "whisper"
	FamilyParakeet = "parakeet"
)

// SpeechFamily reads the head of the file at path and names the speech recognition family it
// holds: FamilyParakeet, FamilyWhisper, or "" for a file of neither. Parakeet is asked first:
// its ggml files begin with the magic of Whisper's. The error is the file's when it cannot be
// read.
func SpeechFamily(path string) (string, error) {
	ok, err := parakeet.IsModelFile(path)
	if err != nil {
		return "", err
	}
	if ok {
		return FamilyParakeet, nil
	}
	if ok, err = whisper.IsModelFile(path); err != nil {
		return "", err
	}
	if ok {
		return FamilyWhisper, nil
	}
	return "", nil
}

// Recognizer is an open speech recognition model and its scheduler: an asr.Recognizer that
// also releases the model when closed.
type Recognizer struct {
	asr.Recognizer
	Family string
	// Whisper is the Whisper model (nil for other families): its languages, for the command
	// line's checks.
	Whisper *whisper.Model
	close   func() error
}

// Close stops the scheduler and releases the model and its file.
func (r *Recognizer) Close() error {
	return errors.Join(r.Recognizer.Close(), r.close())
}

// Multilingual reports whether the model is told, or detects, the language it transcribes:
// a multilingual Whisper model. A transducer hears any language it was trained on without
// being told.
func (r *Recognizer) Multilingual() bool { return r.Whisper != nil && r.Whisper.Multilingual() }

// OpenRecognizer opens the speech recognition model at path on be and starts its scheduler
// sized by cfg. A file of neither family is refused with the reason Whisper's reader gives.
func OpenRecognizer(path string, be backend.Backend, cfg asr.Config) (*Recognizer, error) {
	family, err := SpeechFamily(path)
	if err != nil {
		return nil, err
	}
	switch family {
	case FamilyParakeet:
		f, err := parakeet.Open(path)
		if err != nil {
			return nil, err
		}
		m, err := parakeet.Load(f, be)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		r, err := asr.NewParakeet(m, cfg)
		if err != nil {
			m.Close()
			f.Close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return &Recognizer{Recognizer: r, Family: family, close: func() error { return errors.Join(m.Close(), f.Close()) }}, nil
	default: // Whisper's reader says why a file that is neither family's cannot be opened
		m, err := whisper.Open(be, path)
		if err != nil {
			return nil, err
		}
		r, err := asr.NewWhisper(m, cfg)
		if err != nil {
			m.Close()
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return &Recognizer{Recognizer: r, Family: FamilyWhisper, Whisper: m, close: m.Close}, nil
	}
}
