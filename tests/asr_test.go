package tests

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/audio"
)

// asrBackend is the faster backend the binary under test has.
func asrBackend() string {
	b := backends()
	return b[len(b)-1]
}

// TestServeASR serves the random-weight tiny.en Whisper model (detected as a whisper.cpp file by
// its magic) beside an LLM and checks the transcription endpoints through curl-like multipart
// posts, the openai npm client, and a live WebSocket stream. Random weights make the text
// meaningless, but it is deterministic: the server's text equals `parley transcribe`'s.
func TestServeASR(t *testing.T) {
	sameInBothBuilds(t)
	whisperModel := sharedtest.WhisperRandomModel(t, "tiny.en")
	llm := sharedtest.Path(t, "models/llm/stories260K-f32.gguf")
	short := sharedtest.Path(t, "data/asr/wav/psx-cards-001.wav") // 1.1 s
	be := asrBackend()
	// The same model as GGUF, served under a second name.
	ggufModel := filepath.Join(t.TempDir(), "tiny.en.gguf")
	if res := parley(t, "", "convert", "-o", ggufModel, whisperModel); res.code != 0 {
		t.Fatalf("parley convert: %d %s", res.code, res.stderr)
	}
	srv := startServer(t, "--backend", be, "-m", "stories="+llm, "-m", "whisper="+whisperModel, "-m", "whisper-gguf="+ggufModel,
		"--asr-parallel", "2", "--asr-encode-batch", "2")

	cli := parley(t, "", "transcribe", "--backend", be, "-m", whisperModel, short)
	if cli.code != 0 {
		t.Fatalf("parley transcribe: %d %s", cli.code, cli.stderr)
	}
	want := strings.TrimSpace(cli.stdout)

	t.Run("multipart formats", func(t *testing.T) {
		wav, err := os.ReadFile(short)
		if err != nil {
			t.Fatal(err)
		}
		post := func(format string, model ...string) (int, string, string) {
			return postTranscription(t, srv.base, wav, "model", append(model, "whisper")[0], "response_format", format)
		}
		code, ct, body := post("text")
		if code != 200 || !strings.HasPrefix(ct, "text/plain") || body != want+"\n" {
			t.Errorf("text: %d %s %q; parley transcribe gave %q", code, ct, body, want)
		}
		code, _, body = post("vtt")
		if code != 200 || !strings.HasPrefix(body, "WEBVTT\n\n") {
			t.Errorf("vtt: %d %q", code, body)
		}
		code, _, body = post("text", "whisper-gguf")
		if code != 200 || body != want+"\n" {
			t.Errorf("text from the GGUF model: %d %q; parley transcribe gave %q", code, body, want)
		}
	})

	t.Run("openai node client", func(t *testing.T) {
		node := openAINode(t, "")
		out, err := exec.Command(node, "node/transcribe.mjs", srv.base+"/v1", "whisper", short).CombinedOutput()
		if err != nil {
			t.Fatalf("node: %v\n%s", err, out)
		}
		var r struct {
			Models []string `json:"models"`
			JSON   struct {
				Text string `json:"text"`
			} `json:"json"`
			Text    string `json:"text"`
			SRT     string `json:"srt"`
			Verbose struct {
				Task     string  `json:"task"`
				Language string  `json:"language"`
				Duration float64 `json:"duration"`
				Text     string  `json:"text"`
				Segments []struct {
					Start, End float64
					Text       string
				} `json:"segments"`
				Words []struct {
					Word       string
					Start, End float64
				} `json:"words"`
			} `json:"verbose"`
			Unknown *clientError `json:"unknown_model_error"`
		}
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if strings.Join(r.Models, ",") != "stories,whisper,whisper-gguf" {
			t.Errorf("models %v", r.Models)
		}
		if r.JSON.Text != want || strings.TrimSpace(r.Text) != want || r.Verbose.Text != want {
			t.Errorf("json %q, text %q, verbose %q; parley transcribe gave %q", r.JSON.Text, r.Text, r.Verbose.Text, want)
		}
		if !regexp.MustCompile(`^(\d+\n\d\d:\d\d:\d\d,\d{3} --> \d\d:\d\d:\d\d,\d{3}\n[^\n]*\n\n)*$`).MatchString(r.SRT) {
			t.Errorf("srt %q", r.SRT)
		}
		if r.Verbose.Task != "transcribe" || r.Verbose.Language != "english" || r.Verbose.Duration < 1 || r.Verbose.Duration > 1.2 {
			t.Errorf("verbose_json %+v", r.Verbose)
		}
		if want != "" && (len(r.Verbose.Segments) == 0 || len(r.Verbose.Words) == 0) {
			t.Errorf("verbose_json without segments or words: %+v", r.Verbose)
		}
		if r.Unknown == nil || r.Unknown.Status != 404 || r.Unknown.Code != "model_not_found" {
			t.Errorf("unknown model: %+v", r.Unknown)
		}
	})

	t.Run("websocket stream", func(t *testing.T) {
		b, err := os.ReadFile(sharedtest.Path(t, "data/asr/wav/jfk.wav"))
		if err != nil {
			t.Fatal(err)
		}
		pcm, _, err := audio.Decode(b)
		if err != nil {
			t.Fatal(err)
		}
		pcm = pcm[:6*16000]
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.base, "http")+"/v1/audio/stream?model=whisper&language=en", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		type event struct {
			Type       string
			Text       string
			Start, End float64
		}
		events := make(chan event, 256)
		readErr := make(chan error, 1)
		go func() {
			for {
				_, msg, err := c.Read(ctx)
				if err != nil {
					readErr <- err
					close(events)
					return
				}
				var ev event
				if err := json.Unmarshal(msg, &ev); err != nil {
					readErr <- err
					close(events)
					return
				}
				events <- ev
			}
		}()
		// 200 ms chunks at 4 times real time: the session still sees audio arrive in steps.
		const chunk = 3200
		for i := 0; i < len(pcm); i += chunk {
			seg := pcm[i:min(i+chunk, len(pcm))]
			buf := make([]byte, 2*len(seg))
			for k, v := range seg {
				binary.LittleEndian.PutUint16(buf[2*k:], uint16(int16(max(-32768, min(32767, v*32768)))))
			}
			if err := c.Write(ctx, websocket.MessageBinary, buf); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Write(ctx, websocket.MessageText, []byte(`{"type":"commit"}`))
		c.Write(ctx, websocket.MessageText, []byte(`{"type":"close"}`))
		var got []event
		for ev := range events {
			got = append(got, ev)
		}
		err = <-readErr
		var ce websocket.CloseError
		if !errors.As(err, &ce) || ce.Code != websocket.StatusNormalClosure {
			t.Errorf("stream ended with %v", err)
		}
		n := map[string]int{}
		for _, ev := range got {
			n[ev.Type]++
			if ev.Type == "final" && (ev.End < ev.Start || ev.End > 6.01) {
				t.Errorf("final %+v outside the 6 s sent", ev)
			}
		}
		t.Logf("events: %v", n)
		if n["ready"] != 1 || n["partial"] == 0 || n["final"] == 0 || n["error"] != 0 {
			t.Errorf("events %+v: want ready, partials and finals", got)
		}
	})

	// The speech model is still listed as a model and the LLM still answers.
	resp, err := http.Get(srv.base + "/v1/models/whisper")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("GET /v1/models/whisper: %d", resp.StatusCode)
	}
	code, body, _ := postJSON(t, srv.base+"/v1/completions", `{"model":"stories","prompt":"Once","max_tokens":4}`)
	if code != 200 {
		t.Errorf("completion beside the speech model: %d %s", code, body)
	}
}

