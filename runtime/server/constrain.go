package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/parleyhq/parley/runtime/decode/grammar"
)

// constraint is the language a request's output must belong to: a GBNF grammar, or the JSON
// texts a JSON Schema accepts (any JSON object for response_format json_object).
type constraint struct {
	param  string // the request field it came from, for errors
	gbnf   string // when not empty
	schema []byte // otherwise: the schema, compacted
}

// key is the constraint's key in the model's grammar cache.
func (c *constraint) key() string {
	if c.gbnf != "" {
		return "gbnf\x00" + c.gbnf
	}
	return "schema\x00" + string(c.schema)
}

// anyObject is the schema of response_format json_object.
var anyObject = []byte(`{"type":"object"}`)

// parseConstraint reads the fields that constrain the output: llama.cpp's grammar (GBNF text)
// and json_schema (a schema), and on chat OpenAI's response_format (rf; nil on completions).
// At most one may ask for a constraint. nil when none does.
func parseConstraint(c *commonRequest, rf json.RawMessage) (*constraint, *apiError) {
	var found []*constraint
	if c.Grammar != nil && *c.Grammar != "" {
		found = append(found, &constraint{param: "grammar", gbnf: *c.Grammar})
	}
	if !isNull(c.JSONSchema) {
		s, e := compactSchema("json_schema", c.JSONSchema)
		if e != nil {
			return nil, e
		}
		found = append(found, &constraint{param: "json_schema", schema: s})
	}
	if !isNull(rf) {
		k, e := parseResponseFormat(rf)
		if e != nil {
			return nil, e
		}
		if k != nil {
			found = append(found, k)
		}
	}
	switch len(found) {
	case 0:
		return nil, nil
	case 1:
		return found[0], nil
	}
	return nil, invalid(found[1].param, fmt.Sprintf("Invalid '%s': only one of 'response_format', 'json_schema' and 'grammar' may constrain the output, but '%s' is given too.", found[1].param, found[0].param))
}

// compactSchema checks that raw is a JSON object (or true, any value) and compacts it.
func compactSchema(param string, raw json.RawMessage) ([]byte, *apiError) {
	t := bytes.TrimSpace(raw)
	if string(t) == "true" {
		return []byte("{}"), nil
	}
	if len(t) == 0 || t[0] != '{' {
		return nil, invalid(param, fmt.Sprintf("Invalid type for '%s': expected a JSON Schema object.", param))
	}
	var b bytes.Buffer
	if err := json.Compact(&b, t); err != nil {
		return nil, invalid(param, fmt.Sprintf("Invalid '%s': %v.", param, err))
	}
	return b.Bytes(), nil
}

// parseResponseFormat reads chat's response_format: text (no constraint), json_object (any
// object, or llama.cpp's schema member when given) or json_schema ({name, schema, strict}).
func parseResponseFormat(raw json.RawMessage) (*constraint, *apiError) {
	var rf struct {
		Type       *string         `json:"type"`
		Schema     json.RawMessage `json:"schema"` // llama.cpp: json_object with a schema
		JSONSchema *struct {
			Name   *string         `json:"name"`
			Schema json.RawMessage `json:"schema"`
			Strict *bool           `json:"strict"`
		} `json:"json_schema"`
	}
	if err := json.Unmarshal(raw, &rf); err != nil {
		return nil, invalid("response_format", "Invalid type for 'response_format': expected an object with a string 'type'.")
	}
	if rf.Type == nil {
		return nil, invalid("response_format.type", "Missing required parameter: 'response_format.type'.")
	}
	switch *rf.Type {
	case "text":
		return nil, nil
	case "json_object":
		if isNull(rf.Schema) {
			return &constraint{param: "response_format", schema: anyObject}, nil
		}
		s, e := compactSchema("response_format.schema", rf.Schema)
		if e != nil {
			return nil, e
		}
		return &constraint{param: "response_format.schema", schema: s}, nil
	case "json_schema":
		js := rf.JSONSchema
		if js == nil {
			return nil, invalid("response_format.json_schema", "Missing required parameter: 'response_format.json_schema'.")
		}
		if js.Name == nil || *js.Name == "" {
			return nil, invalid("response_format.json_schema.name", "Missing required parameter: 'response_format.json_schema.name'.")
		}
		if isNull(js.Schema) {
			return &constraint{param: "response_format.json_schema.schema", schema: []byte("{}")}, nil
		}
		s, e := compactSchema("response_format.json_schema.schema", js.Schema)
		if e != nil {
			return nil, e
		}
		return &constraint{param: "response_format.json_schema.schema", schema: s}, nil
	}
	return nil, invalid("response_format.type", fmt.Sprintf("Invalid 'response_format.type': expected one of text, json_object, json_schema, but got %q.", *rf.Type))
}

// compile turns c into an automaton over m's vocabulary, from the model's cache when the same
// grammar was seen before. A grammar or schema that does not compile, or whose first token the
// vocabulary cannot spell, is a 400 before anything is generated.
func (s *Server) compile(m *served, c *constraint) (*grammar.Automaton, *apiError) {
	if c == nil {
		return nil, nil
	}
	cache, err := m.Sched.Grammars()
	if err != nil {
		return nil, invalidCode(c.param, "grammar_unsupported", fmt.Sprintf("The model '%s' cannot constrain its output: %s.", m.Name, strings.TrimPrefix(err.Error(), "grammar: ")))
	}
	a, err := cache.Get(c.key(), func() (*grammar.Grammar, error) {
		if c.gbnf != "" {
			return grammar.ParseGBNF(c.gbnf)
		}
		return grammar.FromJSONSchema(c.schema)
	})
	if err != nil {
		return nil, grammarError(c, err)
	}
	if _, err := a.NewMatcher().Mask(); err != nil {
		return nil, grammarError(c, err)
	}
	return a, nil
}

// grammarError is the 400 for a constraint that does not compile or reaches no token.
func grammarError(c *constraint, err error) *apiError {
	msg := strings.TrimPrefix(err.Error(), "grammar: ")
	var se *grammar.SchemaError
	var ge *grammar.SyntaxError
	switch {
	case errors.As(err, &se):
		return invalidCode(c.param, "invalid_json_schema", fmt.Sprintf("Invalid '%s': the schema cannot be compiled: %s.", c.param, msg))
	case errors.As(err, &ge):
		return invalidCode(c.param, "invalid_grammar", fmt.Sprintf("Invalid '%s': the grammar does not parse: %s.", c.param, msg))
	case errors.Is(err, grammar.ErrDeadEnd):
		return invalidCode(c.param, "invalid_grammar", fmt.Sprintf("Invalid '%s': no token of this model can begin its output (%s).", c.param, msg))
	}
	return invalidCode(c.param, "invalid_grammar", fmt.Sprintf("Invalid '%s': it cannot be used: %s.", c.param, msg))
}
