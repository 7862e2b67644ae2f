package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/sched/asr"
	wtok "github.com/parleyhq/parley/runtime/tokenizer/whisper"
)

// SpeechModel is one served speech recognition model.
type SpeechModel struct {
	Name       string         // id clients pass as "model"; unique among all of a Server's models
	Recognizer asr.Recognizer // runs this model's transcriptions; the caller closes it
	// Params are what every request starts from (beam size, fallback, thresholds); requests set
	// Language, Translate, InitialPrompt and Temperature. nil: asr.DefaultParams().
	Params *asr.Params
}

// speechServed is a SpeechModel with what the server derives from it once.
type speechServed struct {
	*SpeechModel
	params asr.Params
}

const (
	defaultAudioBytes = 25 << 20
	defaultAudioDur   = 2 * time.Hour
	maxFieldBytes     = 64 << 10 // a form field other than the file
)

func (s *Server) addSpeech() error {
	cfg := &s.cfg
	switch {
	case cfg.MaxAudioBytes < 0:
		return fmt.Errorf("server: negative audio body limit %d", cfg.MaxAudioBytes)
	case cfg.MaxAudioDuration < 0:
		return fmt.Errorf("server: negative audio duration limit %v", cfg.MaxAudioDuration)
	}
	if cfg.MaxAudioBytes == 0 {
		cfg.MaxAudioBytes = defaultAudioBytes
	}
	if cfg.MaxAudioDuration == 0 {
		cfg.MaxAudioDuration = defaultAudioDur
	}
	if err := cfg.Stream.setDefaults(); err != nil {
		return err
	}
	s.speechN = map[string]*speechServed{}
	for i, m := range cfg.SpeechModels {
		switch {
		case m == nil || m.Recognizer == nil:
			return fmt.Errorf("server: speech model %d: recognizer is required", i)
		case m.Name == "":
			return fmt.Errorf("server: speech model %d: empty name", i)
		case s.byName[m.Name] != nil || s.speechN[m.Name] != nil:
			return fmt.Errorf("server: model %q listed twice", m.Name)
		}
		sm, err := newSpeechServed(m)
		if err != nil {
			return err
		}
		s.speech = append(s.speech, sm)
		s.speechN[m.Name] = sm
	}
	return nil
}

// newSpeechServed checks m's parameters.
func newSpeechServed(m *SpeechModel) (*speechServed, error) {
	sm := &speechServed{SpeechModel: m, params: asr.DefaultParams()}
	if m.Params != nil {
		sm.params = *m.Params
	}
	if err := sm.params.Validate(); err != nil {
		return nil, fmt.Errorf("server: speech model %q: %w", m.Name, err)
	}
	return sm, nil
}

// speechModel finds the named speech model, loading an on-demand one and holding it until r is
// answered (keep: the request's keep_alive); an empty name picks the only one when there is
// one.
func (s *Server) speechModel(r *http.Request, name string, keep json.RawMessage) (*speechServed, *apiError) {
	if name == "" && len(s.speech) == 1 && len(s.reg.list) == 0 {
		return s.speech[0], nil
	}
	if m := s.speechN[name]; m != nil {
		return m, nil
	}
	if s.reg.kind(name) == KindSpeechRecognition {
		e, ae := s.acquire(r, name, keep)
		if ae != nil {
			return nil, ae
		}
		return e.ss, nil
	}
	if name == "" {
		return nil, invalid("model", "Missing required parameter: 'model'.")
	}
	if k := s.kindOf(name); k == KindLLM || k == KindEmbedding {
		return nil, invalidCode("model", "model_not_supported", fmt.Sprintf("The model '%s' is not a speech recognition model.", name))
	}
	return nil, &apiError{Status: http.StatusNotFound, Message: fmt.Sprintf("The model '%s' does not exist.", name), Type: typeInvalidRequest, Param: strptr("model"), Code: strptr("model_not_found")}
}

// checkLanguage returns the code of a requested language ("" to detect it), or answers 400 for a
// language m cannot transcribe.
func (m *speechServed) checkLanguage(lang string) (string, *apiError) {
	code, err := m.Recognizer.ResolveLanguage(lang)
	if err != nil {
		return "", invalidCode("language", "unsupported_language", badRequestMessage(err))
	}
	return code, nil
}

// badRequestMessage is the part of a recogniser's error wrapping asr.ErrBadRequest meant for the
// client: what follows "bad request: ".
func badRequestMessage(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, asr.ErrBadRequest.Error()+": "); i >= 0 {
		msg = msg[i+len(asr.ErrBadRequest.Error())+2:]
	}
	return msg
}

