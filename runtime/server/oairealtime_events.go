package server

import (
	"context"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/coder/websocket"

	"github.com/parleyhq/parley/runtime/sched/asr"
)

// The worker's side of a realtime session: the stream's events become OpenAI's items. An item is
// the audio up to a commit (turn_detection null) or up to a final of the stream (server_vad: the
// stream's finals end items). Its transcript is its final text, sent whole as one delta and then
// as the completed transcript: a stream's partial text may still change, which OpenAI's deltas,
// appended to each other, cannot express, so partials only mark where speech begins.
//
// An item's audio, which its usage counts in seconds, runs from where the one before it ended
// (the stream's beginning, a clear or a session update where none did) to where it ends: its
// commit, or the end of the final that ends it under server_vad. Audio after the last item, or
// cleared, is in none. It is counted at the stream's rate, after resampling.

// rtItem is the item the audio since the last commit belongs to.
type rtItem struct {
	id      string
	text    string
	tokens  []asr.LiveToken // its text's, where the session includes log-probabilities
	started bool            // speech_started was sent for it
}

// addFinal adds a final's text (and tokens) to the item. The tokens of a final after the first
// get the space joinText puts between their texts, so that the item's tokens put together are
// its transcript.
func (p *realtimeProtocol) addFinal(it *rtItem, ev asr.Event) {
	if p.work.logprobs && ev.Text != "" {
		n := len(it.tokens)
		it.tokens = append(it.tokens, ev.Tokens...)
		if it.text != "" && len(it.tokens) > n && !strings.HasPrefix(it.tokens[n].Text, " ") {
			it.tokens[n].Text = " " + it.tokens[n].Text
		}
	}
	it.text = joinText(it.text, ev.Text)
}

// rtErrorEvent is OpenAI's error event.
type rtErrorEvent struct {
	Type    string  `json:"type"` // "error"
	EventID string  `json:"event_id"`
	Error   rtError `json:"error"`
}

func serverEventID() string { return "event_" + newID() }

// countedLive is a stream that counts the samples written to it, in all and since its last
// commit.
type countedLive struct {
	asr.Live
	total, pending int
}

func (c *countedLive) Write(ctx context.Context, pcm []float32) ([]asr.Event, error) {
	c.total += len(pcm)
	c.pending += len(pcm)
	return c.Live.Write(ctx, pcm)
}

func (c *countedLive) Commit(ctx context.Context) ([]asr.Event, error) {
	c.pending = 0
	return c.Live.Commit(ctx)
}

// config is the configuration of a stream with set.
func (p *realtimeProtocol) config(set rtSettings) asr.SessionConfig {
	cfg := p.lv.s.liveConfig(set.m, set.language, set.prompt)
	if set.beam > 0 {
		cfg.Params.BeamSize = set.beam
	}
	switch {
	case !set.vad:
		cfg.Silence = -1 // commits alone end items
	case set.silence > 0:
		cfg.Silence = set.silence
	}
	return cfg
}

// open makes a stream with set; set.m is not nil.
func (p *realtimeProtocol) open(set rtSettings) (asr.Live, error) {
	l, err := asr.NewLive(p.lv.transcriber(set.m), p.config(set))
	if err != nil {
		return nil, err
	}
	return &countedLive{Live: l}, nil
}

// reopen replaces the stream with one of set (the same settings for a clear); the audio of the
// old one counts on in the times sent.
func (p *realtimeProtocol) reopen(set rtSettings) error {
	lv := p.lv
	if set.m == nil {
		p.work = set
		return nil
	}
	old := lv.m
	lv.setModel(set.m) // the new stream's recogniser is timed under its model
	l, err := p.open(set)
	if err != nil {
		lv.setModel(old)
		return err
	}
	if c, ok := lv.sess.(*countedLive); ok {
		p.base += float64(c.total) / asr.SampleRate
	}
	lv.sess, p.work, p.cur, p.mark = l, set, nil, p.base
	return nil
}

func (p *realtimeProtocol) pending() int {
	if c, ok := p.lv.sess.(*countedLive); ok {
		return c.pending
	}
	return 0
}

// do carries out commit ("flush": a commit the client did not ask for, made before a session
// update), clear, update and the server's shutdown.
func (p *realtimeProtocol) do(ctx context.Context, it item) bool {
	lv := p.lv
	switch it.op {
	case "commit", "flush":
		return p.commit(ctx, it.op == "commit")
	case "clear":
		if err := p.reopen(p.work); err != nil {
			return lv.send(ctx, p.clientError("invalid_value", "", "Clearing the buffer failed: "+err.Error(), "")) == nil
		}
		return p.send(ctx, map[string]any{"type": "input_audio_buffer.cleared"})
	case "update":
		u := it.arg.(rtUpdate)
		if err := p.reopen(u.set); err != nil {
			return lv.send(ctx, p.clientError("invalid_value", "session", "Invalid session parameters: "+err.Error(), "")) == nil
		}
		return lv.send(ctx, p.sessionEvent(u.reply, p.work)) == nil
	case opShutdown:
		if p.pending() > 0 && !p.commit(ctx, false) {
			return false
		}
		lv.end(websocket.StatusGoingAway, "server shutting down", shuttingDown())
		return false
	}
	return true
}

