package grammar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// maxSchemaDepth bounds the nesting of a schema document.
const maxSchemaDepth = 128

// object is a JSON object that keeps its keys in document order, which a schema's
// "properties" needs.
type object struct {
	keys []string
	vals map[string]any
}

func (o *object) get(k string) (any, bool) {
	v, ok := o.vals[k]
	return v, ok
}

// decodeOrdered decodes one JSON value: objects become *object, arrays []any, numbers
// json.Number, and strings, booleans and null their Go values. Duplicate keys and trailing
// data are errors.
func decodeOrdered(data []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	v, err := decodeValue(d, 0)
	if err != nil {
		return nil, err
	}
	if _, err := d.Token(); err != io.EOF {
		return nil, errors.New("data after the JSON value")
	}
	return v, nil
}

func decodeValue(d *json.Decoder, depth int) (any, error) {
	if depth > maxSchemaDepth {
		return nil, fmt.Errorf("nested deeper than %d", maxSchemaDepth)
	}
	t, err := d.Token()
	if err != nil {
		if err == io.EOF {
			return nil, errors.New("unexpected end of JSON")
		}
		return nil, err
	}
	switch t := t.(type) {
	case json.Delim:
		switch t {
		case '{':
			o := &object{vals: map[string]any{}}
			for d.More() {
				kt, err := d.Token()
				if err != nil {
					return nil, err
				}
				k := kt.(string)
				if _, dup := o.vals[k]; dup {
					return nil, fmt.Errorf("duplicate key %q", k)
				}
				v, err := decodeValue(d, depth+1)
				if err != nil {
					return nil, err
				}
				o.keys = append(o.keys, k)
				o.vals[k] = v
			}
			if _, err := d.Token(); err != nil {
				return nil, err
			}
			return o, nil
		case '[':
			a := []any{}
			for d.More() {
				v, err := decodeValue(d, depth+1)
				if err != nil {
					return nil, err
				}
				a = append(a, v)
			}
			if _, err := d.Token(); err != nil {
				return nil, err
			}
			return a, nil
		}
		return nil, fmt.Errorf("unexpected %v", t)
	default:
		return t, nil
	}
}

// encodeJSON writes v (as decodeOrdered returns it) as compact JSON, keys in order.
func encodeJSON(b *strings.Builder, v any) {
	switch v := v.(type) {
	case *object:
		b.WriteByte('{')
		for i, k := range v.keys {
			if i > 0 {
				b.WriteByte(',')
			}
			encodeString(b, k)
			b.WriteByte(':')
			encodeJSON(b, v.vals[k])
		}
		b.WriteByte('}')
	case []any:
		b.WriteByte('[')
		for i, x := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			encodeJSON(b, x)
		}
		b.WriteByte(']')
	case string:
		encodeString(b, v)
	case json.Number:
		b.WriteString(v.String())
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case nil:
		b.WriteString("null")
	}
}

func encodeString(b *strings.Builder, s string) {
	var buf bytes.Buffer
	e := json.NewEncoder(&buf)
	e.SetEscapeHTML(false)
	e.Encode(s) // a string always encodes
	b.Write(bytes.TrimRight(buf.Bytes(), "\n"))
}

// jsonEqual reports whether two decoded values are equal as JSON values (numbers by value).
func jsonEqual(a, b any) bool {
	switch a := a.(type) {
	case *object:
		o, ok := b.(*object)
		if !ok || len(o.keys) != len(a.keys) {
			return false
		}
		for _, k := range a.keys {
			bv, ok := o.vals[k]
			if !ok || !jsonEqual(a.vals[k], bv) {
				return false
			}
		}
		return true
	case []any:
		o, ok := b.([]any)
		if !ok || len(o) != len(a) {
			return false
		}
		for i := range a {
			if !jsonEqual(a[i], o[i]) {
				return false
			}
		}
		return true
	case json.Number:
		o, ok := b.(json.Number)
		if !ok {
			return false
		}
		if a == o {
			return true
		}
		x, err1 := a.Float64()
		y, err2 := o.Float64()
		return err1 == nil && err2 == nil && x == y
	default:
		return a == b
	}
}
