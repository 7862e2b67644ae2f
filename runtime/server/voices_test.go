package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/parleyhq/parley/runtime/audio"
)

// promptWAV is a 16 kHz 16-bit WAV of sec seconds of a tone of f Hz.
func promptWAV(t *testing.T, sec, f float64) []byte {
	t.Helper()
	x := make([]float32, int(sec*16000))
	for i := range x {
		x[i] = float32(0.3 * math.Sin(2*math.Pi*f*float64(i)/16000))
	}
	h, err := audio.WAVHeader(int64(len(x)), 16000)
	if err != nil {
		t.Fatal(err)
	}
	return audio.FloatToPCM16(h, x)
}

// uploadForm posts a multipart form to url: fields, and file (under fileField) when not nil.
func uploadForm(t *testing.T, url, key, fileField string, file []byte, fields ...string) (int, []byte) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for i := 0; i+1 < len(fields); i += 2 {
		mw.WriteField(fields[i], fields[i+1])
	}
	if file != nil {
		fw, err := mw.CreateFormFile(fileField, "prompt.wav")
		if err != nil {
			t.Fatal(err)
		}
		fw.Write(file)
	}
	mw.Close()
	req, err := http.NewRequest("POST", url, &b)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", mw.FormDataContentType())
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	out.ReadFrom(resp.Body)
	return resp.StatusCode, out.Bytes()
}

type voiceList struct {
	Object string `json:"object"`
	Data   []struct {
		ID       string  `json:"id"`
		Object   string  `json:"object"`
		Name     string  `json:"name"`
		Model    string  `json:"model"`
		Type     string  `json:"type"`
		Duration float64 `json:"duration"`
	} `json:"data"`
}

func newVoiceServer(t *testing.T, sp Speaker, cfg Config) *httptest.Server {
	t.Helper()
	cfg.TTSModels = []*TTSModel{{Name: "pocket-tts", Synth: sp}}
	s, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.SetReady(true)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv
}

func authGet(t *testing.T, url, key string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	out.ReadFrom(resp.Body)
	return resp.StatusCode, out.Bytes()
}

func authPost(t *testing.T, url, key, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	out.ReadFrom(resp.Body)
	return resp.StatusCode, out.Bytes()
}

// TestVoiceUpload: an uploaded prompt is resampled to the model's rate and cloned once; its id
// speaks (as a string and as OpenAI's {"id": ...}) with the cloned voice; the same audio again
// is the same voice, not cloned again; the list holds the predefined voices and the uploaded
// ones; everything needs the API key.
func TestVoiceUpload(t *testing.T) {
	sp := &fakeSpeaker{frames: 1}
	const key = "sekrit"
	srv := newVoiceServer(t, sp, Config{APIKey: key})
	url := srv.URL + "/v1/audio/voices"
	prompt := promptWAV(t, 2, 220)
	if code, _ := uploadForm(t, url, "", "file", prompt); code != http.StatusUnauthorized {
		t.Errorf("no key: %d, want 401", code)
	}
	code, b := uploadForm(t, url, key, "file", prompt, "name", "Ann", "model", "pocket-tts")
	var v struct {
		ID, Object, Name, Model, Type string
		Duration                      float64
	}
	if err := json.Unmarshal(b, &v); code != 200 || err != nil || !strings.HasPrefix(v.ID, "voice_") || v.Object != "audio.voice" || v.Name != "Ann" || v.Model != "pocket-tts" || v.Duration != 2 {
		t.Fatalf("upload: %d %s", code, b)
	}
	if len(sp.clones) != 1 || sp.clones[0] < 47900 || sp.clones[0] > 48100 {
		t.Fatalf("cloned prompts of %v samples; want one of 2 s at 24 kHz", sp.clones)
	}
	code, b = uploadForm(t, url, key, "audio_sample", prompt)
	var again struct{ ID string }
	if json.Unmarshal(b, &again); code != 200 || again.ID != v.ID || len(sp.clones) != 1 {
		t.Errorf("the same prompt again: %d %s, %d clones", code, b, len(sp.clones))
	}
	for _, voice := range []string{`"` + v.ID + `"`, `{"id":"` + v.ID + `"}`} {
		code, b = authPost(t, srv.URL+"/v1/audio/speech", key, `{"input":"Hi.","voice":`+voice+`}`)
		if code != 200 || sp.last.Seed != 1001 {
			t.Errorf("speaking with %s: %d %.100s, seed %d (want the clone's 1001)", voice, code, b, sp.last.Seed)
		}
	}
	// and in a live session
	c, status := dialSpeak(t, srv, "?voice="+v.ID, http.Header{"Authorization": {"Bearer " + key}})
	if c == nil {
		t.Fatalf("a live session with the uploaded voice: %d", status)
	}
	sendJSON(t, c, `{"type":"text","text":"Hi there."}`)
	sendJSON(t, c, `{"type":"close"}`)
	ms, cs := readUntilClose(t, c)
	if got := summary(ms); got != "ready segment:Hi there. audio×1 done" || cs != 1000 || sp.last.Seed != 1001 {
		t.Errorf("a live session with the uploaded voice: %s (close %d), seed %d", got, cs, sp.last.Seed)
	}
	if _, status := dialSpeak(t, srv, "?voice="+v.ID, nil); status != http.StatusUnauthorized {
		t.Errorf("a live session without the key: %d", status)
	}
	code, b = authGet(t, url, key)
	var l voiceList
	if err := json.Unmarshal(b, &l); code != 200 || err != nil || l.Object != "list" || len(l.Data) != 3 {
		t.Fatalf("list: %d %s", code, b)
	}
	if d := l.Data; d[0].ID != "alba" || d[0].Type != "predefined" || d[1].ID != "marius" || d[2].ID != v.ID || d[2].Type != "uploaded" || d[2].Name != "Ann" {
		t.Errorf("list: %s", b)
	}
	if code, _ := authGet(t, url, ""); code != http.StatusUnauthorized {
		t.Errorf("list without the key: %d", code)
	}
	if code, b := authGet(t, url+"?model=nothing", key); code != 404 {
		t.Errorf("list of an unknown model: %d %s", code, b)
	}
}

