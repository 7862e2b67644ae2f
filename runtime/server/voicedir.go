package server

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// VoiceStorer is a VoiceCloner whose voices can be kept in files: with VoiceConfig.Dir, the
// voices uploaded to a model are written there and read back when the model is loaded.
type VoiceStorer interface {
	// WriteVoice writes v, a voice this Speaker made or read, as a voice-state safetensors file.
	WriteVoice(w io.Writer, v ClonedVoice) error
	// ReadVoice reads a voice-state safetensors file that WriteVoice wrote.
	ReadVoice(path string) (ClonedVoice, error)
}

// voiceDirName is the folder of a model's voices under VoiceConfig.Dir: its name, escaped as a
// path segment.
func voiceDirName(model string) string {
	n := url.PathEscape(model)
	if n == "." || n == ".." {
		n = strings.ReplaceAll(n, ".", "%2E")
	}
	return n
}

// isVoiceID reports whether id is what voiceID makes: "voice_" and 24 lower-case hex digits.
func isVoiceID(id string) bool {
	h, ok := strings.CutPrefix(id, "voice_")
	if !ok || len(h) != 24 {
		return false
	}
	for _, c := range h {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// load reads the voices kept in the store's folder, once (creating the folder): each ID.safetensors
// with its ID.json (name, creation time, duration; without one, the id names it and the file's
// time dates it), oldest first, as if uploaded in that order, so that the limits drop the oldest
// (and their files) when there are more than they allow. A file that cannot be read is logged
// and left alone. A folder that cannot be made or read is an error, and is tried again at the
// next call.
func (vs *voiceStore) load(st VoiceStorer, model string, log *slog.Logger) error {
	vs.files.Lock()
	defer vs.files.Unlock()
	if vs.dir == "" || vs.loaded {
		return nil
	}
	if err := os.MkdirAll(vs.dir, 0o755); err != nil {
		return fmt.Errorf("voices: %w", err)
	}
	entries, err := os.ReadDir(vs.dir)
	if err != nil {
		return fmt.Errorf("voices: %w", err)
	}
	vs.loaded = true
	var found []*storedVoice
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".tmp-") { // a write that did not finish
			os.Remove(filepath.Join(vs.dir, name))
			continue
		}
		id, ok := strings.CutSuffix(name, ".safetensors")
		if !ok || !isVoiceID(id) || !e.Type().IsRegular() {
			continue
		}
		path := filepath.Join(vs.dir, name)
		cv, err := st.ReadVoice(path)
		if err != nil {
			log.Warn("a stored voice cannot be read; it is not served", "model", model, "path", path, "err", err)
			continue
		}
		v := &storedVoice{ID: id, Object: "audio.voice", Name: id, Model: model, Type: "uploaded", voice: cv}
		if b, err := os.ReadFile(filepath.Join(vs.dir, id+".json")); err == nil {
			var meta storedVoice
			if json.Unmarshal(b, &meta) == nil {
				if meta.Name != "" && len(meta.Name) <= maxVoiceName {
					v.Name = meta.Name
				}
				v.CreatedAt, v.Duration = meta.CreatedAt, meta.Duration
			}
		} else if fi, err := e.Info(); err == nil {
			v.CreatedAt = fi.ModTime().Unix()
		}
		found = append(found, v)
	}
	slices.SortFunc(found, func(a, b *storedVoice) int {
		return cmp.Or(cmp.Compare(a.CreatedAt, b.CreatedAt), strings.Compare(a.ID, b.ID))
	})
	for _, v := range found {
		_, evicted := vs.put(v)
		for _, o := range evicted {
			log.Info("a stored voice is over the voice limits; dropped", "model", model, "voice", o.ID)
			vs.removeFiles(o.ID)
		}
	}
	if len(found) > 0 {
		log.Info("stored voices loaded", "model", model, "voices", len(vs.list()), "dir", vs.dir)
	}
	return nil
}

// save writes v into the store's folder (nothing without one): the voice state as ID.safetensors
// and its description as ID.json, each written to a temporary file and renamed into place.
func (vs *voiceStore) save(st VoiceStorer, v *storedVoice) error {
	if vs.dir == "" {
		return nil
	}
	var b bytes.Buffer
	if err := st.WriteVoice(&b, v.voice); err != nil {
		return err
	}
	meta, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(vs.dir, 0o755); err != nil {
		return err
	}
	if err := writeFileAtomic(vs.dir, v.ID+".safetensors", b.Bytes()); err != nil {
		return err
	}
	return writeFileAtomic(vs.dir, v.ID+".json", meta)
}

