package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/parleyhq/parley/runtime/audio"
)

// rtEv is a realtime server event, the fields the tests look at.
type rtEv struct {
	Type           string  `json:"type"`
	EventID        string  `json:"event_id"`
	ItemID         string  `json:"item_id"`
	PreviousItemID *string `json:"previous_item_id"`
	ContentIndex   *int    `json:"content_index"`
	Delta          string  `json:"delta"`
	Transcript     string  `json:"transcript"`
	AudioStartMs   *int64  `json:"audio_start_ms"`
	AudioEndMs     *int64  `json:"audio_end_ms"`
	Usage          *struct {
		Type    string  `json:"type"`
		Seconds float64 `json:"seconds"`
	} `json:"usage"`
	Logprobs []rtLogprobIn `json:"logprobs"`
	Item     struct {
		ID      string
		Role    string
		Content []struct {
			Type       string
			Transcript *string
		}
	} `json:"item"`
	Session struct {
		Include                 []string `json:"include"`
		Type                    string   `json:"type"`
		Object                  string   `json:"object"`
		InputAudioTranscription *struct {
			Model, Language string
		} `json:"input_audio_transcription"`
		Audio *struct {
			Input struct {
				Format struct {
					Type string
					Rate int
				}
				Transcription struct{ Model, Language string }
				TurnDetection *struct {
					Type              string
					SilenceDurationMs int64 `json:"silence_duration_ms"`
				} `json:"turn_detection"`
			}
		} `json:"audio"`
	} `json:"session"`
	Error *struct {
		Type, Code, Message string
		Param               *string
		EventID             *string `json:"event_id"`
	} `json:"error"`
}

type rtLogprobIn struct {
	Token   string   `json:"token"`
	Logprob *float64 `json:"logprob"`
	Bytes   []int    `json:"bytes"`
}

type rtConn struct {
	t *testing.T
	c *websocket.Conn
}

func dialRealtime(t *testing.T, h *speechHarness, query string, opts *websocket.DialOptions) *rtConn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(h.srv.URL, "http")+"/v1/realtime"+query, opts)
	if err != nil {
		code := 0
		if resp != nil {
			code = resp.StatusCode
		}
		t.Fatalf("dial: %v (HTTP %d)", err, code)
	}
	c.SetReadLimit(1 << 20)
	t.Cleanup(func() { c.CloseNow() })
	return &rtConn{t, c}
}

func (rc *rtConn) send(v any) {
	rc.t.Helper()
	b, _ := json.Marshal(v)
	if err := rc.c.Write(context.Background(), websocket.MessageText, b); err != nil {
		rc.t.Fatal(err)
	}
}

// next reads one event; nil with the close error when the connection ends.
func (rc *rtConn) next(timeout time.Duration) (*rtEv, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	_, b, err := rc.c.Read(ctx)
	if err != nil {
		return nil, err
	}
	var ev rtEv
	if err := json.Unmarshal(b, &ev); err != nil {
		rc.t.Fatalf("event %s: %v", b, err)
	}
	if !strings.HasPrefix(ev.EventID, "event_") {
		rc.t.Errorf("event %s without an event_id", b)
	}
	return &ev, nil
}

// until reads events up to one of type typ and returns them all.
func (rc *rtConn) until(typ string) []*rtEv {
	rc.t.Helper()
	var evs []*rtEv
	for {
		ev, err := rc.next(60 * time.Second)
		if err != nil {
			rc.t.Fatalf("waiting for %s: %v after %d events", typ, err, len(evs))
		}
		evs = append(evs, ev)
		if ev.Type == typ {
			return evs
		}
	}
}

// append sends pcm (at its rate) as input_audio_buffer.append events of chunk samples.
func (rc *rtConn) append(pcm []float32, chunk int, pause time.Duration) {
	rc.t.Helper()
	for i := 0; i < len(pcm); i += chunk {
		rc.send(map[string]string{"type": "input_audio_buffer.append", "audio": base64.StdEncoding.EncodeToString(pcmBytes(pcm[i:min(i+chunk, len(pcm))]))})
		time.Sleep(pause)
	}
}

// to24k resamples 16 kHz audio to OpenAI's 24 kHz.
func to24k(t *testing.T, pcm []float32) []float32 {
	r, err := audio.NewResampler(16000, 24000)
	if err != nil {
		t.Fatal(err)
	}
	return r.Flush(r.Process(nil, pcm))
}

