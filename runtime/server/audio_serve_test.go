package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/models/whisper"
	"github.com/parleyhq/parley/runtime/sched/asr"
)

// TestSpeechOnlyServer: a server with only a speech model lists it, and LLM endpoints say so.
func TestSpeechOnlyServer(t *testing.T) {
	h := newSpeechHarness(t, Config{})
	resp, err := http.Get(h.srv.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []modelObject `json:"data"`
	}
	json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if len(list.Data) != 1 || list.Data[0].ID != "whisper-tiny" {
		t.Errorf("models %+v", list)
	}
	resp, _ = http.Get(h.srv.URL + "/v1/models/whisper-tiny")
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("GET /v1/models/whisper-tiny: %d", resp.StatusCode)
	}
	code, b, _ := post(t, h.srv.URL+"/v1/completions", "application/json", []byte(`{"model":"whisper-tiny","prompt":"x"}`))
	if code != 400 || !strings.Contains(string(b), "speech recognition model") {
		t.Errorf("completion on a speech model: %d %s", code, b)
	}
	if _, err := New(Config{}, nil); err == nil {
		t.Error("New without any model succeeded")
	}
	eng := speechEngine(t)
	if _, err := New(Config{SpeechModels: []*SpeechModel{{Name: "a", Recognizer: eng}, {Name: "a", Recognizer: eng}}}, nil); err == nil {
		t.Error("duplicate speech model names accepted")
	}
}

