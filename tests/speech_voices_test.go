package tests

import (
	"bytes"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/parleyhq/parley/internal/sharedtest"
)

// speechDo sends a request with the key and returns the status and body.
func speechDo(t *testing.T, method, url, contentType string, body io.Reader) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
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
	return resp.StatusCode, b
}

// TestServeVoicesDir: with --voices-dir, a voice uploaded to the binary is kept as a voice-state
// file that a restarted server serves under the same id and name, speaking the same samples,
// and that `parley speak --voice FILE` reads and speaks the same samples with too; DELETE
// removes it, and the server after the next restart no longer has it.
func TestServeVoicesDir(t *testing.T) {
	sameInBothBuilds(t)
	dir := t.TempDir()
	srv := startSpeechServer(t, "--voices-dir", dir)
	wavPrompt, err := os.ReadFile(sharedtest.Path(t, "data/asr/wav/ls-tc-1089-134686-0001.wav"))
	if err != nil {
		t.Fatal(err)
	}
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	fw, _ := mw.CreateFormFile("file", "prompt.wav")
	fw.Write(wavPrompt)
	mw.WriteField("name", "reader")
	mw.Close()
	code, b := speechDo(t, "POST", srv.base+"/v1/audio/voices", mw.FormDataContentType(), &form)
	var voice struct{ ID, Name string }
	if err := json.Unmarshal(b, &voice); code != 200 || err != nil || !strings.HasPrefix(voice.ID, "voice_") {
		t.Fatalf("upload: %d %s", code, b)
	}
	speak := func(srv *serverProc) (int, []byte) {
		return speechDo(t, "POST", srv.base+"/v1/audio/speech", "application/json",
			strings.NewReader(`{"model":"tts","input":"Hello world.","voice":"`+voice.ID+`","response_format":"pcm"}`))
	}
	code, pcm := speak(srv)
	if code != 200 || len(pcm) == 0 || len(pcm)%3840 != 0 {
		t.Fatalf("speaking with the uploaded voice: %d, %d bytes", code, len(pcm))
	}
	file := filepath.Join(dir, "tts", voice.ID+".safetensors")
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("the voice's file: %v", err)
	}
	stop := func(s *serverProc) {
		s.cmd.Process.Kill()
		err := <-s.done
		s.done <- err // for the cleanup's wait
	}
	stop(srv)

	srv = startSpeechServer(t, "--voices-dir", dir)
	code, list := speechDo(t, "GET", srv.base+"/v1/audio/voices", "", nil)
	if code != 200 || !strings.Contains(string(list), `"id":"`+voice.ID+`","object":"audio.voice","name":"reader"`) {
		t.Errorf("voices after a restart: %d %s", code, list)
	}
	if code, again := speak(srv); code != 200 || !bytes.Equal(again, pcm) {
		t.Errorf("the voice after a restart: %d, %d bytes, the same samples: %v", code, len(again), bytes.Equal(again, pcm))
	}
	ref := sharedtest.Path(t, "reference/tts")
	res := parley(t, "", "speak", "-m", sharedtest.PocketTTSRandomWeights(t), "--tokenizer", filepath.Join(ref, "tokenizer", "random-unigram-4000.model"),
		"-t", "2", "--voice", file, "--format", "pcm", "-o", "-", "Hello world.")
	if res.code != 0 || res.stdout != string(pcm) {
		t.Errorf("parley speak --voice %s: exit %d, %d bytes (the server's %d), the same: %v: %s", file, res.code, len(res.stdout), len(pcm), res.stdout == string(pcm), res.stderr)
	}
	if code, b := speechDo(t, "DELETE", srv.base+"/v1/audio/voices/"+voice.ID, "", nil); code != 200 || !strings.Contains(string(b), `"deleted":true`) {
		t.Errorf("delete: %d %s", code, b)
	}
	if _, err := os.Stat(file); !os.IsNotExist(err) {
		t.Errorf("the deleted voice's file: %v", err)
	}
	if code, b := speak(srv); code != 400 || !strings.Contains(string(b), "voice_not_found") {
		t.Errorf("speaking with the deleted voice: %d %s", code, b)
	}
	stop(srv)
	srv = startSpeechServer(t, "--voices-dir", dir)
	if code, list := speechDo(t, "GET", srv.base+"/v1/audio/voices", "", nil); code != 200 || strings.Contains(string(list), voice.ID) {
		t.Errorf("voices after a delete and a restart: %d %s", code, list)
	}
}