// audioRequest is a parsed multipart transcription request.
type audioRequest struct {
	file        []byte
	fileType    string // the file part's Content-Type
	model       string
	language    string
	prompt      string
	format      string
	temperature *float32
	beam        int // beam_size (a Parley extension); 0: the model's default
	words       bool
	segments    bool
	stream      bool
	keepAlive   json.RawMessage // an on-demand model's keep_alive, as a JSON string
}

func (s *Server) transcriptions(w http.ResponseWriter, r *http.Request) { s.audio(w, r, false) }
func (s *Server) translations(w http.ResponseWriter, r *http.Request)   { s.audio(w, r, true) }

func (s *Server) audio(w http.ResponseWriter, r *http.Request, translate bool) {
	ri := info(r.Context())
	if s.speechFull() {
		// Every recogniser this upload could name is full: refused before its body is read,
		// whatever its length. The connection closes after the answer, so that the server does not
		// read the rest of the body first (net/http drains up to 256 KiB of it otherwise).
		w.Header().Set("Connection", "close")
		writeError(w, transcribeError(asr.ErrQueueFull))
		return
	}
	req, e := parseAudioRequest(r)
	if e != nil {
		writeError(w, e)
		return
	}
	m, e := s.speechModel(r, req.model, req.keepAlive)
	if e != nil {
		writeError(w, e)
		return
	}
	p := m.params
	p.InitialPrompt = req.prompt
	p.WordTimestamps = req.words // words timed by alignment, as OpenAI's are
	if req.temperature != nil {
		p.Temperature = *req.temperature
	}
	if req.beam > 0 {
		p.BeamSize = req.beam
	}
	kind := "transcription"
	if translate {
		kind = "translation"
		p.Translate = true
		p.Language = "" // detected; the output is English
	} else {
		code, e := m.checkLanguage(req.language)
		if e != nil {
			writeError(w, e)
			return
		}
		p.Language = code
	}
	if s.cfg.RequestTimeout > 0 {
		p.Timeout = s.cfg.RequestTimeout
	}
	// The header alone is read here (format, and the duration where it states it); the
	// recogniser decodes the file as it transcribes it, once the transcription has its place in
	// the queue: a full queue is answered before any audio is decoded.
	file, err := audio.NewFile(req.file, audio.Options{MaxDuration: s.cfg.MaxAudioDuration, ContentType: req.fileType})
	if err != nil {
		writeError(w, decodeError(err, s.cfg.MaxAudioDuration))
		return
	}
	t0 := time.Now()
	res, err := m.Recognizer.TranscribeSource(r.Context(), file, p, nil)
	s.metrics.asrTime.WithLabelValues(m.Name, kind).Observe(time.Since(t0).Seconds())
	if err != nil {
		switch e := transcribeError(err); {
		case errors.Is(err, audio.ErrUnsupported) || errors.Is(err, audio.ErrCorrupt) || errors.Is(err, audio.ErrTooLong):
			writeError(w, decodeError(err, s.cfg.MaxAudioDuration))
		case e != nil:
			writeError(w, e)
		default:
			ri.log.Error("transcription failed", "model", m.Name, "err", err)
			writeError(w, internalError())
		}
		return
	}
	s.metrics.audioSec.WithLabelValues(m.Name, kind).Add(res.Duration)
	if res.Language == "" {
		// The recogniser names the language of all audio it decodes, detecting it also where it
		// decodes no window; of audio of no samples it names none, and the decoder's language
		// would have been English, as it is for English-only models (whisper.cpp's default).
		res.Language = "en"
	}
	writeTranscript(w, req, res, translate, m.Recognizer.IsSpecial)
}

// speechFull reports whether every speech recognition model served says it is full (a
// recogniser with a Full method); false when one has room or cannot tell.
func (s *Server) speechFull() bool {
	if len(s.speech) == 0 || len(s.reg.list) > 0 {
		return false
	}
	for _, m := range s.speech {
		f, ok := m.Recognizer.(interface{ Full() bool })
		if !ok || !f.Full() {
			return false
		}
	}
	return true
}

