package server

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// personSchema is a nested schema with every kind of value, enums, optional and required
// properties and bounded arrays and strings.
const personSchema = `{"type":"object","properties":{
	"name":{"type":"string","maxLength":10},
	"age":{"type":"integer"},
	"ok":{"type":"boolean"},
	"kind":{"enum":["cat","dog",null]},
	"tags":{"type":"array","items":{"type":"string","maxLength":5},"minItems":1,"maxItems":3},
	"home":{"type":"object","properties":{"x":{"type":"number"},"y":{"anyOf":[{"type":"integer"},{"type":"string","maxLength":4}]}},"required":["x"],"additionalProperties":false},
	"note":{"type":"string","maxLength":6}},
	"required":["name","age","ok","kind","tags","home"],"additionalProperties":false}`

// checkPerson validates text against personSchema by hand.
func checkPerson(text string) error {
	var v map[string]json.RawMessage
	if err := json.Unmarshal([]byte(text), &v); err != nil {
		return fmt.Errorf("not a JSON object: %v", err)
	}
	for k := range v {
		if !slices.Contains([]string{"name", "age", "ok", "kind", "tags", "home", "note"}, k) {
			return fmt.Errorf("property %q not in the schema", k)
		}
	}
	var p struct {
		Name *string
		Age  *json.Number
		OK   *bool
		Kind *string
		Tags []string
		Home *struct {
			X *float64
			Y any
		}
		Note *string
	}
	d := json.NewDecoder(strings.NewReader(text))
	d.UseNumber()
	if err := d.Decode(&p); err != nil {
		return err
	}
	switch {
	case p.Name == nil || len([]rune(*p.Name)) > 10:
		return fmt.Errorf("name %v", p.Name)
	case p.Age == nil || strings.ContainsAny(p.Age.String(), ".eE"):
		return fmt.Errorf("age %v is not an integer", p.Age)
	case p.OK == nil:
		return fmt.Errorf("ok missing")
	case string(v["kind"]) != "null" && (p.Kind == nil || (*p.Kind != "cat" && *p.Kind != "dog")):
		return fmt.Errorf("kind %s", v["kind"])
	case len(p.Tags) < 1 || len(p.Tags) > 3:
		return fmt.Errorf("%d tags", len(p.Tags))
	case p.Home == nil || p.Home.X == nil:
		return fmt.Errorf("home %s", v["home"])
	case p.Note != nil && len([]rune(*p.Note)) > 6:
		return fmt.Errorf("note %q", *p.Note)
	}
	for _, t := range p.Tags {
		if len([]rune(t)) > 5 {
			return fmt.Errorf("tag %q", t)
		}
	}
	switch y := p.Home.Y.(type) {
	case nil:
		if strings.Contains(string(v["home"]), `"y"`) {
			return fmt.Errorf("home.y null")
		}
	case string:
		if len([]rune(y)) > 4 {
			return fmt.Errorf("home.y %q", y)
		}
	case float64:
		if y != float64(int64(y)) {
			return fmt.Errorf("home.y %v", y)
		}
	}
	return nil
}

// outputs collects each choice's text and finish reason from a response or a stream of chat
// (content) or completions (text), checking that every logprobs entry, when asked for, is there.
func outputs(t *testing.T, b []byte, stream, chat bool) (texts, finish []string) {
	t.Helper()
	for _, c := range responseChunks(t, b, stream) {
		var r struct {
			Choices []struct {
				Index        int
				Text         string
				FinishReason *string `json:"finish_reason"`
				Message      *struct{ Content *string }
				Delta        *struct{ Content *string }
			}
		}
		if err := json.Unmarshal([]byte(c), &r); err != nil {
			t.Fatalf("%v: %s", err, c)
		}
		for _, ch := range r.Choices {
			for len(texts) <= ch.Index {
				texts, finish = append(texts, ""), append(finish, "")
			}
			switch {
			case !chat:
				texts[ch.Index] += ch.Text
			case ch.Message != nil && ch.Message.Content != nil:
				texts[ch.Index] += *ch.Message.Content
			case ch.Delta != nil && ch.Delta.Content != nil:
				texts[ch.Index] += *ch.Delta.Content
			}
			if ch.FinishReason != nil {
				finish[ch.Index] = *ch.FinishReason
			}
		}
	}
	return texts, finish
}

