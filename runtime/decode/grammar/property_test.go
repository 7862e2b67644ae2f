package grammar

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// obj is a JSON object with keys in order, for writing schemas.
type obj []kv

type kv struct {
	k string
	v any
}

func (o obj) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, p := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(p.k)
		v, err := json.Marshal(p.v)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// schemaGen draws random schemas from the supported subset.
type schemaGen struct {
	r       *rand.Rand
	useNode bool // a $ref to the recursive #/$defs/node was drawn
}

var (
	propNames = []string{"id", "name", "a", "ab", "value", "x y", "quo\"te", "back\\slash", "ünï", "日本", "tags", "n"}
	patterns  = []string{`^[a-z]{2,5}$`, `^\d{3}-\d{4}$`, `^(foo|bar)+$`, `^[A-F0-9]{4}$`, `^a.c$`, `[xyz]?q\.`, `^"[^"]{0,3}"$`, `^(?:ab|c){1,3}\\$`}
	enumVals  = []any{"red", "green", "blue", 1, 2.5, -3, true, false, nil, "with \"quote\"", "ü", obj{{"k", 1}}, []any{1, "x"}}
)

func (g *schemaGen) pick(xs []string) string { return xs[g.r.IntN(len(xs))] }

func (g *schemaGen) schema(depth int) any {
	r := g.r
	n := 14
	if depth >= 3 {
		n = 8 // leaves only
	}
	switch r.IntN(n) {
	case 0:
		s := obj{{"type", "string"}}
		switch r.IntN(5) {
		case 0:
			s = append(s, kv{"minLength", r.IntN(3)})
			s = append(s, kv{"maxLength", 3 + r.IntN(6)})
		case 1:
			s = append(s, kv{"format", g.pick([]string{"date", "time", "date-time", "uuid"})})
		case 2:
			s = append(s, kv{"pattern", g.pick(patterns)})
		case 3:
			s = append(s, kv{"minLength", 1 + r.IntN(2)})
		}
		return s
	case 1:
		return obj{{"type", "integer"}}
	case 2:
		return obj{{"type", "number"}}
	case 3:
		return obj{{"type", g.pick([]string{"boolean", "null"})}}
	case 4:
		k := 1 + r.IntN(4)
		vals := make([]any, k)
		for i := range vals {
			vals[i] = enumVals[r.IntN(len(enumVals))]
		}
		return obj{{"enum", vals}}
	case 5:
		return obj{{"const", enumVals[r.IntN(len(enumVals))]}}
	case 6:
		return obj{{"type", []any{"string", "null"}}, {"maxLength", 4}}
	case 7:
		if r.IntN(3) == 0 {
			return obj{}
		}
		return obj{{"description", "a number"}, {"type", "number"}}
	case 8, 9:
		return g.object(depth)
	case 10, 11:
		s := obj{{"type", "array"}}
		if r.IntN(3) == 0 {
			s = append(s, kv{"prefixItems", []any{g.schema(depth + 1), g.schema(depth + 1)}})
			if r.IntN(2) == 0 {
				s = append(s, kv{"items", false})
			}
		} else {
			s = append(s, kv{"items", g.schema(depth + 1)})
		}
		if r.IntN(2) == 0 {
			s = append(s, kv{"minItems", r.IntN(2)})
		}
		if r.IntN(2) == 0 {
			s = append(s, kv{"maxItems", 2 + r.IntN(2)})
		}
		return s
	case 12:
		if r.IntN(2) == 0 {
			// oneOf over disjoint types.
			return obj{{"oneOf", []any{obj{{"type", "string"}, {"maxLength", 5}}, obj{{"type", "integer"}}, obj{{"type", "null"}}}}}
		}
		return obj{{"anyOf", []any{g.schema(depth + 1), g.schema(depth + 1)}}}
	default:
		if r.IntN(2) == 0 {
			g.useNode = true
			return obj{{"$ref", "#/$defs/node"}}
		}
		return obj{{"allOf", []any{
			obj{{"type", "object"}, {"properties", obj{{"p", obj{{"type", "integer"}}}}}, {"required", []any{"p"}}},
			obj{{"properties", obj{{"q", g.schema(depth + 1)}}}},
		}}}
	}
}

