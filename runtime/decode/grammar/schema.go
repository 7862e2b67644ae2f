package grammar

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// SchemaError is a JSON Schema the compiler refuses: not JSON, not a schema, or using a keyword
// or a combination it does not support. Path is a JSON Pointer to the offending subschema.
type SchemaError struct {
	Path string
	Msg  string
}

func (e *SchemaError) Error() string {
	p := e.Path
	if p == "" {
		p = "#"
	}
	return fmt.Sprintf("grammar: JSON schema at %s: %s", p, e.Msg)
}

// FromJSONSchema compiles a JSON Schema to a Grammar whose sentences are JSON texts valid
// against it. See SchemaToGBNF for what is supported.
func FromJSONSchema(schema []byte) (*Grammar, error) {
	_, g, err := compileSchema(schema)
	return g, err
}

// JSONObject is the grammar of any JSON object, for response_format {"type": "json_object"}.
func JSONObject() *Grammar {
	g, err := FromJSONSchema([]byte(`{"type":"object"}`))
	if err != nil {
		panic("grammar: the JSON object grammar does not compile: " + err.Error())
	}
	return g
}

// SchemaToGBNF translates a JSON Schema (draft 2020-12 keywords, with draft-07's "definitions"
// and array-form "items") to a GBNF grammar, following the shape of llama.cpp's
// json-schema-to-grammar (common/json-schema-to-grammar.cpp at c392e509): one rule per
// subschema, values followed by a bounded "space" (nothing, one space, or a newline and up to
// 20 blanks), so whitespace can never loop.
//
// Supported: type (a name or a list), enum, const, properties (in the order given; those in
// required are required, the others optional), additionalProperties (false; true or a schema
// allows further keys after the listed ones; absent, none are generated, as in llama.cpp),
// items, prefixItems, minItems, maxItems, anyOf, oneOf (as anyOf: the branches should not
// overlap), allOf of object schemas without additionalProperties, $ref to a JSON Pointer in
// the document ("#/$defs/x", "#/definitions/x", "#"; recursion allowed), string minLength,
// maxLength, pattern (a regular expression of literals, classes, '.', groups, alternation,
// * + ? {m,n}, and ^ $ at its ends) and format (date, time, date-time, uuid); annotations
// ($schema, $id, $comment, title, description, default, examples, deprecated, readOnly,
// writeOnly, $defs, definitions) are ignored. Any other keyword is a *SchemaError naming it;
// so is a schema no JSON text satisfies (false, an empty enum).
//
// Numbers are generated with at most 16 integer digits, 16 decimals and a two-digit exponent,
// so that they fit a float64. Strings never hold a lone surrogate escape, so each generated
// character is one code point, as minLength and maxLength count them.
func SchemaToGBNF(schema []byte) (string, error) {
	text, _, err := compileSchema(schema)
	return text, err
}

// compileSchema translates schema to GBNF text and parses it. A translation that does not parse
// (a $ref that loops back to itself before any JSON is written, so no finite value matches) is
// a *SchemaError.
func compileSchema(schema []byte) (string, *Grammar, error) {
	text, err := schemaText(schema)
	if err != nil {
		return "", nil, err
	}
	g, err := ParseGBNF(text)
	if err != nil {
		return "", nil, &SchemaError{Msg: "no finite JSON value matches (a $ref loops back to itself?): " + err.Error()}
	}
	return text, g, nil
}

func schemaText(schema []byte) (string, error) {
	doc, err := decodeOrdered(schema)
	if err != nil {
		return "", &SchemaError{Msg: "not JSON: " + err.Error()}
	}
	c := &schemaCompiler{doc: doc, bodies: map[string]string{}, refs: map[string]string{}}
	c.reserve("root") // so that no subschema's rule takes the name
	name, err := c.visit(doc, "#", "root", 0)
	if err != nil {
		return "", err
	}
	c.bodies["root"] = name
	var b strings.Builder
	// root first, the rest in the order they were made.
	b.WriteString("root ::= " + c.bodies["root"] + "\n")
	for _, r := range c.rules {
		if r != "root" {
			b.WriteString(r + " ::= " + c.bodies[r] + "\n")
		}
	}
	return b.String(), nil
}

