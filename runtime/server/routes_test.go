package server

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestRoutes: every path of the list answers another method 405 with Allow (its methods) and OpenAI's
// error shape, GET routes answer HEAD, a model name may hold slashes, a path that is not clean is
// answered 404 like any unknown one (not redirected), and each answer is counted under its
// endpoint's label.
func TestRoutes(t *testing.T) {
	h := newHarness(t, Config{})
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path string) (*http.Response, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, h.srv.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := noRedirect.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, b
	}
	methods := map[string][]string{}
	for _, ep := range endpoints {
		methods[ep.path] = append(methods[ep.path], ep.method)
	}
	for _, ep := range endpoints {
		path := strings.ReplaceAll(ep.path, "{model...}", "stories")
		other := http.MethodPost
		if ep.method == http.MethodPost {
			other = http.MethodGet
		}
		allow := strings.Join(methods[ep.path], ", ")
		if len(methods[ep.path]) > 1 {
			other = http.MethodDelete
		}
		resp, b := do(other, path)
		var eb errorBody
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != allow || json.Unmarshal(b, &eb) != nil || eb.Error == nil ||
			!strings.Contains(eb.Error.Message, "use "+strings.Join(methods[ep.path], " or ")) {
			t.Errorf("%s %s: %d, Allow %q: %s", other, path, resp.StatusCode, resp.Header.Get("Allow"), b)
		}
	}
	if resp, b := do("HEAD", "/health"); resp.StatusCode != 200 || len(b) != 0 {
		t.Errorf("HEAD /health: %d %q", resp.StatusCode, b)
	}
	if resp, b := do("GET", "/v1/models/stories-chat"); resp.StatusCode != 200 || !strings.Contains(string(b), `"id":"stories-chat"`) {
		t.Errorf("GET /v1/models/stories-chat: %d %s", resp.StatusCode, b)
	}
	if resp, b := do("GET", "/v1/models/org/stories"); resp.StatusCode != 404 || !strings.Contains(string(b), "model_not_found") || !strings.Contains(string(b), "org/stories") {
		t.Errorf("GET /v1/models/org/stories: %d %s", resp.StatusCode, b)
	}
	if resp, b := do("GET", "/v1/models/"); resp.StatusCode != 400 || !strings.Contains(string(b), "'model'") {
		t.Errorf("GET /v1/models/ with two models: %d %s", resp.StatusCode, b)
	}
	for _, p := range []string{"/v1//models", "/v1/models/../models", "/v1/./models", "/nothing"} {
		if resp, b := do("GET", p); resp.StatusCode != 404 || !strings.Contains(string(b), "unknown_url") || !strings.Contains(string(b), p) {
			t.Errorf("GET %s: %d %s", p, resp.StatusCode, b)
		}
	}
	_, b := do("GET", "/metrics")
	for _, want := range []string{
		`parley_http_requests_total{code="405",endpoint="/v1/models/{model}"} 1`,
		`parley_http_requests_total{code="404",endpoint="/v1/models/{model}"} 1`,
		`parley_http_requests_total{code="405",endpoint="/v1/completions"} 1`,
		`parley_http_requests_total{code="200",endpoint="/health"} 1`,
		`parley_http_requests_total{code="404",endpoint="other"} 4`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}
