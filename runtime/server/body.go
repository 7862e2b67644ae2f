package server

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// deadlineBody is a request body that must arrive whole by a deadline, set on the connection's
// reads. Once the body has been read to its end (or failed otherwise) the deadline is lifted, so
// that it does not end the connection under a long response. Past the deadline it stays, and the
// answer closes the connection: net/http would otherwise read what is left of the body before
// answering, waiting on the very client that stalled.
type deadlineBody struct {
	io.ReadCloser
	w      http.ResponseWriter
	rc     *http.ResponseController
	lifted bool
}

func newDeadlineBody(w http.ResponseWriter, body io.ReadCloser, d time.Duration) io.ReadCloser {
	rc := http.NewResponseController(w)
	if rc.SetReadDeadline(time.Now().Add(d)) != nil {
		return body // a writer that cannot (a test's recorder)
	}
	return &deadlineBody{ReadCloser: body, w: w, rc: rc}
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		b.lifted = true // for good: the connection ends with the answer
		b.w.Header().Set("Connection", "close")
	case err != nil:
		b.lift()
	}
	return n, err
}

func (b *deadlineBody) Close() error {
	b.lift()
	return b.ReadCloser.Close()
}

func (b *deadlineBody) lift() {
	if !b.lifted {
		b.lifted = true
		b.rc.SetReadDeadline(time.Time{})
	}
}

// bodyTimedOut is the answer to a body that did not arrive in time.
func bodyTimedOut() *apiError {
	return &apiError{Status: http.StatusRequestTimeout, Message: "The request body did not arrive in time.", Type: typeInvalidRequest, Code: strptr("request_timeout")}
}

// readBody reads a POST body under the size limit.
func readBody(r *http.Request) ([]byte, *apiError) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			return nil, &apiError{Status: http.StatusRequestEntityTooLarge, Message: fmt.Sprintf("The request body is larger than %d bytes.", mb.Limit), Type: typeInvalidRequest, Code: strptr("request_too_large")}
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, bodyTimedOut()
		}
		return nil, invalid("", "The request body could not be read.")
	}
	return b, nil
}
