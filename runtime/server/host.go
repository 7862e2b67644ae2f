package server

import (
	"net"
	"net/http"
	"strings"
)

// hostAllowed reports whether a request addressed to host (its Host header, with or without a
// port) may be served. With Config.CheckHost unset, any may. Otherwise the host must be a
// loopback name (localhost or a name under .localhost, which browsers resolve to loopback
// themselves, an address in 127.0.0.0/8, or ::1) or one of Config.AllowedHosts: a page whose
// own name has been made to resolve to 127.0.0.1 (DNS rebinding) still sends that name, and is
// refused. A request without a Host (HTTP/1.0) is no browser's, and passes.
func (s *Server) hostAllowed(host string) bool {
	if !s.cfg.CheckHost || host == "" {
		return true
	}
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.TrimSuffix(strings.ToLower(strings.Trim(name, "[]")), ".")
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	if ip := net.ParseIP(name); ip != nil && ip.IsLoopback() {
		return true
	}
	for _, a := range s.cfg.AllowedHosts {
		a = strings.TrimSuffix(strings.ToLower(a), ".")
		switch {
		case a == "*", a == name:
			return true
		case strings.HasPrefix(a, ".") && (name == a[1:] || strings.HasSuffix(name, a)):
			return true
		}
	}
	return false
}

// misdirected is the answer to a request addressed to a host the server does not accept.
func misdirected(host string) *apiError {
	return &apiError{Status: http.StatusMisdirectedRequest, Message: "Host not allowed: " + quoteHeader(host) + " is not a name of this server (--allowed-hosts adds names).", Type: typeInvalidRequest, Code: strptr("host_not_allowed")}
}
