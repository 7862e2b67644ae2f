package server

import (
	"context"
	"encoding/base64"
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

// VoiceCloner is a Speaker that makes voices from recordings: POST /v1/audio/voices is served
// for the models whose Speaker is one.
type VoiceCloner interface {
	// CloneVoice makes the voice of a prompt: mono audio at SampleRate.
	CloneVoice(prompt []float32) (ClonedVoice, error)
}

// ClonedVoice is a voice a VoiceCloner made.
type ClonedVoice interface {
	// Apply makes r speak with this voice (tts.Request.Voice).
	Apply(r *tts.Request)
	// Bytes is the memory the voice holds.
	Bytes() int
}

// TokenCounter is a Speaker that counts the text tokens of an input, for the usage that
// stream_format "sse" reports.
type TokenCounter interface {
	CountTokens(text string) (int, error)
}

// maxSpeechInput is OpenAI's limit on the text of one request, in characters.
const maxSpeechInput = 4096

func (s *Server) addTTS() error {
	s.ttsN = map[string]*TTSModel{}
	s.voices = map[string]*voiceStore{}
	if err := s.cfg.Voices.setDefaults(); err != nil {
		return err
	}
	if err := s.cfg.SpeechStream.setDefaults(); err != nil {
		return err
	}
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
		s.voices[m.Name] = newVoiceStore(s.cfg.Voices, m.Name)
		if st, ok := m.Synth.(VoiceStorer); ok {
			if err := s.voices[m.Name].load(st, m.Name, s.log); err != nil {
				return fmt.Errorf("server: %s: %w", m.Name, err)
			}
		}
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
	KeepAlive      json.RawMessage `json:"keep_alive"` // an on-demand model's, as Ollama's
}

// speechFormats are the response formats served, as error messages name them.
const speechFormats = "'wav', 'flac' and 'pcm'"

// speechBlock is the FLAC block of a response: 80 ms at 24 kHz, one Pocket TTS frame.
const speechBlock = 1920

// speechJob is a checked speech request.
type speechJob struct {
	m      *TTSModel
	voice  voiceRef
	format string // "wav", "flac" or "pcm"
	stream string // "": wav and flac whole, pcm streamed; "audio"; "sse"
}

// speak answers POST /v1/audio/speech: the synthesis of input with voice as 16-bit mono audio in
// WAV, FLAC or raw PCM; whole (WAV and FLAC with their lengths in the header) or streamed frame
// by frame (stream_format "audio", and raw PCM always), or as server-sent events
// (stream_format "sse").
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
	job, e := s.checkSpeech(r, &req)
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
	treq := tts.Request{Text: *req.Input, Temperature: -1}
	job.voice.apply(&treq)
	out, err := newSpeechWriter(w, job, job.m.Synth.SampleRate())
	if err != nil {
		ri.log.Error("speech output", "err", err)
		writeError(w, internalError())
		return
	}
	err = job.m.Synth.Speak(ctx, treq, out.frame)
	if out.samples > 0 {
		s.metrics.speechSec.WithLabelValues(job.m.Name, "speech").Add(float64(out.samples) / float64(out.rate))
	}
	if err == nil {
		var tokens *int
		if tc, ok := job.m.Synth.(TokenCounter); ok && job.stream == "sse" {
			if n, err := tc.CountTokens(*req.Input); err == nil {
				tokens = &n
			}
		}
		err = out.finish(tokens)
	}
	if err != nil {
		e := speechError(err)
		switch {
		case out.started && job.stream == "sse" && !errors.Is(err, context.Canceled):
			if e == nil {
				ri.log.Error("speech synthesis failed", "err", err)
				e = internalError()
			}
			out.sseError(e)
		case out.started:
			ri.log.Warn("speech synthesis stopped", "err", err) // the status is sent; the body ends short
		case e != nil:
			writeError(w, e)
		case errors.Is(err, context.Canceled):
		default:
			ri.log.Error("speech synthesis failed", "err", err)
			writeError(w, internalError())
		}
	}
}

// speechError is the client's answer to a synthesis that failed; nil: an internal error, or the
// client gone.
func speechError(err error) *apiError {
	switch {
	case errors.Is(err, tts.ErrInput):
		return invalid("input", speechInputMessage(err))
	case errors.Is(err, tts.ErrQueueFull):
		return &apiError{Status: http.StatusTooManyRequests, Message: "The server is busy; retry shortly.", Type: typeRateLimit, Code: strptr("queue_full"), RetryAfter: 1}
	case errors.Is(err, tts.ErrClosed):
		return &apiError{Status: http.StatusServiceUnavailable, Message: "The server is shutting down.", Type: typeUnavailable, RetryAfter: 5}
	case errors.Is(err, context.DeadlineExceeded):
		return &apiError{Status: http.StatusGatewayTimeout, Message: "The speech synthesis took longer than the server's request timeout.", Type: typeServer}
	case errors.Is(err, errTooLongForWAV):
		return invalid("input", "The synthesised audio is too long for a WAV file; use response_format \"pcm\".")
	}
	return nil
}

var errTooLongForWAV = errors.New("too long for a WAV file")

