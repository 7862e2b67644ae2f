package grammar

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// elemKind is the kind of one lowered grammar element.
type elemKind uint8

const (
	kEnd   elemKind = iota // end of an alternative
	kRef                   // reference to rule arg
	kBytes                 // one byte from set arg
)

// elem is one element of a lowered grammar: alternatives are runs of elements ending in kEnd.
type elem struct {
	kind elemKind
	arg  int32
}

// byteSet is a set of byte values, bit b of word b/64.
type byteSet [4]uint64

func (s *byteSet) has(b byte) bool { return s[b>>6]&(1<<(b&63)) != 0 }
func (s *byteSet) add(lo, hi byte) {
	for c := int(lo); c <= int(hi); c++ {
		s[c>>6] |= 1 << (c & 63)
	}
}

// Grammar is a parsed grammar lowered to bytes: every character class and literal is a
// sequence of byte-set elements. It is immutable and safe for concurrent use.
type Grammar struct {
	text  string
	names []string  // [rules]
	alts  [][]int32 // [rules][alternatives]: start of each alternative in elems
	elems []elem
	sets  []byteSet
	root  int32
	rest  []int32 // [elems] fewest bytes that finish the alternative from each position
}

// String returns the grammar's GBNF text.
func (g *Grammar) String() string { return g.text }

// Rules returns the number of rules after lowering (those written plus those that groups,
// repetitions and non-ASCII classes add).
func (g *Grammar) Rules() int { return len(g.names) }

// ParseGBNF parses a grammar in llama.cpp's GBNF format and lowers it. The start rule is
// "root". Errors are *SyntaxError with the line and column of the fault: bad syntax, a rule
// defined twice or referenced but not defined, a missing root, a repetition beyond MaxRepeat,
// a grammar larger than MaxElements, a surrogate code point in a literal, a character class
// that matches nothing, left recursion (a rule that can reach itself, through rules that may
// match nothing, before consuming anything and not in tail position: the stack would grow
// without bound, which llama.cpp rejects too), and a root that matches no finite text.
func ParseGBNF(src string) (*Grammar, error) {
	defs, err := parseGBNF(src)
	if err != nil {
		return nil, err
	}
	return lower(src, defs)
}

type lowerer struct {
	p        *gbnfParser // for positions in errors
	defs     []ruleDef
	index    map[string]int
	names    []string
	rules    [][][]elem // [rule][alternative][element], without the kEnd
	setIndex map[byteSet]int32
	sets     []byteSet
	classes  map[string]int32 // normalised class → its rule
	size     int              // elements so far, ends included
}

func lower(src string, defs []ruleDef) (g *Grammar, err error) {
	l := &lowerer{
		p:        &gbnfParser{src: src},
		defs:     defs,
		index:    make(map[string]int, len(defs)),
		setIndex: map[byteSet]int32{},
		classes:  map[string]int32{},
	}
	defer func() {
		if r := recover(); r != nil {
			pe, ok := r.(parseError)
			if !ok {
				panic(r)
			}
			g, err = nil, pe.err
		}
	}()
	for i, d := range defs {
		l.index[d.name] = i
		l.names = append(l.names, d.name)
		l.rules = append(l.rules, nil)
	}
	root, ok := l.index["root"]
	if !ok {
		return nil, &SyntaxError{Line: 1, Col: 1, Msg: `grammar has no "root" rule`}
	}
	for i, d := range defs {
		alts := make([][]elem, len(d.alts))
		for j, seq := range d.alts {
			alts[j] = l.sequence(d.name, seq)
		}
		l.rules[i] = alts
		l.grow(d.off, len(alts))
	}
	g = &Grammar{text: src, names: l.names, sets: l.sets, root: int32(root)}
	g.alts = make([][]int32, len(l.rules))
	g.elems = make([]elem, 0, l.size)
	for r, alts := range l.rules {
		g.alts[r] = make([]int32, len(alts))
		for j, a := range alts {
			g.alts[r][j] = int32(len(g.elems))
			g.elems = append(g.elems, a...)
			g.elems = append(g.elems, elem{kind: kEnd})
		}
	}
	if r, ok := g.leftRecursive(); ok {
		off := 0
		if r < len(defs) {
			off = defs[r].off
		}
		return nil, l.p.errAt(off, fmt.Sprintf("left recursion: rule %q can reach itself before consuming any text", g.names[r]))
	}
	if !g.productive()[g.root] {
		return nil, l.p.errAt(defs[root].off, `rule "root" matches no finite text`)
	}
	g.rest = g.minRest()
	return g, nil
}