// TestServeASRBeam: --asr-beam sets the served transcriptions' beam search: a lone
// transcription's decoder steps at temperature 0 then carry five sequences
// (parley_step_batch_sequences), one without it; --asr-best-of 1 keeps the fallback's steps at
// one. (Random weights give the same text either way, so the text cannot tell.)
func TestServeASRBeam(t *testing.T) {
	sameInBothBuilds(t)
	whisperModel := sharedtest.WhisperRandomModel(t, "tiny.en")
	wav, err := os.ReadFile(sharedtest.Path(t, "data/asr/wav/psx-cards-001.wav"))
	if err != nil {
		t.Fatal(err)
	}
	for _, beam := range []string{"1", "5"} {
		srv := startServer(t, "--backend", asrBackend(), "-m", "whisper="+whisperModel, "--asr-beam", beam, "--asr-best-of", "1")
		if code, _, body := postTranscription(t, srv.base, wav, "model", "whisper"); code != 200 {
			t.Fatalf("--asr-beam %s: status %d %s", beam, code, body)
		}
		resp, err := http.Get(srv.base + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		m, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var sum, count float64
		for _, line := range strings.Split(string(m), "\n") {
			if v, ok := strings.CutPrefix(line, `parley_step_batch_sequences_sum{model="whisper"} `); ok {
				sum, _ = strconv.ParseFloat(v, 64)
			}
			if v, ok := strings.CutPrefix(line, `parley_step_batch_sequences_count{model="whisper"} `); ok {
				count, _ = strconv.ParseFloat(v, 64)
			}
		}
		if count == 0 || (beam == "1") != (sum == count) {
			t.Errorf("--asr-beam %s: %v sequences over %v steps", beam, sum, count)
		}
	}
}

// postTranscription posts wav as "a.wav" with the form fields given as name, value pairs to
// base's /v1/audio/transcriptions and returns the status, content type and body.
func postTranscription(t *testing.T, base string, wav []byte, fields ...string) (int, string, string) {
	t.Helper()
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for i := 0; i+1 < len(fields); i += 2 {
		mw.WriteField(fields[i], fields[i+1])
	}
	fw, _ := mw.CreateFormFile("file", "a.wav")
	fw.Write(wav)
	mw.Close()
	resp, err := http.Post(base+"/v1/audio/transcriptions", mw.FormDataContentType(), &b)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(body)
}