type schemaCompiler struct {
	doc    any
	rules  []string          // rule names in order of creation
	bodies map[string]string // rule name → GBNF body
	refs   map[string]string // $ref target → rule name
}

// Primitive rules, after llama.cpp's PRIMITIVE_RULES. char excludes escapes of surrogates; the
// exponent is at most two digits.
var primitives = map[string]string{
	"space":         `| " " | "\n" [ \t]{0,20}`,
	"boolean":       `("true" | "false") space`,
	"null":          `"null" space`,
	"decimal-part":  `[0-9]{1,16}`,
	"integral-part": `[0] | [1-9] [0-9]{0,15}`,
	"number":        `("-"? integral-part) ("." decimal-part)? ([eE] [-+]? [0-9]{1,2})? space`,
	"integer":       `("-"? integral-part) space`,
	"value":         `object | array | string | number | boolean | null`,
	"object":        `"{" space ( string ":" space value ("," space string ":" space value)* )? "}" space`,
	"array":         `"[" space ( value ("," space value)* )? "]" space`,
	"char":          `[^"\\\x7F\x00-\x1F] | [\\] (["\\/bfnrt] | "u" ([0-9a-cA-C] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} | [e-fE-F] [0-9a-fA-F]{3}))`,
	"string":        `"\"" char* "\"" space`,
	"uuid":          `"\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12} "\"" space`,
	// Calendar-exact days (February to 28, leap years aside), hours to 23, seconds to 59.
	"date":             `[0-9]{4} "-" ( ("01" | "03" | "05" | "07" | "08" | "10" | "12") "-" ("0" [1-9] | [12] [0-9] | "3" [01]) | ("04" | "06" | "09" | "11") "-" ("0" [1-9] | [12] [0-9] | "30") | "02" "-" ("0" [1-9] | "1" [0-9] | "2" [0-8]) )`,
	"time":             `([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? ( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )`,
	"date-time":        `date "T" time`,
	"date-string":      `"\"" date "\"" space`,
	"time-string":      `"\"" time "\"" space`,
	"date-time-string": `"\"" date-time "\"" space`,
	"key-char":         `[^"\\\x7F\x00-\x1F]`,
}

// primDeps lists the primitives each primitive refers to.
var primDeps = map[string][]string{
	"boolean": {"space"}, "null": {"space"},
	"number":           {"integral-part", "decimal-part", "space"},
	"integer":          {"integral-part", "space"},
	"value":            {"object", "array", "string", "number", "boolean", "null"},
	"object":           {"space", "string", "value"},
	"array":            {"space", "value"},
	"string":           {"char", "space"},
	"uuid":             {"space"},
	"date-time":        {"date", "time"},
	"date-string":      {"date", "space"},
	"time-string":      {"time", "space"},
	"date-time-string": {"date-time", "space"},
}

// prim adds a primitive rule (and those it needs) and returns its name.
func (c *schemaCompiler) prim(name string) string {
	if _, ok := c.bodies[name]; ok {
		return name
	}
	c.bodies[name] = primitives[name]
	c.rules = append(c.rules, name)
	for _, d := range primDeps[name] {
		c.prim(d)
	}
	return name
}

// rule adds a rule named after name (made unique) with the given body and returns its name.
// A rule with the same name and body is reused.
func (c *schemaCompiler) rule(name, body string) string {
	name = sanitize(name)
	base := name
	for i := 1; ; i++ {
		old, ok := c.bodies[name]
		if !ok {
			break
		}
		if old == body {
			return name
		}
		name = base + strconv.Itoa(i)
	}
	c.bodies[name] = body
	c.rules = append(c.rules, name)
	return name
}

// reserve makes a unique rule name with an empty body, to be set later (for $ref recursion).
func (c *schemaCompiler) reserve(name string) string {
	name = sanitize(name)
	base := name
	for i := 1; ; i++ {
		if _, ok := c.bodies[name]; !ok {
			break
		}
		name = base + strconv.Itoa(i)
	}
	c.bodies[name] = ""
	c.rules = append(c.rules, name)
	return name
}