func (l *lowerer) grow(off, n int) {
	if l.size += n; l.size > MaxElements {
		l.p.fail(off, "grammar lowers to more than %d elements", MaxElements)
	}
}

func (l *lowerer) newRule(name string) int32 {
	l.names = append(l.names, fmt.Sprintf("%s_%d", name, len(l.names)))
	l.rules = append(l.rules, nil)
	return int32(len(l.rules) - 1)
}

func (l *lowerer) setElem(s byteSet) elem {
	i, ok := l.setIndex[s]
	if !ok {
		i = int32(len(l.sets))
		l.sets = append(l.sets, s)
		l.setIndex[s] = i
	}
	return elem{kind: kBytes, arg: i}
}

func (l *lowerer) sequence(name string, seq []item) []elem {
	var out []elem
	for i := range seq {
		it := &seq[i]
		u := l.unit(name, it)
		out = l.repeat(name, out, u, it)
	}
	return out
}

// unit lowers one item without its repetition.
func (l *lowerer) unit(name string, it *item) []elem {
	switch it.kind {
	case itLit:
		var out []elem
		var buf [4]byte
		for _, r := range it.lit {
			if r >= surrogateLo && r <= surrogateHi {
				l.p.fail(it.off, "literal holds surrogate code point U+%04X, which UTF-8 cannot encode", r)
			}
			n := utf8.EncodeRune(buf[:], r)
			for _, b := range buf[:n] {
				var s byteSet
				s.add(b, b)
				out = append(out, l.setElem(s))
			}
		}
		l.grow(it.off, len(out))
		return out
	case itClass:
		return []elem{l.class(name, it)}
	case itRef:
		r, ok := l.index[it.name]
		if !ok {
			l.p.fail(it.off, "rule %q is not defined", it.name)
		}
		l.grow(it.off, 1)
		return []elem{{kind: kRef, arg: int32(r)}}
	case itGroup:
		if len(it.alts) == 1 {
			return l.sequence(name, it.alts[0])
		}
		r := l.newRule(name)
		alts := make([][]elem, len(it.alts))
		for j, seq := range it.alts {
			alts[j] = l.sequence(name, seq)
		}
		l.rules[r] = alts
		l.grow(it.off, len(alts)+1)
		return []elem{{kind: kRef, arg: r}}
	}
	panic("grammar: unknown item kind")
}

// class lowers a character class to one byte-set element when it holds only ASCII, else to a
// reference to a rule whose alternatives are the UTF-8 byte sequences of its code points.
func (l *lowerer) class(name string, it *item) elem {
	rs := normalizeRanges(it.ranges, it.neg)
	if len(rs) == 0 {
		l.p.fail(it.off, "character class matches no character")
	}
	l.grow(it.off, 1)
	if rs[len(rs)-1].hi < 0x80 {
		var s byteSet
		for _, r := range rs {
			s.add(byte(r.lo), byte(r.hi))
		}
		return l.setElem(s)
	}
	var key strings.Builder
	for _, r := range rs {
		key.WriteString(strconv.Itoa(int(r.lo)))
		key.WriteByte('-')
		key.WriteString(strconv.Itoa(int(r.hi)))
		key.WriteByte(',')
	}
	if r, ok := l.classes[key.String()]; ok {
		return elem{kind: kRef, arg: r}
	}
	var ascii byteSet
	hasASCII := false
	var seqs [][]byteRange
	for _, r := range rs {
		if r.lo < 0x80 {
			ascii.add(byte(r.lo), byte(min(r.hi, 0x7F)))
			hasASCII = true
			r.lo = 0x80
		}
		seqs = utf8Sequences(seqs, r.lo, r.hi)
	}
	r := l.newRule(name)
	var alts [][]elem
	if hasASCII {
		alts = append(alts, []elem{l.setElem(ascii)})
	}
	for _, seq := range seqs {
		a := make([]elem, len(seq))
		for i, br := range seq {
			var s byteSet
			s.add(br.lo, br.hi)
			a[i] = l.setElem(s)
		}
		alts = append(alts, a)
		l.grow(it.off, len(a)+1)
	}
	l.rules[r] = alts
	l.classes[key.String()] = r
	return elem{kind: kRef, arg: r}
}