// speechInputMessage is the message of a request the synthesiser refused.
func speechInputMessage(err error) string {
	msg := err.Error()
	msg = strings.TrimPrefix(msg, tts.ErrInput.Error()+": ")
	if msg == "" {
		return "The input cannot be synthesised."
	}
	return "The input cannot be synthesised: " + msg + "."
}

// ttsModel resolves a text-to-speech model by name ("" when there is only one), loading an
// on-demand one and holding it until r's response is done; keep is the request's keep_alive.
func (s *Server) ttsModel(r *http.Request, name string, keep json.RawMessage) (*TTSModel, *apiError) {
	switch {
	case name == "" && len(s.cfg.TTSModels) == 1 && len(s.reg.list) == 0:
		return s.cfg.TTSModels[0], nil
	case s.ttsN[name] != nil:
		return s.ttsN[name], nil
	case s.reg.kind(name) == KindSpeechSynthesis:
		e, ae := s.acquire(r, name, keep)
		if ae != nil {
			return nil, ae
		}
		return e.loaded.TTS, nil
	case name == "":
		return nil, invalid("model", "Missing required parameter: 'model'.")
	case s.kindOf(name) != "":
		return nil, invalidCode("model", "model_not_supported", fmt.Sprintf("The model '%s' is not a text-to-speech model.", name))
	}
	return nil, &apiError{Status: http.StatusNotFound, Message: fmt.Sprintf("The model '%s' does not exist.", name), Type: typeInvalidRequest, Param: strptr("model"), Code: strptr("model_not_found")}
}

// checkSpeech resolves a speech request's model, voice and formats, answering 400 (404 for an
// unknown model) for anything it cannot honour.
func (s *Server) checkSpeech(r *http.Request, req *speechRequest) (*speechJob, *apiError) {
	m, e := s.ttsModel(r, req.Model, req.KeepAlive)
	if e != nil {
		return nil, e
	}
	if req.Input == nil {
		return nil, invalid("input", "Missing required parameter: 'input'.")
	}
	if e := checkSpeechText(*req.Input, maxSpeechInput); e != nil {
		return nil, e
	}
	if isNull(req.Voice) {
		return nil, invalid("voice", "Missing required parameter: 'voice'.")
	}
	var name string
	if err := json.Unmarshal(req.Voice, &name); err != nil {
		var obj struct {
			ID *string `json:"id"`
		}
		if err := json.Unmarshal(req.Voice, &obj); err != nil || obj.ID == nil {
			return nil, invalid("voice", "Invalid type for 'voice': expected a string, the name of a voice, or an object {\"id\": ...} naming an uploaded voice.")
		}
		name = *obj.ID
	}
	v, e := s.findVoice(m, name)
	if e != nil {
		return nil, e
	}
	job := &speechJob{m: m, voice: v, format: req.ResponseFormat, stream: req.StreamFormat}
	switch job.format {
	case "":
		job.format = "wav" // OpenAI's default is mp3, which Parley does not encode
	case "wav", "pcm", "flac":
	case "mp3", "opus", "aac":
		return nil, invalidCode("response_format", "unsupported_value", fmt.Sprintf("response_format '%s' is not supported here; use %s.", job.format, speechFormats))
	default:
		return nil, invalid("response_format", fmt.Sprintf("Invalid value for 'response_format': '%s'; supported are %s.", job.format, speechFormats))
	}
	if req.Speed != nil && *req.Speed != 1 {
		return nil, invalidCode("speed", "unsupported_value", "Only speed 1.0 is supported: the model speaks at its own pace, and resampling would change the pitch.")
	}
	switch job.stream {
	case "", "audio", "sse":
	default:
		return nil, invalid("stream_format", fmt.Sprintf("Invalid value for 'stream_format': '%s'; supported are 'audio' and 'sse'.", job.stream))
	}
	if req.Instructions != "" {
		return nil, invalidCode("instructions", "unsupported_value", "This model does not take instructions.")
	}
	return job, nil
}

// checkSpeechText answers 400 for a text that is empty or longer than max characters.
func checkSpeechText(text string, max int) *apiError {
	if n := utf8.RuneCountInString(text); n > max {
		return invalidCode("input", "string_above_max_length", fmt.Sprintf("The input is %d characters long; the most is %d.", n, max))
	}
	if strings.TrimSpace(text) == "" {
		return invalid("input", "The input is empty.")
	}
	return nil
}

// speechWriter writes a synthesis's frames as the response asks.
type speechWriter struct {
	w       http.ResponseWriter
	flusher http.Flusher
	job     *speechJob
	rate    int
	started bool // the status and headers are sent
	pcm     []byte
	buf     []byte // whole: the encoded audio so far; streamed: a frame's bytes
	b64     []byte
	flac    *audio.FLACEncoder
	frames  int
	samples int64
}

func newSpeechWriter(w http.ResponseWriter, job *speechJob, rate int) (*speechWriter, error) {
	sw := &speechWriter{w: w, job: job, rate: rate}
	sw.flusher, _ = w.(http.Flusher)
	if job.format == "flac" {
		var err error
		if sw.flac, err = audio.NewFLACEncoder(rate, speechBlock); err != nil {
			return nil, err
		}
	}
	return sw, nil
}

