package tokenizer

// Pre-tokenization for byte-level BPE: the text, as code points, is cut into words by a list of
// steps, each refining the previous cut. llama.cpp expresses each step as a regular expression;
// two of them (GPT-2's and LLaMA-3's) have hand-written matchers there, the rest run through
// std::regex in ECMAScript mode over a "collapsed" text. The matchers here reproduce both: the
// regular-expression steps are written out by hand with ECMAScript's leftmost, first-alternative
// semantics, and character classes follow what the collapsed text makes of them (see colL etc.).

// seg is a half-open range of code point indices.
type seg struct{ a, b int32 }

// splitFunc cuts c[a:b] into words, appending them to out in order; every code point of [a, b)
// ends up in exactly one word.
type splitFunc func(c []rune, a, b int32, out []seg) []seg

// outside is what llama.cpp's _get_cpt yields past the segment ends.
const outside rune = -1

// splitGPT2 is llama.cpp's unicode_regex_split_custom_gpt2, the matcher for
//
//	's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
func splitGPT2(c []rune, a, b int32, out []seg) []seg {
	cpt := func(p int32) rune {
		if p >= a && p < b {
			return c[p]
		}
		return outside
	}
	cls := func(p int32) uint8 {
		if p >= a && p < b {
			return class(c[p])
		}
		return clsNone
	}
	prev := a
	add := func(end int32) int32 {
		n := end - prev
		if n > 0 {
			out = append(out, seg{prev, end})
		}
		prev = end
		return n
	}
	for pos := a; pos < b; {
		r := c[pos]
		f := class(r)
		if r == '\'' && pos+1 < b {
			n := c[pos+1]
			if n == 's' || n == 't' || n == 'm' || n == 'd' {
				pos += add(pos + 2)
				continue
			}
			if pos+2 < b {
				nn := c[pos+2]
				if (n == 'r' && nn == 'e') || (n == 'v' && nn == 'e') || (n == 'l' && nn == 'l') {
					pos += add(pos + 3)
					continue
				}
			}
		}
		f2 := f
		if r == ' ' {
			f2 = cls(pos + 1)
		}
		if f2&clsCatMask == clsLetter {
			if r == ' ' {
				pos++
			}
			for f2&clsCatMask == clsLetter {
				pos++
				f2 = cls(pos)
			}
			add(pos)
			continue
		}
		if f2&clsCatMask == clsNumber {
			if r == ' ' {
				pos++
			}
			for f2&clsCatMask == clsNumber {
				pos++
				f2 = cls(pos)
			}
			add(pos)
			continue
		}
		if isOther(f2) {
			if r == ' ' {
				pos++
			}
			for isOther(f2) {
				pos++
				f2 = cls(pos)
			}
			add(pos)
			continue
		}
		nws := int32(0)
		for cls(pos+nws)&clsSpace != 0 {
			nws++
		}
		if nws > 1 && cpt(pos+nws) != outside {
			pos += nws - 1
			add(pos)
			continue
		}
		if nws > 0 {
			pos += nws
			add(pos)
			continue
		}
		pos++
		add(pos)
	}
	return out
}

// isOther reports [^\s\p{L}\p{N}] for a position inside the segment.
func isOther(f uint8) bool {
	if f == clsNone || f&clsSpace != 0 {
		return false
	}
	k := f & clsCatMask
	return k != clsLetter && k != clsNumber
}