func (g *schemaGen) object(depth int) obj {
	r := g.r
	k := 1 + r.IntN(4)
	used := map[string]bool{}
	var props obj
	var req []any
	for len(props) < k {
		name := g.pick(propNames)
		if used[name] {
			continue
		}
		used[name] = true
		props = append(props, kv{name, g.schema(depth + 1)})
		if r.IntN(2) == 0 {
			req = append(req, name)
		}
	}
	s := obj{{"type", "object"}, {"properties", props}}
	if len(req) > 0 {
		s = append(s, kv{"required", req})
	}
	switch r.IntN(4) {
	case 0:
		s = append(s, kv{"additionalProperties", false})
	case 1:
		s = append(s, kv{"additionalProperties", true})
	case 2:
		s = append(s, kv{"additionalProperties", obj{{"type", "integer"}}})
	}
	return s
}

// randomSchema returns a random schema document as JSON.
func randomSchema(r *rand.Rand) []byte {
	g := &schemaGen{r: r}
	root := g.schema(0)
	if g.useNode {
		ro, ok := root.(obj)
		if !ok {
			ro = obj{{"allOf", []any{root}}}
		}
		node := obj{{"type", "object"}, {"properties", obj{
			{"v", obj{{"type", "integer"}}},
			{"kids", obj{{"type", "array"}, {"items", obj{{"$ref", "#/$defs/node"}}}, {"maxItems", 2}}},
		}}, {"required", []any{"v"}}}
		root = append(ro, kv{"$defs", obj{{"node", node}}})
	}
	b, err := json.Marshal(root)
	if err != nil {
		panic(err)
	}
	return b
}

// validator compiles schema with an independent JSON Schema implementation (formats asserted).
func validator(t *testing.T, schema []byte) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("schema.json")
	if err != nil {
		t.Fatalf("validator rejects %s: %v", schema, err)
	}
	return s
}

// checkOutput asserts that text is JSON valid against schema and that a fresh matcher accepts it
// as a complete sentence.
func checkOutput(t *testing.T, a *Automaton, val *jsonschema.Schema, schema, text []byte) {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(text))
	if err != nil {
		t.Fatalf("schema %s: output %q is not JSON: %v", schema, text, err)
	}
	if !json.Valid(text) {
		t.Fatalf("schema %s: output %q is not JSON for encoding/json", schema, text)
	}
	if err := val.Validate(inst); err != nil {
		t.Fatalf("schema %s:\noutput %s\ninvalid: %v", schema, text, err)
	}
	m := a.NewMatcher()
	if err := m.AcceptBytes(text); err != nil || !m.Complete() {
		t.Fatalf("schema %s: output %q not a complete sentence of the grammar (err %v)", schema, text, err)
	}
}

// TestRandomSchemas compiles a few hundred random schemas and, over a real vocabulary, lets a
// random walk through each grammar's masks produce text; every text that ends must be JSON valid
// against its schema (checked by an independent validator).
func TestRandomSchemas(t *testing.T) {
	vocabs := []*Vocab{sharedVocab(t, vocabLlama)}
	schemas, runs := 300, 2
	if testing.Short() || raceEnabled {
		schemas = 40
	} else {
		vocabs = append(vocabs, sharedVocab(t, vocabDeepseek))
	}
	r := rand.New(rand.NewPCG(7, 11))
	complete, total := 0, 0
	for i := 0; i < schemas; i++ {
		schema := randomSchema(r)
		g, err := FromJSONSchema(schema)
		if err != nil {
			t.Fatalf("schema %s: %v", schema, err)
		}
		val := validator(t, schema)
		v := vocabs[i%len(vocabs)]
		a, err := NewAutomaton(g, v, 0)
		if err != nil {
			t.Fatal(err)
		}
		for run := 0; run < runs; run++ {
			gen := randomGenerate(t, a.NewMatcher(), v, r, 300)
			total++
			if !gen.complete {
				continue
			}
			complete++
			checkOutput(t, a, val, schema, gen.text)
			if i < 3 && run == 0 {
				t.Logf("%s\n-> %s", schema, gen.text)
			}
		}
	}
	t.Logf("%d of %d generations completed and validated", complete, total)
	if complete < total*3/4 {
		t.Fatalf("only %d of %d generations completed within the token cap", complete, total)
	}
}

func TestRandomSchemaGeneratorCoversKeywords(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	var all strings.Builder
	for i := 0; i < 300; i++ {
		all.Write(randomSchema(r))
	}
	for _, k := range []string{"enum", "const", "anyOf", "oneOf", "allOf", "$ref", "prefixItems", "minItems", "maxItems",
		"additionalProperties", "pattern", "format", "minLength", "maxLength", "required", `"type":["string","null"]`} {
		if !strings.Contains(all.String(), fmt.Sprintf("%s", k)) {
			t.Errorf("no random schema uses %s", k)
		}
	}
}