// commit ends the item: the stream's remaining text is its last. An explicit commit makes an
// item even of audio that said nothing.
func (p *realtimeProtocol) commit(ctx context.Context, explicit bool) bool {
	lv := p.lv
	if lv.sess == nil {
		return true
	}
	evs, err := lv.sess.Commit(ctx)
	if err != nil {
		return lv.emit(ctx, nil, err)
	}
	said := false
	for _, ev := range evs {
		said = said || ev.Type == "final" && ev.Text != ""
	}
	if !explicit && p.cur == nil && !said {
		return true
	}
	it := p.item()
	for _, ev := range evs {
		if ev.Type == "final" {
			p.addFinal(it, ev)
		}
	}
	end := p.base + float64(lv.sess.(*countedLive).total)/asr.SampleRate
	if it.started && !p.speech(ctx, "input_audio_buffer.speech_stopped", "audio_end_ms", end) {
		return false
	}
	return p.finish(ctx, end)
}

// events turns the stream's events into items.
func (p *realtimeProtocol) events(ctx context.Context, evs []asr.Event) bool {
	for _, ev := range evs {
		switch {
		case !p.work.vad:
			if ev.Type == "final" && ev.Text != "" {
				p.addFinal(p.item(), ev)
			}
		case ev.Type == "partial":
			if ev.Text != "" && (p.cur == nil || !p.cur.started) && !p.start(ctx, ev.Start) {
				return false
			}
		case ev.Type == "final":
			if ev.Text == "" && p.cur == nil {
				continue
			}
			if (p.cur == nil || !p.cur.started) && !p.start(ctx, ev.Start) {
				return false
			}
			p.addFinal(p.cur, ev)
			if !p.speech(ctx, "input_audio_buffer.speech_stopped", "audio_end_ms", p.base+ev.End) || !p.finish(ctx, p.base+ev.End) {
				return false
			}
		}
	}
	return true
}

// item is the current item, begun when there is none.
func (p *realtimeProtocol) item() *rtItem {
	if p.cur == nil {
		p.cur = &rtItem{id: "item_" + newID()}
	}
	return p.cur
}

// start sends speech_started for the current item.
func (p *realtimeProtocol) start(ctx context.Context, at float64) bool {
	p.item().started = true
	return p.speech(ctx, "input_audio_buffer.speech_started", "audio_start_ms", p.base+at)
}

func (p *realtimeProtocol) speech(ctx context.Context, typ, field string, sec float64) bool {
	return p.send(ctx, map[string]any{"type": typ, field: int64(math.Round(sec * 1000)), "item_id": p.cur.id})
}

// finish commits the current item, whose audio ends at end (seconds like base), and sends its
// transcript.
func (p *realtimeProtocol) finish(ctx context.Context, end float64) bool {
	it := p.cur
	usage := rtUsage{Type: "duration", Seconds: math.Round(max(end-p.mark, 0)*1e6) / 1e6}
	p.mark = max(p.mark, end)
	var prev any
	if p.prev != "" {
		prev = p.prev
	}
	p.cur, p.prev = nil, it.id
	if !p.send(ctx, map[string]any{"type": "input_audio_buffer.committed", "previous_item_id": prev, "item_id": it.id}) {
		return false
	}
	added := "conversation.item.added"
	if p.beta {
		added = "conversation.item.created"
	}
	if !p.send(ctx, map[string]any{"type": added, "previous_item_id": prev, "item": userItem(it.id, nil)}) {
		return false
	}
	var logprobs []rtLogprob
	if p.work.logprobs {
		logprobs = make([]rtLogprob, len(it.tokens))
		for i, t := range it.tokens {
			logprobs[i] = rtLogprob{Token: t.Text, Logprob: min(float64(t.PLog), 0), Bytes: rtBytes(t.Text)}
		}
	}
	if it.text != "" {
		delta := map[string]any{"type": "conversation.item.input_audio_transcription.delta", "item_id": it.id, "content_index": 0, "delta": it.text}
		if logprobs != nil {
			delta["logprobs"] = logprobs
		}
		if !p.send(ctx, delta) {
			return false
		}
	}
	done := map[string]any{"type": "conversation.item.input_audio_transcription.completed", "item_id": it.id, "content_index": 0, "transcript": it.text, "usage": usage}
	if logprobs != nil {
		done["logprobs"] = logprobs
	}
	if !p.send(ctx, done) {
		return false
	}
	return p.beta || p.send(ctx, map[string]any{"type": "conversation.item.done", "previous_item_id": prev, "item": userItem(it.id, it.text)})
}