// sanitize turns a name into a GBNF rule name ([a-zA-Z0-9-]+) that no primitive uses.
func sanitize(s string) string {
	var b strings.Builder
	dash := false
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if isWordChar(ch) && ch != '-' {
			b.WriteByte(ch)
			dash = false
		} else if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	out := strings.TrimRight(b.String(), "-")
	if out == "" {
		out = "r"
	}
	if _, prim := primitives[out]; prim {
		out += "-"
		out += "r"
	}
	return out
}

// Keywords the compiler ignores.
var annotations = map[string]bool{
	"$schema": true, "$id": true, "$comment": true, "title": true, "description": true,
	"default": true, "examples": true, "deprecated": true, "readOnly": true, "writeOnly": true,
	"$defs": true, "definitions": true,
}

// Keywords the compiler understands, by the type they constrain ("" for any type).
var keywordType = map[string]string{
	"type": "", "enum": "", "const": "", "anyOf": "", "oneOf": "", "allOf": "", "$ref": "",
	"properties": "object", "required": "object", "additionalProperties": "object",
	"items": "array", "prefixItems": "array", "minItems": "array", "maxItems": "array",
	"minLength": "string", "maxLength": "string", "pattern": "string", "format": "string",
}

var allTypes = []string{"object", "array", "string", "number", "integer", "boolean", "null"}

func (c *schemaCompiler) fail(path, format string, args ...any) error {
	return &SchemaError{Path: path, Msg: fmt.Sprintf(format, args...)}
}

// visit returns a GBNF expression (a rule name, usually) matching the JSON texts valid
// against s, each followed by space.
func (c *schemaCompiler) visit(s any, path, name string, depth int) (string, error) {
	if depth > maxSchemaDepth {
		return "", c.fail(path, "schema nested deeper than %d", maxSchemaDepth)
	}
	switch s := s.(type) {
	case bool:
		if !s {
			return "", c.fail(path, "schema false: no value is valid")
		}
		return c.prim("value"), nil
	case *object:
		return c.visitObject(s, path, name, depth)
	}
	return "", c.fail(path, "a schema must be an object or a boolean")
}