// offlineText is what POST /v1/audio/transcriptions answers for a WAV of pcm at rate.
func offlineText(t *testing.T, h *speechHarness, pcm []float32, rate int) string {
	t.Helper()
	hdr, _ := audio.WAVHeader(int64(len(pcm)), rate)
	ct, body := form(append(hdr, pcmBytes(pcm)...), "audio/wav", field{"model", "whisper-tiny"}, field{"language", "en"}, field{"response_format", "text"})
	code, b, _ := post(t, h.srv.URL+"/v1/audio/transcriptions", ct, body)
	if code != 200 {
		t.Fatalf("offline transcription: %d %s", code, b)
	}
	return strings.TrimSpace(string(b))
}

// TestRealtimeCommit: the GA dialect with manual turns (turn_detection null). Audio appended
// whole and committed is one item whose transcript is what the offline endpoint answers for the
// same audio: 24 kHz pcm16 (resampled by the session as the WAV decoder resamples a 24 kHz
// file), and 16 kHz where the session's format says so. Items chain by previous_item_id.
func TestRealtimeCommit(t *testing.T) {
	h := newSpeechHarness(t, Config{Stream: StreamConfig{MaxBacklog: time.Minute}})
	base := runtime.NumGoroutine()
	pcm := jfk(t, 4)
	pcm24 := to24k(t, pcm)
	want24, want16 := offlineText(t, h, pcm24, 24000), offlineText(t, h, pcm, 16000)
	if want24 == "" || want16 == "" {
		t.Fatalf("offline texts %q %q: want some text to compare", want24, want16)
	}

	rc := dialRealtime(t, h, "?model=whisper-tiny", nil)
	if ev := rc.until("session.created")[0]; ev.Session.Type != "transcription" || ev.Session.Audio == nil || ev.Session.Audio.Input.Format.Rate != 24000 ||
		ev.Session.Audio.Input.Transcription.Model != "whisper-tiny" || ev.Session.Audio.Input.TurnDetection == nil {
		t.Errorf("session.created %+v", ev.Session)
	}
	rc.send(map[string]any{"type": "session.update", "event_id": "u1", "session": map[string]any{"type": "transcription",
		"audio": map[string]any{"input": map[string]any{"format": map[string]any{"type": "audio/pcm", "rate": 24000},
			"transcription": map[string]any{"model": "whisper-tiny", "language": "en"}, "turn_detection": nil}}}})
	if ev := rc.until("session.updated")[0]; ev.Session.Audio == nil || ev.Session.Audio.Input.TurnDetection != nil || ev.Session.Audio.Input.Transcription.Language != "en" {
		t.Errorf("session.updated %+v", ev.Session)
	}
	rc.append(pcm24, len(pcm24), 0)
	rc.send(map[string]string{"type": "input_audio_buffer.commit"})
	first := checkItem(t, rc.until("conversation.item.done"), nil, want24)

	rc.send(map[string]any{"type": "session.update", "session": map[string]any{"type": "transcription",
		"audio": map[string]any{"input": map[string]any{"format": map[string]any{"type": "audio/pcm", "rate": 16000}}}}})
	rc.until("session.updated")
	rc.append(pcm, len(pcm), 0)
	rc.send(map[string]string{"type": "input_audio_buffer.commit"})
	checkItem(t, rc.until("conversation.item.done"), &first, want16)

	rc.c.Close(websocket.StatusNormalClosure, "")
	waitStreams(t, h, base)
}

