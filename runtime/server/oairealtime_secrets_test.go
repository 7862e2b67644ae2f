package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// mint posts body to path with the API key and decodes the answer into v (if not nil).
func mint(t *testing.T, h *speechHarness, path, key, body string, v any) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if v != nil && json.Unmarshal(b, v) != nil {
		t.Errorf("%s: not JSON: %s", path, b)
	}
	return resp.StatusCode
}

type errBody struct {
	Error struct {
		Message string
		Param   *string
		Code    *string
	}
}

// TestRealtimeClientSecrets: a GA client secret carries its session settings into the session
// it opens (through the browser's key subprotocol), opens nothing but /v1/realtime, expires as
// asked, and bad settings are refused when it is minted.
func TestRealtimeClientSecrets(t *testing.T) {
	h := newSpeechHarness(t, Config{APIKey: "sk-test"})
	session := `{"type":"transcription","audio":{"input":{"transcription":{"model":"whisper-tiny","language":"en","prompt":"Ask not"},"turn_detection":null}}}`
	if code := mint(t, h, "/v1/realtime/client_secrets", "", `{"session":`+session+`}`, nil); code != 401 {
		t.Errorf("minting without the API key: %d, want 401", code)
	}
	var got struct {
		Value     string
		ExpiresAt int64 `json:"expires_at"`
	}
	before := time.Now().Unix()
	if code := mint(t, h, "/v1/realtime/client_secrets", "sk-test", `{"expires_after":{"anchor":"created_at","seconds":120},"session":`+session+`}`, &got); code != 200 {
		t.Fatalf("minting: %d", code)
	}
	if !strings.HasPrefix(got.Value, "ek_") || len(got.Value) < 30 {
		t.Errorf("value %q", got.Value)
	}
	if got.ExpiresAt < before+120 || got.ExpiresAt > time.Now().Unix()+120 {
		t.Errorf("expires_at %d, want 120 s from %d", got.ExpiresAt, before)
	}
	var desc struct {
		Type  string
		Audio struct {
			Input struct {
				Transcription struct{ Model, Language, Prompt string }
				TurnDetection *json.RawMessage `json:"turn_detection"`
			}
		}
	}
	var again struct {
		Value     string
		ExpiresAt int64 `json:"expires_at"`
		Session   json.RawMessage
	}
	mint(t, h, "/v1/realtime/client_secrets", "sk-test", `{"session":`+session+`}`, &again)
	if err := json.Unmarshal(again.Session, &desc); err != nil {
		t.Fatal(err)
	}
	if tr := desc.Audio.Input.Transcription; desc.Type != "transcription" || tr.Model != "whisper-tiny" || tr.Language != "en" || tr.Prompt != "Ask not" || desc.Audio.Input.TurnDetection != nil {
		t.Errorf("session %s", again.Session)
	}
	if d := again.ExpiresAt - time.Now().Unix(); d < 590 || d > 600 {
		t.Errorf("default lifetime %d s, want 600", d)
	}
	if again.Value == got.Value {
		t.Error("two mints gave one key")
	}

	// What a key keeps is its settings as checked, not what else the request held.
	var padded struct{ Value string }
	if code := mint(t, h, "/v1/realtime/client_secrets", "sk-test", `{"session":{"type":"transcription","pad":"`+strings.Repeat("x", 30000)+`","audio":{"input":{"transcription":{"model":"whisper-tiny","pad":"`+strings.Repeat("y", 30000)+`"}}}}}`, &padded); code != 200 {
		t.Errorf("minting with unknown fields: %d", code)
	}
	if sec, ok := h.s.secrets.lookup(padded.Value, time.Now()); !ok || len(sec.session) > 1024 || !bytes.Contains(sec.session, []byte(`"whisper-tiny"`)) {
		t.Errorf("kept %d bytes for the key: %.200s", len(sec.session), sec.session)
	}

	// The key opens a realtime session with its settings, as a browser sends it.
	rc := dialRealtime(t, h, "", &websocket.DialOptions{Subprotocols: []string{"realtime", "openai-insecure-api-key." + got.Value}})
	ev := rc.until("session.created")[0]
	if ev.Session.Audio == nil || ev.Session.Audio.Input.Transcription.Language != "en" || ev.Session.Audio.Input.TurnDetection != nil {
		t.Errorf("session.created %+v, want the minted settings (en, no turn detection)", ev.Session)
	}
	rc.c.CloseNow()

	// And nothing else: not the API's other endpoints, not as the API key.
	req, _ := http.NewRequest(http.MethodGet, h.srv.URL+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer "+got.Value)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != 401 {
		t.Errorf("GET /v1/models with a client secret: %v %v, want 401", err, resp)
	} else {
		resp.Body.Close()
	}
	if code := mint(t, h, "/v1/realtime/client_secrets", got.Value, `{}`, nil); code != 401 {
		t.Errorf("minting with a client secret: %d, want 401", code)
	}

	for _, c := range []struct{ name, body, param, code string }{
		{"short", `{"expires_after":{"seconds":5}}`, "expires_after.seconds", "invalid_value"},
		{"long", `{"expires_after":{"seconds":7201}}`, "expires_after.seconds", "invalid_value"},
		{"anchor", `{"expires_after":{"anchor":"now","seconds":60}}`, "expires_after.anchor", "invalid_value"},
		{"conversation", `{"session":{"type":"realtime"}}`, "session.type", "invalid_value"},
		{"model", `{"session":{"type":"transcription","audio":{"input":{"transcription":{"model":"nope"}}}}}`, "session.audio.input.transcription.model", "model_not_found"},
		{"language", `{"session":{"type":"transcription","audio":{"input":{"transcription":{"language":"tlh"}}}}}`, "session.audio.input.transcription.language", ""},
		{"vad", `{"session":{"type":"transcription","audio":{"input":{"turn_detection":{"type":"semantic_vad"}}}}}`, "session.audio.input.turn_detection.type", "unsupported_value"},
		{"format", `{"session":{"type":"transcription","audio":{"input":{"format":{"type":"audio/pcmu"}}}}}`, "session.audio.input.format", "unsupported_value"},
		{"not json", `{"session":`, "", ""},
		{"overflow", `{"expires_after":{"seconds":36028797018963978}}`, "expires_after.seconds", "invalid_value"},
		{"too large", `{"session":{"type":"transcription","pad":"` + strings.Repeat("x", maxSecretBody) + `"}}`, "", "request_too_large"},
		{"session type", `{"session":"transcription"}`, "session", "invalid_value"},
	} {
		var e errBody
		code := mint(t, h, "/v1/realtime/client_secrets", "sk-test", c.body, &e)
		if code/100 != 4 || e.Error.Message == "" || c.param != "" && (e.Error.Param == nil || *e.Error.Param != c.param) || c.code != "" && (e.Error.Code == nil || *e.Error.Code != c.code) {
			t.Errorf("%s: %d %+v, want 4xx about %q (%s)", c.name, code, e.Error, c.param, c.code)
		}
	}
}