// removeFiles deletes the files of voice id from the store's folder: the voice state, then (once
// it is gone: a description without one is no voice) the description. Missing ones are no error.
func (vs *voiceStore) removeFiles(id string) error {
	if vs.dir == "" {
		return nil
	}
	for _, ext := range []string{".safetensors", ".json"} {
		if err := os.Remove(filepath.Join(vs.dir, id+ext)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	return nil
}

// delete drops the uploaded voice id, in memory and its files; false if there is neither. The
// files go first: a voice whose state file cannot be removed is kept, and the error returned.
func (vs *voiceStore) delete(id string) (bool, error) {
	vs.files.Lock()
	defer vs.files.Unlock()
	vs.mu.Lock()
	had := vs.byID[id] != nil
	vs.mu.Unlock()
	if !had && !(isVoiceID(id) && vs.hasFile(id)) {
		return false, nil
	}
	err := vs.removeFiles(id)
	if err != nil && vs.hasFile(id) {
		return true, err
	}
	vs.remove(id)
	return true, err
}

// hasFile reports whether the store's folder holds voice id.
func (vs *voiceStore) hasFile(id string) bool {
	if vs.dir == "" {
		return false
	}
	_, err := os.Stat(filepath.Join(vs.dir, id+".safetensors"))
	return err == nil
}

// writeFileAtomic writes data to dir/name through a temporary file in dir, synced and renamed
// over it, so that the name holds the old content or the new, never a part.
func writeFileAtomic(dir, name string, data []byte) (err error) {
	f, err := os.CreateTemp(dir, ".tmp-"+name+"-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if _, err = f.Write(data); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(f.Name(), filepath.Join(dir, name)); err != nil {
		return err
	}
	if d, err := os.Open(dir); err == nil { // the rename itself, durable
		d.Sync()
		d.Close()
	}
	return nil
}

// deleteVoice answers DELETE /v1/audio/voices/{id}[?model=M]: the uploaded voice id is dropped
// from the model named (every model without one), with its files.
func (s *Server) deleteVoice(w http.ResponseWriter, r *http.Request) {
	ri := info(r.Context())
	id := r.PathValue("id")
	names := make([]string, 0, len(s.voices))
	for n := range s.voices {
		names = append(names, n)
	}
	if name := r.URL.Query().Get("model"); name != "" {
		if s.voices[name] == nil {
			if s.kindOf(name) != "" {
				writeError(w, invalidCode("model", "model_not_supported", fmt.Sprintf("The model '%s' is not a text-to-speech model.", name)))
				return
			}
			writeError(w, &apiError{Status: http.StatusNotFound, Message: fmt.Sprintf("The model '%s' does not exist.", name), Type: typeInvalidRequest, Param: strptr("model"), Code: strptr("model_not_found")})
			return
		}
		names = []string{name}
	}
	deleted := false
	for _, n := range names {
		vs := s.voices[n]
		if ok, err := vs.delete(id); err != nil {
			ri.log.Error("a deleted voice's files could not be removed", "model", n, "voice", id, "err", err)
			writeError(w, internalError())
			return
		} else if ok {
			deleted = true
			ri.log.Info("voice deleted", "model", n, "voice", id)
		}
	}
	if !deleted {
		for _, m := range append(slices.Clip(s.cfg.TTSModels), s.reg.loadedTTS()...) {
			if slices.Contains(m.Synth.Voices(), id) {
				writeError(w, invalidCode("voice", "voice_not_deletable", fmt.Sprintf("The voice '%s' is one of the model '%s''s own; only uploaded voices can be deleted.", id, m.Name)))
				return
			}
		}
		writeError(w, &apiError{Status: http.StatusNotFound, Message: fmt.Sprintf("No uploaded voice has the id '%s'.", id), Type: typeInvalidRequest, Param: strptr("voice"), Code: strptr("voice_not_found")})
		return
	}
	writeJSON(w, struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Deleted bool   `json:"deleted"`
	}{id, "audio.voice.deleted", true})
}