// checkItem checks that evs hold committed, delta and completed of one item with transcript
// want, chained to prev; it returns the item's id.
func checkItem(t *testing.T, evs []*rtEv, prev *string, want string) string {
	t.Helper()
	var committed, added, delta, completed, done *rtEv
	for _, e := range evs {
		switch e.Type {
		case "input_audio_buffer.committed":
			committed = e
		case "conversation.item.added":
			added = e
		case "conversation.item.done":
			done = e
		case "conversation.item.input_audio_transcription.delta":
			delta = e
		case "conversation.item.input_audio_transcription.completed":
			completed = e
		case "error":
			t.Errorf("error %+v", e.Error)
		}
	}
	if committed == nil || added == nil || delta == nil || completed == nil || done == nil {
		t.Fatalf("events %+v: want committed, conversation.item.added, delta, completed, conversation.item.done", evs)
	}
	if added.Item.ID != committed.ItemID || added.Item.Role != "user" || len(added.Item.Content) != 1 || added.Item.Content[0].Type != "input_audio" || added.Item.Content[0].Transcript != nil {
		t.Errorf("conversation.item.added %+v", added.Item)
	}
	if done.Item.ID != committed.ItemID || len(done.Item.Content) != 1 || done.Item.Content[0].Transcript == nil || *done.Item.Content[0].Transcript != want {
		t.Errorf("conversation.item.done %+v, want transcript %q", done.Item, want)
	}
	id := committed.ItemID
	if !strings.HasPrefix(id, "item_") || delta.ItemID != id || completed.ItemID != id || completed.ContentIndex == nil || *completed.ContentIndex != 0 {
		t.Errorf("item ids %q %q %q", id, delta.ItemID, completed.ItemID)
	}
	if (prev == nil) != (committed.PreviousItemID == nil) || prev != nil && *prev != *committed.PreviousItemID {
		t.Errorf("previous_item_id %v, want %v", committed.PreviousItemID, prev)
	}
	if completed.Usage == nil || completed.Usage.Type != "duration" || !(completed.Usage.Seconds > 0) {
		t.Errorf("completed usage %+v, want the duration of the item's audio", completed.Usage)
	}
	if completed.Transcript != want || delta.Delta != want {
		t.Errorf("transcript %q (delta %q), want %q as the offline endpoint gives", completed.Transcript, delta.Delta, want)
	}
	return id
}

// TestRealtimeUsageLogprobs: a session that includes logprobs gets, with each committed item's
// transcript, its tokens: their texts put together are the transcript (trimmed of white space at
// both ends), their bytes the texts' UTF-8, their log-probabilities finite and at most 0, the
// same in the delta. Usage counts the seconds of the audio committed, within a sample of the
// resampled stream. Turning include off again leaves logprobs out.
func TestRealtimeUsageLogprobs(t *testing.T) {
	h := newSpeechHarness(t, Config{Stream: StreamConfig{MaxBacklog: time.Minute}})
	pcm24 := to24k(t, jfk(t, 4))
	rc := dialRealtime(t, h, "?model=whisper-tiny", nil)
	rc.until("session.created")
	rc.send(map[string]any{"type": "session.update", "session": map[string]any{"type": "transcription", "include": []string{"item.input_audio_transcription.logprobs"},
		"audio": map[string]any{"input": map[string]any{"transcription": map[string]any{"language": "en"}, "turn_detection": nil}}}})
	if ev := rc.until("session.updated")[0]; len(ev.Session.Include) != 1 || ev.Session.Include[0] != "item.input_audio_transcription.logprobs" {
		t.Errorf("session.updated include %v", ev.Session.Include)
	}
	check := func(evs []*rtEv, sent int, logprobs bool) {
		t.Helper()
		var delta, completed *rtEv
		for _, e := range evs {
			switch e.Type {
			case "conversation.item.input_audio_transcription.delta":
				delta = e
			case "conversation.item.input_audio_transcription.completed":
				completed = e
			}
		}
		if delta == nil || completed == nil || completed.Transcript == "" {
			t.Fatalf("events %+v: want a delta and a completed transcript", evs)
		}
		want := float64(sent) / 24000
		if u := completed.Usage; u == nil || u.Type != "duration" || math.Abs(u.Seconds-want) > 1.0/16000+1e-6 {
			t.Errorf("usage %+v, want %.6f seconds (%d samples at 24 kHz)", u, want, sent)
		}
		if !logprobs {
			if completed.Logprobs != nil || delta.Logprobs != nil {
				t.Errorf("logprobs %v %v without include", completed.Logprobs, delta.Logprobs)
			}
			return
		}
		if len(completed.Logprobs) == 0 || !reflect.DeepEqual(completed.Logprobs, delta.Logprobs) {
			t.Fatalf("logprobs %+v, delta's %+v: want the tokens in both", completed.Logprobs, delta.Logprobs)
		}
		var text []byte
		for _, lp := range completed.Logprobs {
			tok := make([]byte, len(lp.Bytes))
			for i, c := range lp.Bytes {
				tok[i] = byte(c)
			}
			text = append(text, tok...)
			if lp.Logprob == nil || !(*lp.Logprob <= 0) || math.IsInf(*lp.Logprob, 0) || utf8.Valid(tok) && string(tok) != lp.Token {
				t.Errorf("token %+v: want a log-probability <= 0 and the token's bytes", lp)
			}
		}
		// As JSON sends the transcript: an invalid UTF-8 sequence as U+FFFD.
		j, _ := json.Marshal(strings.TrimSpace(string(text)))
		var got string
		json.Unmarshal(j, &got)
		if got != completed.Transcript {
			t.Errorf("tokens spell %q, transcript %q", got, completed.Transcript)
		}
	}
	rc.append(pcm24, 4800, 0)
	rc.send(map[string]string{"type": "input_audio_buffer.commit"})
	check(rc.until("conversation.item.done"), len(pcm24), true)

	half := pcm24[:len(pcm24)/2+7]
	rc.append(half, 4800, 0)
	rc.send(map[string]string{"type": "input_audio_buffer.commit"})
	check(rc.until("conversation.item.done"), len(half), true)

	rc.send(map[string]any{"type": "session.update", "session": map[string]any{"type": "transcription", "include": nil}})
	if ev := rc.until("session.updated")[0]; ev.Session.Include != nil {
		t.Errorf("session.updated include %v, want null", ev.Session.Include)
	}
	rc.append(pcm24, 4800, 0)
	rc.send(map[string]string{"type": "input_audio_buffer.commit"})
	check(rc.until("conversation.item.done"), len(pcm24), false)
}

