package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// preflight sets the CORS headers of a request from an Origin and answers it when it is a
// preflight or comes from an origin that Config.AllowedOrigins does not list, reporting whether
// it did. Such a request is refused with 403 whatever its method and content type: a page may
// send a "simple" cross-site request (a form, or text/plain, without a preflight) and a
// WebSocket handshake, and neither may make the server work for it. Requests without an Origin
// (curl, SDKs, servers) pass.
func (s *Server) preflight(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return false
	}
	allowed := s.originAllowed(origin)
	h := w.Header()
	h.Add("Vary", "Origin") // the answer differs between origins, allowed or not
	isPreflight := r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != ""
	if isPreflight {
		h.Add("Vary", "Access-Control-Request-Method, Access-Control-Request-Headers")
	}
	if !allowed {
		writeError(w, &apiError{Status: http.StatusForbidden, Message: "Origin not allowed: the server's --cors does not list " + quoteHeader(origin) + ".", Type: typeInvalidRequest, Code: strptr("origin_not_allowed")})
		return true
	}
	h.Set("Access-Control-Allow-Origin", origin)
	h.Set("Access-Control-Expose-Headers", "X-Request-Id, Retry-After")
	if !isPreflight {
		return false
	}
	h.Set("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
	h.Set("Access-Control-Allow-Headers", allowHeaders(r.Header.Values("Access-Control-Request-Headers")))
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
	return true
}

func (s *Server) originAllowed(origin string) bool {
	for _, o := range s.cfg.AllowedOrigins {
		if o == "*" || o == origin {
			return true
		}
	}
	return false
}

// baseHeaders are allowed to an allowed origin whatever its preflight asks for.
var baseHeaders = []string{"Authorization", "Content-Type", "X-Request-Id"}

// maxAllowHeaders bounds the header names a preflight answer repeats.
const maxAllowHeaders = 64

// allowHeaders answers a preflight's Access-Control-Request-Headers for an allowed origin: every
// header it names (clients such as OpenAI's send their own X-Stainless-* headers), since the API
// key, not a list of headers, guards the API. Entries that are not header names are ignored.
func allowHeaders(requested []string) string {
	names := slices.Clone(baseHeaders)
	seen := map[string]bool{}
	for _, n := range names {
		seen[strings.ToLower(n)] = true
	}
	for _, v := range requested {
		for n := range strings.SplitSeq(v, ",") {
			n = strings.TrimSpace(n)
			if len(names) == len(baseHeaders)+maxAllowHeaders {
				break
			}
			if n == "" || seen[strings.ToLower(n)] || strings.ContainsFunc(n, func(c rune) bool { return !isTokenChar(c) }) {
				continue
			}
			seen[strings.ToLower(n)] = true
			names = append(names, n)
		}
	}
	return strings.Join(names, ", ")
}

// isTokenChar reports whether c may appear in an HTTP token, such as a header name (RFC 9110
// section 5.6.2).
func isTokenChar(c rune) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || strings.ContainsRune("!#$%&'*+-.^_`|~", c)
}

// quoteHeader is a header value for a message: quoted, and cut to 200 bytes.
func quoteHeader(v string) string {
	if len(v) > 200 {
		v = v[:200] + "..."
	}
	return strconv.Quote(v)
}

// keyProtocol begins the WebSocket subprotocol that carries an API key, as OpenAI's browser
// clients send it: a browser cannot set the Authorization header of a WebSocket.
const keyProtocol = "openai-insecure-api-key."

// checkKey answers a request without the API key (401, "missing" or "incorrect"), reporting
// whether it did. The key is "Authorization: Bearer <key>" (the scheme case-insensitive, RFC
// 9110 section 11.1) or, on a WebSocket handshake, a Sec-WebSocket-Protocol entry
// openai-insecure-api-key.<key>.
//
// GET /v1/realtime also takes a key minted by POST /v1/realtime/client_secrets or
// /v1/realtime/transcription_sessions, until it expires.
func (s *Server) checkKey(w http.ResponseWriter, r *http.Request) bool {
	keys := requestKeys(r)
	for _, k := range keys {
		h := sha256.Sum256([]byte(k))
		if k != "" && subtle.ConstantTimeCompare(h[:], s.keyHash) == 1 {
			return false
		}
	}
	if _, ok := s.requestSecret(r); ok {
		return false
	}
	w.Header().Set("WWW-Authenticate", `Bearer realm="parley"`)
	msg := "Incorrect API key provided."
	if len(keys) == 0 {
		msg = "Missing API key: send it as 'Authorization: Bearer <key>' (a browser's WebSocket: as the subprotocol '" + keyProtocol + "<key>')."
	}
	writeError(w, &apiError{Status: http.StatusUnauthorized, Message: msg, Type: typeInvalidRequest, Code: strptr("invalid_api_key")})
	return true
}

// requestKeys are the keys r carries: its bearer token ("" for an Authorization header of
// another scheme) and, on a WebSocket handshake, its openai-insecure-api-key.<key> subprotocols.
func requestKeys(r *http.Request) []string {
	var keys []string
	if a := strings.TrimSpace(r.Header.Get("Authorization")); a != "" {
		scheme, key, ok := strings.Cut(a, " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			key = strings.TrimSpace(key)
		} else {
			key = "" // present but not a bearer token: incorrect
		}
		keys = append(keys, key)
	}
	if isWebSocket(r) {
		for _, p := range subprotocols(r) {
			if k, ok := strings.CutPrefix(p, keyProtocol); ok {
				keys = append(keys, k)
			}
		}
	}
	return keys
}

// isWebSocket reports whether r asks to upgrade to a WebSocket.
func isWebSocket(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket")
}

// subprotocols are the entries of r's Sec-WebSocket-Protocol headers.
func subprotocols(r *http.Request) []string {
	var out []string
	for _, v := range r.Header.Values("Sec-WebSocket-Protocol") {
		for p := range strings.SplitSeq(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// acceptProtocols is the order of preference of the subprotocols a WebSocket handshake offers:
// a browser fails the connection unless the answer names one of those it offered, so one is
// chosen, an API key's entry only when nothing else is offered.
func acceptProtocols(r *http.Request) []string {
	var plain, keys []string
	for _, p := range subprotocols(r) {
		if strings.HasPrefix(p, keyProtocol) {
			keys = append(keys, p)
		} else {
			plain = append(plain, p)
		}
	}
	return append(plain, keys...)
}