// repeat appends u repeated as it says: u min times, then for an unbounded maximum a rule
// R ::= u R | (empty), else a chain R_k ::= u R_(k-1) | (empty) of max-min optional copies,
// as llama.cpp's handle_repetitions rewrites S{m,n}.
func (l *lowerer) repeat(name string, out, u []elem, it *item) []elem {
	if it.min == 1 && it.max == 1 {
		return append(out, u...)
	}
	n := it.min
	if it.max > n {
		n = it.max
	}
	l.grow(it.off, (n+1)*(len(u)+3))
	for i := 0; i < it.min; i++ {
		out = append(out, u...)
	}
	if len(u) == 0 {
		return out
	}
	if it.max < 0 {
		r := l.newRule(name)
		l.rules[r] = [][]elem{append(append([]elem{}, u...), elem{kind: kRef, arg: r}), {}}
		return append(out, elem{kind: kRef, arg: r})
	}
	var last int32 = -1
	for k := 0; k < it.max-it.min; k++ {
		r := l.newRule(name)
		a := append([]elem{}, u...)
		if last >= 0 {
			a = append(a, elem{kind: kRef, arg: last})
		}
		l.rules[r] = [][]elem{a, {}}
		last = r
	}
	if last >= 0 {
		out = append(out, elem{kind: kRef, arg: last})
	}
	return out
}

// nullable reports for each rule whether it matches the empty string.
func (g *Grammar) nullable() []bool {
	null := make([]bool, len(g.alts))
	for changed := true; changed; {
		changed = false
		for r, alts := range g.alts {
			if null[r] {
				continue
			}
			for _, a := range alts {
				if g.seqNullable(a, null) {
					null[r] = true
					changed = true
					break
				}
			}
		}
	}
	return null
}

func (g *Grammar) seqNullable(p int32, null []bool) bool {
	for ; g.elems[p].kind != kEnd; p++ {
		if e := g.elems[p]; e.kind == kBytes || !null[e.arg] {
			return false
		}
	}
	return true
}

// productive reports for each rule whether it matches some finite string.
func (g *Grammar) productive() []bool {
	prod := make([]bool, len(g.alts))
	for changed := true; changed; {
		changed = false
		for r, alts := range g.alts {
			if prod[r] {
				continue
			}
		alt:
			for _, a := range alts {
				for p := a; g.elems[p].kind != kEnd; p++ {
					if e := g.elems[p]; e.kind == kRef && !prod[e.arg] {
						continue alt
					}
				}
				prod[r] = true
				changed = true
				break
			}
		}
	}
	return prod
}

// leftRecursive finds a rule that can reach itself through references each preceded in its
// alternative only by nullable elements, at least one of them not in tail position (a tail
// reference replaces its caller on the stack, so a cycle of those alone does not grow it).
// It returns a rule on such a cycle.
func (g *Grammar) leftRecursive() (int, bool) {
	null := g.nullable()
	type edge struct {
		to   int32
		tail bool
	}
	adj := make([][]edge, len(g.alts))
	for r, alts := range g.alts {
		for _, a := range alts {
			for p := a; g.elems[p].kind == kRef; p++ {
				e := g.elems[p]
				adj[r] = append(adj[r], edge{e.arg, g.elems[p+1].kind == kEnd})
				if !null[e.arg] {
					break
				}
			}
		}
	}
	// Tarjan's strongly connected components, iteratively.
	n := len(g.alts)
	index := make([]int32, n)
	low := make([]int32, n)
	comp := make([]int32, n)
	onStack := make([]bool, n)
	for i := range index {
		index[i] = -1
		comp[i] = -1
	}
	var stack []int32
	type frame struct {
		v    int32
		next int
	}
	var next int32
	var ncomp int32
	for s := 0; s < n; s++ {
		if index[s] >= 0 {
			continue
		}
		calls := []frame{{int32(s), 0}}
		index[s], low[s] = next, next
		next++
		stack = append(stack, int32(s))
		onStack[s] = true
		for len(calls) > 0 {
			f := &calls[len(calls)-1]
			if f.next < len(adj[f.v]) {
				w := adj[f.v][f.next].to
				f.next++
				if index[w] < 0 {
					index[w], low[w] = next, next
					next++
					stack = append(stack, w)
					onStack[w] = true
					calls = append(calls, frame{w, 0})
				} else if onStack[w] {
					low[f.v] = min(low[f.v], index[w])
				}
				continue
			}
			v := f.v
			calls = calls[:len(calls)-1]
			if len(calls) > 0 {
				u := calls[len(calls)-1].v
				low[u] = min(low[u], low[v])
			}
			if low[v] == index[v] {
				for {
					w := stack[len(stack)-1]
					stack = stack[:len(stack)-1]
					onStack[w] = false
					comp[w] = ncomp
					if w == v {
						break
					}
				}
				ncomp++
			}
		}
	}
	for r, es := range adj {
		for _, e := range es {
			if !e.tail && comp[e.to] == comp[r] {
				return r, true
			}
		}
	}
	return 0, false
}
