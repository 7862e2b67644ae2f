package grammar

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// Limits on what a grammar may make the compiler build. They bound memory for any input.
const (
	// MaxRepeat is the largest count a repetition {m,n} may name.
	MaxRepeat = 10000
	// MaxElements is the most elements (terminals, references and ends) a grammar may lower to.
	MaxElements = 1 << 20
	// MaxSource is the longest grammar text accepted, in bytes.
	MaxSource = 1 << 22
	// maxNesting bounds parenthesis nesting, so that parsing recursion stays shallow.
	maxNesting = 256
)

// SyntaxError is a GBNF grammar that does not parse, or that names something it does not
// define. Line and Col count from 1; Col counts bytes.
type SyntaxError struct {
	Line, Col int
	Msg       string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("grammar: %d:%d: %s", e.Line, e.Col, e.Msg)
}

// itemKind is what one item of a GBNF sequence is.
type itemKind uint8

const (
	itLit   itemKind = iota // a string literal: lit
	itClass                 // a character class: ranges, neg ('.' is a negated empty class)
	itRef                   // a rule reference: name
	itGroup                 // a parenthesised group: alts
)

// item is one element of a parsed GBNF sequence, with its repetition.
type item struct {
	kind     itemKind
	lit      []rune
	ranges   []runeRange // inclusive, as written
	neg      bool
	name     string
	alts     [][]item
	min, max int // repetition; 1,1 when none; max -1 when unbounded
	off      int // byte offset in the source, for errors
}

type runeRange struct{ lo, hi rune }

// ruleDef is one parsed rule.
type ruleDef struct {
	name string
	alts [][]item
	off  int
}

// gbnfParser is a recursive-descent parser over GBNF text, following the productions of
// llama.cpp's llama_grammar_parser (src/llama-grammar.cpp at c392e509): names are
// [a-zA-Z0-9-]+, a rule ends at a newline unless inside parentheses or after '|', '#' starts
// a comment to the end of the line.
type gbnfParser struct {
	src   string
	pos   int
	depth int
	rules []ruleDef
	index map[string]int
}

type parseError struct{ err *SyntaxError }

// fail stops the parse with an error at byte offset off.
func (p *gbnfParser) fail(off int, format string, args ...any) {
	panic(parseError{p.errAt(off, fmt.Sprintf(format, args...))})
}

func (p *gbnfParser) errAt(off int, msg string) *SyntaxError {
	line, col := 1, 1
	for i := 0; i < off && i < len(p.src); i++ {
		if p.src[i] == '\n' {
			line++
			col = 1
		} else {
			col++
		}
	}
	return &SyntaxError{Line: line, Col: col, Msg: msg}
}

// parseGBNF parses src into rule definitions. Errors are *SyntaxError.
func parseGBNF(src string) (rules []ruleDef, err error) {
	if len(src) > MaxSource {
		return nil, &SyntaxError{Line: 1, Col: 1, Msg: fmt.Sprintf("grammar of %d bytes exceeds %d", len(src), MaxSource)}
	}
	p := &gbnfParser{src: src, index: map[string]int{}}
	defer func() {
		if r := recover(); r != nil {
			pe, ok := r.(parseError)
			if !ok {
				panic(r)
			}
			rules, err = nil, pe.err
		}
	}()
	p.space(true)
	for p.pos < len(p.src) {
		p.rule()
	}
	if len(p.rules) == 0 {
		return nil, &SyntaxError{Line: 1, Col: 1, Msg: "empty grammar: no rules"}
	}
	return p.rules, nil
}

func (p *gbnfParser) peek(k int) byte {
	if p.pos+k < len(p.src) {
		return p.src[p.pos+k]
	}
	return 0
}

func isWordChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-'
}

// space skips blanks, tabs and comments, and newlines when newlineOK.
func (p *gbnfParser) space(newlineOK bool) {
	for p.pos < len(p.src) {
		switch c := p.src[p.pos]; {
		case c == ' ' || c == '\t':
			p.pos++
		case c == '#':
			for p.pos < len(p.src) && p.src[p.pos] != '\n' && p.src[p.pos] != '\r' {
				p.pos++
			}
		case newlineOK && (c == '\n' || c == '\r'):
			p.pos++
		default:
			return
		}
	}
}

