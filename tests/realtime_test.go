package tests

import (
	"context"
	"encoding/json"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/coder/websocket"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/audio"
)

// TestServeRealtime drives /v1/realtime with the official openai npm client's Realtime WebSocket
// classes (tests/node/realtime.mjs), over a server with an API key (sent by the client as the
// openai-insecure-api-key subprotocol) and two speech models, the random-weight Whisper tiny.en
// and whisper.cpp's tiny Parakeet TDT test model. For each: in the GA dialect, 4 s of jfk.wav at
// 24 kHz appended and committed come back as one item with a transcript, and the same 4 s at
// 16 kHz (the rate set by a session update) as the next item, whose transcript is the final text
// /v1/audio/stream sends for that audio committed; a bad append gets an error event and the
// session goes on. In the beta dialect with server_vad, the 24 kHz audio streamed in 100 ms
// appends comes back as items announced by speech_started. Every completed transcript carries its
// usage, the seconds of its item's audio (each GA item's is the audio committed); the GA session
// includes logprobs: its transcripts' tokens, which put together spell them, each with a
// log-probability of at most 0 and its UTF-8 bytes, in the delta and the completed event alike.
// (The exact transcript of 24 kHz
// audio, resampled, is checked against /v1/audio/transcriptions in runtime/server's tests.) A
// client secret minted with client.realtime.clientSecrets opens a GA session alone, in the
// settings it was minted with, and transcribes the 24 kHz audio as the API key's session did.
func TestServeRealtime(t *testing.T) {
	sameInBothBuilds(t)
	whisper := sharedtest.WhisperRandomModel(t, "tiny.en")
	parakeet := sharedtest.Path(t, "models/asr/for-tests-ggml-parakeet-tdt.bin")
	node := openAINode(t, "")
	// The client uses the global WebSocket: Node 22 has it, Node 20.10 and later behind a flag.
	if out, err := exec.Command(node, "--experimental-websocket", "-e", "process.exit(typeof WebSocket === 'function' ? 0 : 1)").CombinedOutput(); err != nil {
		v, _ := exec.Command(node, "--version").Output()
		t.Skipf("node %s has no global WebSocket (Node 20.10 or later is needed): %v %s", strings.TrimSpace(string(v)), err, out)
	}
	b, err := os.ReadFile(sharedtest.Path(t, "data/asr/wav/jfk.wav"))
	if err != nil {
		t.Fatal(err)
	}
	pcm, _, err := audio.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	r, err := audio.NewResampler(16000, 24000)
	if err != nil {
		t.Fatal(err)
	}
	pcm24 := audio.FloatToPCM16(nil, r.Flush(r.Process(nil, pcm[:4*16000])))
	raw := filepath.Join(t.TempDir(), "jfk4-24k.pcm")
	if err := os.WriteFile(raw, pcm24, 0o644); err != nil {
		t.Fatal(err)
	}
	pcm16 := audio.FloatToPCM16(nil, pcm[:4*16000])
	raw16 := filepath.Join(t.TempDir(), "jfk4-16k.pcm")
	if err := os.WriteFile(raw16, pcm16, 0o644); err != nil {
		t.Fatal(err)
	}

	const key = "sk-realtime"
	srv := startServer(t, "--backend", asrBackend(), "-m", "whisper="+whisper, "-m", "parakeet="+parakeet, "--api-key", key)
	for _, model := range []string{"whisper", "parakeet"} {
		t.Run(model, func(t *testing.T) {
			want := streamTranscript(t, srv.base, key, model, pcm16)
			cmd := exec.Command(node, "--experimental-websocket", "node/realtime.mjs", srv.base+"/v1", model, raw, raw16)
			cmd.Env = append(os.Environ(), "PARLEY_API_KEY="+key)
			out, err := cmd.Output()
			if err != nil {
				var stderr []byte
				if ee, ok := err.(*exec.ExitError); ok {
					stderr = ee.Stderr
				}
				t.Fatalf("node: %v\n%s\n%s", err, out, stderr)
			}
			var res struct {
				GA struct {
					Subprotocol    string `json:"subprotocol"`
					SessionCreated struct {
						Type string `json:"type"`
					} `json:"session_created"`
					SessionUpdated struct {
						Audio struct {
							Input struct {
								Transcription struct{ Model, Language string }
								TurnDetection any `json:"turn_detection"`
							}
						}
						Include []string `json:"include"`
					} `json:"session_updated"`
					Committed struct {
						ItemID         string  `json:"item_id"`
						PreviousItemID *string `json:"previous_item_id"`
					} `json:"committed"`
					Delta struct {
						Logprobs []rtLogprob `json:"logprobs"`
					} `json:"delta"`
					Completed struct {
						ItemID     string      `json:"item_id"`
						Transcript string      `json:"transcript"`
						Usage      rtUsage     `json:"usage"`
						Logprobs   []rtLogprob `json:"logprobs"`
					} `json:"completed"`
					Committed16 struct {
						ItemID         string  `json:"item_id"`
						PreviousItemID *string `json:"previous_item_id"`
					} `json:"committed16"`
					Completed16 struct {
						ItemID     string      `json:"item_id"`
						Transcript string      `json:"transcript"`
						Usage      rtUsage     `json:"usage"`
						Logprobs   []rtLogprob `json:"logprobs"`
					} `json:"completed16"`
					Errors []struct {
						Code, Param string
						EventID     string `json:"event_id"`
					} `json:"errors"`
					Types []string `json:"types"`
				} `json:"ga"`
				Beta struct {
					Subprotocol    string `json:"subprotocol"`
					SessionCreated struct {
						Object                  string
						InputAudioTranscription struct{ Model string } `json:"input_audio_transcription"`
					} `json:"session_created"`
					SessionUpdated struct {
						TurnDetection *struct {
							Type              string
							SilenceDurationMs int `json:"silence_duration_ms"`
						} `json:"turn_detection"`
					} `json:"session_updated"`
					SpeechStarted []struct {
						ItemID       string `json:"item_id"`
						AudioStartMs int    `json:"audio_start_ms"`
					} `json:"speech_started"`
					Committed []struct {
						ItemID string `json:"item_id"`
					} `json:"committed"`
					Completed []struct {
						ItemID     string `json:"item_id"`
						Transcript string
						Usage      rtUsage     `json:"usage"`
						Logprobs   []rtLogprob `json:"logprobs"`
					} `json:"completed"`
					Errors []any `json:"errors"`
				} `json:"beta"`
				Minted struct {
					Value          string `json:"value"`
					ExpiresAt      int64  `json:"expires_at"`
					SessionCreated struct {
						Audio struct {
							Input struct {
								Transcription struct{ Model, Language string }
								TurnDetection any `json:"turn_detection"`
							}
						}
					} `json:"session_created"`
					Completed struct {
						Transcript string
					} `json:"completed"`
					Errors []any `json:"errors"`
				} `json:"minted"`
			}
			if err := json.Unmarshal(out, &res); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			ga := res.GA
			if ga.Subprotocol != "realtime" || ga.SessionCreated.Type != "transcription" {
				t.Errorf("GA: subprotocol %q, session %+v", ga.Subprotocol, ga.SessionCreated)
			}
			if tr := ga.SessionUpdated.Audio.Input; tr.Transcription.Model != model || tr.Transcription.Language != "en" && model == "whisper" || tr.TurnDetection != nil {
				t.Errorf("GA: session.updated %+v", tr)
			}
			if len(ga.Errors) != 1 || ga.Errors[0].Code != "invalid_value" || ga.Errors[0].Param != "audio" || ga.Errors[0].EventID != "bad_1" {
				t.Errorf("GA: errors %+v, want one for the bad append", ga.Errors)
			}
			if !strings.HasPrefix(ga.Committed.ItemID, "item_") || ga.Committed.PreviousItemID != nil || ga.Completed.ItemID != ga.Committed.ItemID {
				t.Errorf("GA: committed %+v, completed %+v", ga.Committed, ga.Completed)
			}
			if ga.Completed.Transcript == "" {
				t.Errorf("GA: no transcript at 24 kHz")
			}
			if ga.Committed16.PreviousItemID == nil || *ga.Committed16.PreviousItemID != ga.Committed.ItemID || ga.Completed16.ItemID != ga.Committed16.ItemID {
				t.Errorf("GA: second item %+v %+v after %s", ga.Committed16, ga.Completed16, ga.Committed.ItemID)
			}
			if ga.Completed16.Transcript != want {
				t.Errorf("GA: transcript at 16 kHz %q; /v1/audio/stream gave %q", ga.Completed16.Transcript, want)
			}
			if types := strings.Join(ga.Types, " "); !strings.Contains(types, "input_audio_buffer.committed conversation.item.added ") ||
				!strings.Contains(types, "conversation.item.input_audio_transcription.completed conversation.item.done") {
				t.Errorf("GA events %v: want each item added after its commit and done after its transcript", ga.Types)
			}
			t.Logf("GA events: %v", ga.Types)
			if inc := ga.SessionUpdated.Include; len(inc) != 1 || inc[0] != "item.input_audio_transcription.logprobs" {
				t.Errorf("GA: session.updated include %v", inc)
			}
			checkRTUsage(t, "GA 24 kHz", ga.Completed.Usage, float64(len(pcm24)/2)/24000)
			checkRTUsage(t, "GA 16 kHz", ga.Completed16.Usage, float64(len(pcm16)/2)/16000)
			checkLogprobs(t, "GA 24 kHz", ga.Completed.Logprobs, ga.Completed.Transcript)
			checkLogprobs(t, "GA 16 kHz", ga.Completed16.Logprobs, ga.Completed16.Transcript)
			if !reflect.DeepEqual(ga.Delta.Logprobs, ga.Completed.Logprobs) {
				t.Errorf("GA: delta's logprobs %+v, completed's %+v", ga.Delta.Logprobs, ga.Completed.Logprobs)
			}

			beta := res.Beta
			if beta.Subprotocol != "realtime" || beta.SessionCreated.Object != "realtime.transcription_session" || beta.SessionCreated.InputAudioTranscription.Model != model {
				t.Errorf("beta: subprotocol %q, session %+v", beta.Subprotocol, beta.SessionCreated)
			}
			if td := beta.SessionUpdated.TurnDetection; td == nil || td.Type != "server_vad" || td.SilenceDurationMs != 500 {
				t.Errorf("beta: turn detection %+v", td)
			}
			if len(beta.Errors) != 0 || len(beta.SpeechStarted) == 0 || len(beta.Committed) == 0 || len(beta.Completed) != len(beta.Committed) {
				t.Errorf("beta: %d speech_started, %d committed, %d completed, errors %v", len(beta.SpeechStarted), len(beta.Committed), len(beta.Completed), beta.Errors)
			}
			for i, c := range beta.Completed {
				if i < len(beta.Committed) && c.ItemID != beta.Committed[i].ItemID {
					t.Errorf("beta: completed %d is %s, committed %s", i, c.ItemID, beta.Committed[i].ItemID)
				}
			}
			for _, s := range beta.SpeechStarted {
				if s.AudioStartMs < 0 || s.AudioStartMs > 4000 {
					t.Errorf("beta: speech_started at %d ms, outside the 4 s sent", s.AudioStartMs)
				}
			}
			t.Logf("beta: %d items: %+v", len(beta.Completed), beta.Completed)
			used := 0.0
			for _, c := range beta.Completed {
				if c.Usage.Type != "duration" || !(c.Usage.Seconds > 0) || c.Logprobs != nil {
					t.Errorf("beta: completed %+v: want a duration and no logprobs (not included)", c)
				}
				used += c.Usage.Seconds
			}
			if sent := float64(len(pcm24)/2) / 24000; used > sent+1.0/16000 {
				t.Errorf("beta: usage of %.4f s in all, %.4f s sent", used, sent)
			}

			mt := res.Minted
			if !strings.HasPrefix(mt.Value, "ek_") || mt.Value == key || mt.ExpiresAt < time.Now().Unix() {
				t.Errorf("client secret %q expiring at %d", mt.Value, mt.ExpiresAt)
			}
			if in := mt.SessionCreated.Audio.Input; in.Transcription.Model != model || in.Transcription.Language != "en" && model == "whisper" || in.TurnDetection != nil {
				t.Errorf("session opened with the client secret: %+v, want the minted settings", in)
			}
			if len(mt.Errors) != 0 || mt.Completed.Transcript != ga.Completed.Transcript {
				t.Errorf("with the client secret: transcript %q, errors %v; the API key's session gave %q", mt.Completed.Transcript, mt.Errors, ga.Completed.Transcript)
			}
		})
	}
}