// rtUsage is a transcript's usage: OpenAI's duration form, the seconds of the item's audio.
type rtUsage struct {
	Type    string  `json:"type"` // "duration"
	Seconds float64 `json:"seconds"`
}

// rtLogprob is a transcript token's log-probability; its bytes are the token's UTF-8 text.
type rtLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   rtBytes `json:"bytes"`
}

// rtBytes is sent as a list of numbers, not base64.
type rtBytes []byte

func (b rtBytes) MarshalJSON() ([]byte, error) {
	out := make([]byte, 0, 2+4*len(b))
	out = append(out, '[')
	for i, c := range b {
		if i > 0 {
			out = append(out, ',')
		}
		out = strconv.AppendUint(out, uint64(c), 10)
	}
	return append(out, ']'), nil
}

// userItem is the conversation item of a committed buffer: a user message of input audio, its
// transcript null until it is known.
func userItem(id string, transcript any) map[string]any {
	return map[string]any{"id": id, "object": "realtime.item", "type": "message", "status": "completed", "role": "user",
		"content": []map[string]any{{"type": "input_audio", "transcript": transcript}}}
}

// send sends an event with a fresh event_id.
func (p *realtimeProtocol) send(ctx context.Context, ev map[string]any) bool {
	ev["event_id"] = serverEventID()
	return p.lv.send(ctx, ev) == nil
}

// joinText puts stretches of final text together, a space between them.
func joinText(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + " " + b
}

// The session as created and updated events describe it, in the GA dialect and the beta one.
type (
	rtTranscriptionOut struct {
		Model    string `json:"model"`
		Language string `json:"language"`
		Prompt   string `json:"prompt"`
	}
	rtTurnDetectionOut struct {
		Type              string `json:"type"` // "server_vad"
		SilenceDurationMs int64  `json:"silence_duration_ms"`
	}
	rtFormatOut struct {
		Type string `json:"type"` // "audio/pcm"
		Rate int    `json:"rate"`
	}
	rtSessionOut struct {
		Type   string `json:"type"` // "transcription"
		ID     string `json:"id"`
		Object string `json:"object"`
		Audio  struct {
			Input struct {
				Format         rtFormatOut         `json:"format"`
				Transcription  rtTranscriptionOut  `json:"transcription"`
				TurnDetection  *rtTurnDetectionOut `json:"turn_detection"`
				NoiseReduction any                 `json:"noise_reduction"`
			} `json:"input"`
		} `json:"audio"`
		Include []string `json:"include"`
	}
	rtBetaSessionOut struct {
		ID                       string              `json:"id"`
		Object                   string              `json:"object"`
		InputAudioFormat         string              `json:"input_audio_format"`
		InputAudioTranscription  rtTranscriptionOut  `json:"input_audio_transcription"`
		TurnDetection            *rtTurnDetectionOut `json:"turn_detection"`
		InputAudioNoiseReduction any                 `json:"input_audio_noise_reduction"`
		Include                  []string            `json:"include"`
	}
	rtSessionEvent struct {
		Type    string `json:"type"`
		EventID string `json:"event_id"`
		Session any    `json:"session"`
	}
)

// sessionEvent describes the session with set: in the beta dialect for the beta session and its
// transcription_session events, else in the GA one.
func (p *realtimeProtocol) sessionEvent(typ string, set rtSettings) rtSessionEvent {
	tr := rtTranscriptionOut{Language: set.language, Prompt: set.prompt}
	if set.m != nil {
		tr.Model = set.m.Name
	}
	var td *rtTurnDetectionOut
	if set.vad {
		silence := set.silence
		if silence <= 0 {
			silence = p.lv.s.cfg.Stream.Session.Silence
		}
		if silence <= 0 {
			silence = 600 * time.Millisecond // asr.Session's
		}
		td = &rtTurnDetectionOut{Type: "server_vad", SilenceDurationMs: silence.Milliseconds()}
	}
	var include []string
	if set.logprobs {
		include = []string{includeLogprobs}
	}
	const object = "realtime.transcription_session"
	if p.beta || typ == "transcription_session.updated" {
		return rtSessionEvent{Type: typ, EventID: serverEventID(), Session: rtBetaSessionOut{ID: p.id, Object: object,
			InputAudioFormat: "pcm16", InputAudioTranscription: tr, TurnDetection: td, Include: include}}
	}
	out := rtSessionOut{Type: "transcription", ID: p.id, Object: object, Include: include}
	out.Audio.Input.Format = rtFormatOut{Type: "audio/pcm", Rate: set.rate}
	out.Audio.Input.Transcription = tr
	out.Audio.Input.TurnDetection = td
	return rtSessionEvent{Type: typ, EventID: serverEventID(), Session: out}
}