func (p *gbnfParser) name() string {
	start := p.pos
	for p.pos < len(p.src) && isWordChar(p.src[p.pos]) {
		p.pos++
	}
	if p.pos == start {
		p.fail(start, "expected a rule name")
	}
	return p.src[start:p.pos]
}

func (p *gbnfParser) rule() {
	off := p.pos
	name := p.name()
	p.space(false)
	if !(p.peek(0) == ':' && p.peek(1) == ':' && p.peek(2) == '=') {
		p.fail(p.pos, "expected ::= after rule name %q", name)
	}
	p.pos += 3
	p.space(true)
	alts := p.alternates(false)
	switch p.peek(0) {
	case '\r':
		p.pos++
		if p.peek(0) == '\n' {
			p.pos++
		}
	case '\n':
		p.pos++
	case 0:
		if p.pos < len(p.src) {
			p.fail(p.pos, "unexpected NUL byte")
		}
	default:
		p.fail(p.pos, "expected newline or end of grammar, found %s", p.describe())
	}
	if _, dup := p.index[name]; dup {
		p.fail(off, "rule %q defined twice", name)
	}
	p.index[name] = len(p.rules)
	p.rules = append(p.rules, ruleDef{name: name, alts: alts, off: off})
	p.space(true)
}

// describe names the byte at the current position for an error message.
func (p *gbnfParser) describe() string {
	if p.pos >= len(p.src) {
		return "end of grammar"
	}
	r, _ := utf8.DecodeRuneInString(p.src[p.pos:])
	return strconv.QuoteRune(r)
}

func (p *gbnfParser) alternates(nested bool) [][]item {
	alts := [][]item{p.sequence(nested)}
	for p.peek(0) == '|' && p.pos < len(p.src) {
		p.pos++
		p.space(true)
		alts = append(alts, p.sequence(nested))
	}
	return alts
}

func (p *gbnfParser) sequence(nested bool) []item {
	var seq []item
	canRepeat := false // the last item may take a repetition operator
	repeat := func(off, lo, hi int) {
		if !canRepeat {
			p.fail(off, "repetition operator with nothing before it to repeat")
		}
		last := &seq[len(seq)-1]
		if last.min != 1 || last.max != 1 {
			// x*{2} and the like: repeat the repeated item as a group, as llama.cpp does.
			inner := *last
			*last = item{kind: itGroup, alts: [][]item{{inner}}, off: inner.off}
		}
		last.min, last.max = lo, hi
	}
	for p.pos < len(p.src) {
		off := p.pos
		c := p.src[p.pos]
		switch {
		case c == '"':
			p.pos++
			var lit []rune
			for {
				if p.pos >= len(p.src) {
					p.fail(off, "unterminated string literal")
				}
				if p.src[p.pos] == '"' {
					break
				}
				lit = append(lit, p.char())
			}
			p.pos++
			if len(lit) == 0 {
				// An empty literal matches the empty string and cannot be repeated.
				canRepeat = false
			} else {
				seq = append(seq, item{kind: itLit, lit: lit, min: 1, max: 1, off: off})
				canRepeat = true
			}
		case c == '[':
			p.pos++
			it := item{kind: itClass, min: 1, max: 1, off: off}
			if p.peek(0) == '^' {
				p.pos++
				it.neg = true
			}
			for {
				if p.pos >= len(p.src) {
					p.fail(off, "unterminated character class")
				}
				if p.src[p.pos] == ']' {
					break
				}
				lo := p.char()
				hi := lo
				if p.peek(0) == '-' && p.peek(1) != ']' {
					p.pos++
					if p.pos >= len(p.src) {
						p.fail(off, "unterminated character class")
					}
					roff := p.pos
					hi = p.char()
					if hi < lo {
						p.fail(roff, "character range %s-%s is reversed", strconv.QuoteRune(lo), strconv.QuoteRune(hi))
					}
				}
				it.ranges = append(it.ranges, runeRange{lo, hi})
			}
			p.pos++
			seq = append(seq, it)
			canRepeat = true
		case isWordChar(c):
			seq = append(seq, item{kind: itRef, name: p.name(), min: 1, max: 1, off: off})
			canRepeat = true
		case c == '(':
			p.pos++
			if p.depth++; p.depth > maxNesting {
				p.fail(off, "parentheses nested deeper than %d", maxNesting)
			}
			p.space(true)
			alts := p.alternates(true)
			if p.peek(0) != ')' || p.pos >= len(p.src) {
				p.fail(p.pos, "expected ')' to close the group opened at %s, found %s", p.where(off), p.describe())
			}
			p.pos++
			p.depth--
			seq = append(seq, item{kind: itGroup, alts: alts, min: 1, max: 1, off: off})
			canRepeat = true
		case c == '.':
			p.pos++
			seq = append(seq, item{kind: itClass, neg: true, min: 1, max: 1, off: off})
			canRepeat = true
		case c == '*':
			p.pos++
			repeat(off, 0, -1)
		case c == '+':
			p.pos++
			repeat(off, 1, -1)
		case c == '?':
			p.pos++
			repeat(off, 0, 1)
		case c == '{':
			p.pos++
			p.space(nested)
			lo := p.int()
			hi := lo
			p.space(nested)
			switch p.peek(0) {
			case '}':
			case ',':
				p.pos++
				p.space(nested)
				hi = -1
				if c := p.peek(0); c >= '0' && c <= '9' {
					hoff := p.pos
					hi = p.int()
					if hi < lo {
						p.fail(hoff, "repetition {%d,%d}: maximum below minimum", lo, hi)
					}
					p.space(nested)
				}
				if p.peek(0) != '}' || p.pos >= len(p.src) {
					p.fail(p.pos, "expected '}' in repetition, found %s", p.describe())
				}
			default:
				p.fail(p.pos, "expected ',' or '}' in repetition, found %s", p.describe())
			}
			p.pos++
			repeat(off, lo, hi)
		default:
			return seq
		}
		p.space(nested)
	}
	return seq
}

