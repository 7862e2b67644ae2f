package server

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/models/whisper"
	"github.com/parleyhq/parley/runtime/sched/asr"
	wtok "github.com/parleyhq/parley/runtime/tokenizer/whisper"
)

// asrParams keep the random-weight model's transcriptions short: no temperature fallback and at
// most 24 tokens a window (random weights rarely sample end-of-text, so a window would otherwise
// run its full 220 tokens).
func asrParams() asr.Params {
	p := asr.DefaultParams()
	p.TemperatureInc = 0
	p.MaxTokens = 24
	return p
}

var asrTiny struct {
	once sync.Once
	eng  *asr.Whisper
	err  error
	skip string
}

// speechEngine is one recogniser over the random-weight tiny.en model shared by this package's
// tests, on the native CPU backend when the build has it (the pure-Go one is about 8 times slower).
func speechEngine(t testing.TB) *asr.Whisper {
	t.Helper()
	path := sharedtest.WhisperRandomModel(t, "tiny.en")
	asrTiny.once.Do(func() {
		var be backend.Backend
		for _, name := range []string{"cpu", "go"} {
			if be, _, asrTiny.err = backend.New(name, backend.Options{Threads: 2}); asrTiny.err == nil {
				break
			}
		}
		if asrTiny.err != nil {
			return
		}
		m, err := whisper.Open(be, path)
		if err != nil {
			asrTiny.err = err
			return
		}
		asrTiny.eng, asrTiny.err = asr.NewWhisper(m, asr.Config{MaxActive: 4, MaxQueue: 8})
	})
	if asrTiny.err != nil {
		t.Fatal(asrTiny.err)
	}
	return asrTiny.eng
}

// jfk returns the first sec seconds of jfk.wav as samples.
func jfk(t *testing.T, sec float64) []float32 {
	t.Helper()
	b, err := os.ReadFile(sharedtest.Path(t, "data/asr/wav/jfk.wav"))
	if err != nil {
		t.Fatal(err)
	}
	s, _, err := audio.Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	return s[:min(len(s), int(sec*16000))]
}

// wavBytes is a 16 kHz mono PCM16 WAV of samples.
func wavBytes(samples []float32) []byte {
	var b bytes.Buffer
	n := uint32(2 * len(samples))
	b.WriteString("RIFF")
	binary.Write(&b, binary.LittleEndian, 36+n)
	b.WriteString("WAVEfmt ")
	for _, v := range []any{uint32(16), uint16(1), uint16(1), uint32(16000), uint32(32000), uint16(2), uint16(16)} {
		binary.Write(&b, binary.LittleEndian, v)
	}
	b.WriteString("data")
	binary.Write(&b, binary.LittleEndian, n)
	for _, v := range samples {
		binary.Write(&b, binary.LittleEndian, int16(max(-32768, min(32767, math.Round(float64(v)*32768)))))
	}
	return b.Bytes()
}

type speechHarness struct {
	srv *httptest.Server
	s   *Server
	eng *asr.Whisper
}

func newSpeechHarness(t testing.TB, cfg Config) *speechHarness {
	t.Helper()
	eng := speechEngine(t)
	p := asrParams()
	cfg.SpeechModels = []*SpeechModel{{Name: "whisper-tiny", Recognizer: eng, Params: &p}}
	s, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.SetReady(true)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	return &speechHarness{srv: srv, s: s, eng: eng}
}

type field struct{ name, value string }

// form builds a multipart body; a file is added when file is not nil.
func form(file []byte, fileType string, fields ...field) (string, []byte) {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for _, f := range fields {
		mw.WriteField(f.name, f.value)
	}
	if file != nil {
		h := map[string][]string{"Content-Disposition": {`form-data; name="file"; filename="a.wav"`}}
		if fileType != "" {
			h["Content-Type"] = []string{fileType}
		}
		w, _ := mw.CreatePart(h)
		w.Write(file)
	}
	mw.Close()
	return mw.FormDataContentType(), b.Bytes()
}

