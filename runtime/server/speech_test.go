package server

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/sched/tts"
)

// fakeSpeaker emits frames of a known signal: frame k's sample i is sin(k + i/100)/2.
type fakeSpeaker struct {
	mu     sync.Mutex
	frames int
	last   tts.Request
	texts  []string  // every text spoken, in order
	clones []int     // the length of every prompt cloned
	prompt []float32 // the last prompt cloned
	// gate, when set, holds each frame after a synthesis's first until a value arrives.
	gate chan struct{}
}

// fakeVoice is a cloned voice: it marks the requests it speaks with Seed.
type fakeVoice struct{ seed uint64 }

func (v fakeVoice) Apply(r *tts.Request) { r.Seed = v.seed }
func (v fakeVoice) Bytes() int           { return 1 << 20 }

// CloneVoice makes the n-th voice, whose requests have Seed 1000+n.
func (f *fakeSpeaker) CloneVoice(prompt []float32) (ClonedVoice, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.clones = append(f.clones, len(prompt))
	f.prompt = append(f.prompt[:0], prompt...)
	return fakeVoice{seed: uint64(1000 + len(f.clones))}, nil
}

// WriteVoice writes a fake voice as its seed in text.
func (f *fakeSpeaker) WriteVoice(w io.Writer, v ClonedVoice) error {
	_, err := fmt.Fprintf(w, "fake voice %d", v.(fakeVoice).seed)
	return err
}

// ReadVoice reads what WriteVoice wrote.
func (f *fakeSpeaker) ReadVoice(path string) (ClonedVoice, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var v fakeVoice
	if _, err := fmt.Sscanf(string(b), "fake voice %d", &v.seed); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return v, nil
}

// CountTokens counts words.
func (f *fakeSpeaker) CountTokens(text string) (int, error) { return len(strings.Fields(text)), nil }

func (f *fakeSpeaker) SampleRate() int  { return 24000 }
func (f *fakeSpeaker) Voices() []string { return []string{"alba", "marius"} }