// where formats a byte offset as line:column.
func (p *gbnfParser) where(off int) string {
	e := p.errAt(off, "")
	return fmt.Sprintf("%d:%d", e.Line, e.Col)
}

func (p *gbnfParser) int() int {
	start := p.pos
	v := 0
	for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
		v = v*10 + int(p.src[p.pos]-'0')
		if v > MaxRepeat {
			p.fail(start, "repetition count exceeds %d", MaxRepeat)
		}
		p.pos++
	}
	if p.pos == start {
		p.fail(start, "expected a number, found %s", p.describe())
	}
	return v
}

// char reads one character of a literal or class: an escape or a UTF-8 encoded code point.
func (p *gbnfParser) char() rune {
	off := p.pos
	c := p.src[p.pos]
	if c != '\\' {
		r, n := utf8.DecodeRuneInString(p.src[p.pos:])
		if r == utf8.RuneError && n <= 1 {
			p.fail(off, "invalid UTF-8")
		}
		p.pos += n
		return r
	}
	if p.pos+1 >= len(p.src) {
		p.fail(off, "unterminated escape")
	}
	e := p.src[p.pos+1]
	p.pos += 2
	switch e {
	case 'x':
		return p.hex(off, 2)
	case 'u':
		return p.hex(off, 4)
	case 'U':
		return p.hex(off, 8)
	case 't':
		return '\t'
	case 'r':
		return '\r'
	case 'n':
		return '\n'
	case '\\', '"', '[', ']':
		return rune(e)
	}
	r, _ := utf8.DecodeRuneInString(p.src[p.pos-1:])
	p.fail(off, "unknown escape \\%c", r)
	return 0
}

func (p *gbnfParser) hex(off, n int) rune {
	if p.pos+n > len(p.src) {
		p.fail(off, "expected %d hexadecimal digits", n)
	}
	var v uint64
	for i := 0; i < n; i++ {
		c := p.src[p.pos+i]
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			p.fail(p.pos+i, "expected %d hexadecimal digits", n)
		}
		v = v<<4 | uint64(d)
	}
	p.pos += n
	if v > utf8.MaxRune {
		p.fail(off, "code point U+%X beyond U+10FFFF", v)
	}
	return rune(v)
}