// TestRealtimeServerVAD: the beta dialect (intent=transcription, the openai-beta subprotocol)
// with server_vad: 11 s of speech streamed at 24 kHz come back as items, each announced by
// speech_started and ended by speech_stopped, committed and completed, in order and within the
// audio sent.
func TestRealtimeServerVAD(t *testing.T) {
	h := newSpeechHarness(t, Config{Stream: StreamConfig{MaxBacklog: time.Minute}})
	rc := dialRealtime(t, h, "?intent=transcription", &websocket.DialOptions{Subprotocols: []string{"realtime", "openai-beta.realtime-v1"}})
	if rc.c.Subprotocol() != "realtime" {
		t.Errorf("subprotocol %q, want realtime", rc.c.Subprotocol())
	}
	if ev := rc.until("transcription_session.created")[0]; ev.Session.Object != "realtime.transcription_session" || ev.Session.InputAudioTranscription == nil || ev.Session.InputAudioTranscription.Model != "whisper-tiny" {
		t.Errorf("created %+v", ev.Session)
	}
	rc.send(map[string]any{"type": "transcription_session.update", "session": map[string]any{"input_audio_format": "pcm16",
		"input_audio_transcription": map[string]any{"model": "whisper-tiny", "language": "en"},
		"turn_detection":            map[string]any{"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 300, "silence_duration_ms": 500}}})
	rc.until("transcription_session.updated")
	pcm24 := to24k(t, jfk(t, 11))
	rc.append(pcm24, 2400, 8*time.Millisecond) // 100 ms at about 12 times real time
	rc.send(map[string]string{"type": "input_audio_buffer.commit"})
	// Read until the commit's item (or the last VAD item) is done and nothing more comes.
	var evs []*rtEv
	for {
		ev, err := rc.next(20 * time.Second)
		if err != nil {
			break
		}
		evs = append(evs, ev)
	}
	started := map[string]int64{}
	var prev *string
	items, created, last, used := 0, 0, int64(-1), 0.0
	for i, e := range evs {
		switch e.Type {
		case "input_audio_buffer.speech_started":
			started[e.ItemID] = *e.AudioStartMs
			if *e.AudioStartMs < last {
				t.Errorf("speech_started at %d ms before the last item's end %d", *e.AudioStartMs, last)
			}
		case "input_audio_buffer.speech_stopped":
			if s, ok := started[e.ItemID]; !ok || *e.AudioEndMs < s || *e.AudioEndMs > 11100 {
				t.Errorf("speech_stopped %d ms for %s started at %d", *e.AudioEndMs, e.ItemID, s)
			}
			last = *e.AudioEndMs
		case "input_audio_buffer.committed":
			if prev != nil && (e.PreviousItemID == nil || *e.PreviousItemID != *prev) || prev == nil && e.PreviousItemID != nil {
				t.Errorf("event %d: previous_item_id %v, want %v", i, e.PreviousItemID, prev)
			}
			prev = &e.ItemID
			items++
		case "conversation.item.created":
			if prev == nil || e.Item.ID != *prev {
				t.Errorf("conversation.item.created %s, committed %v", e.Item.ID, prev)
			}
			created++
		case "conversation.item.added", "conversation.item.done":
			t.Errorf("%s in the beta dialect", e.Type)
		case "conversation.item.input_audio_transcription.completed":
			if prev == nil || e.ItemID != *prev {
				t.Errorf("completed %s, committed %v", e.ItemID, prev)
			}
			// An item the VAD found has audio; the explicit commit's item has what the VAD's
			// items left, which is none when the last of them ended with the audio.
			_, vad := started[e.ItemID]
			if e.Usage == nil || e.Usage.Type != "duration" || e.Usage.Seconds < 0 || vad && e.Usage.Seconds == 0 {
				t.Errorf("completed usage %+v (speech_started: %v)", e.Usage, vad)
			} else {
				used += e.Usage.Seconds
			}
		case "error":
			t.Errorf("error %+v", e.Error)
		}
	}
	t.Logf("%d events, %d items, %d with speech_started", len(evs), items, len(started))
	if created != items {
		t.Errorf("%d items committed, %d created", items, created)
	}
	// The items' audio does not overlap: together it is at most the audio sent.
	if sent := float64(len(pcm24)) / 24000; used > sent+1.0/16000 {
		t.Errorf("usage of %.4f s in all, %.4f s sent", used, sent)
	}
	if len(started) == 0 || items < 2 {
		t.Errorf("%d items, %d started: want server VAD to end more than the last item", items, len(started))
	}
}

// TestRealtimeBadEvents: each bad event gets an OpenAI error event naming the code, the
// parameter and the client's event_id, and the session goes on.
func TestRealtimeBadEvents(t *testing.T) {
	h := newSpeechHarness(t, Config{})
	rc := dialRealtime(t, h, "", nil)
	rc.until("session.created")
	upd := func(s map[string]any) map[string]any {
		return map[string]any{"type": "session.update", "event_id": "evt_1", "session": s}
	}
	input := func(k string, v any) map[string]any {
		return upd(map[string]any{"type": "transcription", "audio": map[string]any{"input": map[string]any{k: v}}})
	}
	cases := []struct {
		name        string
		msg         any // a string is sent as it is
		code, param string
	}{
		{"not JSON", "hello", "invalid_json", ""},
		{"unknown type", map[string]any{"type": "response.create", "event_id": "evt_1"}, "invalid_value", "type"},
		{"bad base64", map[string]any{"type": "input_audio_buffer.append", "event_id": "evt_1", "audio": "@@@"}, "invalid_value", "audio"},
		{"odd bytes", map[string]any{"type": "input_audio_buffer.append", "event_id": "evt_1", "audio": "AAAA"}, "invalid_value", "audio"},
		{"no audio", map[string]any{"type": "input_audio_buffer.append", "event_id": "evt_1"}, "missing_required_parameter", "audio"},
		{"empty commit", map[string]any{"type": "input_audio_buffer.commit", "event_id": "evt_1"}, "input_audio_buffer_commit_empty", ""},
		{"conversation session", upd(map[string]any{"type": "realtime"}), "invalid_value", "session.type"},
		{"semantic_vad", input("turn_detection", map[string]any{"type": "semantic_vad"}), "unsupported_value", "session.audio.input.turn_detection.type"},
		{"silence out of range", input("turn_detection", map[string]any{"type": "server_vad", "silence_duration_ms": 0}), "invalid_value", "session.audio.input.turn_detection.silence_duration_ms"},
		{"mu-law", input("format", map[string]any{"type": "audio/pcmu"}), "unsupported_value", "session.audio.input.format"},
		{"beta g711", upd(map[string]any{"input_audio_format": "g711_ulaw"}), "unsupported_value", "session.input_audio_format"},
		{"noise reduction", input("noise_reduction", map[string]any{"type": "near_field"}), "unsupported_value", "session.audio.input.noise_reduction"},
		{"unknown include", upd(map[string]any{"type": "transcription", "include": []string{"item.input_audio_transcription.logprobs", "item.input_audio_transcription.words"}}), "unsupported_value", "session.include"},
		{"beta include", upd(map[string]any{"include": []string{"message.input_image.image_url"}}), "unsupported_value", "session.include"},
		{"include not a list", upd(map[string]any{"include": "item.input_audio_transcription.logprobs"}), "invalid_value", "session.include"},
		{"unknown model", input("transcription", map[string]any{"model": "gpt-4o-transcribe"}), "model_not_found", "session.audio.input.transcription.model"},
		{"language", upd(map[string]any{"input_audio_transcription": map[string]any{"language": "de"}}), "unsupported_language", "session.input_audio_transcription.language"},
		{"beam of 0", input("transcription", map[string]any{"beam_size": 0}), "invalid_value", "session.audio.input.transcription.beam_size"},
		{"beam of 9", upd(map[string]any{"input_audio_transcription": map[string]any{"beam_size": 9}}), "invalid_value", "session.input_audio_transcription.beam_size"},
		{"transcription off", upd(map[string]any{"input_audio_transcription": nil}), "unsupported_value", "session.input_audio_transcription"},
		{"no session", map[string]any{"type": "session.update", "event_id": "evt_1"}, "missing_required_parameter", "session"},
	}
	for _, c := range cases {
		if s, ok := c.msg.(string); ok {
			rc.c.Write(context.Background(), websocket.MessageText, []byte(s))
		} else {
			rc.send(c.msg)
		}
		ev, err := rc.next(10 * time.Second)
		if err != nil {
			t.Fatalf("%s: %v: the session did not survive", c.name, err)
		}
		e := ev.Error
		if ev.Type != "error" || e == nil || e.Code != c.code || e.Type != "invalid_request_error" || e.Message == "" || orDefault(e.Param, "") != c.param {
			t.Errorf("%s: %+v %+v, want error %s param %q", c.name, ev, e, c.code, c.param)
			continue
		}
		if _, ok := c.msg.(string); !ok && orDefault(e.EventID, "") != "evt_1" {
			t.Errorf("%s: error.event_id %v, want the client's", c.name, e.EventID)
		}
	}
	rc.c.Write(context.Background(), websocket.MessageBinary, []byte{0, 0})
	if ev, err := rc.next(10 * time.Second); err != nil || ev.Error == nil || ev.Error.Code != "invalid_json" {
		t.Errorf("binary message: %+v %v", ev, err)
	}
	// Still alive, and a bad update changed nothing.
	rc.send(map[string]any{"type": "session.update", "session": map[string]any{"type": "transcription"}})
	if ev := rc.until("session.updated")[0]; ev.Session.Audio == nil || ev.Session.Audio.Input.TurnDetection == nil || ev.Session.Audio.Input.Format.Rate != 24000 {
		t.Errorf("session after bad updates: %+v", ev.Session)
	}
}

// TestRealtimeRefusals: refused before the upgrade as plain HTTP errors.
func TestRealtimeRefusals(t *testing.T) {
	h := newSpeechHarness(t, Config{})
	ctx := context.Background()
	for q, want := range map[string]int{"?model=nope": 404, "?intent=conversation": 400} {
		_, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(h.srv.URL, "http")+"/v1/realtime"+q, nil)
		if err == nil || resp == nil || resp.StatusCode != want {
			t.Errorf("%s: %v %+v, want HTTP %d", q, err, resp, want)
		}
	}
	resp, err := http.Get(h.srv.URL + "/v1/realtime")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUpgradeRequired {
		t.Errorf("plain GET: %d", resp.StatusCode)
	}
}

// TestRealtimeAuth: with an API key, the handshake takes it as a bearer token or as OpenAI's
// browser subprotocol (answering with "realtime"); a missing or wrong key is refused with 401.
func TestRealtimeAuth(t *testing.T) {
	h := newSpeechHarness(t, Config{APIKey: "sk-test"})
	ctx := context.Background()
	for name, c := range map[string]struct {
		opts *websocket.DialOptions
		want int
	}{
		"bearer":      {&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer sk-test"}}}, 101},
		"subprotocol": {&websocket.DialOptions{Subprotocols: []string{"realtime", "openai-insecure-api-key.sk-test", "openai-beta.realtime-v1"}}, 101},
		"wrong key":   {&websocket.DialOptions{Subprotocols: []string{"realtime", "openai-insecure-api-key.sk-nope"}}, 401},
		"no key":      {&websocket.DialOptions{Subprotocols: []string{"realtime"}}, 401},
	} {
		c2, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(h.srv.URL, "http")+"/v1/realtime", c.opts)
		if resp == nil || resp.StatusCode != c.want {
			t.Errorf("%s: %v %+v, want HTTP %d", name, err, resp, c.want)
			continue
		}
		if err == nil {
			if name == "subprotocol" && c2.Subprotocol() != "realtime" {
				t.Errorf("subprotocol %q", c2.Subprotocol())
			}
			c2.CloseNow()
		}
	}
}

// TestRealtimeLimits: the live sessions' limits hold for realtime sessions too: one session
// limit across both endpoints (429), the backlog bound and the idle timeout as OpenAI error
// events before a 1008 close.
func TestRealtimeLimits(t *testing.T) {
	h := newSpeechHarness(t, Config{Stream: StreamConfig{MaxSessions: 2, MaxBacklog: time.Second, IdleTimeout: time.Second}})
	ctx := context.Background()
	a, b := dial(t, h, ""), dialRealtime(t, h, "", nil)
	_, resp, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(h.srv.URL, "http")+"/v1/realtime", nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Errorf("third session: %v %+v, want 429", err, resp)
	}
	a.CloseNow()
	b.c.CloseNow()
	waitIdle(h)

	endsWith := func(rc *rtConn, code string) {
		t.Helper()
		var last *rtEv
		for {
			ev, err := rc.next(30 * time.Second)
			if err != nil {
				var ce websocket.CloseError
				if !errors.As(err, &ce) || ce.Code != websocket.StatusPolicyViolation || last == nil || last.Error == nil || last.Error.Code != code {
					t.Errorf("ended with %v after %+v, want error %s and 1008", err, last, code)
				}
				return
			}
			last = ev
		}
	}
	rc := dialRealtime(t, h, "", nil)
	pcm := bytes.Repeat(pcmBytes(jfk(t, 1)), 1)
	for i := 0; i < 30; i++ { // 30 s at 16 kHz read as 24 kHz: 20 s, faster than it is transcribed
		if rc.c.Write(ctx, websocket.MessageText, []byte(`{"type":"input_audio_buffer.append","audio":"`+base64.StdEncoding.EncodeToString(pcm)+`"}`)) != nil {
			break
		}
	}
	endsWith(rc, "backlog")
	waitIdle(h)
	endsWith(dialRealtime(t, h, "", nil), "idle_timeout")
}

// TestRealtimeShutdown: Shutdown lets a realtime session commit the audio it has received: the
// item whose speech has begun is completed, then the shutting_down error event (server_error)
// and close 1001 follow.
func TestRealtimeShutdown(t *testing.T) {
	h := newSpeechHarness(t, Config{Stream: StreamConfig{MaxBacklog: time.Minute}})
	rc := dialRealtime(t, h, "", nil)
	rc.until("session.created")
	rc.append(to24k(t, jfk(t, 3)), 72000, 0)
	item := rc.until("input_audio_buffer.speech_started")[0].ItemID // the audio is in the stream
	shut := make(chan error, 1)
	go func() { shut <- h.s.Shutdown(context.Background()) }()
	var evs []*rtEv
	var end error
	for {
		ev, err := rc.next(60 * time.Second)
		if err != nil {
			end = err
			break
		}
		evs = append(evs, ev)
	}
	if err := <-shut; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	var ce websocket.CloseError
	if !errors.As(end, &ce) || ce.Code != websocket.StatusGoingAway {
		t.Errorf("ended with %v, want 1001", end)
	}
	completed := false
	for _, e := range evs {
		completed = completed || e.Type == "conversation.item.input_audio_transcription.completed" && e.ItemID == item
	}
	if n := len(evs); !completed || n == 0 || evs[n-1].Error == nil || evs[n-1].Error.Code != "shutting_down" || evs[n-1].Error.Type != "server_error" {
		for _, e := range evs {
			t.Logf("%s %s %+v", e.Type, e.ItemID, e.Error)
		}
		t.Errorf("want item %s completed, then shutting_down", item)
	}
}
