package grammar

import (
	"errors"
	"testing"
)

// FuzzParseGBNF: any text parses to a grammar or a *SyntaxError, never a panic; a grammar that
// parses builds an automaton whose masks and steps over a byte vocabulary agree.
func FuzzParseGBNF(f *testing.F) {
	for _, c := range gbnfCases {
		f.Add(c.src, "")
		for _, s := range c.accept {
			f.Add(c.src, s)
		}
	}
	v := byteVocab(f)
	f.Fuzz(func(t *testing.T, src, text string) {
		g, err := ParseGBNF(src)
		if err != nil {
			var se *SyntaxError
			if !errors.As(err, &se) {
				t.Fatalf("error %v is not a *SyntaxError", err)
			}
			return
		}
		a, err := NewAutomaton(g, v, 0)
		if err != nil {
			if !errors.Is(err, ErrAmbiguous) {
				t.Fatal(err)
			}
			return
		}
		m := a.NewMatcher()
		for i := 0; i < len(text) && i < 64; i++ {
			mask, err := m.Mask()
			if err != nil {
				if errors.Is(err, ErrDeadEnd) || errors.Is(err, ErrAmbiguous) {
					return
				}
				t.Fatal(err)
			}
			b := text[i]
			allowed := mask[b>>6]>>(b&63)&1 != 0
			err = m.Accept(int32(b))
			if allowed != (err == nil) {
				t.Fatalf("byte %q: mask says %v, Accept says %v", b, allowed, err)
			}
			if err != nil {
				return
			}
		}
	})
}

// FuzzSchemaToGBNF: any bytes compile to a grammar or a *SchemaError, never a panic, and a
// grammar the compiler writes always parses.
func FuzzSchemaToGBNF(f *testing.F) {
	for _, c := range schemaCases {
		f.Add([]byte(c.schema))
	}
	f.Add([]byte(`{"type":"object","properties":{"a b":{"enum":["\u0000",1e5]}},"additionalProperties":{"pattern":"^[\\w-]{2}(x|y)?$"}}`))
	f.Fuzz(func(t *testing.T, schema []byte) {
		text, err := SchemaToGBNF(schema)
		if err != nil {
			var se *SchemaError
			if !errors.As(err, &se) {
				t.Fatalf("error %v is not a *SchemaError", err)
			}
			return
		}
		if _, err := ParseGBNF(text); err != nil {
			t.Fatalf("schema %s compiles to a grammar that does not parse: %v\n%s", schema, err, text)
		}
	})
}
