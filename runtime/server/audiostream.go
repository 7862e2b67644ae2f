package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/coder/websocket"

	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/sched/asr"
)

// clientEvent is a JSON text message from the client.
type clientEvent struct {
	Type  string `json:"type"`  // "audio", "commit" or "close"
	Audio string `json:"audio"` // base64 PCM16LE, for "audio"
}

type readyEvent struct {
	Type       string `json:"type"` // "ready"
	Model      string `json:"model"`
	SampleRate int    `json:"sample_rate"`
}

// audioStream upgrades to a WebSocket and runs a live transcription session in Parley's own
// protocol (docs/streaming.md).
func (s *Server) audioStream(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var keep json.RawMessage
	if k := q.Get("keep_alive"); k != "" {
		keep, _ = json.Marshal(k)
	}
	m, e := s.speechModel(r, q.Get("model"), keep)
	if e != nil {
		writeError(w, e)
		return
	}
	lang, e := m.checkLanguage(strings.ToLower(q.Get("language")))
	if e != nil {
		writeError(w, e)
		return
	}
	cfg := s.liveConfig(m, lang, q.Get("prompt"))
	if v := q.Get("beam_size"); v != "" {
		n, msg := parseBeamSize(v)
		if msg != "" {
			writeError(w, invalid("beam_size", msg))
			return
		}
		cfg.Params.BeamSize = n
	}
	lv := s.newLive(r, m)
	lv.proto = &streamProtocol{lv: lv}
	s.serveLive(w, r, lv, func() (asr.Live, error) { return asr.NewLive(lv.transcriber(m), cfg) })
}

// liveConfig is the configuration of a live stream of m.
func (s *Server) liveConfig(m *speechServed, lang, prompt string) asr.SessionConfig {
	cfg := s.cfg.Stream.Session
	cfg.Params = m.params
	cfg.Params.Language = lang
	cfg.Params.InitialPrompt = prompt
	cfg.Params.Timeout = 0
	cfg.IsSpecial = m.Recognizer.IsSpecial
	return cfg
}

// streamProtocol is the protocol of GET /v1/audio/stream.
type streamProtocol struct{ lv *live }

func (p *streamProtocol) hello() any {
	return readyEvent{Type: "ready", Model: p.lv.m.Name, SampleRate: asr.SampleRate}
}

func (p *streamProtocol) errorMessage(ev *errorEvent) any {
	ev.Type = "error"
	return ev
}

func (p *streamProtocol) parse(typ websocket.MessageType, b []byte) ([]item, any, websocket.StatusCode, *errorEvent) {
	it, code, ev := parseMessage(typ, b)
	if ev != nil {
		return nil, nil, code, ev
	}
	return []item{it}, nil, 0, nil
}

func (p *streamProtocol) events(ctx context.Context, evs []asr.Event) bool {
	for _, ev := range evs {
		if p.lv.send(ctx, wireEvent(ev)) != nil {
			return false
		}
	}
	return true
}

// do carries out commit, close and the server's shutdown: each commits first.
func (p *streamProtocol) do(ctx context.Context, it item) bool {
	lv := p.lv
	if !lv.commit(ctx) {
		return false
	}
	switch it.op {
	case "close":
		lv.end(websocket.StatusNormalClosure, "closed by the client", nil)
		return false
	case opShutdown:
		lv.end(websocket.StatusGoingAway, "server shutting down", shuttingDown())
		return false
	}
	return true
}

// parseMessage reads one client message; a bad one yields the error event and close code.
func parseMessage(typ websocket.MessageType, b []byte) (item, websocket.StatusCode, *errorEvent) {
	if typ == websocket.MessageBinary {
		pcm, err := pcm16(b)
		if err != nil {
			return item{}, websocket.StatusInvalidFramePayloadData, &errorEvent{Code: "invalid_audio", Message: err.Error()}
		}
		return item{pcm: pcm}, 0, nil
	}
	var ev clientEvent
	if err := json.Unmarshal(b, &ev); err != nil {
		return item{}, websocket.StatusInvalidFramePayloadData, &errorEvent{Code: "invalid_json", Message: "A text message is not a JSON event."}
	}
	switch ev.Type {
	case "audio":
		raw, err := base64.StdEncoding.DecodeString(ev.Audio)
		if err != nil {
			return item{}, websocket.StatusInvalidFramePayloadData, &errorEvent{Code: "invalid_audio", Message: "The audio field is not base64."}
		}
		pcm, err := pcm16(raw)
		if err != nil {
			return item{}, websocket.StatusInvalidFramePayloadData, &errorEvent{Code: "invalid_audio", Message: err.Error()}
		}
		return item{pcm: pcm}, 0, nil
	case "commit", "close":
		return item{op: ev.Type}, 0, nil
	}
	return item{}, websocket.StatusUnsupportedData, &errorEvent{Code: "unknown_event", Message: fmt.Sprintf("Unknown event type %q: want audio, commit or close.", ev.Type)}
}

func pcm16(b []byte) ([]float32, error) {
	if len(b)%2 != 0 {
		return nil, fmt.Errorf("audio of %d bytes is not whole 16-bit samples", len(b))
	}
	pcm := make([]float32, len(b)/2)
	audio.PCM16ToFloat(pcm, b)
	return pcm, nil
}

// wireEvent is ev as it is sent: its times to the millisecond (asr.RoundTime).
func wireEvent(ev asr.Event) asr.Event {
	ev.Start, ev.End = asr.RoundTime(ev.Start), asr.RoundTime(ev.End)
	if ev.Segments != nil {
		segs := make([]asr.LiveSegment, len(ev.Segments))
		for i, sg := range ev.Segments {
			sg.Start, sg.End = asr.RoundTime(sg.Start), asr.RoundTime(sg.End)
			segs[i] = sg
		}
		ev.Segments = segs
	}
	return ev
}
