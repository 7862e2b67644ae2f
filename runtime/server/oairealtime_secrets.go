package server

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Ephemeral keys for OpenAI Realtime clients that must not hold the API key (a browser's):
// POST /v1/realtime/client_secrets (GA) and POST /v1/realtime/transcription_sessions (beta) mint
// a key that opens GET /v1/realtime, and nothing else, until it expires. The session settings
// given with it are checked when it is minted and are the ones the session starts with; the
// session's own updates may change them later. The model they name is loaded (on demand) then,
// so the session that follows finds it ready.

const (
	secretPrefix = "ek_"
	// maxSecrets is how many unexpired keys the server holds; minting more is refused (429)
	// until some expire.
	maxSecrets    = 4096
	minSecretTTL  = 10 * time.Second
	maxSecretTTL  = 2 * time.Hour
	gaSecretTTL   = 10 * time.Minute // OpenAI's default for client secrets
	betaSecretTTL = time.Minute      // and for a beta transcription session's
	// maxSecretBody bounds a minting request's body (a session's settings are a few hundred
	// bytes, a prompt included).
	maxSecretBody = 64 << 10
)

// rtSecret is what a minted key opens: a session in its dialect with its settings.
type rtSecret struct {
	session json.RawMessage // the settings as checked, as a GA session description; nil for the defaults
	beta    bool
	expires time.Time
}

// rtSecrets are the unexpired keys, by the SHA-256 of the key (the keys themselves are not
// kept).
type rtSecrets struct {
	mu sync.Mutex
	m  map[[32]byte]rtSecret
}

// add stores sec under a new key and returns the key, or "" when maxSecrets are held.
func (ss *rtSecrets) add(sec rtSecret, now time.Time) string {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.m == nil {
		ss.m = make(map[[32]byte]rtSecret)
	}
	if len(ss.m) >= maxSecrets {
		for h, s := range ss.m {
			if !now.Before(s.expires) {
				delete(ss.m, h)
			}
		}
		if len(ss.m) >= maxSecrets {
			return ""
		}
	}
	var b [24]byte
	rand.Read(b[:])
	key := secretPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	ss.m[sha256.Sum256([]byte(key))] = sec
	return key
}

// lookup is the secret of key, if it is an unexpired minted key.
func (ss *rtSecrets) lookup(key string, now time.Time) (rtSecret, bool) {
	if !strings.HasPrefix(key, secretPrefix) {
		return rtSecret{}, false
	}
	h := sha256.Sum256([]byte(key))
	ss.mu.Lock()
	defer ss.mu.Unlock()
	sec, ok := ss.m[h]
	if ok && !now.Before(sec.expires) {
		delete(ss.m, h)
		return rtSecret{}, false
	}
	return sec, ok
}

// requestSecret is the minted key r carries (as a bearer token or a WebSocket key subprotocol)
// on GET /v1/realtime, if any.
func (s *Server) requestSecret(r *http.Request) (rtSecret, bool) {
	if r.URL.Path != "/v1/realtime" {
		return rtSecret{}, false
	}
	now := time.Now()
	for _, k := range requestKeys(r) {
		if sec, ok := s.secrets.lookup(k, now); ok {
			return sec, true
		}
	}
	return rtSecret{}, false
}

// rtExpiresAfter is a client secret's lifetime: seconds after its creation.
type rtExpiresAfter struct {
	Anchor  string `json:"anchor"`
	Seconds *int   `json:"seconds"`
}

// ttl reads a requested lifetime (param names it in errors), def when none is asked.
func (x *rtExpiresAfter) ttl(param string, def time.Duration) (time.Duration, *apiError) {
	if x == nil {
		return def, nil
	}
	if x.Anchor != "" && x.Anchor != "created_at" {
		return 0, invalidCode(param+".anchor", "invalid_value", fmt.Sprintf("Invalid value: '%s'. Supported values are: 'created_at'.", x.Anchor))
	}
	if x.Seconds == nil {
		return def, nil
	}
	if sec := *x.Seconds; sec < int(minSecretTTL/time.Second) || sec > int(maxSecretTTL/time.Second) {
		return 0, invalidCode(param+".seconds", "invalid_value", fmt.Sprintf("Invalid 'seconds': %d. Expected a value between %d and %d.", sec, int(minSecretTTL.Seconds()), int(maxSecretTTL.Seconds())))
	}
	return time.Duration(*x.Seconds) * time.Second, nil
}

// readSecretBody reads a minting request's body, refusing one over maxSecretBody (413).
func readSecretBody(r *http.Request) ([]byte, *apiError) {
	if r.ContentLength > maxSecretBody {
		return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Message: fmt.Sprintf("The request body is larger than %d bytes.", maxSecretBody), Type: typeInvalidRequest, Code: strptr("request_too_large")}
	}
	r.Body = http.MaxBytesReader(nil, r.Body, maxSecretBody)
	return readBody(r)
}

