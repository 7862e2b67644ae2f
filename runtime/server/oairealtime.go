package server

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/sched/asr"
)

// OpenAI's Realtime API, transcription sessions (docs/realtime.md): GET /v1/realtime upgrades to
// a WebSocket whose client sends session updates and base64 PCM16 audio (24 kHz unless the
// session says otherwise) and whose server answers with OpenAI's events. Both dialects are
// spoken: the beta one (?intent=transcription, transcription_session.update, the
// openai-beta.realtime-v1 subprotocol or OpenAI-Beta header) and the GA one (session.update with
// session.type "transcription").

// openAIRate is the sample rate of OpenAI's pcm16 audio.
const openAIRate = 24000

// rtSettings is a realtime session's transcription settings.
type rtSettings struct {
	m        *speechServed // nil until the query or a session update names a model
	language string        // the model's code for it; "" detects it
	prompt   string
	beam     int           // beam_size (a Parley extension); 0: the model's default
	vad      bool          // server_vad: the stream's endpoints end items; else commits do
	silence  time.Duration // server_vad's silence_duration_ms; 0: the server's
	rate     int           // of the audio appended
	logprobs bool          // include: item.input_audio_transcription.logprobs
}

// includeLogprobs is the one include value taken: transcripts' tokens and their log-probabilities.
const includeLogprobs = "item.input_audio_transcription.logprobs"

// realtime upgrades to a WebSocket and runs an OpenAI Realtime transcription session.
func (s *Server) realtime(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	intent := q.Get("intent")
	if intent != "" && intent != "transcription" {
		writeError(w, invalidCode("intent", "unsupported_intent", fmt.Sprintf("Unsupported intent '%s': this server's realtime sessions transcribe (intent=transcription).", intent)))
		return
	}
	sec, minted := s.requestSecret(r)
	var m *speechServed
	switch name := q.Get("model"); {
	case name != "" || len(s.speech) <= 1 && !minted:
		var e *apiError
		if m, e = s.speechModel(r, name, nil); e != nil {
			writeError(w, e)
			return
		}
	case len(s.speech) == 1 && len(s.reg.list) == 0: // a minted key's session may name one
		m = s.speech[0]
	}
	beta := strings.Contains(r.Header.Get("OpenAI-Beta"), "realtime") || slices.Contains(subprotocols(r), "openai-beta.realtime-v1")
	lv := s.newLive(r, m)
	p := &realtimeProtocol{lv: lv, id: "sess_" + newID(), beta: beta && intent == "transcription" || minted && sec.beta,
		set: rtSettings{m: m, vad: true, rate: openAIRate}}
	if minted && sec.session != nil { // the settings the key was minted with (checked then)
		set, bad := p.update(p.set, sec.session)
		if bad != nil {
			writeError(w, bad.httpError())
			return
		}
		p.set, m = set, set.m
		lv.setModel(m)
	}
	p.work = p.set
	p.res, _ = audio.NewResampler(p.set.rate, asr.SampleRate)
	lv.proto = p
	var open func() (asr.Live, error)
	if m != nil {
		open = func() (asr.Live, error) { return p.open(p.set) }
	}
	s.serveLive(w, r, lv, open)
}

// realtimeProtocol is the protocol of GET /v1/realtime. The fields up to work are the reading
// goroutine's; work and those after it the worker's.
type realtimeProtocol struct {
	lv   *live
	id   string // the session's
	beta bool   // the session was opened in the beta dialect: it is described as one

	set      rtSettings // as the updates read so far leave them
	res      *audio.Resampler
	appended int       // samples appended since the last commit or clear, at set.rate
	scratch  []float32 // an append's samples before resampling

	work rtSettings // the stream's, as the updates done so far leave them
	cur  *rtItem    // the item the audio since the last commit belongs to
	prev string     // the last item committed
	base float64    // seconds of audio in the streams before this one
	mark float64    // where the current item's audio begins, in seconds like base
}

// clientRealtimeEvent is a client event; fields beyond type belong to some types.
type clientRealtimeEvent struct {
	Type    string          `json:"type"`
	EventID string          `json:"event_id"`
	Audio   *string         `json:"audio"`
	Session json.RawMessage `json:"session"`
}

// rtError is a realtime error event's error.
type rtError struct {
	Type    string  `json:"type"`
	Code    string  `json:"code"`
	Message string  `json:"message"`
	Param   *string `json:"param"`
	EventID *string `json:"event_id"` // the client event it answers
}

