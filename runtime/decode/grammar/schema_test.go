package grammar

import (
	"errors"
	"strings"
	"testing"
)

var schemaCases = []struct {
	name, schema   string
	accept, reject []string
}{
	{"json_object", `{"type":"object"}`,
		[]string{`{}`, `{"a":[1,{"b":null}],"c":"d"}`, "{ \"a\" : true }\n"},
		[]string{`[]`, `1`, `{"a"}`, `{"a":1,}`}},
	{"any", `{}`, []string{`1`, `"x"`, `[null]`, `{"a":{}}`, `-0.5e-3`}, []string{`01`, `.5`, `+1`, `nul`}},
	{"true schema", `true`, []string{`false`}, []string{`x`}},
	{"properties in order, optional ones optional",
		`{"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},"c":{"type":"boolean"}},"required":["b"]}`,
		[]string{`{"b":"x"}`, `{"a":1,"b":"x"}`, `{"b":"x","c":true}`, `{"a":1,"b":"","c":false}`},
		[]string{`{}`, `{"a":1}`, `{"b":"x","a":1}`, `{"c":true,"b":"x"}`, `{"b":"x","d":1}`, `{"b":"x",}`, `{,"b":"x"}`}},
	{"all optional", `{"type":"object","properties":{"a":{"type":"null"},"b":{"type":"null"}}}`,
		[]string{`{}`, `{"a":null}`, `{"b":null}`, `{"a":null,"b":null}`}, []string{`{,}`, `{"b":null,"a":null}`}},
	{"additionalProperties false", `{"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":false}`,
		[]string{`{}`, `{"a":5}`}, []string{`{"b":5}`, `{"a":5,"b":5}`}},
	{"additionalProperties schema", `{"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":{"type":"string"}}`,
		[]string{`{"a":1,"b":"x"}`, `{"b":"x","c":"y"}`, `{"ab":"x"}`, `{"":"x"}`},
		[]string{`{"b":1}`, `{"a":1,"a":"x"}`, `{"a":"x"}`, `{"b\u0061":"x"}`}},
	{"additionalProperties true", `{"type":"object","properties":{"n":{"type":"integer"}},"additionalProperties":true}`,
		[]string{`{"n":1,"x":[1]}`, `{"x":{"n":"s"}}`}, []string{`{"n":"s"}`, `{"x":1,"n":2}`}},
	{"required not listed", `{"type":"object","required":["id"]}`, []string{`{"id":3}`, `{"id":"x"}`}, []string{`{}`}},
	{"nested", `{"type":"object","properties":{"o":{"type":"object","properties":{"p":{"type":"array","items":{"type":"number"}}},"required":["p"]}},"required":["o"]}`,
		[]string{`{"o":{"p":[]}}`, `{"o":{"p":[1,2.5,-3e2]}}`}, []string{`{"o":{}}`, `{"o":{"p":["x"]}}`}},
	{"enum", `{"enum":["a",1,null,{"k":[true]},"q\"uote"]}`,
		[]string{`"a"`, `1`, `null`, `{"k":[true]}`, `"q\"uote"`}, []string{`"b"`, `2`, `{"k":[false]}`, `{ "k":[true]}`}},
	{"enum filtered by type", `{"type":"string","enum":["a",1]}`, []string{`"a"`}, []string{`1`}},
	{"const", `{"const":{"a":[1,"x"]}}`, []string{`{"a":[1,"x"]}`}, []string{`{"a":[1]}`}},
	{"anyOf", `{"anyOf":[{"type":"integer"},{"type":"string","maxLength":1}]}`, []string{`1`, `"x"`}, []string{`"xy"`, `1.5`}},
	{"oneOf", `{"oneOf":[{"type":"boolean"},{"type":"null"}]}`, []string{`true`, `null`}, []string{`0`}},
	{"type list", `{"type":["string","null"]}`, []string{`"x"`, `null`}, []string{`1`}},
	{"number and integer", `{"type":["integer","number"]}`, []string{`1`, `1.5`}, []string{`"1"`}},
	{"allOf", `{"allOf":[{"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]},{"properties":{"b":{"type":"string"}}}]}`,
		[]string{`{"a":1}`, `{"a":1,"b":"x"}`}, []string{`{"b":"x"}`, `{}`}},
	{"$defs ref", `{"$defs":{"pt":{"type":"object","properties":{"x":{"type":"integer"}},"required":["x"]}},"type":"array","items":{"$ref":"#/$defs/pt"}}`,
		[]string{`[]`, `[{"x":1},{"x":2}]`}, []string{`[{}]`}},
	{"definitions ref", `{"definitions":{"s":{"type":"string"}},"$ref":"#/definitions/s"}`, []string{`"x"`}, []string{`1`}},
	{"recursive ref", `{"$defs":{"t":{"type":"object","properties":{"k":{"type":"array","items":{"$ref":"#/$defs/t"}}},"required":["k"]}},"$ref":"#/$defs/t"}`,
		[]string{`{"k":[]}`, `{"k":[{"k":[{"k":[]}]},{"k":[]}]}`}, []string{`{"k":[{}]}`}},
	{"root ref", `{"type":"array","items":{"anyOf":[{"type":"integer"},{"$ref":"#"}]}}`, []string{`[1,[2,[]]]`}, []string{`[1,["x"]]`}},
	{"items and counts", `{"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3}`,
		[]string{`[1,2]`, `[1,2,3]`}, []string{`[]`, `[1]`, `[1,2,3,4]`}},
	{"minItems only", `{"type":"array","items":{"type":"null"},"minItems":1}`, []string{`[null]`, `[null,null,null]`}, []string{`[]`}},
	{"maxItems 0", `{"type":"array","maxItems":0}`, []string{`[]`}, []string{`[1]`}},
	{"prefixItems", `{"type":"array","prefixItems":[{"type":"integer"},{"type":"string"}],"items":false}`,
		[]string{`[]`, `[1]`, `[1,"x"]`}, []string{`["x"]`, `[1,"x",2]`}},
	{"prefixItems then items", `{"type":"array","prefixItems":[{"type":"integer"}],"items":{"type":"boolean"},"minItems":2}`,
		[]string{`[1,true]`, `[1,true,false]`}, []string{`[1]`, `[true,true]`, `[1,2]`}},
	{"tuple items (draft 7)", `{"type":"array","items":[{"type":"null"},{"type":"boolean"}],"minItems":2}`, []string{`[null,true]`}, []string{`[null]`, `[true,null]`}},
	{"string lengths", `{"type":"string","minLength":2,"maxLength":3}`,
		[]string{`"ab"`, `"abc"`, `"日本"`, `"\n\u0041"`}, []string{`"a"`, `"abcd"`, `"\ud83d\ude00"`}},
	{"string escapes", `{"type":"string"}`, []string{`"a\"b\\c\/\b\f\n\r\t\u00e9"`}, []string{`"\x"`, `"a`, "\"\x01\"", `"\ud800"`}},
	{"date", `{"type":"string","format":"date"}`, []string{`"2024-02-28"`, `"1999-12-31"`}, []string{`"2024-02-30"`, `"2024-13-01"`, `"2024-04-31"`}},
	{"time", `{"type":"string","format":"time"}`, []string{`"23:59:59Z"`, `"01:02:03.456+05:30"`}, []string{`"24:00:00Z"`, `"12:00:00"`}},
	{"date-time", `{"type":"string","format":"date-time"}`, []string{`"2024-01-02T03:04:05Z"`}, []string{`"2024-01-02 03:04:05Z"`}},
	{"uuid", `{"type":"string","format":"uuid"}`, []string{`"123e4567-e89b-12d3-a456-426614174000"`}, []string{`"123e4567"`}},
	{"pattern", `{"type":"string","pattern":"^[a-z]+-\\d{2}$"}`, []string{`"ab-12"`}, []string{`"ab-1"`, `"AB-12"`}},
	{"pattern with quotes and dots", `{"type":"string","pattern":"^a\"(b|c)*.$"}`, []string{`"a\"bcbx"`, `"a\"\""`, `"a\"\\"`, `"a\"b"`}, []string{`"a\""`, `"a\"\n"`, `"a\"bdd"`}},
	{"pattern classes", `{"type":"string","pattern":"^[^a-y\"]\\w\\s\\S?$"}`, []string{`"z_ "`, `"Za\t"`, `"Q1\nx"`}, []string{`"a_ "`, `"\"a "`}},
	{"integer", `{"type":"integer"}`, []string{`0`, `-12`, `1234567890123456`}, []string{`01`, `1.0`, `12345678901234567`, `-`}},
	{"number", `{"type":"number"}`, []string{`0.5`, `-1e10`, `2E-05`, `3.25e+7`}, []string{`1.`, `1e`, `1e100`, `.5`}},
	{"whitespace bounded", `{"type":"array"}`, []string{"[ 1,\n  2 ]", "[\n" + strings.Repeat(" ", 20) + "1]"},
		[]string{"[\n" + strings.Repeat(" ", 21) + "1]", "[  1]", "[1  ,2]"}},
	{"annotations ignored", `{"$schema":"https://json-schema.org/draft/2020-12/schema","title":"t","description":"d","type":"boolean","default":true,"examples":[false]}`,
		[]string{`true`}, []string{`1`}},
}

