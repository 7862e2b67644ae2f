package server

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// deleteReq sends DELETE to url.
func deleteReq(t *testing.T, url string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodDelete, url, nil)
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

// dirFiles lists the names in dir, sorted.
func dirFiles(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n []string
	for _, e := range es {
		n = append(n, e.Name())
	}
	return n
}

// TestVoiceDir: with VoiceConfig.Dir, an uploaded voice is written to the model's folder (the
// voice state and its description, no temporary file left); a server started on the folder
// serves it with the same name, date and duration and speaks with the state read back, without
// cloning; a voice dropped by the limits, or deleted (DELETE /v1/audio/voices/{id}), loses its
// files; deleting an unknown id is a 404, a predefined voice a 400; a file that cannot be read
// is skipped at start, a leftover temporary file removed, and voices over the limit at start
// dropped oldest first.
func TestVoiceDir(t *testing.T) {
	dir := t.TempDir()
	folder := filepath.Join(dir, "pocket-tts")
	cfg := Config{Voices: VoiceConfig{Dir: dir, MaxVoices: 2}}
	srv := newVoiceServer(t, &fakeSpeaker{frames: 1}, cfg)
	upload := func(srv string, f float64, name string) storedVoice {
		t.Helper()
		code, b := uploadForm(t, srv+"/v1/audio/voices", "", "file", promptWAV(t, 2, f), "name", name)
		var v storedVoice
		if err := json.Unmarshal(b, &v); code != 200 || err != nil {
			t.Fatalf("upload: %d %s", code, b)
		}
		return v
	}
	a := upload(srv.URL, 220, "Ann")
	if got := dirFiles(t, folder); !slices.Equal(got, []string{a.ID + ".json", a.ID + ".safetensors"}) {
		t.Fatalf("the folder holds %v", got)
	}
	srv.Close()

	sp := &fakeSpeaker{frames: 1}
	srv = newVoiceServer(t, sp, cfg)
	code, b := authGet(t, srv.URL+"/v1/audio/voices", "")
	var l voiceList
	if err := json.Unmarshal(b, &l); code != 200 || err != nil || len(l.Data) != 3 {
		t.Fatalf("list after a restart: %d %s", code, b)
	}
	if d := l.Data[2]; d.ID != a.ID || d.Name != "Ann" || d.Type != "uploaded" || d.Duration != 2 || d.Model != "pocket-tts" {
		t.Errorf("the voice read back: %+v, uploaded %+v", d, a)
	}
	var created struct {
		Data []struct {
			CreatedAt int64 `json:"created_at"`
		} `json:"data"`
	}
	if json.Unmarshal(b, &created); created.Data[2].CreatedAt != a.CreatedAt {
		t.Errorf("created_at %d, uploaded at %d", created.Data[2].CreatedAt, a.CreatedAt)
	}
	code, b = authPost(t, srv.URL+"/v1/audio/speech", "", `{"input":"Hi.","voice":"`+a.ID+`"}`)
	if code != 200 || sp.last.Seed != 1001 || len(sp.clones) != 0 {
		t.Errorf("speaking with the voice read back: %d %.100s, seed %d (want the first clone's 1001), %d clones", code, b, sp.last.Seed, len(sp.clones))
	}
	// over the limit: the least recently used (Ann, spoken with before B's upload) is dropped
	bv := upload(srv.URL, 330, "B")
	cv := upload(srv.URL, 440, "C")
	if got := dirFiles(t, folder); len(got) != 4 || slices.Contains(got, a.ID+".safetensors") || !slices.Contains(got, bv.ID+".safetensors") || !slices.Contains(got, cv.ID+".json") {
		t.Errorf("after a voice is dropped the folder holds %v (dropped %s)", got, a.ID)
	}
	if code, b := deleteReq(t, srv.URL+"/v1/audio/voices/"+cv.ID); code != 200 || !strings.Contains(string(b), `"deleted":true`) || !strings.Contains(string(b), cv.ID) {
		t.Errorf("delete: %d %s", code, b)
	}
	if got := dirFiles(t, folder); !slices.Equal(got, []string{bv.ID + ".json", bv.ID + ".safetensors"}) {
		t.Errorf("after a delete the folder holds %v", got)
	}
	if code, b := authPost(t, srv.URL+"/v1/audio/speech", "", `{"input":"Hi.","voice":"`+cv.ID+`"}`); code != 400 || !strings.Contains(string(b), "voice_not_found") {
		t.Errorf("speaking with a deleted voice: %d %s", code, b)
	}
	for _, c := range []struct {
		path, code string
		status     int
	}{{cv.ID, "voice_not_found", 404}, {"alba", "voice_not_deletable", 400}, {bv.ID + "?model=nothing", "model_not_found", 404}} {
		if code, b := deleteReq(t, srv.URL+"/v1/audio/voices/"+c.path); code != c.status || !strings.Contains(string(b), c.code) {
			t.Errorf("delete %s: %d %s", c.path, code, b)
		}
	}
	srv.Close()

	// at start: an unreadable file skipped, a temporary file removed, the limit kept
	bad := "voice_000000000000000000000000"
	os.WriteFile(filepath.Join(folder, bad+".safetensors"), []byte("not a voice"), 0o644)
	os.WriteFile(filepath.Join(folder, ".tmp-x.safetensors-123"), []byte("half"), 0o644)
	sp = &fakeSpeaker{frames: 1}
	srv = newVoiceServer(t, sp, cfg)
	d := upload(srv.URL, 550, "D")
	srv.Close()
	// B uploaded before D, whatever the clock's resolution
	meta := filepath.Join(folder, bv.ID+".json")
	mb, err := os.ReadFile(meta)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	json.Unmarshal(mb, &m)
	m["created_at"] = d.CreatedAt - 100
	mb, _ = json.Marshal(m)
	os.WriteFile(meta, mb, 0o644)
	cfg.Voices.MaxVoices = 1
	srv = newVoiceServer(t, &fakeSpeaker{frames: 1}, cfg)
	code, b = authGet(t, srv.URL+"/v1/audio/voices", "")
	if err := json.Unmarshal(b, &l); code != 200 || err != nil || len(l.Data) != 3 || l.Data[2].ID != d.ID {
		t.Errorf("a limit of one voice at start: %d %s (want %s kept)", code, b, d.ID)
	}
	if got := dirFiles(t, folder); !slices.Equal(got, []string{bad + ".safetensors", d.ID + ".json", d.ID + ".safetensors"}) {
		t.Errorf("the folder holds %v", got)
	}
}

