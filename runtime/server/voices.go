package server

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"mime/multipart"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/parleyhq/parley/runtime/audio"
	"github.com/parleyhq/parley/runtime/sched/tts"
)

// VoiceConfig bounds the voices uploaded to POST /v1/audio/voices.
type VoiceConfig struct {
	// MaxVoices bounds the uploaded voices kept per model; one more evicts the voice used least
	// recently. 0 means 32.
	MaxVoices int
	// MaxDuration bounds a voice prompt; a longer one is answered 400. 0 means 30 s.
	MaxDuration time.Duration
	// MinDuration is the shortest voice prompt taken; 0 means 1 s.
	MinDuration time.Duration
	// MaxBytes bounds the memory of the uploaded voices of a model (ClonedVoice.Bytes: about
	// 0.6 MB a second of prompt with Pocket TTS); beyond it the voices used least recently are
	// dropped, all but the newest. 0 means 256 MiB.
	MaxBytes int64
	// Dir, when set, keeps the uploaded voices of a model whose Speaker is a VoiceStorer in
	// files, in a folder per model (its name, escaped): ID.safetensors (the voice state, in
	// upstream's layout) and ID.json (its name, creation time and duration), each written
	// atomically. They are read back when the model is loaded (at New for the models served
	// from the start), within the limits above; a voice dropped or deleted loses its files.
	Dir string
}

func (c *VoiceConfig) setDefaults() error {
	if c.MaxVoices < 0 || c.MaxDuration < 0 || c.MinDuration < 0 || c.MaxBytes < 0 {
		return errors.New("server: negative voice limit")
	}
	if c.MaxVoices == 0 {
		c.MaxVoices = 32
	}
	if c.MaxDuration == 0 {
		c.MaxDuration = 30 * time.Second
	}
	if c.MinDuration == 0 {
		c.MinDuration = time.Second
	}
	if c.MaxBytes == 0 {
		c.MaxBytes = 256 << 20
	}
	if c.MinDuration > c.MaxDuration {
		return fmt.Errorf("server: shortest voice prompt %v over the longest %v", c.MinDuration, c.MaxDuration)
	}
	return nil
}

// voiceRef is the voice of a request: a Speaker's own (name) or an uploaded one.
type voiceRef struct {
	name     string
	uploaded ClonedVoice
}

func (v voiceRef) apply(r *tts.Request) {
	if v.uploaded != nil {
		v.uploaded.Apply(r)
		return
	}
	r.VoiceName = v.name
}

// findVoice resolves a voice of m by name: one of its Speaker's, or an uploaded one's id.
func (s *Server) findVoice(m *TTSModel, name string) (voiceRef, *apiError) {
	known := m.Synth.Voices()
	if slices.Contains(known, name) {
		return voiceRef{name: name}, nil
	}
	if v := s.voices[m.Name].get(name); v != nil {
		return voiceRef{name: name, uploaded: v.voice}, nil
	}
	have := "none of its own"
	if len(known) > 0 {
		have = strings.Join(known, ", ")
	}
	msg := fmt.Sprintf("The model '%s' has no voice '%s'; it has: %s", m.Name, name, have)
	if _, ok := m.Synth.(VoiceCloner); ok {
		msg += ", and the voices uploaded to /v1/audio/voices (GET lists them; the least recently used are dropped beyond the server's limit)"
	}
	return voiceRef{}, invalidCode("voice", "voice_not_found", msg+".")
}

// storedVoice is an uploaded voice.
type storedVoice struct {
	ID        string  `json:"id"`
	Object    string  `json:"object"` // "audio.voice"
	Name      string  `json:"name"`
	Model     string  `json:"model"`
	Type      string  `json:"type"` // "uploaded"
	CreatedAt int64   `json:"created_at"`
	Duration  float64 `json:"duration"` // seconds of the prompt

	voice ClonedVoice
	used  uint64 // the store's clock at its last use
}

// voiceStore is the uploaded voices of one model, at most max of them and maxBytes of memory,
// the least recently used evicted.
type voiceStore struct {
	// files is held, before mu, around each change of the voices that touches their files
	// (reading the folder, an upload's save and add, a delete, an eviction's removal), so that
	// the files match the voices in memory once each is done.
	files    sync.Mutex
	mu       sync.Mutex
	max      int
	maxBytes int64
	bytes    int64
	clock    uint64
	byID     map[string]*storedVoice
	dir      string // where the voices are kept in files; "" for none
	loaded   bool   // dir has been read; guarded by files
}

func newVoiceStore(c VoiceConfig, model string) *voiceStore {
	vs := &voiceStore{max: c.MaxVoices, maxBytes: c.MaxBytes, byID: map[string]*storedVoice{}}
	if c.Dir != "" {
		vs.dir = filepath.Join(c.Dir, voiceDirName(model))
	}
	return vs
}

