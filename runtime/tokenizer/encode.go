package tokenizer

import (
	"fmt"
	"math"
	"strings"
	"unicode/utf8"
)

// frag is a piece of the input after special-token recognition: a token (tok >= 0) or the raw
// text s[a:b].
type frag struct {
	tok  int32
	a, b int
}

// symbol is a run of bytes of the word being merged, linked to its neighbours.
type symbol struct {
	start, n   int32 // bytes of the word; n == 0 once merged into the left neighbour
	prev, next int32
	part       int32 // id of the text in Tokenizer.parts (byte-level BPE), -1 if none
}

// bigram is a candidate merge of symbols left and right. Candidates pop in increasing key order.
type bigram struct {
	key         uint64
	left, right int32
	size        int32
}

// scratch is the reusable working memory of one Encode call.
type scratch struct {
	frags, frags2 []frag
	present       []bool   // [len(Tokenizer.specials)] which special tokens occur in the text
	cps           []rune   // code points of the fragment being pre-tokenised
	segs, segs2   []seg    // its words, as code point ranges
	word          []byte   // the word being merged (byte-level or U+2581-escaped)
	syms          []symbol // [characters of word]
	heap          []bigram
	words         []int32 // WordPiece words as [start, end) byte offsets into word, in pairs
}

func (t *Tokenizer) getScratch() *scratch {
	if s, ok := t.scratch.Get().(*scratch); ok {
		return s
	}
	return &scratch{present: make([]bool, len(t.specials))}
}

// Encode tokenises text. With addSpecial, BOS/EOS (CLS/SEP for "bert") are added as the
// vocabulary asks; with parseSpecial, the text of control tokens (e.g. "<s>", "<|endoftext|>") is
// recognised as those tokens. User-defined tokens are recognised either way, as in llama.cpp.
// Malformed UTF-8 is accepted (byte-level BPE sees U+FFFD in its place, as llama.cpp does). The
// only errors are a text over 512 MiB and a byte that a SentencePiece vocabulary can spell
// neither as <0xXX> nor as itself.
func (t *Tokenizer) Encode(text string, addSpecial, parseSpecial bool) ([]int32, error) {
	return t.AppendEncode(nil, text, addSpecial, parseSpecial)
}

// AppendEncode is Encode appending to dst. On error dst is returned unchanged.
func (t *Tokenizer) AppendEncode(dst []int32, text string, addSpecial, parseSpecial bool) ([]int32, error) {
	if len(text) > math.MaxInt32/4 {
		return dst, fmt.Errorf("tokenizer: text of %d bytes is too long", len(text))
	}
	sc := t.getScratch()
	defer t.scratch.Put(sc)
	frags := t.partition(sc, text, parseSpecial)
	out := dst
	v := &t.vocab
	var err error
	switch t.model {
	case modelSPM:
		if addSpecial && v.AddBOS {
			out = append(out, v.BOS)
		}
		prevSpecial := true // the first text fragment gets the space prefix
		for _, f := range frags {
			if f.tok >= 0 {
				out = append(out, f.tok)
				prevSpecial = true
				continue
			}
			out, err = t.encodeSPM(sc, text[f.a:f.b], t.addSpacePrefix && prevSpecial, out)
			if err != nil {
				return dst, err
			}
			prevSpecial = false
		}
		if addSpecial && v.AddEOS {
			out = append(out, v.EOS)
		}
	case modelBPE:
		if addSpecial && v.AddBOS {
			out = append(out, v.BOS)
		}
		for _, f := range frags {
			if f.tok >= 0 {
				out = append(out, f.tok)
				continue
			}
			out = t.encodeBPE(sc, text[f.a:f.b], out)
		}
		if addSpecial && v.AddEOS {
			out = append(out, v.EOS)
		}
	case modelWPM:
		if addSpecial && v.BOS != NoToken {
			out = append(out, v.BOS)
		}
		for _, f := range frags {
			if f.tok >= 0 {
				out = append(out, f.tok)
				continue
			}
			out = t.encodeWPM(sc, text[f.a:f.b], out)
		}
		if addSpecial && v.SEP != NoToken {
			out = append(out, v.SEP)
		}
	}
	return out, nil
}