// rtUsage and rtLogprob are a completed transcript's usage and logprobs.
type (
	rtUsage struct {
		Type    string  `json:"type"`
		Seconds float64 `json:"seconds"`
	}
	rtLogprob struct {
		Token   string   `json:"token"`
		Logprob *float64 `json:"logprob"`
		Bytes   []int    `json:"bytes"`
	}
)

// checkRTUsage checks a duration usage against the seconds of audio sent, within a sample of the
// 16 kHz stream.
func checkRTUsage(t *testing.T, what string, u rtUsage, want float64) {
	t.Helper()
	if u.Type != "duration" || math.Abs(u.Seconds-want) > 1.0/16000+1e-6 {
		t.Errorf("%s: usage %+v, want %.6f seconds", what, u, want)
	}
}

// checkLogprobs checks that a transcript's tokens spell it and have log-probabilities and bytes.
func checkLogprobs(t *testing.T, what string, lps []rtLogprob, transcript string) {
	t.Helper()
	if transcript != "" && len(lps) == 0 {
		t.Errorf("%s: no logprobs for %q", what, transcript)
	}
	var b []byte
	for _, lp := range lps {
		tok := make([]byte, len(lp.Bytes))
		for i, c := range lp.Bytes {
			tok[i] = byte(c)
		}
		b = append(b, tok...)
		if lp.Logprob == nil || !(*lp.Logprob <= 0) || utf8.Valid(tok) && string(tok) != lp.Token {
			t.Errorf("%s: token %+v: want a log-probability <= 0 and the token's bytes", what, lp)
		}
	}
	// As JSON sends the transcript: an invalid UTF-8 sequence as U+FFFD.
	j, _ := json.Marshal(strings.TrimSpace(string(b)))
	var got string
	json.Unmarshal(j, &got)
	if got != transcript {
		t.Errorf("%s: tokens spell %q, transcript %q", what, got, transcript)
	}
}

// streamTranscript is the final text /v1/audio/stream sends for pcm16 (16 kHz) sent whole and
// committed.
func streamTranscript(t *testing.T, base, key, model string, pcm16 []byte) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(base, "http")+"/v1/audio/stream?model="+model,
		&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + key}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	c.SetReadLimit(1 << 20)
	if err := c.Write(ctx, websocket.MessageBinary, pcm16); err != nil {
		t.Fatal(err)
	}
	c.Write(ctx, websocket.MessageText, []byte(`{"type":"close"}`))
	var finals []string
	for {
		_, b, err := c.Read(ctx)
		if err != nil {
			break
		}
		var ev struct{ Type, Text, Code string }
		json.Unmarshal(b, &ev)
		switch ev.Type {
		case "final":
			if ev.Text != "" {
				finals = append(finals, ev.Text)
			}
		case "error":
			t.Fatalf("/v1/audio/stream: %s", b)
		}
	}
	if len(finals) == 0 {
		t.Fatal("/v1/audio/stream sent no final text")
	}
	return strings.Join(finals, " ")
}