// get returns the voice of id, marking it used; nil if there is none.
func (vs *voiceStore) get(id string) *storedVoice {
	if vs == nil {
		return nil
	}
	vs.mu.Lock()
	defer vs.mu.Unlock()
	v := vs.byID[id]
	if v != nil {
		vs.clock++
		v.used = vs.clock
	}
	return v
}

// put adds v, evicting the least recently used voices beyond max (returned); an id already
// there is kept (and returned) instead.
func (vs *voiceStore) put(v *storedVoice) (kept *storedVoice, evicted []*storedVoice) {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	vs.clock++
	if old := vs.byID[v.ID]; old != nil {
		old.used = vs.clock
		return old, nil
	}
	v.used = vs.clock
	vs.byID[v.ID] = v
	vs.bytes += int64(v.voice.Bytes())
	for len(vs.byID) > 1 && (len(vs.byID) > vs.max || vs.bytes > vs.maxBytes) {
		var lru *storedVoice
		for _, o := range vs.byID {
			if o != v && (lru == nil || o.used < lru.used) {
				lru = o
			}
		}
		delete(vs.byID, lru.ID)
		vs.bytes -= int64(lru.voice.Bytes())
		evicted = append(evicted, lru)
	}
	return v, evicted
}

// remove drops the voice of id; false if there is none.
func (vs *voiceStore) remove(id string) bool {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	v := vs.byID[id]
	if v == nil {
		return false
	}
	delete(vs.byID, id)
	vs.bytes -= int64(v.voice.Bytes())
	return true
}

// list returns the voices, oldest upload first.
func (vs *voiceStore) list() []storedVoice {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	out := make([]storedVoice, 0, len(vs.byID))
	for _, v := range vs.byID {
		out = append(out, *v)
	}
	slices.SortFunc(out, func(a, b storedVoice) int {
		return cmp.Or(cmp.Compare(a.CreatedAt, b.CreatedAt), strings.Compare(a.ID, b.ID))
	})
	return out
}

// maxVoiceName bounds an uploaded voice's name, in bytes.
const maxVoiceName = 256

// uploadVoice answers POST /v1/audio/voices: a multipart form with the voice prompt as "file"
// (or "audio_sample", OpenAI's name), and optionally "name" and "model". The prompt is decoded
// at its own rate, resampled once to the model's and cloned into a voice, whose id (voice_ and a hash of the
// samples) the speech endpoints take as "voice". The same samples again get the same voice,
// not cloned again.
func (s *Server) uploadVoice(w http.ResponseWriter, r *http.Request) {
	ri := info(r.Context())
	ct := r.Header.Get("Content-Type")
	mt, mp, err := mime.ParseMediaType(ct)
	if err != nil || mt != "multipart/form-data" || mp["boundary"] == "" {
		writeError(w, &apiError{Status: http.StatusUnsupportedMediaType, Message: fmt.Sprintf("Content-Type must be multipart/form-data with a boundary, not %q.", ct), Type: typeInvalidRequest, Code: strptr("unsupported_media_type")})
		return
	}
	var file []byte
	var fileType, name, model string
	haveFile := false
	mr := multipart.NewReader(r.Body, mp["boundary"])
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil {
			writeError(w, bodyError(err))
			return
		}
		field := part.FormName()
		if field == "file" || field == "audio_sample" {
			if haveFile {
				writeError(w, invalid("file", "More than one file was sent."))
				return
			}
			haveFile = true
			if file, err = io.ReadAll(part); err != nil {
				writeError(w, bodyError(err))
				return
			}
			fileType = part.Header.Get("Content-Type")
			continue
		}
		b, err := io.ReadAll(io.LimitReader(part, maxFieldBytes+1))
		if err != nil {
			writeError(w, bodyError(err))
			return
		}
		switch field {
		case "name":
			name = strings.TrimSpace(string(b))
			if len(name) > maxVoiceName {
				writeError(w, invalid("name", fmt.Sprintf("The name is longer than %d bytes.", maxVoiceName)))
				return
			}
		case "model":
			model = strings.TrimSpace(string(b))
		}
	}
	switch {
	case !haveFile:
		writeError(w, invalid("file", "Missing required parameter: 'file' (the voice prompt, an audio file)."))
		return
	case len(file) == 0:
		writeError(w, invalidCode("file", "empty_file", "The audio file is empty."))
		return
	}
	m, e := s.ttsModel(r, model, nil)
	if e != nil {
		writeError(w, e)
		return
	}
	cloner, ok := m.Synth.(VoiceCloner)
	if !ok {
		writeError(w, invalidCode("model", "model_not_supported", fmt.Sprintf("The model '%s' cannot clone voices.", m.Name)))
		return
	}
	vc := s.cfg.Voices
	rate := m.Synth.SampleRate()
	// Decoded at the prompt's own rate and resampled once, straight to the model's: a prompt
	// at the model's rate reaches the encoder as it is.
	prompt, _, err := audio.DecodeWith(file, audio.Options{MaxDuration: vc.MaxDuration, ContentType: fileType, SampleRate: rate})
	if err != nil {
		writeError(w, voiceDecodeError(err, vc.MaxDuration))
		return
	}
	dur := float64(len(prompt)) / float64(rate)
	if dur < vc.MinDuration.Seconds() {
		writeError(w, invalidCode("file", "audio_too_short", fmt.Sprintf("The voice prompt is %.2f s long; the shortest taken is %v.", dur, vc.MinDuration)))
		return
	}
	id := voiceID(prompt)
	store := s.voices[m.Name]
	if v := store.get(id); v != nil {
		writeJSON(w, v)
		return
	}
	t0 := time.Now()
	cv, err := cloner.CloneVoice(prompt)
	if err != nil {
		ri.log.Error("voice cloning failed", "model", m.Name, "err", err)
		writeError(w, invalidCode("file", "voice_clone_failed", "A voice could not be made from this prompt."))
		return
	}
	if name == "" {
		name = id
	}
	v := &storedVoice{ID: id, Object: "audio.voice", Name: name, Model: m.Name, Type: "uploaded",
		CreatedAt: time.Now().Unix(), Duration: math.Round(dur*1000) / 1000, voice: cv}
	store.files.Lock()
	if old := store.get(id); old != nil { // the same prompt, uploaded meanwhile
		store.files.Unlock()
		writeJSON(w, old)
		return
	}
	if st, ok := m.Synth.(VoiceStorer); ok {
		if err := store.save(st, v); err != nil {
			store.removeFiles(id)
			store.files.Unlock()
			ri.log.Error("an uploaded voice could not be saved", "model", m.Name, "voice", id, "dir", store.dir, "err", err)
			writeError(w, internalError())
			return
		}
	}
	v, evicted := store.put(v)
	for _, o := range evicted {
		if err := store.removeFiles(o.ID); err != nil {
			ri.log.Error("a dropped voice's files could not be removed", "model", m.Name, "voice", o.ID, "err", err)
		}
	}
	store.files.Unlock()
	ri.log.Info("voice uploaded", "model", m.Name, "voice", id, "seconds", dur, "bytes", cv.Bytes(), "took", time.Since(t0).Round(time.Millisecond))
	writeJSON(w, v)
}