// TestVoiceUploadLRU: beyond MaxVoices, or MaxBytes of voices, the voice used least recently
// is dropped, and speaking with it is a 400 naming the voice.
func TestVoiceUploadLRU(t *testing.T) {
	for _, vc := range []VoiceConfig{{MaxVoices: 2}, {MaxVoices: 10, MaxBytes: 2 << 20}} { // fakeVoice holds 1 MiB
		t.Run(fmt.Sprintf("%d voices, %d bytes", vc.MaxVoices, vc.MaxBytes), func(t *testing.T) { testVoiceLRU(t, vc) })
	}
}

func testVoiceLRU(t *testing.T, vc VoiceConfig) {
	sp := &fakeSpeaker{frames: 1}
	srv := newVoiceServer(t, sp, Config{Voices: vc})
	url := srv.URL + "/v1/audio/voices"
	ids := make([]string, 3)
	for i, f := range []float64{200, 300, 400} {
		code, b := uploadForm(t, url, "", "file", promptWAV(t, 1.5, f))
		var v struct{ ID string }
		if json.Unmarshal(b, &v); code != 200 {
			t.Fatalf("upload %d: %d %s", i, code, b)
		}
		ids[i] = v.ID
		if i == 1 { // the first is used after the second is uploaded: the second is the older
			if code, b, _ := post(t, srv.URL+"/v1/audio/speech", "application/json", []byte(`{"input":"Hi.","voice":"`+ids[0]+`"}`)); code != 200 {
				t.Fatalf("speaking: %d %s", code, b)
			}
		}
	}
	for i, want := range []int{200, 400, 200} {
		code, b, _ := post(t, srv.URL+"/v1/audio/speech", "application/json", []byte(`{"input":"Hi.","voice":"`+ids[i]+`"}`))
		if code != want || want == 400 && !strings.Contains(string(b), "voice_not_found") {
			t.Errorf("voice %d: %d %.200s, want %d", i, code, b, want)
		}
	}
}