func post(t *testing.T, url, ctype string, body []byte) (int, []byte, http.Header) {
	t.Helper()
	resp, err := http.Post(url, ctype, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b, resp.Header
}

// TestTranscriptionMatchesEngine: every response format carries what a direct Transcribe call
// with the same parameters returns.
func TestTranscriptionMatchesEngine(t *testing.T) {
	h := newSpeechHarness(t, Config{})
	pcm := jfk(t, 4)
	p := asrParams()
	p.InitialPrompt = "President Kennedy."
	t0 := time.Now()
	want, err := h.eng.Transcribe(context.Background(), pcm, p, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("direct: %v, %q, %d segments", time.Since(t0), want.Text, len(want.Segments))
	wav := wavBytes(pcm)
	url := h.srv.URL + "/v1/audio/transcriptions"
	base := []field{{"model", "whisper-tiny"}, {"prompt", p.InitialPrompt}, {"language", "en"}}
	call := func(fs ...field) []byte {
		ct, body := form(wav, "audio/wav", append(base, fs...)...)
		code, b, _ := post(t, url, ct, body)
		if code != 200 {
			t.Fatalf("%v: status %d: %s", fs, code, b)
		}
		return b
	}

	var js struct {
		Text  string `json:"text"`
		Usage struct {
			Type    string `json:"type"`
			Seconds int    `json:"seconds"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(call(), &js); err != nil {
		t.Fatal(err)
	}
	if js.Text != strings.TrimSpace(want.Text) || js.Usage.Type != "duration" || js.Usage.Seconds != 4 {
		t.Errorf("json: %+v, want text %q and 4 s", js, strings.TrimSpace(want.Text))
	}
	if got := string(call(field{"response_format", "text"})); got != strings.TrimSpace(want.Text)+"\n" {
		t.Errorf("text: %q", got)
	}
	srt := string(call(field{"response_format", "srt"}))
	if srt != want.SRT() || !regexp.MustCompile(`^(\d+\n\d\d:\d\d:\d\d,\d{3} --> \d\d:\d\d:\d\d,\d{3}\n[^\n]*\n\n)*$`).MatchString(srt) {
		t.Errorf("srt:\n%s\nwant:\n%s", srt, want.SRT())
	}
	vtt := string(call(field{"response_format", "vtt"}))
	if vtt != want.VTT() || !strings.HasPrefix(vtt, "WEBVTT\n\n") {
		t.Errorf("vtt:\n%s", vtt)
	}
	var vj struct {
		Task     string        `json:"task"`
		Language string        `json:"language"`
		Duration float64       `json:"duration"`
		Text     string        `json:"text"`
		Segments []segmentJSON `json:"segments"`
		Words    []asr.Word    `json:"words"`
	}
	if err := json.Unmarshal(call(field{"response_format", "verbose_json"}, field{"timestamp_granularities[]", "word"}, field{"timestamp_granularities[]", "segment"}), &vj); err != nil {
		t.Fatal(err)
	}
	if vj.Task != "transcribe" || vj.Language != "english" || vj.Duration != 4 || vj.Text != strings.TrimSpace(want.Text) || len(vj.Segments) != len(want.Segments) {
		t.Errorf("verbose_json: %+v", vj)
	}
	for i, sg := range vj.Segments {
		w := want.Segments[i]
		if sg.Text != w.Text || sg.Start != asr.RoundTime(w.Start) || sg.End != asr.RoundTime(w.End) || len(sg.Tokens) != len(w.Tokens) || sg.AvgLogprob != w.AvgLogprob {
			t.Errorf("segment %d: %+v, want %+v", i, sg, w)
		}
	}
	// Word granularity times words by alignment (Params.WordTimestamps), as OpenAI's are.
	pw := p
	pw.WordTimestamps = true
	aligned, err := h.eng.Transcribe(context.Background(), pcm, pw, nil)
	if err != nil {
		t.Fatal(err)
	}
	wantWords := asr.Words(aligned.Segments, h.eng.IsSpecial, "en")
	for i, w := range wantWords {
		w = w.Rounded()
		wantWords[i] = asr.Word{Word: w.Word, Start: w.Start, End: w.End} // as JSON has it
	}
	if fmt.Sprint(vj.Words) != fmt.Sprint(wantWords) {
		t.Errorf("words %v, want %v", vj.Words, wantWords)
	}
	for i, w := range vj.Words {
		if w.End < w.Start || (i > 0 && w.Start < vj.Words[i-1].Start) {
			t.Errorf("word %d times %+v", i, w)
		}
	}

	// Only words: no segments.
	var wo map[string]json.RawMessage
	json.Unmarshal(call(field{"response_format", "verbose_json"}, field{"timestamp_granularities[]", "word"}), &wo)
	if _, ok := wo["segments"]; ok || wo["words"] == nil {
		t.Errorf("words only: keys %v", wo)
	}

	// Metrics count the audio and the latency.
	resp, err := http.Get(h.srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	mb, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`parley_audio_seconds_total{kind="transcription",model="whisper-tiny"} 24`,
		`parley_transcription_duration_seconds_count{kind="transcription",model="whisper-tiny"} 6`,
		`parley_http_requests_total{code="200",endpoint="/v1/audio/transcriptions"} 6`} {
		if !strings.Contains(string(mb), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

var asrMulti struct {
	once sync.Once
	eng  *asr.Whisper
	err  error
}

// multilingualEngine is one recogniser over the random-weight multilingual tiny model, shared by
// this package's tests.
func multilingualEngine(t testing.TB) *asr.Whisper {
	t.Helper()
	path := sharedtest.WhisperRandomModel(t, "tiny")
	asrMulti.once.Do(func() {
		be, _, err := backend.New(backend.Choose(""), backend.Options{Threads: 2})
		if err != nil {
			asrMulti.err = err
			return
		}
		m, err := whisper.Open(be, path)
		if err != nil {
			asrMulti.err = err
			return
		}
		asrMulti.eng, asrMulti.err = asr.NewWhisper(m, asr.Config{MaxActive: 2, MaxQueue: 4})
	})
	if asrMulti.err != nil {
		t.Fatal(asrMulti.err)
	}
	return asrMulti.eng
}

// TestTranscriptionLanguageMultilingual: verbose_json always names a language. A translation
// names English, the language of its text, as OpenAI's does, not the one detected in the audio;
// a transcription of silence, which the model does not decode, names the language detected in
// it (the model's guess for the same audio through /v1/audio/translations' detection).
func TestTranscriptionLanguageMultilingual(t *testing.T) {
	eng := multilingualEngine(t)
	p := asrParams()
	s, err := New(Config{SpeechModels: []*SpeechModel{{Name: "whisper-multi", Recognizer: eng, Params: &p}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.SetReady(true)
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	verbose := func(path string, pcm []float32, fs ...field) verboseJSON {
		t.Helper()
		ct, body := form(wavBytes(pcm), "audio/wav", append([]field{{"model", "whisper-multi"}, {"response_format", "verbose_json"}}, fs...)...)
		code, b, _ := post(t, srv.URL+path, ct, body)
		var v verboseJSON
		if code != 200 || json.Unmarshal(b, &v) != nil {
			t.Fatalf("%s: %d %s", path, code, b)
		}
		return v
	}
	voice := jfk(t, 2)
	probs, err := eng.DetectLanguage(context.Background(), voice)
	if err != nil {
		t.Fatal(err)
	}
	detected := probs[0]
	for _, lp := range probs {
		if lp.P > detected.P {
			detected = lp
		}
	}
	t.Logf("the random-weight model hears %s in jfk.wav", detected.Code)
	if v := verbose("/v1/audio/translations", voice); v.Task != "translate" || v.Language != "english" {
		t.Errorf("translation: task %q, language %q; want translate, english", v.Task, v.Language)
	}
	if v := verbose("/v1/audio/transcriptions", voice); v.Language == "" || v.Language != wtok.LanguageName(detected.Code) {
		t.Errorf("transcription: language %q, want %q", v.Language, wtok.LanguageName(detected.Code))
	}
	zeros := make([]float32, 10*16000)
	probs, err = eng.DetectLanguage(context.Background(), zeros)
	if err != nil {
		t.Fatal(err)
	}
	detected = probs[0]
	for _, lp := range probs {
		if lp.P > detected.P {
			detected = lp
		}
	}
	v := verbose("/v1/audio/transcriptions", zeros)
	if v.Language == "" || v.Language != wtok.LanguageName(detected.Code) || v.Text != "" || v.Duration != 10 {
		t.Errorf("10 s of silence: language %q, text %q over %v s; want %q, no text, 10 s", v.Language, v.Text, v.Duration, wtok.LanguageName(detected.Code))
	}
	if v := verbose("/v1/audio/transcriptions", zeros, field{"language", "de"}); v.Language != "german" {
		t.Errorf("10 s of silence in German: language %q", v.Language)
	}
	if v := verbose("/v1/audio/transcriptions", nil); v.Language == "" {
		t.Errorf("no samples: no language")
	}
}

// TestTranscriptTimesRounded: verbose_json writes segment and word times (and the duration) to
// the millisecond, not as float64 sums print.
func TestTranscriptTimesRounded(t *testing.T) {
	a, b := 0.1, 0.2
	start, mid, end := a+b, 0.7600000000000001, 59.040000000000006 // 0.30000000000000004 and an ulp over 0.76 and 59.04
	res := &asr.Result{Text: " Hi there", Language: "en", Duration: end, Segments: []asr.Segment{{
		Start: start, End: end, Text: " Hi there", Tokens: []asr.Token{
			{ID: 50400, T0: start, T1: start}, {ID: 1, Text: " Hi", T0: start, T1: mid}, {ID: 2, Text: " there", T0: mid, T1: end}}}}}
	w := httptest.NewRecorder()
	req := &audioRequest{format: "verbose_json", words: true, segments: true}
	writeTranscript(w, req, res, false, func(id int32) bool { return id >= 50257 })
	body := w.Body.String()
	if m := regexp.MustCompile(`\d\.\d{4,}`).FindString(body); m != "" {
		t.Errorf("a time of more than three decimals, %s, in %s", m, body)
	}
	for _, want := range []string{`"duration":59.04`, `"start":0.3,"end":59.04`, `{"word":"Hi","start":0.3,"end":0.76}`, `{"word":"there","start":0.76,"end":59.04}`} {
		if !strings.Contains(body, want) {
			t.Errorf("verbose_json lacks %s: %s", want, body)
		}
	}
	if res.Segments[0].Start != start || res.Segments[0].Tokens[1].T1 != mid {
		t.Error("writing the transcript changed it")
	}
}
