package grammar

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// regexToGBNF translates a JSON Schema pattern to a GBNF expression for the content of a JSON
// string (between the quotes) whose decoded text the pattern matches in full. Characters that
// JSON must escape are written escaped. Supported: literals, escapes (\d \w \s \D \W \S, \n \t
// \r \f \v, \xHH, \uHHHH, escaped metacharacters), classes with ranges and negation, '.',
// groups ( ) and (?: ), alternation, the quantifiers * + ? {m} {m,} {m,n} (a lazy '?' after
// one is accepted: it changes no match), '^' at the start and '$' at the end. A pattern
// without anchors still generates only strings it matches whole, which a search matches too.
func regexToGBNF(pattern string) (string, error) {
	p := &regexParser{src: pattern}
	if strings.HasPrefix(p.src, "^") {
		p.pos++
	}
	e, err := p.alternation(0)
	if err != nil {
		return "", err
	}
	if p.pos < len(p.src) && p.src[p.pos] == '$' && p.pos == len(p.src)-1 {
		p.pos++
	}
	if p.pos < len(p.src) {
		return "", p.errorf("unexpected %q", p.src[p.pos:p.pos+1])
	}
	return e, nil
}

type regexParser struct {
	src string
	pos int
}

func (p *regexParser) errorf(format string, args ...any) error {
	return fmt.Errorf("at offset %d: %s", p.pos, fmt.Sprintf(format, args...))
}