func (p *realtimeProtocol) clientError(code, param, msg, eventID string) any {
	return rtErrorEvent{Type: "error", EventID: serverEventID(), Error: rtError{Type: typeInvalidRequest, Code: code, Message: msg, Param: strptr(param), EventID: strptr(eventID)}}
}

// errorMessage sends the core's errors (backlog, idle timeout, shutdown, transcription failures)
// as OpenAI's error events.
func (p *realtimeProtocol) errorMessage(ev *errorEvent) any {
	typ := typeInvalidRequest
	switch ev.Code {
	case "internal_error", "shutting_down", "busy":
		typ = typeServer
	}
	return rtErrorEvent{Type: "error", EventID: serverEventID(), Error: rtError{Type: typ, Code: ev.Code, Message: ev.Message}}
}

func (p *realtimeProtocol) hello() any {
	typ := "session.created"
	if p.beta {
		typ = "transcription_session.created"
	}
	return p.sessionEvent(typ, p.work)
}

// parse reads one client event. Bad events are answered with an error event and the session
// goes on, as OpenAI's does.
func (p *realtimeProtocol) parse(typ websocket.MessageType, b []byte) ([]item, any, websocket.StatusCode, *errorEvent) {
	if typ == websocket.MessageBinary {
		return nil, p.clientError("invalid_json", "", "Binary messages are not events: send JSON text events (input_audio_buffer.append carries base64 audio).", ""), 0, nil
	}
	var ev clientRealtimeEvent
	if err := json.Unmarshal(b, &ev); err != nil {
		return nil, p.clientError("invalid_json", "", "The message is not a JSON event: "+err.Error(), ""), 0, nil
	}
	switch ev.Type {
	case "input_audio_buffer.append":
		return p.append(ev)
	case "input_audio_buffer.commit":
		if p.appended == 0 {
			return nil, p.clientError("input_audio_buffer_commit_empty", "", "Error committing input audio buffer: the buffer is empty.", ev.EventID), 0, nil
		}
		return []item{p.flush("commit")}, nil, 0, nil
	case "input_audio_buffer.clear":
		p.res, _ = audio.NewResampler(p.set.rate, asr.SampleRate)
		p.appended = 0
		return []item{{op: "clear"}}, nil, 0, nil
	case "session.update", "transcription_session.update":
		if ev.Session == nil {
			return nil, p.clientError("missing_required_parameter", "session", "Missing required parameter: 'session'.", ev.EventID), 0, nil
		}
		set, e := p.update(p.set, ev.Session)
		if e != nil {
			return nil, p.clientError(e.code, e.param, e.msg, ev.EventID), 0, nil
		}
		var its []item
		if p.appended > 0 { // the audio before the update is transcribed as it was asked for
			its = append(its, p.flush("commit"))
		}
		if set.rate != p.set.rate {
			p.res, _ = audio.NewResampler(set.rate, asr.SampleRate)
		}
		p.set = set
		reply := strings.TrimSuffix(ev.Type, "update") + "updated"
		return append(its, item{op: "update", arg: rtUpdate{set: set, reply: reply}}), nil, 0, nil
	}
	return nil, p.clientError("invalid_value", "type", fmt.Sprintf("Invalid value: '%s'. A transcription session takes 'session.update', 'transcription_session.update', 'input_audio_buffer.append', 'input_audio_buffer.commit' and 'input_audio_buffer.clear'.", ev.Type), ev.EventID), 0, nil
}

// rtUpdate is the argument of an "update" item: the settings, and the event that answers it.
type rtUpdate struct {
	set   rtSettings
	reply string
}

// append decodes an append's audio and resamples it to the stream's rate.
func (p *realtimeProtocol) append(ev clientRealtimeEvent) ([]item, any, websocket.StatusCode, *errorEvent) {
	if ev.Audio == nil {
		return nil, p.clientError("missing_required_parameter", "audio", "Missing required parameter: 'audio'.", ev.EventID), 0, nil
	}
	raw, err := base64.StdEncoding.DecodeString(*ev.Audio)
	if err != nil {
		return nil, p.clientError("invalid_value", "audio", "The audio is not base64: "+err.Error()+".", ev.EventID), 0, nil
	}
	if len(raw)%2 != 0 {
		return nil, p.clientError("invalid_value", "audio", fmt.Sprintf("Audio of %d bytes is not whole 16-bit samples.", len(raw)), ev.EventID), 0, nil
	}
	if p.set.m == nil {
		return nil, p.clientError("missing_required_parameter", p.param("model"), "No transcription model: name one in the URL (?model=) or in a session update before appending audio.", ev.EventID), 0, nil
	}
	if len(raw) == 0 {
		return nil, nil, 0, nil
	}
	n := len(raw) / 2
	p.scratch = slices.Grow(p.scratch[:0], n)[:n]
	audio.PCM16ToFloat(p.scratch, raw)
	p.appended += n
	pcm := p.res.Process(make([]float32, 0, p.res.OutLen(int64(n))+1), p.scratch)
	return []item{{pcm: pcm}}, nil, 0, nil
}

