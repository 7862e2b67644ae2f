package server

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// Error types, as OpenAI spells them.
const (
	typeInvalidRequest = "invalid_request_error"
	typeAuthentication = "authentication_error"
	typeNotFound       = "not_found_error"
	typeRateLimit      = "rate_limit_error"
	typeServer         = "server_error"
	typeUnavailable    = "service_unavailable"
)

// apiError is an error the client sees: status and the body {"error":{...}}. Message is written
// for the client; nothing internal goes into it.
type apiError struct {
	Status     int     `json:"-"`
	Message    string  `json:"message"`
	Type       string  `json:"type"`
	Param      *string `json:"param"`
	Code       *string `json:"code"`
	RetryAfter int     `json:"-"` // seconds, for 429 and 503
}

func (e *apiError) Error() string { return e.Message }

func strptr(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

// invalid is a 400 invalid_request_error about param (empty when it concerns no one field).
func invalid(param, msg string) *apiError {
	return &apiError{Status: http.StatusBadRequest, Message: msg, Type: typeInvalidRequest, Param: strptr(param)}
}

// invalidCode is invalid with an error code.
func invalidCode(param, code, msg string) *apiError {
	e := invalid(param, msg)
	e.Code = strptr(code)
	return e
}

func internalError() *apiError {
	return &apiError{Status: http.StatusInternalServerError, Message: "The server had an error while processing your request.", Type: typeServer}
}

// writeError writes e as the response.
func writeError(w http.ResponseWriter, e *apiError) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(e.RetryAfter))
	}
	w.WriteHeader(e.Status)
	b, _ := json.Marshal(struct {
		Error *apiError `json:"error"`
	}{e})
	w.Write(append(b, '\n'))
}

// writeJSON writes v with status 200.
func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, internalError())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(b, '\n'))
}
