package sentencepiece

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// spaceSymbol is U+2581 LOWER ONE EIGHTH BLOCK, which stands for a space in pieces.
const spaceSymbol = "\u2581"

// maxCharsmapResults is how many prefix matches SentencePiece's normaliser considers at one
// position (Normalizer::kMaxTrieResultsSize); its builder guarantees no key has more.
const maxCharsmapResults = 32

// charsmap is a precompiled normalisation map: a darts-clone double-array trie whose keys are
// UTF-8 prefixes of the input and whose values index NUL-terminated replacements in norm.
// Layout of the blob: <uint32 LE trie size in bytes><trie units, uint32 LE each><replacements>.
type charsmap struct {
	units []uint32
	norm  []byte
}

// Double-array unit fields (darts.h, DoubleArrayUnit).
func unitHasLeaf(u uint32) bool  { return (u>>8)&1 == 1 }
func unitValue(u uint32) uint32  { return u & (1<<31 - 1) }
func unitLabel(u uint32) uint32  { return u & (1<<31 | 0xff) }
func unitOffset(u uint32) uint32 { return (u >> 10) << ((u & (1 << 9)) >> 6) }

func parseCharsmap(blob []byte) (*charsmap, error) {
	if len(blob) <= 4 {
		return nil, errors.New("precompiled charsmap: too short")
	}
	size := binary.LittleEndian.Uint32(blob)
	if uint64(size) >= uint64(len(blob)) || uint64(size)+4 > uint64(len(blob)) {
		return nil, fmt.Errorf("precompiled charsmap: trie size %d exceeds the %d-byte blob", size, len(blob))
	}
	if size%4 != 0 || size == 0 {
		return nil, fmt.Errorf("precompiled charsmap: trie size %d is not a positive multiple of 4", size)
	}
	c := &charsmap{units: make([]uint32, size/4), norm: blob[4+size:]}
	for i := range c.units {
		c.units[i] = binary.LittleEndian.Uint32(blob[4+4*i:])
	}
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("precompiled charsmap: %w", err)
	}
	return c, nil
}

// validate walks every state reachable from the root once, as lookups would, and checks that
// every transition stays inside the array and every value points at a NUL-terminated
// replacement. After it, lookups cannot go astray.
func (c *charsmap) validate() error {
	n := uint32(len(c.units))
	seen := make([]bool, n)
	stack := []uint32{unitOffset(c.units[0])} // the root's children are at root.offset ^ label
	for len(stack) > 0 {
		base := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		for label := uint32(0); label < 256; label++ {
			child := base ^ label
			if child >= n || unitLabel(c.units[child]) != label {
				continue
			}
			if seen[child] { // darts-clone shares suffixes: the states form a DAG
				continue
			}
			seen[child] = true
			u := c.units[child]
			next := child ^ unitOffset(u)
			if unitHasLeaf(u) {
				if next >= n {
					return fmt.Errorf("leaf of unit %d lies outside the %d-unit array", child, n)
				}
				v := unitValue(c.units[next])
				if v >= uint32(len(c.norm)) || bytes.IndexByte(c.norm[v:], 0) < 0 {
					return fmt.Errorf("value %d of unit %d is not a NUL-terminated replacement", v, child)
				}
			}
			stack = append(stack, next)
		}
	}
	return nil
}

// longestPrefix returns the replacement for the longest key that prefixes s (among the first
// maxCharsmapResults matches, as SentencePiece does) and its length in bytes; 0 if none.
func (c *charsmap) longestPrefix(s string) (string, int) {
	n := uint32(len(c.units))
	pos := unitOffset(c.units[0])
	found := 0
	bestLen, bestVal := 0, uint32(0)
	for i := 0; i < len(s); i++ {
		label := uint32(s[i])
		pos ^= label
		if pos >= n {
			break
		}
		u := c.units[pos]
		if unitLabel(u) != label {
			break
		}
		pos ^= unitOffset(u)
		if unitHasLeaf(u) {
			if pos >= n {
				break
			}
			if found < maxCharsmapResults {
				bestLen, bestVal = i+1, unitValue(c.units[pos])
			}
			found++
		}
	}
	if bestLen == 0 || bestVal >= uint32(len(c.norm)) {
		return "", 0
	}
	r := c.norm[bestVal:]
	if end := bytes.IndexByte(r, 0); end >= 0 {
		r = r[:end]
	}
	return string(r), bestLen
}