// flush ends the audio buffer: the resampler's last samples go with the request op.
func (p *realtimeProtocol) flush(op string) item {
	pcm := p.res.Flush(nil)
	p.res, _ = audio.NewResampler(p.set.rate, asr.SampleRate)
	p.appended = 0
	return item{pcm: pcm, op: op}
}

// param is the name of a transcription setting in the session's dialect.
func (p *realtimeProtocol) param(name string) string {
	if p.beta {
		return "session.input_audio_transcription." + name
	}
	return "session.audio.input.transcription." + name
}

// rtSessionIn is the session of a session update, in either dialect.
type rtSessionIn struct {
	Type                     string          `json:"type"`
	InputAudioFormat         json.RawMessage `json:"input_audio_format"`
	InputAudioTranscription  json.RawMessage `json:"input_audio_transcription"`
	TurnDetection            json.RawMessage `json:"turn_detection"`
	InputAudioNoiseReduction json.RawMessage `json:"input_audio_noise_reduction"`
	Include                  json.RawMessage `json:"include"` // null or [] turns include off
	Audio                    *struct {
		Input *struct {
			Format         json.RawMessage `json:"format"`
			Transcription  json.RawMessage `json:"transcription"`
			TurnDetection  json.RawMessage `json:"turn_detection"`
			NoiseReduction json.RawMessage `json:"noise_reduction"`
		} `json:"input"`
	} `json:"audio"`
}

type rtTranscriptionIn struct {
	Model    string  `json:"model"`
	Language *string `json:"language"`
	Prompt   *string `json:"prompt"`
	BeamSize *int    `json:"beam_size"` // a Parley extension
}

type rtTurnDetectionIn struct {
	Type              string `json:"type"`
	SilenceDurationMs *int   `json:"silence_duration_ms"`
}

type rtFormatIn struct {
	Type string `json:"type"`
	Rate *int   `json:"rate"`
}

// badSetting is a session update's error.
type badSetting struct {
	code, param, msg string
	status           int // the HTTP status where one is answered (a minted key's settings); 0: 400
}

// httpError is b as an HTTP answer, for settings checked before a session opens (a minted key's).
func (b *badSetting) httpError() *apiError {
	status := b.status
	if status == 0 {
		status = http.StatusBadRequest
	}
	return &apiError{Status: status, Message: b.msg, Type: typeInvalidRequest, Param: strptr(b.param), Code: strptr(b.code)}
}