// TestRealtimeTranscriptionSessions: the beta dialect's mint answers with the session and its
// client_secret, and the key opens a beta session with those settings.
func TestRealtimeTranscriptionSessions(t *testing.T) {
	h := newSpeechHarness(t, Config{APIKey: "sk-test"})
	var got struct {
		Object                  string
		InputAudioTranscription struct{ Model string } `json:"input_audio_transcription"`
		TurnDetection           struct {
			Type              string
			SilenceDurationMs int64 `json:"silence_duration_ms"`
		} `json:"turn_detection"`
		ClientSecret struct {
			Value     string
			ExpiresAt int64 `json:"expires_at"`
		} `json:"client_secret"`
	}
	body := `{"input_audio_format":"pcm16","input_audio_transcription":{"model":"whisper-tiny"},"turn_detection":{"type":"server_vad","silence_duration_ms":300}}`
	if code := mint(t, h, "/v1/realtime/transcription_sessions", "sk-test", body, &got); code != 200 {
		t.Fatalf("minting: %d", code)
	}
	if got.Object != "realtime.transcription_session" || got.InputAudioTranscription.Model != "whisper-tiny" || got.TurnDetection.SilenceDurationMs != 300 || !strings.HasPrefix(got.ClientSecret.Value, "ek_") {
		t.Errorf("answer %+v", got)
	}
	if d := got.ClientSecret.ExpiresAt - time.Now().Unix(); d < 50 || d > 60 {
		t.Errorf("default lifetime %d s, want 60", d)
	}
	rc := dialRealtime(t, h, "?intent=transcription", &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + got.ClientSecret.Value}}})
	ev := rc.until("transcription_session.created")[0]
	if tr := ev.Session.InputAudioTranscription; tr == nil || tr.Model != "whisper-tiny" {
		t.Errorf("session %+v", ev.Session)
	}
	rc.c.CloseNow()

	var e errBody
	if code := mint(t, h, "/v1/realtime/transcription_sessions", "sk-test", `{"client_secret":{"expires_at":{"seconds":1}}}`, &e); code != 400 || e.Error.Param == nil || *e.Error.Param != "client_secret.expires_at.seconds" {
		t.Errorf("short lifetime: %d %+v", code, e.Error)
	}
	if code := mint(t, h, "/v1/realtime/transcription_sessions", "sk-test", `{"input_audio_noise_reduction":{"type":"near_field"}}`, &e); code != 400 {
		t.Errorf("noise reduction: %d %+v", code, e.Error)
	}
}

// TestRealtimeSecretsExpire: a key stops opening sessions when it expires, and the store holds
// at most maxSecrets unexpired keys, dropping expired ones to make room.
func TestRealtimeSecretsExpire(t *testing.T) {
	var ss rtSecrets
	now := time.Now()
	key := ss.add(rtSecret{expires: now.Add(time.Second)}, now)
	if _, ok := ss.lookup(key, now); !ok {
		t.Fatal("fresh key not found")
	}
	if _, ok := ss.lookup(key, now.Add(time.Second)); ok {
		t.Error("expired key found")
	}
	if _, ok := ss.lookup("sk-"+key[3:], now); ok {
		t.Error("a key without the prefix found")
	}
	for i := 0; i < maxSecrets; i++ {
		if ss.add(rtSecret{expires: now.Add(time.Minute)}, now) == "" {
			t.Fatalf("add %d refused", i)
		}
	}
	if ss.add(rtSecret{expires: now.Add(time.Minute)}, now) != "" {
		t.Error("more than maxSecrets held")
	}
	if ss.add(rtSecret{expires: now.Add(2 * time.Minute)}, now.Add(time.Minute)) == "" {
		t.Error("expired keys not dropped to make room")
	}

	// Through the server: an expired key is refused like a wrong one.
	h := newSpeechHarness(t, Config{APIKey: "sk-test"})
	k := h.s.secrets.add(rtSecret{expires: time.Now().Add(-time.Second)}, time.Now().Add(-2*time.Second))
	_, resp, err := websocket.Dial(context.Background(), "ws"+strings.TrimPrefix(h.srv.URL, "http")+"/v1/realtime", &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + k}}})
	if err == nil || resp == nil || resp.StatusCode != 401 {
		t.Errorf("expired key: %v %+v, want 401", err, resp)
	}
}