// normalizer is SentencePiece's Normalizer: the charsmap, user-defined symbols kept whole, the
// dummy prefix, whitespace removal and escaping.
type normalizer struct {
	spec        NormalizerSpec
	cmap        *charsmap // nil: no rules (identity)
	asSuffix    bool      // TrainerSpec.treat_whitespace_as_suffix
	userDefined *trie     // user-defined symbols, matched before the charsmap; nil if none
}

func newNormalizer(spec NormalizerSpec, asSuffix bool, user *trie) (*normalizer, error) {
	n := &normalizer{spec: spec, asSuffix: asSuffix, userDefined: user}
	if len(spec.PrecompiledCharsmap) > 0 {
		c, err := parseCharsmap(spec.PrecompiledCharsmap)
		if err != nil {
			return nil, err
		}
		n.cmap = c
	} else if spec.Name != "" && spec.Name != "identity" {
		return nil, fmt.Errorf("normaliser %q has no precompiled charsmap; only charsmap-based normalisers (nmt_nfkc, nfkc, ..., from spm_train) and identity are supported", spec.Name)
	}
	return n, nil
}

// prefix returns the normalised form of the first unit of s and how many bytes of s it takes:
// a user-defined symbol verbatim, else the longest charsmap rule, else one UTF-8 character
// (a malformed byte becomes U+FFFD).
func (n *normalizer) prefix(s string) (string, int) {
	if n.userDefined != nil {
		if l := n.userDefined.longestPrefix(s); l > 0 {
			return s[:l], l
		}
	}
	if n.cmap != nil {
		if r, l := n.cmap.longestPrefix(s); l > 0 {
			return r, l
		}
	}
	r, l := utf8.DecodeRuneInString(s)
	if r == utf8.RuneError && l == 1 {
		return "\uFFFD", 1
	}
	return s[:l], l
}

// normalize follows Normalizer::Normalize (normalizer.cc) without the alignment.
func (n *normalizer) normalize(s string) string {
	if s == "" {
		return ""
	}
	if n.spec.RemoveExtraWhitespaces {
		for s != "" {
			p, l := n.prefix(s)
			if p != " " {
				break
			}
			s = s[l:]
		}
		if s == "" {
			return ""
		}
	}
	var sb strings.Builder
	sb.Grow(3 * len(s))
	addSpace := func() {
		if n.spec.EscapeWhitespaces {
			sb.WriteString(spaceSymbol)
		} else {
			sb.WriteByte(' ')
		}
	}
	if !n.asSuffix && n.spec.AddDummyPrefix {
		addSpace()
	}
	prevSpace := n.spec.RemoveExtraWhitespaces
	for s != "" {
		p, l := n.prefix(s)
		if prevSpace {
			p = strings.TrimLeft(p, " ")
		}
		if p != "" {
			if n.spec.EscapeWhitespaces {
				sb.WriteString(strings.ReplaceAll(p, " ", spaceSymbol))
			} else {
				sb.WriteString(p)
			}
			prevSpace = strings.HasSuffix(p, " ")
		}
		s = s[l:]
		if !n.spec.RemoveExtraWhitespaces {
			prevSpace = false
		}
	}
	out := sb.String()
	if n.spec.RemoveExtraWhitespaces {
		space := " "
		if n.spec.EscapeWhitespaces {
			space = spaceSymbol
		}
		for strings.HasSuffix(out, space) {
			out = out[:len(out)-len(space)]
		}
	}
	if n.asSuffix && n.spec.AddDummyPrefix {
		if n.spec.EscapeWhitespaces {
			out += spaceSymbol
		} else {
			out += " "
		}
	}
	return out
}