func (p *regexParser) alternation(depth int) (string, error) {
	if depth > maxNesting {
		return "", p.errorf("groups nested deeper than %d", maxNesting)
	}
	var alts []string
	for {
		s, err := p.sequence(depth)
		if err != nil {
			return "", err
		}
		alts = append(alts, s)
		if p.pos < len(p.src) && p.src[p.pos] == '|' {
			p.pos++
			continue
		}
		break
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	return "(" + strings.Join(alts, " | ") + ")", nil
}

func (p *regexParser) sequence(depth int) (string, error) {
	var parts []string
	for p.pos < len(p.src) {
		c := p.src[p.pos]
		if c == '|' || c == ')' {
			break
		}
		if c == '$' {
			if p.pos == len(p.src)-1 && depth == 0 {
				break
			}
			return "", p.errorf("'$' is supported only at the end of the pattern")
		}
		atom, err := p.atom(depth)
		if err != nil {
			return "", err
		}
		atom, err = p.quantifier(atom)
		if err != nil {
			return "", err
		}
		parts = append(parts, atom)
	}
	if len(parts) == 0 {
		return `""`, nil
	}
	return strings.Join(parts, " "), nil
}

func (p *regexParser) quantifier(atom string) (string, error) {
	if p.pos >= len(p.src) {
		return atom, nil
	}
	var q string
	switch c := p.src[p.pos]; c {
	case '*', '+', '?':
		p.pos++
		q = string(c)
	case '{':
		end := strings.IndexByte(p.src[p.pos:], '}')
		if end < 0 {
			return "", p.errorf("unterminated {")
		}
		body := p.src[p.pos+1 : p.pos+end]
		lo, hi, ok := strings.Cut(body, ",")
		m, err := strconv.Atoi(lo)
		if err != nil || m < 0 || m > MaxRepeat {
			return "", p.errorf("bad repetition {%s}", body)
		}
		q = fmt.Sprintf("{%d}", m)
		if ok {
			if hi == "" {
				q = fmt.Sprintf("{%d,}", m)
			} else {
				n, err := strconv.Atoi(hi)
				if err != nil || n < m || n > MaxRepeat {
					return "", p.errorf("bad repetition {%s}", body)
				}
				q = fmt.Sprintf("{%d,%d}", m, n)
			}
		}
		p.pos += end + 1
	default:
		return atom, nil
	}
	if p.pos < len(p.src) && p.src[p.pos] == '?' {
		p.pos++ // lazy: the same strings match
	}
	if p.pos < len(p.src) && strings.IndexByte("*+?{", p.src[p.pos]) >= 0 {
		return "", p.errorf("quantifier after a quantifier")
	}
	return "(" + atom + ")" + q, nil
}

func (p *regexParser) atom(depth int) (string, error) {
	c := p.src[p.pos]
	switch c {
	case '(':
		p.pos++
		if strings.HasPrefix(p.src[p.pos:], "?:") {
			p.pos += 2
		} else if p.pos < len(p.src) && p.src[p.pos] == '?' {
			return "", p.errorf("group modifiers other than (?: are not supported")
		}
		e, err := p.alternation(depth + 1)
		if err != nil {
			return "", err
		}
		if p.pos >= len(p.src) || p.src[p.pos] != ')' {
			return "", p.errorf("missing )")
		}
		p.pos++
		return "(" + e + ")", nil
	case '[':
		rs, err := p.class()
		if err != nil {
			return "", err
		}
		return jsonCharsExpr(rs)
	case '.':
		p.pos++
		return jsonCharsExpr(normalizeRanges([]runeRange{{'\n', '\n'}}, true))
	case '^':
		return "", p.errorf("'^' is supported only at the start of the pattern")
	case '*', '+', '?', '{':
		return "", p.errorf("quantifier with nothing to repeat")
	case '\\':
		rs, err := p.escape(false)
		if err != nil {
			return "", err
		}
		return jsonCharsExpr(rs)
	}
	r, n := utf8.DecodeRuneInString(p.src[p.pos:])
	p.pos += n
	return jsonCharsExpr([]runeRange{{r, r}})
}

// Shorthand classes.
var (
	digitRanges = []runeRange{{'0', '9'}}
	wordRanges  = []runeRange{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}
	spaceRanges = []runeRange{{'\t', '\r'}, {' ', ' '}}
)

// escape reads a backslash escape and returns the characters it stands for.
func (p *regexParser) escape(inClass bool) ([]runeRange, error) {
	p.pos++
	if p.pos >= len(p.src) {
		return nil, p.errorf("trailing backslash")
	}
	c := p.src[p.pos]
	p.pos++
	one := func(r rune) []runeRange { return []runeRange{{r, r}} }
	switch c {
	case 'd':
		return digitRanges, nil
	case 'w':
		return wordRanges, nil
	case 's':
		return spaceRanges, nil
	case 'D':
		return normalizeRanges(digitRanges, true), nil
	case 'W':
		return normalizeRanges(wordRanges, true), nil
	case 'S':
		return normalizeRanges(spaceRanges, true), nil
	case 'n':
		return one('\n'), nil
	case 't':
		return one('\t'), nil
	case 'r':
		return one('\r'), nil
	case 'f':
		return one('\f'), nil
	case 'v':
		return one('\v'), nil
	case 'x', 'u':
		n := 2
		if c == 'u' {
			n = 4
		}
		if p.pos+n > len(p.src) {
			return nil, p.errorf("\\%c needs %d hexadecimal digits", c, n)
		}
		v, err := strconv.ParseUint(p.src[p.pos:p.pos+n], 16, 32)
		if err != nil {
			return nil, p.errorf("\\%c needs %d hexadecimal digits", c, n)
		}
		p.pos += n
		if v >= surrogateLo && v <= surrogateHi {
			return nil, p.errorf("surrogate code point U+%04X", v)
		}
		return one(rune(v)), nil
	}
	if strings.IndexByte(`\.^$|?*+()[]{}/-"'`, c) >= 0 {
		return one(rune(c)), nil
	}
	if inClass && c == 'b' {
		return one('\b'), nil
	}
	return nil, p.errorf("escape \\%c is not supported", c)
}

// class reads a bracketed class and returns its characters (negation applied).
func (p *regexParser) class() ([]runeRange, error) {
	p.pos++ // [
	neg := false
	if p.pos < len(p.src) && p.src[p.pos] == '^' {
		neg = true
		p.pos++
	}
	var rs []runeRange
	first := true
	for {
		if p.pos >= len(p.src) {
			return nil, p.errorf("unterminated [")
		}
		c := p.src[p.pos]
		if c == ']' && !first {
			p.pos++
			break
		}
		first = false
		var lo []runeRange
		if c == '\\' {
			var err error
			if lo, err = p.escape(true); err != nil {
				return nil, err
			}
		} else {
			if c == '[' && strings.HasPrefix(p.src[p.pos:], "[:") {
				return nil, p.errorf("POSIX classes are not supported")
			}
			r, n := utf8.DecodeRuneInString(p.src[p.pos:])
			p.pos += n
			lo = []runeRange{{r, r}}
		}
		if len(lo) == 1 && lo[0].lo == lo[0].hi && p.pos+1 < len(p.src) && p.src[p.pos] == '-' && p.src[p.pos+1] != ']' {
			p.pos++
			var hi []runeRange
			if p.src[p.pos] == '\\' {
				var err error
				if hi, err = p.escape(true); err != nil {
					return nil, err
				}
			} else {
				r, n := utf8.DecodeRuneInString(p.src[p.pos:])
				p.pos += n
				hi = []runeRange{{r, r}}
			}
			if len(hi) != 1 || hi[0].lo != hi[0].hi || hi[0].lo < lo[0].lo {
				return nil, p.errorf("bad range in class")
			}
			rs = append(rs, runeRange{lo[0].lo, hi[0].lo})
			continue
		}
		rs = append(rs, lo...)
	}
	out := normalizeRanges(rs, neg)
	if len(out) == 0 {
		return nil, p.errorf("class matches no character")
	}
	return out, nil
}

// jsonCharsExpr returns a GBNF expression for one character among rs as it appears inside a
// JSON string: unescaped where JSON allows, escaped where it must be.
func jsonCharsExpr(rs []runeRange) (string, error) {
	rs = normalizeRanges(rs, false)
	var safe []runeRange
	var alts []string
	for _, r := range rs {
		for lo := r.lo; lo <= r.hi; {
			if lo < 0x20 || lo == '"' || lo == '\\' {
				alts = append(alts, gbnfLiteral(jsonEscape(lo)))
				lo++
				continue
			}
			hi := r.hi
			if lo < '"' {
				hi = min(hi, '"'-1)
			} else if lo < '\\' {
				hi = min(hi, '\\'-1)
			}
			safe = append(safe, runeRange{lo, hi})
			lo = hi + 1
		}
	}
	if len(safe) > 0 {
		var b strings.Builder
		b.WriteByte('[')
		for _, r := range safe {
			b.WriteString(classChar(r.lo))
			if r.hi > r.lo {
				b.WriteByte('-')
				b.WriteString(classChar(r.hi))
			}
		}
		b.WriteByte(']')
		alts = append([]string{b.String()}, alts...)
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	return "(" + strings.Join(alts, " | ") + ")", nil
}

// jsonEscape returns the JSON escape of r, one of the characters JSON must escape.
func jsonEscape(r rune) string {
	switch r {
	case '"':
		return `\"`
	case '\\':
		return `\\`
	case '\n':
		return `\n`
	case '\t':
		return `\t`
	case '\r':
		return `\r`
	case '\b':
		return `\b`
	case '\f':
		return `\f`
	}
	return fmt.Sprintf(`\u%04x`, r)
}