// TestSpeechMetrics: a speech model's engine reports through /metrics the scheduler figures the
// language models report (queue, active, KV blocks, steps, last batch).
func TestSpeechMetrics(t *testing.T) {
	h := newSpeechHarness(t, Config{})
	ct, body := form(wavBytes(jfk(t, 1)), "audio/wav", field{"model", "whisper-tiny"})
	if code, b, _ := post(t, h.srv.URL+"/v1/audio/transcriptions", ct, body); code != 200 {
		t.Fatalf("transcription: %d %s", code, b)
	}
	resp, err := http.Get(h.srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	text := string(b)
	steps := regexp.MustCompile(`(?m)^parley_steps_total\{model="whisper-tiny"\} (\d+)$`).FindStringSubmatch(text)
	if steps == nil || steps[1] == "0" {
		t.Errorf("no steps counted for the speech model: %v", steps)
	}
	for _, name := range []string{`parley_queue_depth{model="whisper-tiny"} 0`, `parley_kv_blocks_free{model="whisper-tiny"}`,
		`parley_batch_size{model="whisper-tiny"}`, `parley_step_duration_seconds{model="whisper-tiny"}`} {
		if !strings.Contains(text, name) {
			t.Errorf("metrics lack %s", name)
		}
	}
	if t.Failed() {
		t.Log(text)
	}
}

// TestTranscriptionBadInput: each bad request gets its 4xx in the API's error shape, and the
// server goes on serving.
func TestTranscriptionBadInput(t *testing.T) {
	h := newSpeechHarness(t, Config{MaxAudioBytes: 200 << 10, MaxAudioDuration: 5 * time.Second})
	url := h.srv.URL + "/v1/audio/transcriptions"
	wav := wavBytes(jfk(t, 1))
	mp := func(file []byte, fileType string, fs ...field) (string, []byte) {
		return form(file, fileType, append([]field{{"model", "whisper-tiny"}}, fs...)...)
	}
	type tc struct {
		name   string
		ctype  string
		body   []byte
		status int
		code   string
	}
	var cases []tc
	add := func(name string, status int, code string, ct string, body []byte) {
		cases = append(cases, tc{name, ct, body, status, code})
	}
	ct, b := mp(wav[:len(wav)/2+1], "audio/wav")
	add("truncated wav", 400, "invalid_audio", ct, b)
	bad := append([]byte(nil), wav...)
	copy(bad[20:], []byte{0x55, 0x00}) // format tag 0x55 (MP3 in WAV)
	ct, b = mp(bad, "audio/wav")
	add("wav with an unknown format tag", 0, "", ct, b)
	ct, b = mp([]byte("RIFF\x10\x00\x00\x00WAVEjunkjunk"), "audio/wav")
	add("corrupt wav", 400, "invalid_audio", ct, b)
	// An ID3 tag and an MP3 frame header (MPEG-1 layer III, 417-byte frames) before bytes in
	// which no frame follows: MP3, corrupt.
	fakeMP3 := append([]byte("ID3\x03\x00\x00\x00\x00\x00\x00\xff\xfb\x90\x64"), bytes.Repeat([]byte{0x5a, 0xf1, 0xff, 0xf1, 0x50}, 800)...)
	ct, b = mp(fakeMP3, "audio/mpeg")
	add("corrupt mp3", 400, "invalid_audio", ct, b)
	ct, b = mp(fakeMP3, "")
	add("corrupt mp3 without a type", 400, "invalid_audio", ct, b)
	ct, b = mp([]byte("%PDF-1.4 not audio at all, just text that goes on for a while"), "application/pdf")
	add("unsupported format", 415, "unsupported_format", ct, b)
	ct, b = mp([]byte{}, "audio/wav")
	add("empty upload", 400, "empty_file", ct, b)
	ct, b = mp(nil, "")
	add("missing file", 400, "", ct, b)
	big := wavBytes(make([]float32, 150_000)) // 300 KB > 200 KiB
	ct, b = mp(big, "audio/wav")
	add("over-large upload", 413, "request_too_large", ct, b)
	long := wavBytes(make([]float32, 6*16000)) // 6 s > 5 s, 192 KB
	ct, b = mp(long, "audio/wav")
	add("too long", 400, "audio_too_long", ct, b)
	add("json body", 415, "unsupported_media_type", "application/json", []byte(`{"model":"whisper-tiny"}`))
	add("no content type", 415, "unsupported_media_type", "", []byte("x"))
	add("multipart without boundary", 400, "", "multipart/form-data", []byte("x"))
	add("broken multipart", 400, "", "multipart/form-data; boundary=zzz", []byte("--zzz\r\nnot a header\r\n\r\n"))
	ct, b = form(wav, "audio/wav", field{"model", "nope"})
	add("unknown model", 404, "model_not_found", ct, b)
	ct, b = mp(wav, "audio/wav", field{"response_format", "xml"})
	add("bad response_format", 400, "", ct, b)
	ct, b = mp(wav, "audio/wav", field{"timestamp_granularities[]", "word"})
	add("granularity without verbose_json", 400, "", ct, b)
	ct, b = mp(wav, "audio/wav", field{"timestamp_granularities[]", "sentence"})
	add("bad granularity", 400, "", ct, b)
	ct, b = mp(wav, "audio/wav", field{"temperature", "1.5"})
	add("temperature out of range", 400, "", ct, b)
	ct, b = mp(wav, "audio/wav", field{"language", "de"})
	add("language an English-only model lacks", 400, "unsupported_language", ct, b)
	ct, b = mp(wav, "audio/wav", field{"stream", "true"})
	add("stream", 400, "", ct, b)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body, _ := post(t, url, c.ctype, c.body)
			if c.status == 0 { // either answer is right; it must be one of them
				if code != 400 && code != 415 {
					t.Errorf("status %d: %s", code, body)
				}
				return
			}
			var e struct {
				Error apiError `json:"error"`
			}
			if code != c.status || json.Unmarshal(body, &e) != nil || e.Error.Message == "" || e.Error.Type != typeInvalidRequest {
				t.Fatalf("status %d body %s, want %d in the error shape", code, body, c.status)
			}
			if c.code != "" && (e.Error.Code == nil || *e.Error.Code != c.code) {
				t.Errorf("code %v, want %s", e.Error.Code, c.code)
			}
		})
	}
	// Translation with an English-only model: a clear 400 from the engine.
	ct, b = mp(wav, "audio/wav")
	code, body, _ := post(t, h.srv.URL+"/v1/audio/translations", ct, b)
	if code != 400 || !strings.Contains(string(body), "cannot translate") || strings.Contains(string(body), "whisper:") {
		t.Errorf("translation on tiny.en: %d %s", code, body)
	}
	// A well-formed file without samples is an empty transcription.
	ct, b = mp(wavBytes(nil), "audio/wav")
	code, body, _ = post(t, url, ct, b)
	if code != 200 || strings.TrimSpace(string(body)) != `{"text":"","usage":{"type":"duration","seconds":0}}` {
		t.Errorf("no samples: %d %s", code, body)
	}
	// ... and reports the language as any transcription does, not as the request spelled it.
	ct, b = mp(wavBytes(nil), "audio/wav", field{"language", "auto"}, field{"response_format", "verbose_json"})
	code, body, _ = post(t, url, ct, b)
	if code != 200 || !strings.Contains(string(body), `"language":"english"`) {
		t.Errorf("no samples, language auto: %d %s", code, body)
	}
	// So is silence (under -60 dBFS), which the model is not asked to transcribe.
	ct, b = mp(wavBytes(make([]float32, 4*16000)), "audio/wav", field{"response_format", "verbose_json"})
	code, body, _ = post(t, url, ct, b)
	var vj verboseJSON
	if code != 200 || json.Unmarshal(body, &vj) != nil || vj.Text != "" || vj.Duration != 4 || vj.Usage.Seconds != 4 || !strings.Contains(string(body), `"segments":[]`) {
		t.Errorf("silence: %d %s", code, body)
	}
	// Still serving.
	ct, b = mp(wav, "audio/wav", field{"response_format", "text"})
	if code, body, _ := post(t, url, ct, b); code != 200 {
		t.Errorf("after the bad requests: %d %s", code, body)
	}
	// Wrong method.
	resp, _ := http.Get(url)
	resp.Body.Close()
	if resp.StatusCode != 405 {
		t.Errorf("GET: %d", resp.StatusCode)
	}
}