// voiceID names a prompt by its samples: "voice_" and 96 bits of their SHA-256.
func voiceID(prompt []float32) string {
	h := sha256.New()
	var b [4]byte
	for _, v := range prompt {
		binary.LittleEndian.PutUint32(b[:], math.Float32bits(v))
		h.Write(b[:])
	}
	return "voice_" + hex.EncodeToString(h.Sum(nil)[:12])
}

// voiceDecodeError is the answer to a voice prompt that cannot be read: 400 in each case.
func voiceDecodeError(err error, maxDur time.Duration) *apiError {
	switch {
	case errors.Is(err, audio.ErrUnsupported):
		return invalidCode("file", "unsupported_format", "The voice prompt is not audio in a supported format (wav, flac, mp3, ogg/vorbis, ogg/opus).")
	case errors.Is(err, audio.ErrTooLong):
		return invalidCode("file", "audio_too_long", fmt.Sprintf("The voice prompt is longer than the %v this server takes.", maxDur))
	}
	return invalidCode("file", "invalid_audio", "The voice prompt could not be decoded: it is corrupt or truncated.")
}

// voiceJSON is a voice as GET /v1/audio/voices lists it.
type voiceJSON struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Name   string `json:"name"`
	Model  string `json:"model"`
	Type   string `json:"type"` // "predefined"
}

// listVoices answers GET /v1/audio/voices[?model=M]: every model's predefined voices, then its
// uploaded ones.
func (s *Server) listVoices(w http.ResponseWriter, r *http.Request) {
	models := s.cfg.TTSModels
	if name := r.URL.Query().Get("model"); name != "" {
		m, e := s.ttsModel(r, name, nil)
		if e != nil {
			writeError(w, e)
			return
		}
		models = []*TTSModel{m}
	}
	data := []any{}
	for _, m := range models {
		for _, v := range m.Synth.Voices() {
			data = append(data, voiceJSON{ID: v, Object: "audio.voice", Name: v, Model: m.Name, Type: "predefined"})
		}
		for _, v := range s.voices[m.Name].list() {
			data = append(data, v)
		}
	}
	writeJSON(w, struct {
		Object string `json:"object"`
		Data   []any  `json:"data"`
	}{"list", data})
}