// TestVoiceUploadBadInput: what is not a usable prompt is a 4xx naming the field; nothing is
// cloned.
func TestVoiceUploadBadInput(t *testing.T) {
	sp := &fakeSpeaker{frames: 1}
	srv := newVoiceServer(t, sp, Config{Voices: VoiceConfig{MaxDuration: 5 * time.Second}})
	url := srv.URL + "/v1/audio/voices"
	for _, c := range []struct {
		name   string
		field  string
		file   []byte
		fields []string
		status int
		code   string
	}{
		{"not audio", "file", []byte("this is plain text, not a recording of anyone"), nil, 400, "unsupported_format"},
		{"truncated", "file", promptWAV(t, 2, 220)[:30], nil, 400, ""},
		{"empty", "file", []byte{}, nil, 400, "empty_file"},
		{"no file", "", nil, []string{"name", "x"}, 400, ""},
		{"too short", "file", promptWAV(t, 0.5, 220), nil, 400, "audio_too_short"},
		{"too long", "file", promptWAV(t, 6, 220), nil, 400, "audio_too_long"},
		{"unknown model", "file", promptWAV(t, 2, 220), []string{"model", "tts-1"}, 404, "model_not_found"},
		{"long name", "file", promptWAV(t, 2, 220), []string{"name", strings.Repeat("n", 300)}, 400, ""},
	} {
		code, b := uploadForm(t, url, "", c.field, c.file, c.fields...)
		var e errorBody
		if json.Unmarshal(b, &e); code != c.status || e.Error == nil || e.Error.Message == "" || c.code != "" && (e.Error.Code == nil || *e.Error.Code != c.code) {
			t.Errorf("%s: %d %s; want %d %s", c.name, code, b, c.status, c.code)
		}
	}
	code, b, _ := post(t, url, "application/json", []byte(`{"file":"x"}`))
	if code != http.StatusUnsupportedMediaType {
		t.Errorf("JSON body: %d %s", code, b)
	}
	if len(sp.clones) != 0 {
		t.Errorf("%d prompts cloned", len(sp.clones))
	}
}

// TestVoiceUploadNoCloner: a model whose synthesiser cannot clone answers 400.
func TestVoiceUploadNoCloner(t *testing.T) {
	sp := struct{ Speaker }{&fakeSpeaker{frames: 1}}
	srv := newVoiceServer(t, sp, Config{})
	code, b := uploadForm(t, srv.URL+"/v1/audio/voices", "", "file", promptWAV(t, 2, 220))
	if code != 400 || !strings.Contains(string(b), "cannot clone") {
		t.Errorf("%d %s", code, b)
	}
}

// TestVoicePromptRate: an uploaded prompt is decoded at its own rate and resampled once,
// straight to the model's 24 kHz: a 24 kHz 16-bit WAV's samples reach the cloner exactly
// (s16·2⁻¹⁵), and a 16, 44.1 or 48 kHz one's are one Resampler's output from the file's rate,
// bit for bit; the duration is the prompt's.
func TestVoicePromptRate(t *testing.T) {
	sp := &fakeSpeaker{frames: 1}
	srv := newVoiceServer(t, sp, Config{})
	rng := rand.New(rand.NewPCG(3, 4))
	for _, rate := range []int{24000, 16000, 44100, 48000} {
		n := rate * 3 / 2
		file, err := audio.WAVHeader(int64(n), rate)
		if err != nil {
			t.Fatal(err)
		}
		exact := make([]float32, n)
		for i := range exact {
			v := int16(rng.IntN(1<<16) - 1<<15)
			file = append(file, byte(v), byte(uint16(v)>>8))
			exact[i] = float32(v) / 32768
		}
		code, b := uploadForm(t, srv.URL+"/v1/audio/voices", "", "file", file)
		var v struct{ Duration float64 }
		if err := json.Unmarshal(b, &v); code != 200 || err != nil || v.Duration != 1.5 {
			t.Fatalf("%d Hz: %d %s", rate, code, b)
		}
		want := exact
		if rate != 24000 {
			rs, err := audio.NewResampler(rate, 24000)
			if err != nil {
				t.Fatal(err)
			}
			want = rs.Flush(rs.Process(nil, exact))
		}
		sp.mu.Lock()
		got := sp.prompt
		sp.mu.Unlock()
		if len(got) != len(want) {
			t.Fatalf("%d Hz: a prompt of %d samples reached the cloner, want %d", rate, len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%d Hz: sample %d is %v, want %v", rate, i, got[i], want[i])
			}
		}
	}
}