// TestTranscriptionStalledUpload: an upload that stops after its first bytes is answered 408
// once BodyTimeout has passed.
func TestTranscriptionStalledUpload(t *testing.T) {
	h := newSpeechHarness(t, Config{BodyTimeout: 200 * time.Millisecond})
	ct, body := form(wavBytes(jfk(t, 2)), "audio/wav", field{"model", "whisper-tiny"})
	pr, pw := io.Pipe()
	defer pw.Close()
	go pw.Write(body[:len(body)/2]) // and nothing more
	resp, err := http.Post(h.srv.URL+"/v1/audio/transcriptions", ct, pr)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("stalled upload: %d %s", resp.StatusCode, b)
	}
}

// TestTranscriptionAdmission: with the recogniser's one place taken by a two-hour transcription,
// another two-hour upload is answered 429 within 100 ms of being sent (its audio is not decoded
// first: the server reads the header only, and the recogniser takes the request's place in its
// queue before it decodes); and the first, its client gone, leaves the recogniser idle.
func TestTranscriptionAdmission(t *testing.T) {
	path := sharedtest.WhisperRandomModel(t, "tiny.en")
	be, _, err := backend.New(backend.Choose(""), backend.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer be.Close()
	m, err := whisper.Open(be, path)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	eng, err := asr.NewWhisper(m, asr.Config{MaxActive: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	p := asrParams()
	s, err := New(Config{SpeechModels: []*SpeechModel{{Name: "whisper-tiny", Recognizer: eng, Params: &p}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.SetReady(true)
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	url := srv.URL + "/v1/audio/transcriptions"
	ct, body := form(sharedtest.SquareFLAC(t, 2*3600), "audio/flac", field{"model", "whisper-tiny"})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(body))
		req.Header.Set("Content-Type", ct)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		first <- err
	}()
	for deadline := time.Now().Add(30 * time.Second); eng.Stats().Active == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first transcription was not admitted within 30 s")
		}
	}
	var worst time.Duration
	for range 5 {
		t0 := time.Now()
		code, b, h := post(t, url, ct, body)
		took := time.Since(t0)
		t.Logf("refused in %v", took)
		worst = max(worst, took)
		if code != http.StatusTooManyRequests || !strings.Contains(string(b), "queue_full") || h.Get("Retry-After") == "" {
			t.Fatalf("a second two-hour upload: %d %s after %v, want 429", code, b, took)
		}
	}
	t.Logf("%d-byte uploads refused in %v at worst", len(body), worst)
	if worst > 100*time.Millisecond {
		t.Errorf("a full queue answered a two-hour upload after %v, want within 100 ms", worst)
	}
	// An upload whose body has not all arrived (here: never will) is refused too, from its
	// headers: the server does not wait for the body when every recogniser is full.
	pr, pw := io.Pipe()
	defer pw.Close()
	go pw.Write(body[:len(body)/2])
	rctx, rcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer rcancel()
	req, _ := http.NewRequestWithContext(rctx, "POST", url, pr)
	req.Header.Set("Content-Type", ct)
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("an upload still arriving: %v", err)
	}
	resp.Body.Close()
	if took := time.Since(t0); resp.StatusCode != http.StatusTooManyRequests || took > 100*time.Millisecond {
		t.Errorf("an upload still arriving: %d after %v, want 429 within 100 ms", resp.StatusCode, took)
	}
	cancel()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Errorf("the first upload: %v, want its own cancellation", err)
	}
	t0 = time.Now()
	for eng.Stats().Active != 0 {
		if time.Since(t0) > 10*time.Second {
			t.Fatalf("the recogniser is still busy %v after its client left: %+v", time.Since(t0), eng.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("the recogniser was idle %v after the client left", time.Since(t0))
}