// rtClientSecret is a minted key as the beta API describes it.
type rtClientSecret struct {
	Value     string `json:"value"`
	ExpiresAt int64  `json:"expires_at"`
}

// clientSecrets mints a key for a GA transcription session:
// {"expires_after": {"anchor": "created_at", "seconds": N}, "session": {"type": "transcription", ...}}.
func (s *Server) clientSecrets(w http.ResponseWriter, r *http.Request) {
	body, e := readSecretBody(r)
	if e != nil {
		writeError(w, e)
		return
	}
	var req struct {
		ExpiresAfter *rtExpiresAfter `json:"expires_after"`
		Session      json.RawMessage `json:"session"`
	}
	if strings.TrimSpace(string(body)) != "" {
		if e := decodeBody(body, &req); e != nil {
			writeError(w, e)
			return
		}
	}
	ttl, e := req.ExpiresAfter.ttl("expires_after", gaSecretTTL)
	if e != nil {
		writeError(w, e)
		return
	}
	if isNull(req.Session) {
		req.Session = nil
	}
	s.mintSecret(w, r, req.Session, false, ttl)
}

// transcriptionSessions mints a key for a beta transcription session: the body is the session
// (input_audio_format, input_audio_transcription, turn_detection, ...), with the key's lifetime
// in client_secret.expires_at.
func (s *Server) transcriptionSessions(w http.ResponseWriter, r *http.Request) {
	body, e := readSecretBody(r)
	if e != nil {
		writeError(w, e)
		return
	}
	if strings.TrimSpace(string(body)) == "" {
		body = []byte("{}")
	}
	var req struct {
		ClientSecret *struct {
			ExpiresAt *rtExpiresAfter `json:"expires_at"`
		} `json:"client_secret"`
	}
	if e := decodeBody(body, &req); e != nil {
		writeError(w, e)
		return
	}
	ttl := betaSecretTTL
	if req.ClientSecret != nil {
		if ttl, e = req.ClientSecret.ExpiresAt.ttl("client_secret.expires_at", betaSecretTTL); e != nil {
			writeError(w, e)
			return
		}
	}
	s.mintSecret(w, r, body, true, ttl)
}

// mintSecret checks session as a session update of a new session would, stores a key for it
// and answers with the key and the session it opens.
func (s *Server) mintSecret(w http.ResponseWriter, r *http.Request, session json.RawMessage, beta bool, ttl time.Duration) {
	p := &realtimeProtocol{lv: s.newLive(r, nil), id: "sess_" + newID(), beta: beta, set: rtSettings{vad: true, rate: openAIRate}}
	if len(s.speech) == 1 && len(s.reg.list) == 0 {
		p.set.m = s.speech[0]
	}
	set := p.set
	if session != nil {
		var bad *badSetting
		if set, bad = p.update(p.set, session); bad != nil {
			writeError(w, bad.httpError())
			return
		}
	}
	// What is kept is the settings as checked, described in the GA shape a session update
	// takes in either dialect: nothing of the request beyond them.
	var kept json.RawMessage
	if session != nil {
		ga := *p
		ga.beta = false
		b, err := json.Marshal(ga.sessionEvent("", set).Session)
		if err != nil {
			writeError(w, internalError())
			return
		}
		kept = b
	}
	now := time.Now()
	expires := now.Add(ttl)
	key := s.secrets.add(rtSecret{session: kept, beta: beta, expires: expires}, now)
	if key == "" {
		writeError(w, &apiError{Status: http.StatusTooManyRequests, Message: fmt.Sprintf("Too many unexpired realtime client secrets (%d): retry when some have expired.", maxSecrets), Type: typeInvalidRequest, Code: strptr("rate_limit_exceeded"), RetryAfter: 10})
		return
	}
	desc := p.sessionEvent("", set).Session
	if beta {
		writeJSON(w, struct {
			rtBetaSessionOut
			ClientSecret rtClientSecret `json:"client_secret"`
		}{desc.(rtBetaSessionOut), rtClientSecret{Value: key, ExpiresAt: expires.Unix()}})
		return
	}
	writeJSON(w, struct {
		Value     string `json:"value"`
		ExpiresAt int64  `json:"expires_at"`
		Session   any    `json:"session"`
	}{key, expires.Unix(), desc})
}