// llama3Splitter is llama.cpp's unicode_regex_split_custom_llama3, the matcher for
//
//	(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// With maxDigits 1 it matches the Qwen2 expression (\p{N} in place of \p{N}{1,3}), which
// llama.cpp runs through std::regex; both give the same cut, as every code point matches one of
// the alternatives and the classes used agree between the two.
func llama3Splitter(maxDigits int32) splitFunc {
	return func(c []rune, a, b int32, out []seg) []seg {
		cpt := func(p int32) rune {
			if p >= a && p < b {
				return c[p]
			}
			return outside
		}
		cls := func(p int32) uint8 {
			if p >= a && p < b {
				return class(c[p])
			}
			return clsNone
		}
		prev := a
		add := func(end int32) int32 {
			n := end - prev
			if n > 0 {
				out = append(out, seg{prev, end})
			}
			prev = end
			return n
		}
		for pos := a; pos < b; {
			r := c[pos]
			f := class(r)
			if r == '\'' && pos+1 < b {
				n := toLower(c[pos+1])
				if n == 's' || n == 't' || n == 'm' || n == 'd' {
					pos += add(pos + 2)
					continue
				}
				if pos+2 < b {
					nn := toLower(c[pos+2])
					if (n == 'r' && nn == 'e') || (n == 'v' && nn == 'e') || (n == 'l' && nn == 'l') {
						pos += add(pos + 3)
						continue
					}
				}
			}
			// [^\r\n\p{L}\p{N}]?\p{L}+
			if !(r == '\r' || r == '\n' || f&clsCatMask == clsNumber) {
				if f&clsCatMask == clsLetter || cls(pos+1)&clsCatMask == clsLetter {
					pos++
					for cls(pos)&clsCatMask == clsLetter {
						pos++
					}
					add(pos)
					continue
				}
			}
			// \p{N}{1,3}
			if f&clsCatMask == clsNumber {
				ini := pos
				for cls(pos)&clsCatMask == clsNumber {
					pos++
					if pos-ini >= maxDigits {
						add(pos)
						ini = pos
					}
				}
				add(pos)
				continue
			}
			// <space>?[^\s\p{L}\p{N}]+[\r\n]*
			f2 := f
			if r == ' ' {
				f2 = cls(pos + 1)
			}
			if isOther(f2) {
				if r == ' ' {
					pos++
				}
				for isOther(f2) {
					pos++
					f2 = cls(pos)
				}
				for r2 := cpt(pos); r2 == '\r' || r2 == '\n'; r2 = cpt(pos) {
					pos++
				}
				add(pos)
				continue
			}
			nws := int32(0)
			lastRN := int32(0)
			for cls(pos+nws)&clsSpace != 0 {
				r2 := cpt(pos + nws)
				if r2 == '\r' || r2 == '\n' {
					lastRN = pos + nws + 1
				}
				nws++
			}
			// \s*[\r\n]+
			if lastRN > 0 {
				pos = lastRN
				add(pos)
				continue
			}
			// \s+(?!\S)
			if nws > 1 && cpt(pos+nws) != outside {
				pos += nws - 1
				add(pos)
				continue
			}
			// \s+
			if nws > 0 {
				pos += nws
				add(pos)
				continue
			}
			pos++
			add(pos)
		}
		return out
	}
}

// toLower is llama.cpp's unicode_tolower for the characters it is asked about here.
func toLower(r rune) rune {
	if r >= 'A' && r <= 'Z' {
		return r + ('a' - 'A')
	}
	if r < 0x80 {
		return r
	}
	return lowerRune(r)
}

// matcher reports the end of a match of one regular expression starting exactly at p in c[:end],
// or -1.
type matcher func(c []rune, p, end int32) int32

// regexSplit runs m as std::regex_iterator does over each segment: leftmost matches, searched
// again from the end of the previous one; the text between matches becomes words of its own.
func regexSplit(m matcher) splitFunc {
	return func(c []rune, a, b int32, out []seg) []seg {
		gap := a
		for p := a; p < b; {
			e := m(c, p, b)
			if e <= p {
				p++
				continue
			}
			if p > gap {
				out = append(out, seg{gap, p})
			}
			out = append(out, seg{p, e})
			p, gap = e, e
		}
		if gap < b {
			out = append(out, seg{gap, b})
		}
		return out
	}
}

// classFn is a character class of a regular expression.
type classFn func(r rune) bool

// run matches [C]+.
func run(in classFn) matcher {
	return func(c []rune, p, end int32) int32 {
		if !in(c[p]) {
			return -1
		}
		for p++; p < end && in(c[p]); p++ {
		}
		return p
	}
}

// one matches [C].
func one(in classFn) matcher {
	return func(c []rune, p, end int32) int32 {
		if in(c[p]) {
			return p + 1
		}
		return -1
	}
}

// spaceRun matches \s?[C]+ (greedy optional space, given back when no class member follows).
func spaceRun(in classFn) matcher {
	return func(c []rune, p, end int32) int32 {
		q := p
		if reSpace(c[p]) && p+1 < end && in(c[p+1]) {
			q = p + 1
		} else if !in(c[p]) {
			return -1
		}
		for q++; q < end && in(c[q]); q++ {
		}
		return q
	}
}

// threeDigits matches [0-9][0-9][0-9].
func threeDigits(c []rune, p, end int32) int32 {
	if p+3 <= end && isASCIIDigit(c[p]) && isASCIIDigit(c[p+1]) && isASCIIDigit(c[p+2]) {
		return p + 3
	}
	return -1
}