// update applies a session update to set; the session is refused whole when one setting is bad.
func (p *realtimeProtocol) update(set rtSettings, raw json.RawMessage) (rtSettings, *badSetting) {
	var in rtSessionIn
	if err := json.Unmarshal(raw, &in); err != nil {
		return set, &badSetting{code: "invalid_value", param: "session", msg: "The session is not a session object: " + err.Error() + "."}
	}
	if in.Type != "" && in.Type != "transcription" {
		return set, &badSetting{code: "invalid_value", param: "session.type", msg: fmt.Sprintf("Unsupported session type '%s': this server's realtime sessions transcribe (session.type 'transcription').", in.Type)}
	}
	format, tr, td, nr := in.InputAudioFormat, in.InputAudioTranscription, in.TurnDetection, in.InputAudioNoiseReduction
	prefix, formatParam, nrParam := "session.", "session.input_audio_format", "session.input_audio_noise_reduction"
	if in.Audio != nil && in.Audio.Input != nil {
		ai := in.Audio.Input
		prefix, formatParam, nrParam = "session.audio.input.", "session.audio.input.format", "session.audio.input.noise_reduction"
		format, tr, td, nr = ai.Format, ai.Transcription, ai.TurnDetection, ai.NoiseReduction
	}
	if format != nil {
		if err := parseFormat(&set, format); err != nil {
			return set, &badSetting{code: "unsupported_value", param: formatParam, msg: err.Error()}
		}
	}
	if nr != nil && !isNull(nr) {
		return set, &badSetting{code: "unsupported_value", param: nrParam, msg: "Noise reduction is not supported: leave it out or set it to null."}
	}
	if in.Include != nil {
		var include []string
		if err := json.Unmarshal(in.Include, &include); err != nil {
			return set, &badSetting{code: "invalid_value", param: "session.include", msg: "include is not a list of names: " + err.Error() + "."}
		}
		for _, v := range include {
			if v != includeLogprobs {
				return set, &badSetting{code: "unsupported_value", param: "session.include", msg: "Including " + strings.Join(include, ", ") + " is not supported: include only " + includeLogprobs + " or leave include out."}
			}
		}
		set.logprobs = len(include) > 0
	}
	if td != nil {
		tdParam := prefix + "turn_detection"
		if isNull(td) {
			set.vad = false
		} else {
			var t rtTurnDetectionIn
			if err := json.Unmarshal(td, &t); err != nil {
				return set, &badSetting{code: "invalid_value", param: tdParam, msg: "Turn detection is not an object: " + err.Error() + "."}
			}
			if t.Type != "server_vad" {
				return set, &badSetting{code: "unsupported_value", param: tdParam + ".type", msg: fmt.Sprintf("Unsupported turn detection '%s': use 'server_vad' or null (commits end items).", t.Type)}
			}
			set.vad = true
			if ms := t.SilenceDurationMs; ms != nil {
				if *ms < 10 || *ms > 10000 {
					return set, &badSetting{code: "invalid_value", param: tdParam + ".silence_duration_ms", msg: fmt.Sprintf("silence_duration_ms %d: want 10 to 10000.", *ms)}
				}
				set.silence = time.Duration(*ms) * time.Millisecond
			}
		}
	}
	if tr == nil {
		return set, nil
	}
	trParam := "session.input_audio_transcription"
	if prefix != "session." {
		trParam = prefix + "transcription"
	}
	if isNull(tr) {
		return set, &badSetting{code: "unsupported_value", param: trParam, msg: "A transcription session cannot turn transcription off."}
	}
	var t rtTranscriptionIn
	if err := json.Unmarshal(tr, &t); err != nil {
		return set, &badSetting{code: "invalid_value", param: trParam, msg: "The transcription settings are not an object: " + err.Error() + "."}
	}
	if t.Model != "" {
		m, e := p.lv.s.speechModel(p.lv.req, t.Model, nil)
		if e != nil {
			return set, &badSetting{code: orDefault(e.Code, "invalid_value"), param: trParam + ".model", msg: e.Message, status: e.Status}
		}
		set.m = m
	}
	if t.Prompt != nil {
		set.prompt = *t.Prompt
	}
	if t.BeamSize != nil {
		n, msg := parseBeamSize(strconv.Itoa(*t.BeamSize))
		if msg != "" {
			return set, &badSetting{code: "invalid_value", param: trParam + ".beam_size", msg: msg}
		}
		set.beam = n
	}
	lang := set.language
	if t.Language != nil {
		lang = strings.ToLower(*t.Language)
	}
	if set.m != nil {
		code, e := set.m.checkLanguage(lang)
		if e != nil {
			return set, &badSetting{code: orDefault(e.Code, "invalid_value"), param: trParam + ".language", msg: e.Message, status: e.Status}
		}
		set.language = code
	}
	return set, nil
}

func orDefault(s *string, def string) string {
	if s == nil {
		return def
	}
	return *s
}

// parseFormat reads an audio format: beta's "pcm16", or GA's {"type":"audio/pcm","rate":24000}
// (any rate the resampler takes).
func parseFormat(set *rtSettings, raw json.RawMessage) error {
	var name string
	if json.Unmarshal(raw, &name) == nil {
		if name != "pcm16" {
			return fmt.Errorf("Unsupported audio format '%s': send 'pcm16' (16-bit little-endian PCM, 24 kHz, mono).", name)
		}
		set.rate = openAIRate
		return nil
	}
	var f rtFormatIn
	if err := json.Unmarshal(raw, &f); err != nil {
		return fmt.Errorf("The audio format is neither a name nor an object: %v.", err)
	}
	if f.Type != "" && f.Type != "audio/pcm" {
		return fmt.Errorf("Unsupported audio format '%s': send 'audio/pcm' (16-bit little-endian PCM, mono).", f.Type)
	}
	rate := openAIRate
	if f.Rate != nil {
		rate = *f.Rate
	}
	if rate < audio.MinRate || rate > audio.MaxRate {
		return fmt.Errorf("Unsupported sample rate %d Hz: want %d to %d.", rate, audio.MinRate, audio.MaxRate)
	}
	set.rate = rate
	return nil
}