func TestSchemas(t *testing.T) {
	v := byteVocab(t)
	for _, c := range schemaCases {
		g, err := FromJSONSchema([]byte(c.schema))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		a, err := NewAutomaton(g, v, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range c.accept {
			if !accepts(a, s) {
				t.Errorf("%s: %s rejected\n%s", c.name, s, g)
			}
		}
		for _, s := range c.reject {
			if accepts(a, s) {
				t.Errorf("%s: %s accepted\n%s", c.name, s, g)
			}
		}
	}
}

func TestSchemaErrors(t *testing.T) {
	cases := []struct{ schema, want string }{
		{`{`, "not JSON"},
		{`{"type":"string"} x`, "not JSON: data after"},
		{`{"a":1,"a":2}`, `duplicate key "a"`},
		{`false`, "schema false"},
		{`3`, "must be an object or a boolean"},
		{`{"type":"strng"}`, `unknown type "strng"`},
		{`{"type":[]}`, "empty array"},
		{`{"type":"integer","minimum":0}`, `#: unsupported keyword "minimum"`},
		{`{"properties":{"a":{"uniqueItems":true}}}`, `#/properties/a: unsupported keyword "uniqueItems"`},
		{`{"type":"object","patternProperties":{}}`, `unsupported keyword "patternProperties"`},
		{`{"not":{}}`, `unsupported keyword "not"`},
		{`{"type":"string","format":"email"}`, `unsupported string format "email"`},
		{`{"type":"string","pattern":"a\\bc"}`, `escape \b is not supported`},
		{`{"type":"string","pattern":"(?=a)"}`, "group modifiers"},
		{`{"type":"string","pattern":"a^b"}`, "'^' is supported only at the start"},
		{`{"type":"string","pattern":"(a"}`, "missing )"},
		{`{"type":"string","pattern":"a**"}`, "quantifier after a quantifier"},
		{`{"type":"string","pattern":"[b-a]"}`, "bad range"},
		{`{"type":"string","pattern":"x","maxLength":3}`, "pattern beside minLength or maxLength"},
		{`{"type":"string","minLength":3,"maxLength":2}`, "maxLength 2 below minLength 3"},
		{`{"type":"string","maxLength":-1}`, "non-negative integer"},
		{`{"type":"array","maxItems":100000}`, "maxItems 100000 exceeds 10000"},
		{`{"type":"array","prefixItems":[{}],"items":false,"minItems":2}`, "at most 1 items"},
		{`{"enum":[]}`, "no enum or const value"},
		{`{"type":"integer","enum":["a"]}`, "no enum or const value"},
		{`{"const":1,"enum":[2]}`, "const is not among enum"},
		{`{"enum":[1],"minLength":2}`, `enum beside "minLength"`},
		{`{"$ref":"#/$defs/missing"}`, `no "$defs"`},
		{`{"$ref":"other.json#/x"}`, "only references within the document"},
		{`{"$ref":"#/$defs/a","type":"string","$defs":{"a":{}}}`, `$ref beside "type"`},
		{`{"anyOf":[]}`, "non-empty array"},
		{`{"type":"object","anyOf":[{}]}`, `anyOf beside "type"`},
		{`{"allOf":[{"type":"string"}]}`, "only for object schemas"},
		{`{"allOf":[{"properties":{"a":{"type":"string"}}},{"properties":{"a":{"type":"integer"}}}]}`, `property "a" has different schemas`},
		{`{"allOf":[{"properties":{}, "additionalProperties":false}]}`, `keyword "additionalProperties" in a branch`},
		{`{"type":"object","required":["x"],"additionalProperties":false}`, `required property "x" is not in properties`},
		{`{"type":"array","items":[{}],"additionalItems":false}`, `"additionalItems"`},
		{`{"definitions":{"":{"":""}},"$ref":"#"}`, "no finite JSON value matches"},
		{strings.Repeat(`{"items":`, 200) + `{}` + strings.Repeat(`}`, 200), "nested deeper than 128"},
	}
	for _, c := range cases {
		_, err := FromJSONSchema([]byte(c.schema))
		var se *SchemaError
		if err == nil || !errors.As(err, &se) {
			t.Errorf("%s: error %v, want a *SchemaError with %q", c.schema, err, c.want)
			continue
		}
		if !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %q, want %q", c.schema, err, c.want)
		}
	}
}

func TestJSONObject(t *testing.T) {
	a, err := NewAutomaton(JSONObject(), byteVocab(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	if !accepts(a, `{"a":[]}`) || accepts(a, `[]`) {
		t.Error("JSONObject is not the grammar of JSON objects")
	}
}