// gpt4o matches llama.cpp's rendering of GPT-4o's (o200k) expression, which std::regex runs over
// the collapsed text:
//
//	[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?
//	|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*(?:'[sS]|...|'[dD])?
//	|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
//
// A letter "not a-z" is an upper-case one and a letter "not A-Z" a lower-case one; a non-ASCII
// letter, collapsed to one byte, is both. Every code point starts a match of some alternative.
func gpt4o(c []rune, p, end int32) int32 {
	upper := func(q int32) bool { return q < end && colL(c[q]) && !(c[q] >= 'a' && c[q] <= 'z') }
	lower := func(q int32) bool { return q < end && colL(c[q]) && !(c[q] >= 'A' && c[q] <= 'Z') }
	space := func(q int32) bool { return q < end && reSpace(c[q]) }
	// The two letter alternatives, from q (after the optional leading character): the end of the
	// match, or -1.
	letters := func(q int32) int32 {
		// U*L+: U* greedy, given back one by one until L+ matches after it.
		n := int32(0)
		for upper(q + n) {
			n++
		}
		for k := n; k >= 0; k-- {
			if lower(q + k) {
				e := q + k + 1
				for lower(e) {
					e++
				}
				return contraction(c, e, end)
			}
		}
		// U+L*.
		if n == 0 {
			return -1
		}
		e := q + n
		for lower(e) {
			e++
		}
		return contraction(c, e, end)
	}
	r := c[p]
	if !isCRLF(r) && !colL(r) && !colN(r) {
		if e := letters(p + 1); e >= 0 {
			return e
		}
	}
	if e := letters(p); e >= 0 {
		return e
	}
	if colN(r) { // \p{N}{1,3}
		e := p + 1
		for e < end && e < p+3 && colN(c[e]) {
			e++
		}
		return e
	}
	other := func(q int32) bool { return q < end && !reSpace(c[q]) && !colL(c[q]) && !colN(c[q]) }
	q := p
	if r == ' ' && other(p+1) {
		q++
	}
	if other(q) { // ' ?[^\s\p{L}\p{N}]+[\r\n/]*'
		for other(q) {
			q++
		}
		for q < end && (isCRLF(c[q]) || c[q] == '/') {
			q++
		}
		return q
	}
	n, lastRN := int32(0), int32(-1)
	for space(p + n) {
		if isCRLF(c[p+n]) {
			lastRN = p + n + 1
		}
		n++
	}
	switch {
	case lastRN >= 0: // \s*[\r\n]+
		return lastRN
	case n > 1 && p+n < end: // \s+(?!\S)
		return p + n - 1
	case n > 0: // \s+
		return p + n
	}
	return p + 1 // not reached: every code point is a letter, a number, white space or other
}

// contraction extends a match ending at e by an English contraction ('s 't 're 've 'm 'll 'd,
// either case), if one follows.
func contraction(c []rune, e, end int32) int32 {
	if e+1 >= end || c[e] != '\'' {
		return e
	}
	lc := func(r rune) rune {
		if r >= 'A' && r <= 'Z' {
			return r + 'a' - 'A'
		}
		return r
	}
	switch a := lc(c[e+1]); a {
	case 's', 't', 'm', 'd':
		return e + 2
	case 'r', 'v', 'l':
		if e+2 < end {
			b := lc(c[e+2])
			if a == 'r' && b == 'e' || a == 'v' && b == 'e' || a == 'l' && b == 'l' {
				return e + 3
			}
		}
	}
	return e
}

// splitTrailingSpace is the step for \s+$: the run of white space that ends a segment, if any,
// becomes a word of its own.
func splitTrailingSpace(c []rune, a, b int32, out []seg) []seg {
	p := b
	for p > a && reSpace(c[p-1]) {
		p--
	}
	if p > a {
		out = append(out, seg{a, p})
	}
	if p < b {
		out = append(out, seg{p, b})
	}
	return out
}

func isASCIIDigit(r rune) bool { return r >= '0' && r <= '9' }

// reSpace is \s as std::regex sees it in llama.cpp: the C locale's white space, with every
// non-ASCII White_Space code point first replaced by a vertical tab.
func reSpace(r rune) bool {
	if r < 0x80 {
		return r == ' ' || (r >= '\t' && r <= '\r')
	}
	return isSpace(r)
}

// Classes over llama.cpp's collapsed text: a code point below 0x80 stands for itself and \p{..}
// matches only the ASCII characters listed for it; any other code point is one byte naming its
// category (white space becoming a vertical tab).
func colL(r rune) bool {
	if r < 0x80 {
		return (r >= 'A' && r <= 'Z') || (r >= 'a' && r <= 'z')
	}
	return class(r) == clsLetter
}