// TestConstrainedChat: response_format json_schema and json_object on the stories model, whose
// output is otherwise random text: every choice, sampled or greedy, streamed or not, with
// log-probabilities or not, parses and validates.
func TestConstrainedChat(t *testing.T) {
	h := newHarness(t, Config{})
	msgs := []map[string]any{{"role": "user", "content": "Tell me about a cat."}}
	for _, stream := range []bool{false, true} {
		for _, temp := range []float64{0, 1.3} {
			name := fmt.Sprintf("stream=%v temp=%v", stream, temp)
			req := map[string]any{"model": "stories-chat", "messages": msgs, "max_tokens": 200, "temperature": temp, "seed": 7,
				"n": 3, "stream": stream, "logprobs": true, "top_logprobs": 2,
				"response_format": map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "person", "strict": true, "schema": json.RawMessage(personSchema)}}}
			resp, b := h.post(t, "/v1/chat/completions", req)
			if resp.StatusCode != 200 {
				t.Fatalf("%s: status %d: %s", name, resp.StatusCode, b)
			}
			texts, finish := outputs(t, b, stream, true)
			if len(texts) != 3 {
				t.Fatalf("%s: %d choices", name, len(texts))
			}
			for i, text := range texts {
				if err := checkPerson(text); err != nil {
					t.Errorf("%s choice %d (%s): %q: %v", name, i, finish[i], text, err)
				}
			}
			req["response_format"] = map[string]any{"type": "json_object"}
			req["max_tokens"] = 60
			resp, b = h.post(t, "/v1/chat/completions", req)
			if resp.StatusCode != 200 {
				t.Fatalf("%s: json_object: status %d: %s", name, resp.StatusCode, b)
			}
			texts, finish = outputs(t, b, stream, true)
			for i, text := range texts {
				var v map[string]any
				if err := json.Unmarshal([]byte(text), &v); err != nil {
					t.Errorf("%s json_object choice %d (%s): %q: %v", name, i, finish[i], text, err)
				}
			}
		}
	}
}

// TestConstrainedCompletions: llama.cpp's grammar and json_schema fields on completions, with a
// budget so short that only the steering to a complete text keeps the output in the language.
func TestConstrainedCompletions(t *testing.T) {
	h := newHarness(t, Config{})
	re := regexp.MustCompile(`^(yes|no), [0-9]{1,3} (cats?|dogs?)\.$`)
	for _, stream := range []bool{false, true} {
		for _, max := range []int{12, 40} {
			req := map[string]any{"model": "stories", "prompt": "Once upon a time", "max_tokens": max, "temperature": 1.5, "seed": 3, "n": 4, "stream": stream,
				"grammar": `root ::= ("yes" | "no") ", " [0-9]{1,3} " " ("cat" | "dog") "s"? "."`}
			resp, b := h.post(t, "/v1/completions", req)
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			texts, finish := outputs(t, b, stream, false)
			for i, text := range texts {
				if !re.MatchString(text) {
					t.Errorf("stream=%v max %d choice %d (%s): %q is not in the grammar's language", stream, max, i, finish[i], text)
				}
			}
		}
		req := map[string]any{"model": "stories", "prompt": "Once upon a time", "max_tokens": 200, "temperature": 1, "seed": 5, "n": 2, "stream": stream,
			"logprobs": 3, "json_schema": json.RawMessage(personSchema)}
		resp, b := h.post(t, "/v1/completions", req)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		texts, finish := outputs(t, b, stream, false)
		for i, text := range texts {
			if err := checkPerson(text); err != nil {
				t.Errorf("stream=%v json_schema choice %d (%s): %q: %v", stream, i, finish[i], text, err)
			}
		}
	}
}

// TestConstraintErrors: a grammar or schema that cannot be used is a 400 naming its field,
// before anything is generated.
func TestConstraintErrors(t *testing.T) {
	h := newHarness(t, Config{})
	const comp = `{"model":"stories","prompt":"Once","max_tokens":4,`
	const chat = `{"model":"stories-chat","messages":[{"role":"user","content":"hi"}],"max_tokens":4,`
	cases := []struct {
		body, param, code string
	}{
		{comp + `"grammar":"root ::= (\"a\""}`, "grammar", "invalid_grammar"},
		{comp + `"grammar":"start ::= \"a\""}`, "grammar", "invalid_grammar"},
		{comp + `"json_schema":{"type":"string","pattern":"(a|b)*\\1"}}`, "json_schema", "invalid_json_schema"},
		{comp + `"json_schema":{"$ref":"#/nope"}}`, "json_schema", "invalid_json_schema"},
		{comp + `"json_schema":5}`, "json_schema", ""},
		{comp + `"grammar":"root ::= \"a\"","json_schema":{}}`, "json_schema", ""},
		{chat + `"response_format":{"type":"json_schema","json_schema":{"schema":{}}}}`, "response_format.json_schema.name", ""},
		{chat + `"response_format":{"type":"json_schema"}}`, "response_format.json_schema", ""},
		{chat + `"response_format":{"type":"yaml"}}`, "response_format.type", ""},
		{chat + `"response_format":{}}`, "response_format.type", ""},
		{chat + `"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"integer","minimum":"x"}}}}`, "response_format.json_schema.schema", "invalid_json_schema"},
		{chat + `"response_format":{"type":"json_object"},"grammar":"root ::= \"a\""}`, "response_format", ""},
	}
	for _, c := range cases {
		path := "/v1/completions"
		if strings.HasPrefix(c.body, chat) {
			path = "/v1/chat/completions"
		}
		h.expectError(t, path, c.body, c.param, c.code)
	}
}