// transcribeError maps a recogniser's error to the client's answer; nil: an internal error.
func transcribeError(err error) *apiError {
	switch {
	case errors.Is(err, asr.ErrQueueFull):
		return &apiError{Status: http.StatusTooManyRequests, Message: "The server is busy; retry shortly.", Type: typeRateLimit, Code: strptr("queue_full"), RetryAfter: 1}
	case errors.Is(err, asr.ErrBadRequest):
		return invalid("", badRequestMessage(err))
	case errors.Is(err, asr.ErrClosed):
		return &apiError{Status: http.StatusServiceUnavailable, Message: "The server is shutting down.", Type: typeUnavailable, RetryAfter: 5}
	case errors.Is(err, context.DeadlineExceeded):
		return &apiError{Status: http.StatusServiceUnavailable, Message: "The transcription took longer than the server allows.", Type: typeUnavailable, Code: strptr("timeout")}
	case errors.Is(err, context.Canceled):
		return &apiError{Status: http.StatusServiceUnavailable, Message: "The request was cancelled.", Type: typeUnavailable}
	}
	return nil
}

func decodeError(err error, maxDur time.Duration) *apiError {
	switch {
	case errors.Is(err, audio.ErrUnsupported):
		return &apiError{Status: http.StatusUnsupportedMediaType, Message: "The file is not in a supported audio format (wav, flac, mp3, ogg/vorbis, ogg/opus).", Type: typeInvalidRequest, Param: strptr("file"), Code: strptr("unsupported_format")}
	case errors.Is(err, audio.ErrTooLong):
		return invalidCode("file", "audio_too_long", fmt.Sprintf("The audio is longer than the %v this server accepts.", maxDur))
	}
	return invalidCode("file", "invalid_audio", "The audio file could not be decoded: it is corrupt or truncated.")
}

// parseAudioRequest reads OpenAI's multipart/form-data transcription request.
func parseAudioRequest(r *http.Request) (*audioRequest, *apiError) {
	ct := r.Header.Get("Content-Type")
	mt, mp, err := mime.ParseMediaType(ct)
	if err != nil || mt != "multipart/form-data" {
		return nil, &apiError{Status: http.StatusUnsupportedMediaType, Message: fmt.Sprintf("Content-Type must be multipart/form-data, not %q.", ct), Type: typeInvalidRequest, Code: strptr("unsupported_media_type")}
	}
	if mp["boundary"] == "" {
		return nil, invalid("", "The multipart/form-data Content-Type has no boundary.")
	}
	mr := multipart.NewReader(r.Body, mp["boundary"])
	req := &audioRequest{}
	haveFile := false
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, bodyError(err)
		}
		name := part.FormName()
		if name == "file" {
			if haveFile {
				return nil, invalid("file", "More than one file was sent.")
			}
			haveFile = true
			if req.file, err = io.ReadAll(part); err != nil {
				return nil, bodyError(err)
			}
			req.fileType = part.Header.Get("Content-Type")
			continue
		}
		b, err := io.ReadAll(io.LimitReader(part, maxFieldBytes+1))
		if err != nil {
			return nil, bodyError(err)
		}
		if len(b) > maxFieldBytes {
			return nil, invalid(name, fmt.Sprintf("The field '%s' is longer than %d bytes.", name, maxFieldBytes))
		}
		v := string(b)
		switch name {
		case "model":
			req.model = v
		case "language":
			req.language = strings.ToLower(strings.TrimSpace(v))
		case "prompt":
			req.prompt = v
		case "response_format":
			req.format = v
		case "temperature":
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 32)
			if err != nil || f < 0 || f > 1 || math.IsNaN(f) {
				return nil, invalid("temperature", fmt.Sprintf("Invalid temperature %q: want a number from 0 to 1.", v))
			}
			t := float32(f)
			req.temperature = &t
		case "beam_size":
			n, msg := parseBeamSize(v)
			if msg != "" {
				return nil, invalid("beam_size", msg)
			}
			req.beam = n
		case "timestamp_granularities[]", "timestamp_granularities":
			switch v {
			case "word":
				req.words = true
			case "segment":
				req.segments = true
			default:
				return nil, invalid("timestamp_granularities", fmt.Sprintf("Invalid timestamp granularity %q: want 'word' or 'segment'.", v))
			}
		case "stream":
			req.stream = v == "true"
		case "keep_alive":
			req.keepAlive, _ = json.Marshal(v)
		}
	}
	switch {
	case !haveFile:
		return nil, invalid("file", "Missing required parameter: 'file'.")
	case len(req.file) == 0:
		return nil, invalidCode("file", "empty_file", "The audio file is empty.")
	case req.stream:
		return nil, invalid("stream", "Streaming transcription is not supported here; use the WebSocket endpoint /v1/audio/stream.")
	}
	switch req.format {
	case "":
		req.format = "json"
	case "json", "text", "srt", "vtt", "verbose_json":
	default:
		return nil, invalid("response_format", fmt.Sprintf("Invalid response_format %q: want json, text, srt, verbose_json or vtt.", req.format))
	}
	if (req.words || req.segments) && req.format != "verbose_json" {
		return nil, invalid("timestamp_granularities", "timestamp_granularities needs response_format 'verbose_json'.")
	}
	if !req.words && !req.segments {
		req.segments = true
	}
	return req, nil
}

