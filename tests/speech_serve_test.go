package tests

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/parleyhq/parley/internal/sharedtest"
	"github.com/parleyhq/parley/runtime/audio"
)

const speechKey = "speech-key"

// startSpeechServer serves the random-weight Pocket TTS checkpoint (with the reference's
// tokenizer beside it, as upstream lays a checkpoint out) as "tts", with the reference's voice
// state as "alba", behind an API key, with the flags extra.
func startSpeechServer(t *testing.T, extra ...string) *serverProc {
	t.Helper()
	ref := sharedtest.Path(t, "reference/tts")
	weights := sharedtest.PocketTTSRandomWeights(t)
	dir := t.TempDir()
	if err := os.Symlink(weights, filepath.Join(dir, "model.safetensors")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(ref, "tokenizer", "random-unigram-4000.model"), filepath.Join(dir, "tokenizer.model")); err != nil {
		t.Fatal(err)
	}
	return startServer(t, append([]string{"-t", "2", "--api-key", speechKey, "-m", "tts=" + filepath.Join(dir, "model.safetensors"),
		"--tts-voice", "alba=" + filepath.Join(ref, "voice", "voice_state.safetensors")}, extra...)...)
}

// speechPost posts a JSON speech request with the key.
func speechPost(t *testing.T, url, body string) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest("POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+speechKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b, resp.Header
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// TestServeSpeech: the binary serves one synthesis (the seed is fixed, so every request of one
// text and voice is the same audio) as a whole WAV, streamed PCM, streamed FLAC that the audio
// package decodes to the same samples, and server-sent events whose deltas are the same bytes;
// an uploaded prompt becomes a voice that speaks and is listed; a live WebSocket session speaks
// the sentence it is sent with the same samples; mp3 is a 400; and the official openai client
// gets the same audio.
func TestServeSpeech(t *testing.T) {
	sameInBothBuilds(t)
	srv := startSpeechServer(t)
	url := srv.base + "/v1/audio/speech"
	code, wav, h := speechPost(t, url, `{"model":"tts","input":"Hello world.","voice":"alba"}`)
	le := binary.LittleEndian
	if code != 200 || h.Get("Content-Type") != "audio/wav" || len(wav) < 44+3840 || (len(wav)-44)%3840 != 0 || le.Uint32(wav[40:]) != uint32(len(wav)-44) {
		t.Fatalf("wav: %d %s, %d bytes: %.200s", code, h.Get("Content-Type"), len(wav), wav)
	}
	pcm := wav[44:]
	code, got, h := speechPost(t, url, `{"model":"tts","input":"Hello world.","voice":"alba","response_format":"pcm"}`)
	if code != 200 || !bytes.Equal(got, pcm) || h.Get("X-Sample-Rate") != "24000" {
		t.Errorf("pcm: %d, %d bytes, unlike the WAV's %d", code, len(got), len(pcm))
	}
	code, flacBody, h := speechPost(t, url, `{"model":"tts","input":"Hello world.","voice":"alba","response_format":"flac","stream_format":"audio"}`)
	if code != 200 || h.Get("Content-Type") != "audio/flac" || len(flacBody) >= len(wav) {
		t.Fatalf("flac: %d %s, %d bytes (the WAV %d)", code, h.Get("Content-Type"), len(flacBody), len(wav))
	}
	if bin, err := exec.LookPath("flac"); err == nil { // libFLAC's own test of the stream
		f := filepath.Join(t.TempDir(), "streamed.flac")
		os.WriteFile(f, flacBody, 0o644)
		if out, err := exec.Command(bin, "-t", "-s", f).CombinedOutput(); err != nil {
			t.Errorf("flac -t: %v\n%s", err, out)
		}
	}
	dec, info, err := audio.Decode(flacBody)
	if err != nil || info.Format != audio.FormatFLAC || info.SampleRate != 24000 || info.Frames != int64(len(pcm)/2) {
		t.Fatalf("flac decodes to %+v: %v", info, err)
	}
	wdec, _, err := audio.Decode(wav)
	if err != nil || len(wdec) != len(dec) {
		t.Fatalf("wav decodes to %d samples, flac to %d: %v", len(wdec), len(dec), err)
	}
	for i := range dec {
		if dec[i] != wdec[i] {
			t.Fatalf("sample %d: flac %v, wav %v", i, dec[i], wdec[i])
		}
	}
	code, sse, h := speechPost(t, url, `{"model":"tts","input":"Hello world.","voice":"alba","response_format":"wav","stream_format":"sse"}`)
	if code != 200 || h.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("sse: %d %s", code, h.Get("Content-Type"))
	}
	var streamed []byte
	var done struct {
		Type  string `json:"type"`
		Usage struct {
			In  int `json:"input_tokens"`
			Out int `json:"output_tokens"`
		} `json:"usage"`
	}
	sc := bufio.NewScanner(bytes.NewReader(sse))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev struct{ Type, Audio string }
		json.Unmarshal([]byte(data), &ev)
		if ev.Type == "speech.audio.delta" {
			b, err := base64.StdEncoding.DecodeString(ev.Audio)
			if err != nil {
				t.Fatal(err)
			}
			streamed = append(streamed, b...)
		} else {
			json.Unmarshal([]byte(data), &done)
		}
	}
	if len(streamed) != len(wav) || !bytes.Equal(streamed[44:], pcm) || le.Uint32(streamed[40:]) != 0xffffffff || done.Type != "speech.audio.done" || done.Usage.Out != len(pcm)/3840 || done.Usage.In < 1 {
		t.Errorf("sse: %d bytes streamed (the WAV %d), done %+v", len(streamed), len(wav), done)
	}
	code, b, _ := speechPost(t, url, `{"model":"tts","input":"Hello world.","voice":"alba","response_format":"mp3"}`)
	if code != 400 || !strings.Contains(string(b), "'wav', 'flac' and 'pcm'") {
		t.Errorf("mp3: %d %s", code, b)
	}

	// a voice uploaded, spoken with, listed
	prompt := sharedtest.Path(t, "data/asr/wav/ls-tc-1089-134686-0001.wav")
	wavPrompt, err := os.ReadFile(prompt)
	if err != nil {
		t.Fatal(err)
	}
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	fw, _ := mw.CreateFormFile("file", "prompt.wav")
	fw.Write(wavPrompt)
	mw.Close()
	req, _ := http.NewRequest("POST", srv.base+"/v1/audio/voices", &form)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("Authorization", "Bearer "+speechKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var voice struct {
		ID       string  `json:"id"`
		Duration float64 `json:"duration"`
	}
	err = json.NewDecoder(resp.Body).Decode(&voice)
	resp.Body.Close()
	if resp.StatusCode != 200 || err != nil || !strings.HasPrefix(voice.ID, "voice_") || voice.Duration < 3.2 || voice.Duration > 3.3 {
		t.Fatalf("upload: %d %+v %v", resp.StatusCode, voice, err)
	}
	code, cloned, _ := speechPost(t, url, `{"model":"tts","input":"Hello world.","voice":"`+voice.ID+`","response_format":"pcm"}`)
	if code != 200 || len(cloned) == 0 || len(cloned)%3840 != 0 || bytes.Equal(cloned, pcm) {
		t.Errorf("the uploaded voice: %d, %d bytes (alba's %d)", code, len(cloned), len(pcm))
	}
	req, _ = http.NewRequest("GET", srv.base+"/v1/audio/voices", nil)
	req.Header.Set("Authorization", "Bearer "+speechKey)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	list, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(list), `"id":"alba"`) || !strings.Contains(string(list), voice.ID) {
		t.Errorf("voices: %d %s", resp.StatusCode, list)
	}

	t.Run("websocket", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.base, "http")+"/v1/audio/speech/stream?model=tts&voice=alba",
			&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + speechKey}}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		send := func(m string) {
			if err := c.Write(ctx, websocket.MessageText, []byte(m)); err != nil {
				t.Fatal(err)
			}
		}
		send(`{"type":"text","text":"Hello wor"}`)
		send(`{"type":"text","text":"ld. And th"}`)
		var events []string
		var live []byte
		for {
			typ, b, err := c.Read(ctx)
			if err != nil {
				var ce websocket.CloseError
				if !errors.As(err, &ce) || ce.Code != websocket.StatusNormalClosure {
					t.Fatalf("read: %v (events %v)", err, events)
				}
				break
			}
			if typ == websocket.MessageBinary {
				live = append(live, b...)
				if len(live) == len(pcm) { // "Hello world." is spoken; "And th" waits for more
					send(`{"type":"cancel"}`)
					send(`{"type":"close"}`)
				}
				continue
			}
			var ev struct{ Type, Text string }
			json.Unmarshal(b, &ev)
			events = append(events, ev.Type+":"+ev.Text)
		}
		if strings.Join(events, " ") != "ready: segment:Hello world. cancelled: done:" || !bytes.Equal(live, pcm) {
			t.Errorf("events %v, %d bytes of audio (the HTTP synthesis's %d, equal: %v)", events, len(live), len(pcm), bytes.Equal(live, pcm))
		}
	})

	t.Run("websocket flac", func(t *testing.T) { // the same samples as a FLAC stream
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.base, "http")+"/v1/audio/speech/stream?model=tts&voice=alba",
			&websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer " + speechKey}}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.CloseNow()
		for _, m := range []string{`{"type":"config","response_format":"flac"}`, `{"type":"text","text":"Hello world."}`, `{"type":"close"}`} {
			if err := c.Write(ctx, websocket.MessageText, []byte(m)); err != nil {
				t.Fatal(err)
			}
		}
		var stream []byte
		var events []string
		for {
			typ, b, err := c.Read(ctx)
			if err != nil {
				break
			}
			if typ == websocket.MessageBinary {
				stream = append(stream, b...)
				continue
			}
			var ev struct {
				Type           string `json:"type"`
				ResponseFormat string `json:"response_format"`
			}
			json.Unmarshal(b, &ev)
			events = append(events, ev.Type+":"+ev.ResponseFormat)
		}
		got, info, err := audio.DecodeWith(stream, audio.Options{SampleRate: 24000})
		want := make([]float32, len(pcm)/2)
		audio.PCM16ToFloat(want, pcm)
		same := len(got) == len(want)
		for i := 0; same && i < len(got); i++ {
			same = got[i] == want[i]
		}
		if strings.Join(events, " ") != "ready:pcm configured:flac segment: done:" || err != nil || info.Format != audio.FormatFLAC || !same {
			t.Errorf("events %v; the stream decodes to %d samples as %+v (the HTTP synthesis's %d, equal: %v): %v", events, len(got), info, len(want), same, err)
		}
	})

	t.Run("openai node client", func(t *testing.T) {
		node := openAINode(t, "")
		cmd := exec.Command(node, "node/speech.mjs", srv.base+"/v1", "tts", "alba", prompt)
		cmd.Env = append(os.Environ(), "PARLEY_API_KEY="+speechKey)
		cmd.Stderr = os.Stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("node: %v\n%s", err, out)
		}
		var r struct {
			WAV struct {
				Bytes    int    `json:"bytes"`
				RIFF     string `json:"riff"`
				DataSize int    `json:"data_size"`
				PCMSHA   string `json:"pcm_sha256"`
			} `json:"wav"`
			PCM struct {
				Bytes       int    `json:"bytes"`
				Chunks      int    `json:"chunks"`
				SHA         string `json:"sha256"`
				ContentType string `json:"content_type"`
			} `json:"pcm"`
			Upload struct {
				Status int    `json:"status"`
				ID     string `json:"id"`
			} `json:"upload"`
			Cloned struct {
				SHA string `json:"sha256"`
			} `json:"cloned"`
			MP3 *struct {
				Status int    `json:"status"`
				Param  string `json:"param"`
			} `json:"mp3_error"`
		}
		if err := json.Unmarshal(out, &r); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		if r.WAV.RIFF != "RIFF" || r.WAV.Bytes != len(wav) || r.WAV.DataSize != len(pcm) || r.WAV.PCMSHA != sha(pcm) {
			t.Errorf("wav: %+v", r.WAV)
		}
		if r.PCM.SHA != sha(pcm) || r.PCM.ContentType != "audio/pcm" || r.PCM.Chunks < 2 {
			t.Errorf("pcm stream: %+v (want %d bytes in chunks)", r.PCM, len(pcm))
		}
		if r.Upload.Status != 200 || r.Upload.ID != voice.ID || r.Cloned.SHA != sha(cloned) {
			t.Errorf("upload %+v (want %s), cloned %s (want %s)", r.Upload, voice.ID, r.Cloned.SHA, sha(cloned))
		}
		if r.MP3 == nil || r.MP3.Status != 400 || r.MP3.Param != "response_format" {
			t.Errorf("mp3: %+v", r.MP3)
		}
	})
}