func (sw *speechWriter) whole() bool { return sw.job.stream == "" && sw.job.format != "pcm" }

func (sw *speechWriter) contentType() string {
	switch sw.job.format {
	case "wav":
		return "audio/wav"
	case "flac":
		return "audio/flac"
	}
	return "audio/pcm"
}

// start sends the status and headers of a streamed response and returns the stream's header
// bytes (WAV's and FLAC's, of unknown length).
func (sw *speechWriter) start() ([]byte, error) {
	sw.started = true
	h := sw.w.Header()
	h.Set("X-Sample-Rate", strconv.Itoa(sw.rate))
	if sw.job.stream == "sse" {
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		h.Set("X-Audio-Content-Type", sw.contentType())
	} else {
		h.Set("Content-Type", sw.contentType())
	}
	sw.w.WriteHeader(http.StatusOK)
	switch sw.job.format {
	case "wav":
		return audio.WAVStreamHeader(sw.rate)
	case "flac":
		return sw.flac.Header(0, nil)
	}
	return nil, nil
}

// frame takes one frame of audio.
func (sw *speechWriter) frame(a []float32) error {
	sw.frames++
	sw.samples += int64(len(a))
	if sw.whole() {
		if sw.job.format == "wav" {
			sw.buf = audio.FloatToPCM16(sw.buf, a)
			return nil
		}
		sw.pcm = audio.FloatToPCM16(sw.pcm[:0], a)
		var err error
		sw.buf, err = sw.flac.Append(sw.buf, sw.pcm)
		return err
	}
	sw.buf = sw.buf[:0]
	if !sw.started {
		h, err := sw.start()
		if err != nil {
			return err
		}
		sw.buf = append(sw.buf, h...)
	}
	sw.pcm = audio.FloatToPCM16(sw.pcm[:0], a)
	if sw.flac != nil {
		var err error
		if sw.buf, err = sw.flac.Append(sw.buf, sw.pcm); err != nil {
			return err
		}
	} else {
		sw.buf = append(sw.buf, sw.pcm...)
	}
	return sw.send(sw.buf)
}

// send writes b (streamed bytes) as they are or as a delta event.
func (sw *speechWriter) send(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if sw.job.stream == "sse" {
		sw.b64 = append(sw.b64[:0], `data: {"type":"speech.audio.delta","audio":"`...)
		sw.b64 = base64.StdEncoding.AppendEncode(sw.b64, b)
		sw.b64 = append(sw.b64, "\"}\n\n"...)
		b = sw.b64
	}
	if _, err := sw.w.Write(b); err != nil {
		return err
	}
	if sw.flusher != nil {
		sw.flusher.Flush()
	}
	return nil
}

// speechUsage is the usage of speech.audio.done: text tokens in, audio frames out.
type speechUsage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

// finish ends a synthesis that succeeded: a whole file's header and body, a stream's last
// frame, the done event.
func (sw *speechWriter) finish(inputTokens *int) error {
	if sw.whole() {
		var h []byte
		var err error
		if sw.job.format == "wav" {
			if h, err = audio.WAVHeader(int64(len(sw.buf)/2), sw.rate); err != nil {
				return errTooLongForWAV
			}
		} else {
			sw.buf = sw.flac.Flush(sw.buf)
			if h, err = sw.flac.Header(sw.flac.Samples(), sw.flac.MD5()); err != nil {
				return err
			}
		}
		sw.w.Header().Set("Content-Type", sw.contentType())
		sw.w.Header().Set("X-Sample-Rate", strconv.Itoa(sw.rate))
		sw.w.Header().Set("Content-Length", strconv.Itoa(len(h)+len(sw.buf)))
		sw.started = true
		sw.w.Write(h)
		sw.w.Write(sw.buf)
		return nil
	}
	sw.buf = sw.buf[:0]
	if !sw.started {
		h, err := sw.start()
		if err != nil {
			return err
		}
		sw.buf = append(sw.buf, h...)
	}
	if sw.flac != nil {
		sw.buf = sw.flac.Flush(sw.buf)
	}
	if err := sw.send(sw.buf); err != nil {
		return err
	}
	if sw.job.stream != "sse" {
		return nil
	}
	done := struct {
		Type  string       `json:"type"`
		Usage *speechUsage `json:"usage,omitempty"`
	}{Type: "speech.audio.done"}
	if inputTokens != nil {
		done.Usage = &speechUsage{*inputTokens, sw.frames, *inputTokens + sw.frames}
	}
	b, _ := json.Marshal(done)
	_, err := fmt.Fprintf(sw.w, "data: %s\n\n", b)
	if sw.flusher != nil {
		sw.flusher.Flush()
	}
	return err
}

// sseError ends an event stream with an error event.
func (sw *speechWriter) sseError(e *apiError) {
	b, _ := json.Marshal(struct {
		Type  string    `json:"type"`
		Error *apiError `json:"error"`
	}{"error", e})
	fmt.Fprintf(sw.w, "data: %s\n\n", b)
	if sw.flusher != nil {
		sw.flusher.Flush()
	}
}
