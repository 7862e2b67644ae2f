package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/sched/tts"
)

// TTSModel is a text-to-speech model served at POST /v1/audio/speech.
type TTSModel struct {
	Name  string  // id clients pass as "model"; unique among all of a Server's models
	Synth Speaker // runs this model's syntheses; the caller closes it
}

// Speaker is what /v1/audio/speech needs of a speech synthesiser (a *tts.Synthesizer).
type Speaker interface {
	SampleRate() int
	Voices() []string
	Speak(ctx context.Context, r tts.Request, emit func(audio []float32) error) error
}

// maxSpeechInput is OpenAI's limit on the text of one request, in characters.
const maxSpeechInput = 4096

func (s *Server) addTTS() error {
	s.ttsN = map[string]*TTSModel{}
	for i, m := range s.cfg.TTSModels {
		switch {
		case m == nil || m.Synth == nil:
			return fmt.Errorf("server: text-to-speech model %d: synthesiser is required", i)
		case m.Name == "":
			return fmt.Errorf("server: text-to-speech model %d: empty name", i)
		case s.byName[m.Name] != nil || s.speechN[m.Name] != nil || s.ttsN[m.Name] != nil:
			return fmt.Errorf("server: model %q listed twice", m.Name)
		}
		s.ttsN[m.Name] = m
	}
	return nil
}

// speechRequest is OpenAI's request of /v1/audio/speech.
type speechRequest struct {
	Model          string          `json:"model"`
	Input          *string         `json:"input"`
	Voice          json.RawMessage `json:"voice"`
	ResponseFormat string          `json:"response_format"`
	Speed          *float64        `json:"speed"`
	StreamFormat   string          `json:"stream_format"`
	Instructions   string          `json:"instructions"`
}

// speak answers POST /v1/audio/speech: the synthesis of input with voice, as a 16-bit mono WAV
// file (whole, with its length in the header) or as raw 16-bit PCM streamed frame by frame.
func (s *Server) speak(w http.ResponseWriter, r *http.Request) {
	ri := info(r.Context())
	body, e := readBody(r)
	if e != nil {
		writeError(w, e)
		return
	}
	var req speechRequest
	if e := decodeBody(body, &req); e != nil {
		writeError(w, e)
		return
	}
	m, voice, format, e := s.checkSpeech(&req)
	if e != nil {
		writeError(w, e)
		return
	}
	ctx := r.Context()
	if s.cfg.RequestTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.RequestTimeout)
		defer cancel()
	}
	treq := tts.Request{Text: *req.Input, VoiceName: voice, Temperature: -1}
	rate := m.Synth.SampleRate()
	var pcm []byte
	started := false
	flusher, _ := w.(http.Flusher)
	err := m.Synth.Speak(ctx, treq, func(a []float32) error {
		if format == "wav" {
			pcm = audio.FloatToPCM16(pcm, a)
			return nil
		}
		if !started {
			started = true
			w.Header().Set("Content-Type", "audio/pcm")
			w.Header().Set("X-Sample-Rate", strconv.Itoa(rate))
			w.WriteHeader(http.StatusOK)
		}
		pcm = audio.FloatToPCM16(pcm[:0], a)
		if _, err := w.Write(pcm); err != nil {
			return err
		}
		if flusher != nil {
			flusher.Flush()
		}
		return nil
	})
	if err != nil {
		switch {
		case started:
			ri.log.Warn("speech synthesis stopped", "err", err) // the status is sent; the body ends short
		case errors.Is(err, tts.ErrInput):
			writeError(w, invalid("input", speechInputMessage(err)))
		case errors.Is(err, tts.ErrQueueFull):
			writeError(w, &apiError{Status: http.StatusTooManyRequests, Message: "The server is busy; retry shortly.", Type: typeRateLimit, Code: strptr("queue_full"), RetryAfter: 1})
		case errors.Is(err, tts.ErrClosed):
			writeError(w, &apiError{Status: http.StatusServiceUnavailable, Message: "The server is shutting down.", Type: typeUnavailable, RetryAfter: 5})
		case errors.Is(err, context.DeadlineExceeded):
			writeError(w, &apiError{Status: http.StatusGatewayTimeout, Message: "The speech synthesis took longer than the server's request timeout.", Type: typeServer})
		case errors.Is(err, context.Canceled):
		default:
			ri.log.Error("speech synthesis failed", "err", err)
			writeError(w, internalError())
		}
		return
	}
	if format == "pcm" {
		if !started { // no frames: an empty body
			w.Header().Set("Content-Type", "audio/pcm")
			w.Header().Set("X-Sample-Rate", strconv.Itoa(rate))
		}
		return
	}
	h, err := audio.WAVHeader(int64(len(pcm)/2), rate)
	if err != nil {
		writeError(w, invalid("input", "The synthesised audio is too long for a WAV file; use response_format \"pcm\"."))
		return
	}
	w.Header().Set("Content-Type", "audio/wav")
	w.Header().Set("Content-Length", strconv.Itoa(len(h)+len(pcm)))
	w.Write(h)
	w.Write(pcm)
}