func colN(r rune) bool {
	if r < 0x80 {
		return isASCIIDigit(r)
	}
	return class(r) == clsNumber
}

// asciiPunct is the collapsed text's \p{P} below 0x80: !-#%-*,-/:-;?-@[-]_{}
var asciiPunct = asciiSet("!\"#%&'()*,-./:;?@[\\]_{}")

func colP(r rune) bool {
	if r < 0x80 {
		return asciiPunct[r]
	}
	return class(r) == clsPunct
}

func asciiSet(s string) (t [128]bool) {
	for i := 0; i < len(s); i++ {
		t[s[i]] = true
	}
	return t
}

// defaultPunct is [\p{P}\$\+<=>\^~\|]; falconPunct adds the backquote.
var (
	defaultExtra = asciiSet("$+<=>^~|")
	falconExtra  = asciiSet("$+<=>^~|`")
)

func defaultPunct(r rune) bool { return colP(r) || (r < 0x80 && defaultExtra[r]) }
func falconPunct(r rune) bool  { return colP(r) || (r < 0x80 && falconExtra[r]) }

func isCRLF(r rune) bool { return r == '\r' || r == '\n' }

// rangeClass is a bracket expression of code point ranges, matched against the code points
// llama.cpp hands to std::wregex (non-ASCII white space replaced by a vertical tab).
type rangeClass [][2]rune

func (rc rangeClass) has(r rune) bool {
	if r >= 0x80 && isSpace(r) {
		return false
	}
	for _, x := range rc {
		if r >= x[0] && r <= x[1] {
			return true
		}
	}
	return false
}

// DeepSeek LLM's letter class: [A-Za-zµÀ-ÖØ-öø-ƺ ... 𞤀-𞥃], the cased letters of a few scripts.
var deepseekLetters = rangeClass{
	{0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA},
	{0x1BC, 0x1BF}, {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x377},
	{0x37B, 0x37D}, {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C},
	{0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556},
	{0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF},
	{0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15}, {0x1F18, 0x1F1D},
	{0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B},
	{0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE},
	{0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC},
	{0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210A, 0x2113},
	{0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128},
	{0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149},
	{0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE},
	{0x2CF2, 0x2CF3}, {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787},
	{0xA78B, 0xA78E}, {0xAB70, 0xABBF}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A},
	{0xFF41, 0xFF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
	{0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
}

// DeepSeek LLM's punctuation class: [!-/:-~！-／：-～‘-‟　-。].
var deepseekPunct = rangeClass{
	{0x21, 0x2F}, {0x3A, 0x7E}, {0xFF01, 0xFF0F}, {0xFF1A, 0xFF5E}, {0x2018, 0x201F}, {0x3000, 0x3002},
}

// DeepSeek's CJK class: [一-龥ࠀ-一가-퟿].
var deepseekCJK = rangeClass{{0x4E00, 0x9FA5}, {0x0800, 0x4E00}, {0xAC00, 0xD7FF}}

// preSteps returns the splitting steps of a pre-tokenizer kind.
func preSteps(k preKind) []splitFunc {
	switch k {
	case preGPT2:
		return []splitFunc{splitGPT2}
	case preLlama3:
		return []splitFunc{llama3Splitter(3)}
	case preQwen2:
		return []splitFunc{llama3Splitter(1)}
	case preDeepseekLLM:
		return []splitFunc{
			regexSplit(one(isCRLF)),
			regexSplit(spaceRun(deepseekLetters.has)),
			regexSplit(spaceRun(deepseekPunct.has)),
			splitTrailingSpace,
			regexSplit(run(deepseekCJK.has)),
			regexSplit(run(colN)),
		}
	case preDeepseekCoder:
		return []splitFunc{
			regexSplit(one(isCRLF)),
			regexSplit(spaceRun(colL)),
			regexSplit(spaceRun(colP)),
			regexSplit(run(deepseekCJK.has)),
			regexSplit(one(colN)),
		}
	case preFalcon:
		return []splitFunc{
			regexSplit(run(falconPunct)),
			splitGPT2,
			regexSplit(threeDigits),
		}
	case preStarcoder:
		return []splitFunc{regexSplit(one(colN)), splitGPT2}
	case preGPT4o:
		return []splitFunc{regexSplit(gpt4o)}
	}
	return []splitFunc{
		regexSplit(run(defaultPunct)),
		splitGPT2,
		regexSplit(run(colN)),
		regexSplit(threeDigits),
	}
}