// partition splits text at occurrences of special tokens as llama.cpp's tokenizer_st_partition
// does: token by token, longest first, each one searched for in the text fragments the previous
// ones left. Without parseSpecial, control and unknown tokens are not looked for.
func (t *Tokenizer) partition(sc *scratch, text string, parseSpecial bool) []frag {
	frags := sc.frags[:0]
	if text == "" {
		return frags
	}
	frags = append(frags, frag{tok: -1, a: 0, b: len(text)})
	present := sc.present
	if len(present) != len(t.specials) {
		present = make([]bool, len(t.specials))
		sc.present = present
	}
	clear(present)
	if !t.trie.scan(text, present) {
		sc.frags = frags
		return frags
	}
	v := &t.vocab
	out := sc.frags2[:0]
	for k, id := range t.specials {
		if !present[k] {
			continue
		}
		attr := v.attrs[id]
		if !parseSpecial && attr&attrSpecial != 0 {
			continue
		}
		tok := v.tokens[id]
		out = out[:0]
		for _, f := range frags {
			if f.tok >= 0 {
				out = append(out, f)
				continue
			}
			a, b := f.a, f.b
			for a < b {
				i := strings.Index(text[a:b], tok)
				if i < 0 {
					break
				}
				m := a + i
				l := m
				if attr&attrLStrip != 0 {
					for l > a && cSpace(text[l-1]) {
						l--
					}
				}
				if l > a {
					out = append(out, frag{tok: -1, a: a, b: l})
				}
				out = append(out, frag{tok: id})
				a = m + len(tok)
				if attr&attrRStrip != 0 {
					for a < b && cSpace(text[a]) {
						a++
					}
				}
			}
			if a < b {
				out = append(out, frag{tok: -1, a: a, b: b})
			}
		}
		frags, out = out, frags
	}
	sc.frags, sc.frags2 = frags, out
	return frags
}