func (c *schemaCompiler) visitObject(s *object, path, name string, depth int) (string, error) {
	var kw []string // keywords that constrain
	for _, k := range s.keys {
		if annotations[k] {
			continue
		}
		if _, ok := keywordType[k]; !ok {
			return "", c.fail(path, "unsupported keyword %q", k)
		}
		kw = append(kw, k)
	}
	others := func(except ...string) []string {
		var o []string
		for _, k := range kw {
			if !slices.Contains(except, k) {
				o = append(o, k)
			}
		}
		return o
	}

	if ref, ok := s.get("$ref"); ok {
		if o := others("$ref"); len(o) > 0 {
			return "", c.fail(path, "$ref beside %q is not supported", o[0])
		}
		r, ok := ref.(string)
		if !ok {
			return "", c.fail(path, "$ref must be a string")
		}
		return c.visitRef(r, path, depth)
	}
	for _, comb := range []string{"anyOf", "oneOf"} {
		if v, ok := s.get(comb); ok {
			if o := others(comb); len(o) > 0 {
				return "", c.fail(path, "%s beside %q is not supported", comb, o[0])
			}
			subs, ok := v.([]any)
			if !ok || len(subs) == 0 {
				return "", c.fail(path, "%s must be a non-empty array", comb)
			}
			alts := make([]string, len(subs))
			for i, sub := range subs {
				e, err := c.visit(sub, fmt.Sprintf("%s/%s/%d", path, comb, i), fmt.Sprintf("%s-%d", name, i), depth+1)
				if err != nil {
					return "", err
				}
				alts[i] = e
			}
			return c.rule(name, strings.Join(alts, " | ")), nil
		}
	}
	if v, ok := s.get("allOf"); ok {
		return c.visitAllOf(s, v, path, name, depth)
	}
	if v, ok := s.get("const"); ok {
		if o := others("const", "type", "enum"); len(o) > 0 {
			return "", c.fail(path, "const beside %q is not supported", o[0])
		}
		if e, ok := s.get("enum"); ok {
			vals, _ := e.([]any)
			if !slices.ContainsFunc(vals, func(x any) bool { return jsonEqual(x, v) }) {
				return "", c.fail(path, "const is not among enum: no value is valid")
			}
		}
		return c.literals(s, []any{v}, path, name)
	}
	if v, ok := s.get("enum"); ok {
		if o := others("enum", "type"); len(o) > 0 {
			return "", c.fail(path, "enum beside %q is not supported", o[0])
		}
		vals, ok := v.([]any)
		if !ok {
			return "", c.fail(path, "enum must be an array")
		}
		return c.literals(s, vals, path, name)
	}

	types, err := c.types(s, path, kw)
	if err != nil {
		return "", err
	}
	if len(types) == len(allTypes) && len(kw) == 0 {
		return c.prim("value"), nil
	}
	alts := make([]string, 0, len(types))
	for _, t := range types {
		if t == "integer" && slices.Contains(types, "number") {
			continue // every integer is a number
		}
		e, err := c.visitType(s, t, path, name, depth)
		if err != nil {
			return "", err
		}
		alts = append(alts, e)
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	return c.rule(name, strings.Join(alts, " | ")), nil
}

// types returns the types s allows: its "type", or those its keywords constrain, or all.
func (c *schemaCompiler) types(s *object, path string, kw []string) ([]string, error) {
	if t, ok := s.get("type"); ok {
		var names []string
		switch t := t.(type) {
		case string:
			names = []string{t}
		case []any:
			for _, x := range t {
				n, ok := x.(string)
				if !ok {
					return nil, c.fail(path, "type must be a string or an array of strings")
				}
				names = append(names, n)
			}
		default:
			return nil, c.fail(path, "type must be a string or an array of strings")
		}
		if len(names) == 0 {
			return nil, c.fail(path, "type is an empty array: no value is valid")
		}
		for _, n := range names {
			if !slices.Contains(allTypes, n) {
				return nil, c.fail(path, "unknown type %q", n)
			}
		}
		// "number" alongside "integer" covers it; keep one of each.
		slices.Sort(names)
		return slices.Compact(names), nil
	}
	var names []string
	for _, k := range kw {
		if t := keywordType[k]; t != "" && !slices.Contains(names, t) {
			names = append(names, t)
		}
	}
	if len(names) == 0 {
		return allTypes, nil
	}
	return names, nil
}

// literals returns alternatives matching exactly the JSON values vals (those of the schema's
// type, when it names one).
func (c *schemaCompiler) literals(s *object, vals []any, path, name string) (string, error) {
	types := allTypes
	if _, ok := s.get("type"); ok {
		var err error
		if types, err = c.types(s, path, nil); err != nil {
			return "", err
		}
	}
	var alts []string
	for _, v := range vals {
		if !slices.Contains(types, jsonType(v)) && !(jsonType(v) == "integer" && slices.Contains(types, "number")) {
			continue
		}
		var b strings.Builder
		encodeJSON(&b, v)
		alts = append(alts, gbnfLiteral(b.String()))
	}
	if len(alts) == 0 {
		return "", c.fail(path, "no enum or const value is of the schema's type: no value is valid")
	}
	slices.Sort(alts)
	alts = slices.Compact(alts)
	c.prim("space")
	return c.rule(name, "("+strings.Join(alts, " | ")+") space"), nil
}

// jsonType names the JSON Schema type of a decoded value ("integer" for whole numbers).
func jsonType(v any) string {
	switch v := v.(type) {
	case *object:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case json.Number:
		if _, err := strconv.ParseInt(v.String(), 10, 64); err == nil {
			return "integer"
		}
		if f, err := v.Float64(); err == nil && f == float64(int64(f)) && !strings.ContainsAny(v.String(), ".eE") {
			return "integer"
		}
		return "number"
	case bool:
		return "boolean"
	}
	return "null"
}

func (c *schemaCompiler) visitRef(ref, path string, depth int) (string, error) {
	if name, ok := c.refs[ref]; ok {
		return name, nil
	}
	target, err := c.resolve(ref, path)
	if err != nil {
		return "", err
	}
	base := "ref"
	if i := strings.LastIndexByte(ref, '/'); i >= 0 && i+1 < len(ref) {
		base = ref[i+1:]
	}
	name := c.reserve(base)
	c.refs[ref] = name
	e, err := c.visit(target, ref, name+"-body", depth+1)
	if err != nil {
		return "", err
	}
	c.bodies[name] = e
	return name, nil
}

func (c *schemaCompiler) visitType(s *object, t, path, name string, depth int) (string, error) {
	switch t {
	case "boolean", "null":
		return c.prim(t), nil
	case "number", "integer":
		return c.prim(t), nil
	case "string":
		return c.visitString(s, path, name)
	case "array":
		return c.visitArray(s, path, name, depth)
	case "object":
		return c.visitObjectType(s, path, name, depth)
	}
	return "", c.fail(path, "unknown type %q", t)
}

func (c *schemaCompiler) count(s *object, key, path string) (int, bool, error) {
	v, ok := s.get(key)
	if !ok {
		return 0, false, nil
	}
	n, isNum := v.(json.Number)
	i, err := strconv.Atoi(n.String())
	if !isNum || err != nil || i < 0 {
		return 0, false, c.fail(path, "%s must be a non-negative integer", key)
	}
	if i > MaxRepeat {
		return 0, false, c.fail(path, "%s %d exceeds %d", key, i, MaxRepeat)
	}
	return i, true, nil
}

func (c *schemaCompiler) visitString(s *object, path, name string) (string, error) {
	minLen, hasMin, err := c.count(s, "minLength", path)
	if err != nil {
		return "", err
	}
	maxLen, hasMax, err := c.count(s, "maxLength", path)
	if err != nil {
		return "", err
	}
	if hasMin && hasMax && maxLen < minLen {
		return "", c.fail(path, "maxLength %d below minLength %d: no value is valid", maxLen, minLen)
	}
	if f, ok := s.get("format"); ok {
		fs, _ := f.(string)
		if hasMin || hasMax {
			return "", c.fail(path, "format beside minLength or maxLength is not supported")
		}
		if _, ok := s.get("pattern"); ok {
			return "", c.fail(path, "format beside pattern is not supported")
		}
		switch fs {
		case "date", "time", "date-time":
			return c.prim(fs + "-string"), nil
		case "uuid":
			return c.prim("uuid"), nil
		}
		return "", c.fail(path, "unsupported string format %q (date, time, date-time and uuid are)", fs)
	}
	if p, ok := s.get("pattern"); ok {
		ps, ok := p.(string)
		if !ok {
			return "", c.fail(path, "pattern must be a string")
		}
		if hasMin || hasMax {
			return "", c.fail(path, "pattern beside minLength or maxLength is not supported")
		}
		body, err := regexToGBNF(ps)
		if err != nil {
			return "", c.fail(path, "pattern %q: %v", ps, err)
		}
		c.prim("space")
		return c.rule(name, `"\"" `+body+` "\"" space`), nil
	}
	if !hasMin && !hasMax {
		return c.prim("string"), nil
	}
	c.prim("char")
	c.prim("space")
	rep := fmt.Sprintf("{%d,}", minLen)
	if hasMax {
		rep = fmt.Sprintf("{%d,%d}", minLen, maxLen)
	}
	return c.rule(name, `"\"" char`+rep+` "\"" space`), nil
}

func (c *schemaCompiler) visitArray(s *object, path, name string, depth int) (string, error) {
	minItems, _, err := c.count(s, "minItems", path)
	if err != nil {
		return "", err
	}
	maxItems, hasMax, err := c.count(s, "maxItems", path)
	if err != nil {
		return "", err
	}
	if !hasMax {
		maxItems = -1
	} else if maxItems < minItems {
		return "", c.fail(path, "maxItems %d below minItems %d: no value is valid", maxItems, minItems)
	}
	var prefix []string
	var extra string // "" when no item beyond the prefix is allowed
	addPrefix := func(list []any, key string) error {
		for i, sub := range list {
			e, err := c.visit(sub, fmt.Sprintf("%s/%s/%d", path, key, i), fmt.Sprintf("%s-%d", name, i), depth+1)
			if err != nil {
				return err
			}
			prefix = append(prefix, e)
		}
		return nil
	}
	items, hasItems := s.get("items")
	if p, ok := s.get("prefixItems"); ok {
		list, ok := p.([]any)
		if !ok {
			return "", c.fail(path, "prefixItems must be an array")
		}
		if err := addPrefix(list, "prefixItems"); err != nil {
			return "", err
		}
	} else if list, ok := items.([]any); ok { // draft-07 tuple form
		if err := addPrefix(list, "items"); err != nil {
			return "", err
		}
		items, hasItems = s.get("additionalItems")
		if hasItems {
			return "", c.fail(path, "unsupported keyword \"additionalItems\"")
		}
	}
	switch {
	case !hasItems:
		extra = c.prim("value")
	case items == false:
	default:
		if extra, err = c.visit(items, path+"/items", name+"-item", depth+1); err != nil {
			return "", err
		}
	}
	if extra == "" && minItems > len(prefix) {
		return "", c.fail(path, "minItems %d but at most %d items allowed: no value is valid", minItems, len(prefix))
	}
	c.prim("space")
	// tail(i): the items from i+1 on, given i already written.
	var tail func(i int) string
	tail = func(i int) string {
		sep := `"," space `
		if i == 0 {
			sep = ""
		}
		if maxItems >= 0 && i >= maxItems {
			return ""
		}
		if i < len(prefix) {
			body := sep + prefix[i]
			if t := tail(i + 1); t != "" {
				body += " " + t
			}
			if i >= minItems {
				return "(" + body + ")?"
			}
			return body
		}
		if extra == "" {
			return ""
		}
		// Items beyond the prefix: between lo and hi more (hi -1: unbounded).
		lo := max(minItems-i, 0)
		hi := -1
		if maxItems >= 0 {
			hi = maxItems - i
		}
		if i == 0 {
			// first item has no separator
			rest := ""
			switch {
			case hi < 0:
				rest = fmt.Sprintf(`("," space %s){%d,}`, extra, max(lo-1, 0))
			case hi > 1:
				rest = fmt.Sprintf(`("," space %s){%d,%d}`, extra, max(lo-1, 0), hi-1)
			}
			body := extra
			if rest != "" {
				body += " " + rest
			}
			if lo == 0 {
				return "(" + body + ")?"
			}
			return body
		}
		if hi < 0 {
			return fmt.Sprintf(`("," space %s){%d,}`, extra, lo)
		}
		if hi == 0 {
			return ""
		}
		return fmt.Sprintf(`("," space %s){%d,%d}`, extra, lo, hi)
	}
	body := `"[" space `
	if t := tail(0); t != "" {
		body += t + " "
	}
	body += `"]" space`
	return c.rule(name, body), nil
}

// property is one listed property of an object schema.
type property struct {
	name     string
	expr     string // the value's expression
	required bool
}

func (c *schemaCompiler) visitObjectType(s *object, path, name string, depth int) (string, error) {
	props, _ := s.get("properties")
	req, _ := s.get("required")
	add, hasAdd := s.get("additionalProperties")
	if props == nil && req == nil && !hasAdd {
		return c.prim("object"), nil
	}
	var required []string
	if req != nil {
		list, ok := req.([]any)
		if !ok {
			return "", c.fail(path, "required must be an array of strings")
		}
		for _, r := range list {
			rs, ok := r.(string)
			if !ok {
				return "", c.fail(path, "required must be an array of strings")
			}
			required = append(required, rs)
		}
	}
	var list []property
	if props != nil {
		po, ok := props.(*object)
		if !ok {
			return "", c.fail(path, "properties must be an object")
		}
		for _, k := range po.keys {
			e, err := c.visit(po.vals[k], path+"/properties/"+escapePointer(k), name+"-"+k, depth+1)
			if err != nil {
				return "", err
			}
			list = append(list, property{name: k, expr: e, required: slices.Contains(required, k)})
		}
	}
	// The additional properties' value, "" when none may be generated.
	var extra string
	switch {
	case !hasAdd || add == false:
	case add == true:
		extra = c.prim("value")
	default:
		var err error
		if extra, err = c.visit(add, path+"/additionalProperties", name+"-additional", depth+1); err != nil {
			return "", err
		}
	}
	for _, r := range required {
		if slices.ContainsFunc(list, func(p property) bool { return p.name == r }) {
			continue
		}
		if hasAdd && add == false {
			return "", c.fail(path, "required property %q is not in properties and additionalProperties is false: no value is valid", r)
		}
		e := extra
		if e == "" {
			e = c.prim("value")
		}
		list = append(list, property{name: r, expr: e, required: true})
	}
	return c.objectRule(list, extra, name), nil
}

// objectRule writes an object of the listed properties in order, the required ones always and
// the optional ones at will, then (when extra is not "") any further keys, none equal to a
// listed one, with values matching extra. first(i) and next(i) are the rules for the
// properties from i on, before and after a first property has been written.
func (c *schemaCompiler) objectRule(list []property, extra, name string) string {
	c.prim("space")
	kv := make([]string, len(list))
	for i, p := range list {
		var b strings.Builder
		encodeString(&b, p.name)
		kv[i] = c.rule(name+"-"+p.name+"-kv", gbnfLiteral(b.String())+` space ":" space `+p.expr)
	}
	var extraFirst, extraNext string // the tail after the listed properties
	if extra != "" {
		names := make([]string, len(list))
		for i, p := range list {
			names[i] = p.name
		}
		key := c.rule(name+"-additional-key", `"\"" `+c.notStrings(names)+` "\"" space`)
		akv := c.rule(name+"-additional-kv", key+` ":" space `+extra)
		extraNext = c.rule(name+"-additional-next", fmt.Sprintf(`("," space %s)*`, akv))
		extraFirst = c.rule(name+"-additional-first", fmt.Sprintf(`(%s %s)?`, akv, extraNext))
	}
	var first, next string = extraFirst, extraNext
	join := func(parts ...string) string {
		var out []string
		for _, p := range parts {
			if p != "" {
				out = append(out, p)
			}
		}
		return strings.Join(out, " ")
	}
	for i := len(list) - 1; i >= 0; i-- {
		p := list[i]
		var f, n string
		if p.required {
			f = join(kv[i], next)
			n = join(`"," space`, kv[i], next)
		} else {
			// No alternative is left empty at the end of a line: GBNF would read the next
			// line as its continuation.
			if first != "" {
				f = "(" + join(kv[i], next) + ") | " + first
			} else {
				f = "(" + join(kv[i], next) + ")?"
			}
			if next != "" {
				n = "(" + join(`"," space`, kv[i], next) + ") | " + next
			} else {
				n = "(" + join(`"," space`, kv[i], next) + ")?"
			}
		}
		first = c.rule(fmt.Sprintf("%s-p%d-first", name, i), f)
		next = c.rule(fmt.Sprintf("%s-p%d-next", name, i), n)
	}
	body := `"{" space `
	if first != "" {
		body += first + " "
	}
	body += `"}" space`
	return c.rule(name, body)
}

// notStrings returns an expression for the content of a JSON string (without escapes) that is
// none of names: a walk down the trie of the names where at each node the string may end (if
// no name ends there), continue with a character no name continues with (then anything), or
// follow a name's next character.
func (c *schemaCompiler) notStrings(names []string) string {
	c.prim("key-char")
	type node struct {
		children map[rune]*node
		order    []rune
		end      bool
	}
	root := &node{children: map[rune]*node{}}
	for _, n := range names {
		cur := root
		for _, r := range n {
			ch, ok := cur.children[r]
			if !ok {
				ch = &node{children: map[rune]*node{}}
				cur.children[r] = ch
				cur.order = append(cur.order, r)
			}
			cur = ch
		}
		cur.end = true
	}
	var walk func(n *node) string
	walk = func(n *node) string {
		var alts []string
		if !n.end {
			alts = append(alts, `""`)
		}
		// A character no name continues with here, then any characters.
		var excl strings.Builder
		excl.WriteString(`[^"\\\x7F\x00-\x1F`)
		for _, r := range n.order {
			excl.WriteString(classChar(r))
		}
		excl.WriteString(`] key-char*`)
		alts = append(alts, excl.String())
		for _, r := range n.order {
			if r == '"' || r == '\\' || r < 0x20 || r == 0x7F {
				continue // such names cannot be spelt without escapes, so they cannot be hit
			}
			alts = append(alts, gbnfLiteral(string(r))+" "+walk(n.children[r]))
		}
		return "(" + strings.Join(alts, " | ") + ")"
	}
	return walk(root)
}

func (c *schemaCompiler) visitAllOf(s *object, v any, path, name string, depth int) (string, error) {
	subs, ok := v.([]any)
	if !ok || len(subs) == 0 {
		return "", c.fail(path, "allOf must be a non-empty array")
	}
	// Gather the object schemas: s itself without allOf, and each branch ($refs resolved).
	parts := []*object{{vals: map[string]any{}}}
	for _, k := range s.keys {
		if k != "allOf" {
			parts[0].keys = append(parts[0].keys, k)
			parts[0].vals[k] = s.vals[k]
		}
	}
	for i, sub := range subs {
		for {
			o, ok := sub.(*object)
			if !ok {
				if sub == true {
					break
				}
				return "", c.fail(fmt.Sprintf("%s/allOf/%d", path, i), "allOf branches must be object schemas")
			}
			ref, isRef := o.get("$ref")
			if !isRef {
				parts = append(parts, o)
				break
			}
			rs, _ := ref.(string)
			t, err := c.resolve(rs, path)
			if err != nil {
				return "", err
			}
			sub = t
		}
	}
	merged := &object{vals: map[string]any{}}
	props := &object{vals: map[string]any{}}
	var required []any
	for i, o := range parts {
		for _, k := range o.keys {
			if annotations[k] {
				continue
			}
			val := o.vals[k]
			switch k {
			case "type":
				if t, ok := val.(string); !ok || t != "object" {
					return "", c.fail(path, "allOf is supported only for object schemas")
				}
			case "properties":
				po, ok := val.(*object)
				if !ok {
					return "", c.fail(path, "properties must be an object")
				}
				for _, pk := range po.keys {
					if old, dup := props.vals[pk]; dup && !jsonEqual(old, po.vals[pk]) {
						return "", c.fail(path, "allOf: property %q has different schemas in two branches", pk)
					} else if !dup {
						props.keys = append(props.keys, pk)
						props.vals[pk] = po.vals[pk]
					}
				}
			case "required":
				list, _ := val.([]any)
				required = append(required, list...)
			default:
				if i == 0 && k == "allOf" {
					continue
				}
				return "", c.fail(path, "allOf: keyword %q in a branch is not supported (only type object, properties and required merge)", k)
			}
		}
	}
	merged.keys = []string{"type", "properties", "required"}
	merged.vals["type"] = "object"
	merged.vals["properties"] = props
	merged.vals["required"] = required
	return c.visitObjectType(merged, path, name, depth)
}

// resolve follows a $ref to its target schema.
func (c *schemaCompiler) resolve(ref, path string) (any, error) {
	if !strings.HasPrefix(ref, "#") {
		return nil, c.fail(path, "$ref %q: only references within the document (#...) are supported", ref)
	}
	frag, err := url.PathUnescape(ref[1:])
	if err != nil {
		return nil, c.fail(path, "$ref %q: %v", ref, err)
	}
	target := c.doc
	if frag == "" {
		return target, nil
	}
	if !strings.HasPrefix(frag, "/") {
		return nil, c.fail(path, "$ref %q: only JSON Pointer fragments are supported", ref)
	}
	for _, tok := range strings.Split(frag[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch t := target.(type) {
		case *object:
			v, ok := t.get(tok)
			if !ok {
				return nil, c.fail(path, "$ref %q: no %q", ref, tok)
			}
			target = v
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(t) {
				return nil, c.fail(path, "$ref %q: no %q", ref, tok)
			}
			target = t[i]
		default:
			return nil, c.fail(path, "$ref %q: no %q", ref, tok)
		}
	}
	return target, nil
}

func escapePointer(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// gbnfLiteral quotes s as a GBNF string literal.
func gbnfLiteral(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x20 || r == 0x7F:
			fmt.Fprintf(&b, `\x%02X`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// classChar writes r for use inside a GBNF character class.
func classChar(r rune) string {
	switch {
	case r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9':
		return string(r)
	case r < 0x80:
		return fmt.Sprintf(`\x%02X`, r)
	case r <= 0xFFFF:
		return fmt.Sprintf(`\u%04X`, r)
	}
	return fmt.Sprintf(`\U%08X`, r)
}