func (f *fakeSpeaker) Speak(ctx context.Context, r tts.Request, emit func([]float32) error) error {
	f.mu.Lock()
	f.last = r
	f.texts = append(f.texts, r.Text)
	f.mu.Unlock()
	switch r.Text {
	case "?":
		return fmt.Errorf("%w: %w", tts.ErrInput, errors.New("nothing to say"))
	case "boom":
		return errors.New("the backend failed")
	case "late boom": // after a frame
		if err := emit(make([]float32, 1920)); err != nil {
			return err
		}
		return errors.New("the backend failed")
	}
	a := make([]float32, 1920)
	for k := range f.frames {
		if err := ctx.Err(); err != nil {
			return err
		}
		if k > 0 && f.gate != nil {
			select {
			case <-f.gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		for i := range a {
			a[i] = float32(math.Sin(float64(k)+float64(i)/100) / 2)
		}
		if err := emit(a); err != nil {
			return err
		}
	}
	return nil
}

func fakePCM(frames int) []byte {
	var want []byte
	a := make([]float32, 1920)
	for k := range frames {
		for i := range a {
			a[i] = float32(math.Sin(float64(k)+float64(i)/100) / 2)
		}
		want = audio.FloatToPCM16(want, a)
	}
	return want
}

func newTTSServer(t *testing.T, sp Speaker) *httptest.Server {
	t.Helper()
	s, err := New(Config{TTSModels: []*TTSModel{{Name: "pocket-tts", Synth: sp}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.SetReady(true)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return srv
}

// TestSpeech: the WAV response is the synthesiser's frames as 16-bit PCM behind a header of the
// right length and rate; pcm is the same samples bare; the request reaches the synthesiser with
// its text and voice and upstream's default temperature.
func TestSpeech(t *testing.T) {
	sp := &fakeSpeaker{frames: 3}
	srv := newTTSServer(t, sp)
	url := srv.URL + "/v1/audio/speech"
	code, body, h := post(t, url, "application/json", []byte(`{"model":"pocket-tts","input":"Hello there.","voice":"alba","response_format":"wav"}`))
	if code != http.StatusOK || h.Get("Content-Type") != "audio/wav" {
		t.Fatalf("%d %s: %s", code, h.Get("Content-Type"), body)
	}
	want := fakePCM(3)
	le := binary.LittleEndian
	if len(body) != 44+len(want) || string(body[:4]) != "RIFF" || le.Uint32(body[24:]) != 24000 || le.Uint32(body[40:]) != uint32(len(want)) {
		t.Fatalf("a WAV of %d bytes, rate %d, data %d; want %d bytes of data at 24000 Hz", len(body), le.Uint32(body[24:]), le.Uint32(body[40:]), len(want))
	}
	if string(body[44:]) != string(want) {
		t.Error("the WAV's samples are not the synthesiser's")
	}
	if sp.last.Text != "Hello there." || sp.last.VoiceName != "alba" || sp.last.Temperature >= 0 || sp.last.Noise != nil {
		t.Errorf("the synthesiser got %+v", sp.last)
	}
	code, body, h = post(t, url, "application/json", []byte(`{"model":"pocket-tts","input":"Hi.","voice":"marius","response_format":"pcm","speed":1.0,"stream_format":"audio"}`))
	if code != http.StatusOK || h.Get("Content-Type") != "audio/pcm" || h.Get("X-Sample-Rate") != "24000" || string(body) != string(want) {
		t.Errorf("pcm: %d %s rate %q, %d bytes (want %d)", code, h.Get("Content-Type"), h.Get("X-Sample-Rate"), len(body), len(want))
	}
	// the one model is the default, and wav the default format
	code, body, h = post(t, url, "application/json", []byte(`{"input":"Hi.","voice":"alba"}`))
	if code != http.StatusOK || h.Get("Content-Type") != "audio/wav" || len(body) != 44+len(want) {
		t.Errorf("defaults: %d %s, %d bytes", code, h.Get("Content-Type"), len(body))
	}
	resp, err := http.Get(srv.URL + "/v1/models/pocket-tts")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET /v1/models/pocket-tts: %d", resp.StatusCode)
	}
}

// TestSpeechBadInput: every request the server cannot honour is answered with a 4xx naming the
// parameter, and a failing synthesis with a 500; the server goes on serving.
func TestSpeechBadInput(t *testing.T) {
	srv := newTTSServer(t, &fakeSpeaker{frames: 1})
	url := srv.URL + "/v1/audio/speech"
	long := strings.Repeat("a", maxSpeechInput+1)
	for _, c := range []struct {
		body   string
		status int
		param  string
	}{
		{`{"model":"pocket-tts","voice":"alba"}`, 400, "input"},
		{`{"model":"pocket-tts","input":"   ","voice":"alba"}`, 400, "input"},
		{`{"model":"pocket-tts","input":"` + long + `","voice":"alba"}`, 400, "input"},
		{`{"model":"pocket-tts","input":"?","voice":"alba"}`, 400, "input"},
		{`{"model":"pocket-tts","input":"Hi."}`, 400, "voice"},
		{`{"model":"pocket-tts","input":"Hi.","voice":"nobody"}`, 400, "voice"},
		{`{"model":"pocket-tts","input":"Hi.","voice":{"id":42}}`, 400, "voice"},
		{`{"model":"pocket-tts","input":"Hi.","voice":{"name":"alba"}}`, 400, "voice"},
		{`{"model":"pocket-tts","input":"Hi.","voice":{"id":"voice_0123"}}`, 400, "voice"},
		{`{"model":"pocket-tts","input":"Hi.","voice":"alba","response_format":"mp3"}`, 400, "response_format"},
		{`{"model":"pocket-tts","input":"Hi.","voice":"alba","response_format":"ogg"}`, 400, "response_format"},
		{`{"model":"pocket-tts","input":"Hi.","voice":"alba","speed":1.5}`, 400, "speed"},
		{`{"model":"pocket-tts","input":"Hi.","voice":"alba","stream_format":"websocket"}`, 400, "stream_format"},
		{`{"model":"pocket-tts","input":"Hi.","voice":"alba","response_format":"opus"}`, 400, "response_format"},
		{`{"model":"pocket-tts","input":"Hi.","voice":"alba","response_format":"aac","stream_format":"sse"}`, 400, "response_format"},
		{`{"model":"pocket-tts","input":"Hi.","voice":"alba","speed":0.5}`, 400, "speed"},
		{`{"model":"pocket-tts","input":"Hi.","voice":"alba","instructions":"cheerfully"}`, 400, "instructions"},
		{`{"model":"tts-1","input":"Hi.","voice":"alba"}`, 404, "model"},
		{`{"model":"pocket-tts","input":42,"voice":"alba"}`, 400, "input"},
		{`not json`, 400, ""},
		{`{"model":"pocket-tts","input":"boom","voice":"alba"}`, 500, ""},
	} {
		code, body, _ := post(t, url, "application/json", []byte(c.body))
		var e struct {
			Error struct {
				Message string  `json:"message"`
				Param   *string `json:"param"`
			} `json:"error"`
		}
		if err := json.Unmarshal(body, &e); err != nil || code != c.status || e.Error.Message == "" {
			t.Errorf("%.80s: %d %s; want %d with a message", c.body, code, body, c.status)
			continue
		}
		if c.param != "" && (e.Error.Param == nil || *e.Error.Param != c.param) {
			t.Errorf("%.80s: param %v, want %q", c.body, e.Error.Param, c.param)
		}
	}
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %d, want 405", resp.StatusCode)
	}
}