// parseBeamSize reads a request's beam size (beam_size, a Parley extension: the hypotheses a
// transcription keeps, 1 for greedy decoding), or returns the message that refuses it.
func parseBeamSize(v string) (int, string) {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 1 || n > asr.MaxDecoders {
		return 0, fmt.Sprintf("Invalid beam_size %q: want an integer from 1 (greedy) to %d.", v, asr.MaxDecoders)
	}
	return n, ""
}

// bodyError is a failure reading the request body: 413 over the limit, 408 past its deadline,
// else 400.
func bodyError(err error) *apiError {
	var mb *http.MaxBytesError
	if errors.As(err, &mb) {
		return &apiError{Status: http.StatusRequestEntityTooLarge, Message: fmt.Sprintf("The request body is larger than %d bytes.", mb.Limit), Type: typeInvalidRequest, Code: strptr("request_too_large")}
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return bodyTimedOut()
	}
	return invalid("", "The multipart/form-data body could not be parsed.")
}

type audioUsage struct {
	Type    string `json:"type"`
	Seconds int    `json:"seconds"`
}

type segmentJSON struct {
	ID               int     `json:"id"`
	Seek             int     `json:"seek"`
	Start            float64 `json:"start"`
	End              float64 `json:"end"`
	Text             string  `json:"text"`
	Tokens           []int32 `json:"tokens"`
	Temperature      float32 `json:"temperature"`
	AvgLogprob       float64 `json:"avg_logprob"`
	CompressionRatio float64 `json:"compression_ratio"`
	NoSpeechProb     float32 `json:"no_speech_prob"`
}

type verboseJSON struct {
	Task     string     `json:"task"`
	Language string     `json:"language"`
	Duration float64    `json:"duration"`
	Text     string     `json:"text"`
	Segments any        `json:"segments,omitempty"` // []segmentJSON when asked for
	Words    any        `json:"words,omitempty"`    // []asr.Word when asked for
	Usage    audioUsage `json:"usage"`
}

// writeTranscript answers with res in the requested format; isSpecial tells the model's tokens
// that are not text. Times are written to the millisecond (asr.RoundTime).
func writeTranscript(w http.ResponseWriter, req *audioRequest, res *asr.Result, translate bool, isSpecial func(int32) bool) {
	text := strings.TrimSpace(res.Text)
	usage := audioUsage{Type: "duration", Seconds: int(math.Ceil(res.Duration))}
	switch req.format {
	case "json":
		writeJSON(w, struct {
			Text  string     `json:"text"`
			Usage audioUsage `json:"usage"`
		}{text, usage})
	case "text":
		writeText(w, text+"\n")
	case "srt":
		writeText(w, res.SRT())
	case "vtt":
		writeText(w, res.VTT())
	case "verbose_json":
		v := verboseJSON{Task: "transcribe", Language: wtok.LanguageName(res.Language), Duration: asr.RoundTime(res.Duration), Text: text, Usage: usage}
		lang := res.Language
		if translate {
			// OpenAI's translations name the language of their text, always English, not the
			// language detected in the audio.
			v.Task, v.Language, lang = "translate", "english", "en"
		}
		if req.segments {
			segs := make([]segmentJSON, len(res.Segments))
			for i, sg := range res.Segments {
				ids := make([]int32, len(sg.Tokens))
				for k, t := range sg.Tokens {
					ids[k] = t.ID
				}
				// Seek is the segment's start in 10 ms frames: the recogniser does not report the
				// window a segment was decoded in.
				segs[i] = segmentJSON{ID: sg.ID, Seek: int(math.Round(sg.Start * 100)), Start: asr.RoundTime(sg.Start), End: asr.RoundTime(sg.End), Text: sg.Text, Tokens: ids,
					Temperature: sg.Temperature, AvgLogprob: sg.AvgLogprob, CompressionRatio: sg.CompressionRatio, NoSpeechProb: sg.NoSpeechProb}
			}
			v.Segments = segs
		}
		if req.words {
			words := asr.Words(res.Segments, isSpecial, lang)
			if words == nil {
				words = []asr.Word{}
			}
			for i := range words {
				words[i] = words[i].Rounded()
			}
			v.Words = words
		}
		writeJSON(w, v)
	}
}

func writeText(w http.ResponseWriter, s string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	io.WriteString(w, s)
}