// speechInputMessage is the message of a request the synthesiser refused.
func speechInputMessage(err error) string {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, tts.ErrInput.Error()+": ")
	if msg == "" {
		return "The input cannot be synthesised."
	}
	return "The input cannot be synthesised: " + msg + "."
}

// checkSpeech resolves a speech request's model, voice and format, answering 400 (404 for an
// unknown model) for anything it cannot honour.
func (s *Server) checkSpeech(req *speechRequest) (*TTSModel, string, string, *apiError) {
	var m *TTSModel
	switch {
	case req.Model == "" && len(s.cfg.TTSModels) == 1:
		m = s.cfg.TTSModels[0]
	case s.ttsN[req.Model] != nil:
		m = s.ttsN[req.Model]
	case req.Model == "":
		return nil, "", "", invalid("model", "Missing required parameter: 'model'.")
	case s.byName[req.Model] != nil || s.speechN[req.Model] != nil:
		return nil, "", "", invalidCode("model", "model_not_supported", fmt.Sprintf("The model '%s' is not a text-to-speech model.", req.Model))
	default:
		return nil, "", "", &apiError{Status: http.StatusNotFound, Message: fmt.Sprintf("The model '%s' does not exist.", req.Model), Type: typeInvalidRequest, Param: strptr("model"), Code: strptr("model_not_found")}
	}
	if req.Input == nil {
		return nil, "", "", invalid("input", "Missing required parameter: 'input'.")
	}
	if n := utf8.RuneCountInString(*req.Input); n > maxSpeechInput {
		return nil, "", "", invalidCode("input", "string_above_max_length", fmt.Sprintf("The input is %d characters long; the most is %d.", n, maxSpeechInput))
	}
	if strings.TrimSpace(*req.Input) == "" {
		return nil, "", "", invalid("input", "The input is empty.")
	}
	var voice string
	if isNull(req.Voice) {
		return nil, "", "", invalid("voice", "Missing required parameter: 'voice'.")
	}
	if err := json.Unmarshal(req.Voice, &voice); err != nil {
		return nil, "", "", invalid("voice", "Invalid type for 'voice': expected a string, the name of a voice.")
	}
	known := m.Synth.Voices()
	found := false
	for _, v := range known {
		found = found || v == voice
	}
	if !found {
		return nil, "", "", invalid("voice", fmt.Sprintf("The model '%s' has no voice '%s'; it has: %s.", m.Name, voice, strings.Join(known, ", ")))
	}
	format := req.ResponseFormat
	switch format {
	case "", "wav":
		format = "wav" // OpenAI's default is mp3, which Parley does not encode
	case "pcm":
	case "mp3", "opus", "aac", "flac":
		return nil, "", "", invalidCode("response_format", "unsupported_value", fmt.Sprintf("response_format '%s' is not supported here; use 'wav' or 'pcm'.", format))
	default:
		return nil, "", "", invalid("response_format", fmt.Sprintf("Invalid value for 'response_format': '%s'; supported are 'wav' and 'pcm'.", format))
	}
	if req.Speed != nil && *req.Speed != 1 {
		return nil, "", "", invalidCode("speed", "unsupported_value", "Only speed 1.0 is supported.")
	}
	if req.StreamFormat != "" && req.StreamFormat != "audio" {
		return nil, "", "", invalidCode("stream_format", "unsupported_value", fmt.Sprintf("stream_format '%s' is not supported; use 'audio'.", req.StreamFormat))
	}
	if req.Instructions != "" {
		return nil, "", "", invalidCode("instructions", "unsupported_value", "This model does not take instructions.")
	}
	return m, voice, format, nil
}