// TestVoiceDirOnDemand: the voices kept for a model served on demand are read back when it is
// loaded, by the first request that names it; before, deleting one removes its files.
func TestVoiceDirOnDemand(t *testing.T) {
	dir := t.TempDir()
	folder := filepath.Join(dir, "od-tts")
	os.MkdirAll(folder, 0o755)
	kept, gone := "voice_00000000000000000000000a", "voice_00000000000000000000000b"
	for i, id := range []string{kept, gone} {
		os.WriteFile(filepath.Join(folder, id+".safetensors"), []byte("fake voice "+string(rune('7'+i))), 0o644)
	}
	sp := &fakeSpeaker{frames: 1}
	loads := 0
	s, err := New(Config{Voices: VoiceConfig{Dir: dir}, OnDemand: []*OnDemandModel{{Name: "od-tts", Kind: KindSpeechSynthesis, Bytes: 1 << 20, KeepAlive: -1,
		Load: func(context.Context) (*Loaded, error) {
			loads++
			return &Loaded{TTS: &TTSModel{Synth: sp}, Close: func() {}}, nil
		}}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.SetReady(true)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	t.Cleanup(func() { s.CloseModels(context.Background()) })
	if code, b := deleteReq(t, srv.URL+"/v1/audio/voices/"+gone+"?model=od-tts"); code != 200 || loads != 0 {
		t.Errorf("deleting a kept voice of a model not loaded: %d %s, %d loads", code, b, loads)
	}
	if got := dirFiles(t, folder); !slices.Equal(got, []string{kept + ".safetensors"}) {
		t.Errorf("the folder holds %v", got)
	}
	code, b := authPost(t, srv.URL+"/v1/audio/speech", "", `{"model":"od-tts","input":"Hi.","voice":"`+kept+`"}`)
	if code != 200 || sp.last.Seed != 7 || loads != 1 {
		t.Errorf("speaking with a kept voice of a model on demand: %d %.100s, seed %d (want the file's 7), %d loads", code, b, sp.last.Seed, loads)
	}
}

// onDemandVoiceServer serves sp as the on-demand model "od-tts", kept loaded once loaded, with
// its voices kept under dir; load, when set, fails a load by its error.
func onDemandVoiceServer(t *testing.T, sp Speaker, dir string, load func() error) *httptest.Server {
	t.Helper()
	s, err := New(Config{Voices: VoiceConfig{Dir: dir}, OnDemand: []*OnDemandModel{{Name: "od-tts", Kind: KindSpeechSynthesis, Bytes: 1 << 20, KeepAlive: -1,
		Load: func(context.Context) (*Loaded, error) {
			if load != nil {
				if err := load(); err != nil {
					return nil, err
				}
			}
			return &Loaded{TTS: &TTSModel{Synth: sp}, Close: func() {}}, nil
		}}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.SetReady(true)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	t.Cleanup(func() { s.CloseModels(context.Background()) })
	return srv
}

// TestVoiceDeleteOwnOnDemand: deleting a predefined voice of a model served on demand, once it
// is loaded, is a 400 as for a model served from the start.
func TestVoiceDeleteOwnOnDemand(t *testing.T) {
	srv := onDemandVoiceServer(t, &fakeSpeaker{frames: 1}, t.TempDir(), nil)
	if code, b := authPost(t, srv.URL+"/v1/audio/speech", "", `{"model":"od-tts","input":"Hi.","voice":"alba"}`); code != 200 {
		t.Fatalf("speech: %d %.200s", code, b)
	}
	for _, path := range []string{"alba", "alba?model=od-tts"} {
		if code, b := deleteReq(t, srv.URL+"/v1/audio/voices/"+path); code != 400 || !strings.Contains(string(b), "voice_not_deletable") {
			t.Errorf("delete %s: %d %s", path, code, b)
		}
	}
	if code, b := deleteReq(t, srv.URL+"/v1/audio/voices/nobody"); code != 404 || !strings.Contains(string(b), "voice_not_found") {
		t.Errorf("delete an unknown voice: %d %s", code, b)
	}
}

// TestVoiceDirLoadRetry: when the voice folder of a model served on demand cannot be made, its
// load fails; once it can, the next load reads the voices kept there.
func TestVoiceDirLoadRetry(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "voices")
	if err := os.WriteFile(dir, []byte("a file, not a folder"), 0o644); err != nil {
		t.Fatal(err)
	}
	sp := &fakeSpeaker{frames: 1}
	srv := onDemandVoiceServer(t, sp, dir, nil)
	id := "voice_00000000000000000000000c"
	req := `{"model":"od-tts","input":"Hi.","voice":"` + id + `"}`
	if code, b := authPost(t, srv.URL+"/v1/audio/speech", "", req); code != 500 || !strings.Contains(string(b), "model_load_failed") {
		t.Fatalf("speech with no voice folder to be had: %d %.200s", code, b)
	}
	os.Remove(dir)
	os.MkdirAll(filepath.Join(dir, "od-tts"), 0o755)
	os.WriteFile(filepath.Join(dir, "od-tts", id+".safetensors"), []byte("fake voice 9"), 0o644)
	if code, b := authPost(t, srv.URL+"/v1/audio/speech", "", req); code != 200 || sp.last.Seed != 9 {
		t.Errorf("speech with a kept voice after a failed load: %d %.200s, seed %d (want the file's 9)", code, b, sp.last.Seed)
	}
}

// TestVoiceDeleteFailureKeeps: a DELETE whose files cannot be removed is a 500 that leaves the
// voice served, and its files in place.
func TestVoiceDeleteFailureKeeps(t *testing.T) {
	dir := t.TempDir()
	folder := filepath.Join(dir, "pocket-tts")
	srv := newVoiceServer(t, &fakeSpeaker{frames: 1}, Config{Voices: VoiceConfig{Dir: dir}})
	code, b := uploadForm(t, srv.URL+"/v1/audio/voices", "", "file", promptWAV(t, 2, 220))
	var v storedVoice
	if err := json.Unmarshal(b, &v); code != 200 || err != nil {
		t.Fatalf("upload: %d %s", code, b)
	}
	// a folder that is not empty in the state file's place cannot be removed, even by root
	state := filepath.Join(folder, v.ID+".safetensors")
	os.Remove(state)
	os.MkdirAll(filepath.Join(state, "x"), 0o755)
	if code, b := deleteReq(t, srv.URL+"/v1/audio/voices/"+v.ID); code != 500 {
		t.Errorf("delete whose file cannot be removed: %d %s", code, b)
	}
	if code, b := authPost(t, srv.URL+"/v1/audio/speech", "", `{"input":"Hi.","voice":"`+v.ID+`"}`); code != 200 {
		t.Errorf("speech with a voice whose delete failed: %d %.200s", code, b)
	}
	if got := dirFiles(t, folder); !slices.Equal(got, []string{v.ID + ".json", v.ID + ".safetensors"}) {
		t.Errorf("after a failed delete the folder holds %v", got)
	}
}

// TestVoiceDirCreatedAtOrder: the voices read at start are ordered by created_at however far
// apart the values, so that the limit keeps the newest.
func TestVoiceDirCreatedAtOrder(t *testing.T) {
	dir := t.TempDir()
	folder := filepath.Join(dir, "pocket-tts")
	os.MkdirAll(folder, 0o755)
	older, newer := "voice_00000000000000000000000a", "voice_00000000000000000000000b"
	for i, c := range []struct {
		id      string
		created int64
	}{{older, -1}, {newer, math.MaxInt64}} {
		os.WriteFile(filepath.Join(folder, c.id+".safetensors"), []byte(fmt.Sprintf("fake voice %d", i+1)), 0o644)
		os.WriteFile(filepath.Join(folder, c.id+".json"), []byte(fmt.Sprintf(`{"name":"v","created_at":%d}`, c.created)), 0o644)
	}
	srv := newVoiceServer(t, &fakeSpeaker{frames: 1}, Config{Voices: VoiceConfig{Dir: dir, MaxVoices: 1}})
	code, b := authGet(t, srv.URL+"/v1/audio/voices", "")
	var l voiceList
	if err := json.Unmarshal(b, &l); code != 200 || err != nil || len(l.Data) != 3 || l.Data[2].ID != newer {
		t.Errorf("a limit of one voice at start: %d %s (want %s kept)", code, b, newer)
	}
	if got := dirFiles(t, folder); !slices.Equal(got, []string{newer + ".json", newer + ".safetensors"}) {
		t.Errorf("the folder holds %v", got)
	}
}

// TestVoiceDirConcurrent: uploads and deletes of the same voices at once, with a limit that
// evicts, leave the folder holding the files of the voices served, and only those.
func TestVoiceDirConcurrent(t *testing.T) {
	dir := t.TempDir()
	folder := filepath.Join(dir, "pocket-tts")
	srv := newVoiceServer(t, &fakeSpeaker{frames: 1}, Config{Voices: VoiceConfig{Dir: dir, MaxVoices: 2}})
	prompts := [][]byte{promptWAV(t, 1, 220), promptWAV(t, 1, 330), promptWAV(t, 1, 440)}
	ids := make([]string, len(prompts))
	for i, p := range prompts {
		code, b := uploadForm(t, srv.URL+"/v1/audio/voices", "", "file", p)
		var v storedVoice
		if err := json.Unmarshal(b, &v); code != 200 || err != nil {
			t.Fatalf("upload: %d %s", code, b)
		}
		ids[i] = v.ID
	}
	for round := 0; round < 10; round++ {
		var wg sync.WaitGroup
		for g := 0; g < 6; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 6; i++ {
					k := (g + i + round) % len(prompts)
					if (g+i)%2 == 0 {
						if code, b := uploadForm(t, srv.URL+"/v1/audio/voices", "", "file", prompts[k]); code != 200 {
							t.Errorf("upload: %d %s", code, b)
						}
					} else if code, b := deleteReq(t, srv.URL+"/v1/audio/voices/"+ids[k]); code != 200 && code != 404 {
						t.Errorf("delete: %d %s", code, b)
					}
				}
			}()
		}
		wg.Wait()
		code, b := authGet(t, srv.URL+"/v1/audio/voices", "")
		var l voiceList
		if err := json.Unmarshal(b, &l); code != 200 || err != nil {
			t.Fatalf("list: %d %s", code, b)
		}
		var want []string
		for _, d := range l.Data {
			if d.Type == "uploaded" {
				want = append(want, d.ID+".json", d.ID+".safetensors")
			}
		}
		slices.Sort(want)
		if got := dirFiles(t, folder); !slices.Equal(got, want) {
			t.Fatalf("round %d: the folder holds %v, the voices served are %v", round, got, want)
		}
	}
}