// encodeSPM is llama.cpp's llm_tokenizer_spm over one text fragment: spaces become U+2581 (with
// one more in front when spacePrefix), the text is cut into UTF-8 characters, and neighbouring
// symbols are merged, best-scoring vocabulary entry first, for as long as any pair forms a
// token. Symbols left that are not tokens are written as byte tokens.
//
// When no token has U+2581 after another character (t.spmWordSplit), no merge can join a
// character to a U+2581 that follows it, so the text is merged word by word: the same result
// with small queues.
func (t *Tokenizer) encodeSPM(sc *scratch, text string, spacePrefix bool, out []int32) ([]int32, error) {
	const esc = "\u2581"
	w := sc.word[:0]
	if spacePrefix {
		w = append(w, esc...)
	}
	for i := 0; i < len(text); i++ {
		if text[i] == ' ' {
			w = append(w, esc...)
		} else {
			w = append(w, text[i])
		}
	}
	sc.word = w
	syms := sc.syms[:0]
	prevEsc := false
	for off := 0; off < len(w); {
		n := min(utf8Len(w[off]), len(w)-off)
		isEsc := string(w[off:off+n]) == esc
		i := int32(len(syms))
		prev := i - 1
		if i > 0 && t.spmWordSplit && isEsc && !prevEsc {
			syms[i-1].next = -1 // a new word: no link to the previous one
			prev = -1
		}
		syms = append(syms, symbol{start: int32(off), n: int32(n), prev: prev, next: i + 1})
		prevEsc = isEsc
		off += n
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	sc.syms = syms
	h := sc.heap[:0]
	scores := t.vocab.scores
	try := func(l, r int32) {
		if l < 0 || r < 0 {
			return
		}
		s := syms[l].start
		e := syms[r].start + syms[r].n
		if int(e-s) > t.maxTokenLen {
			return
		}
		id, ok := t.toID[string(w[s:e])]
		if !ok {
			return
		}
		h = pushBigram(h, bigram{key: scoreKey(scores[id], l), left: l, right: r, size: e - s})
	}
	for cs := int32(0); cs < int32(len(syms)); {
		ce := cs + 1
		for ce < int32(len(syms)) && syms[ce].prev >= 0 {
			ce++
		}
		for i := cs + 1; i < ce; i++ {
			try(i-1, i)
		}
		for len(h) > 0 {
			var bg bigram
			bg, h = popBigram(h)
			ls, rs := &syms[bg.left], &syms[bg.right]
			if ls.n == 0 || rs.n == 0 || ls.n+rs.n != bg.size {
				continue
			}
			ls.n += rs.n
			rs.n = 0
			ls.next = rs.next
			if rs.next >= 0 {
				syms[rs.next].prev = bg.left
			}
			try(ls.prev, bg.left)
			try(bg.left, ls.next)
		}
		for i := cs; i != -1; i = syms[i].next {
			s := syms[i]
			piece := w[s.start : s.start+s.n]
			if id, ok := t.toID[string(piece)]; ok {
				out = append(out, id)
				continue
			}
			for _, b := range piece {
				id := t.byteTok[b]
				if id == NoToken {
					sc.heap = h
					return out, fmt.Errorf("tokenizer: no token for byte 0x%02X (neither <0x%02X> nor the byte itself)", b, b)
				}
				out = append(out, id)
			}
		}
		cs = ce
	}
	sc.heap = h
	return out, nil
}

// scoreKey orders SentencePiece candidates: higher score first, then leftmost.
func scoreKey(score float32, left int32) uint64 {
	if score == 0 {
		score = 0 // -0 ranks with +0
	}
	u := math.Float32bits(score)
	if u&(1<<31) != 0 {
		u = ^u
	} else {
		u |= 1 << 31
	}
	return uint64(^u)<<32 | uint64(uint32(left))
}

// encodeBPE is llama.cpp's llm_tokenizer_bpe over one text fragment: pre-tokenise into
// words, map each word's bytes to the byte-level alphabet, and merge neighbouring symbols
// lowest-rank merge first. A final symbol that is not a token is written byte by byte where
// single bytes are tokens, and dropped otherwise.
func (t *Tokenizer) encodeBPE(sc *scratch, text string, out []int32) []int32 {
	cps := appendCodePoints(sc.cps[:0], text)
	sc.cps = cps
	segs := append(sc.segs[:0], seg{0, int32(len(cps))})
	next := sc.segs2[:0]
	for _, step := range t.steps {
		next = next[:0]
		for _, s := range segs {
			next = step(cps, s.a, s.b, next)
		}
		segs, next = next, segs
	}
	sc.segs, sc.segs2 = segs, next
	for _, s := range segs {
		w := sc.word[:0]
		var u [4]byte
		for _, r := range cps[s.a:s.b] {
			for _, b := range appendRune(u[:0], r) {
				w = utf8.AppendRune(w, byteToRune[b])
			}
		}
		sc.word = w
		out = t.mergeBPE(sc, w, out)
	}
	return out
}

// mergeBPE tokenises one byte-level word.
func (t *Tokenizer) mergeBPE(sc *scratch, w []byte, out []int32) []int32 {
	if len(w) == 0 {
		return out
	}
	if t.ignoreMerges {
		if id, ok := t.toID[string(w)]; ok {
			return append(out, id)
		}
	}
	syms := sc.syms[:0]
	for off := 0; off < len(w); {
		n := min(utf8Len(w[off]), len(w)-off)
		i := int32(len(syms))
		next := i + 1
		if off+n == len(w) {
			next = -1
		}
		part := int32(-1)
		if r, _ := decodeRune(string(w[off:off+n]), 0); r >= 0 && int(r) < len(t.runePart) {
			part = t.runePart[r] // words are made of byte-alphabet characters
		} else if p, ok := t.parts[string(w[off:off+n])]; ok {
			part = p
		}
		syms = append(syms, symbol{start: int32(off), n: int32(n), prev: i - 1, next: next, part: part})
		off += n
	}
	sc.syms = syms
	h := sc.heap[:0]
	try := func(l, r int32) {
		if l < 0 || r < 0 || syms[l].part < 0 || syms[r].part < 0 {
			return
		}
		rank, ok := t.ranks[uint64(syms[l].part)<<32|uint64(syms[r].part)]
		if !ok {
			return
		}
		h = pushBigram(h, bigram{key: uint64(rank)<<32 | uint64(uint32(l)), left: l, right: r, size: syms[l].n + syms[r].n})
	}
	for i := int32(1); i < int32(len(syms)); i++ {
		try(i-1, i)
	}
	for len(h) > 0 {
		var bg bigram
		bg, h = popBigram(h)
		ls, rs := &syms[bg.left], &syms[bg.right]
		if ls.n == 0 || rs.n == 0 || ls.n+rs.n != bg.size {
			continue
		}
		ls.n += rs.n
		rs.n = 0
		ls.next = rs.next
		if rs.next >= 0 {
			syms[rs.next].prev = bg.left
		}
		ls.part = -1
		if p, ok := t.parts[string(w[ls.start:ls.start+ls.n])]; ok {
			ls.part = p
		}
		try(ls.prev, bg.left)
		try(bg.left, ls.next)
	}
	sc.heap = h
	for i := int32(0); i != -1; i = syms[i].next {
		s := syms[i]
		if s.part >= 0 && t.partTok[s.part] != NoToken {
			out = append(out, t.partTok[s.part])
			continue
		}
		piece := w[s.start : s.start+s.n]
		if id, ok := t.toID[string(piece)]; ok {
			out = append(out, id)
			continue
		}
		for j := range piece {
			if id, ok := t.toID[string(piece[j:j+1])]; ok {
				out = append(out, id)
			}
		}
	}
	return out
}

// pushBigram and popBigram keep h a binary min-heap on key.
func pushBigram(h []bigram, b bigram) []bigram {
	h = append(h, b)
	i := len(h) - 1
	for i > 0 {
		p := (i - 1) / 2
		if h[p].key <= h[i].key {
			break
		}
		h[p], h[i] = h[i], h[p]
		i = p
	}
	return h
}

func popBigram(h []bigram) (bigram, []bigram) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		l := 2*i + 1
		if l >= len(h) {
			break
		}
		m := l
		if r := l + 1; r < len(h) && h[r].key < h[l].key {
			m = r
		}
		if h[i].key <= h[m].key {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	return top, h
}

// encodeWPM is llama.cpp's llm_tokenizer_wpm_session::tokenize over one text fragment
// (src/llama-vocab.cpp at commit c392e509). Each code point in turn is normalised (the first code
// point of its NFD, then with setNormalizer's options: marks dropped, lower case) and then:
// White_Space ends the word; NUL, U+FFFD and control characters (Cc, Cf, Co, Cs, so zero-width
// ones too) are dropped; punctuation (P), ASCII symbols and CJK ideographs (isChineseChar) are
// words of their own; anything else (letters, marks, numbers, symbols above U+007F, unassigned
// code points) joins the word. Each word, prefixed with U+2581, is then covered greedily with the
// longest tokens from left to right; a word that cannot be covered becomes UNK as a whole.
func (t *Tokenizer) encodeWPM(sc *scratch, text string, out []int32) []int32 {
	cps := appendCodePoints(sc.cps[:0], text)
	sc.cps = cps
	// Words are written into sc.word, each after a U+2581, with bounds in sc.words.
	const esc = "\u2581"
	w := sc.word[:0]
	bounds := sc.words[:0]
	start := -1 // start of the word being built, -1 if none
	finish := func() {
		if start >= 0 {
			if len(w)-start > len(esc) {
				bounds = append(bounds, int32(start), int32(len(w)))
			} else {
				w = w[:start]
			}
			start = -1
		}
	}
	for _, r := range cps {
		if t.nfd {
			r = nfdFirst(r)
		}
		c := class(r)
		if c&clsSpace != 0 {
			finish()
			continue
		}
		k := c & clsCatMask
		if r == 0 || r == utf8.RuneError || k == clsControl {
			continue
		}
		if t.dropMarks && k == clsMark {
			continue
		}
		lr := r
		if t.lowercase {
			lr = lowerRune(r)
		}
		if k == clsPunct || (r < 0x7F && k == clsSymbol) || isChineseChar(r) {
			finish()
			w = append(w, esc...)
			w = appendRune(w, lr)
			bounds = append(bounds, int32(len(w)-len(esc)-runeLen(lr)), int32(len(w)))
			continue
		}
		if start < 0 {
			start = len(w)
			w = append(w, esc...)
		}
		w = appendRune(w, lr)
	}
	finish()
	sc.word, sc.words = w, bounds

	for i := 0; i+1 < len(bounds); i += 2 {
		word := w[bounds[i]:bounds[i+1]]
		n := len(word)
		first := len(out)
		for p := 0; p < n; p++ {
			match := false
			for e := min(n, p+t.maxTokenLen+1); e > p; e-- {
				if id, ok := t.toID[string(word[p:e])]; ok {
					out = append(out, id)
					match = true
					p = e - 1
					break
				}
			}
			if !match {
				out = out[:first]
				break
			}
		}
		if len(out) == first && t.vocab.UNK != NoToken {
			out = append(out, t.vocab.UNK)
		}
	}
	return out
}

func runeLen(r rune) int {
	switch {
	case r < 0x80:
		return 1
	case r < 0x800:
		return 2
	case r < 0x10000:
		return 3
	}
	return 4
}

// isChineseChar is BERT's CJK test (llama.cpp keeps HF's 0x2B920 where 0x2B820 was meant).
func isChineseChar(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) ||
		(r >= 0x3400 && r <= 0x4DBF) ||
		(r >= 0x20000 && r <= 0x2A6DF) ||
		(r >= 0x2A700 && r <= 0x2B73F) ||
		(r >= 0x2B740 && r <= 0x2B81F) ||
		(r >= 0x2B920 && r <= 0x2CEAF) ||
		(r >= 0xF900 && r <= 0xFAFF) ||
		(r >= 0x2F800 && r <= 0x2FA1F)
}
