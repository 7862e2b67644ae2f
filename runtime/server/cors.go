package server

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"slices"
	"strings"
)

// preflight sets the CORS headers of a request from an Origin and answers it when it is a
// preflight, reporting whether it did.
func (s *Server) preflight(w http.ResponseWriter, r *http.Request) bool {
	origin := r.Header.Get("Origin")
	if origin == "" {
		return false
	}
	allowed := s.originAllowed(origin)
	h := w.Header()
	h.Add("Vary", "Origin") // the answer differs between origins, allowed or not
	if allowed {
		h.Set("Access-Control-Allow-Origin", origin)
		h.Set("Access-Control-Expose-Headers", "X-Request-Id, Retry-After")
	}
	if r.Method != http.MethodOptions || r.Header.Get("Access-Control-Request-Method") == "" {
		return false
	}
	h.Add("Vary", "Access-Control-Request-Method, Access-Control-Request-Headers")
	if !allowed {
		writeError(w, &apiError{Status: http.StatusForbidden, Message: "Origin not allowed.", Type: typeInvalidRequest})
		return true
	}
	h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
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

// authorized reports whether r carries "Authorization: Bearer <key>"; the scheme is
// case-insensitive (RFC 9110 section 11.1).
func (s *Server) authorized(r *http.Request) bool {
	scheme, key, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	h := sha256.Sum256([]byte(strings.TrimSpace(key)))
	return subtle.ConstantTimeCompare(h[:], s.keyHash) == 1
}
