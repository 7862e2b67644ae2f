// Package tokenizer turns text into token ids and back for the vocabularies that GGUF files carry
// in their "tokenizer.ggml.*" metadata, reproducing llama.cpp's tokenizers id for id:
//
//   - "llama": SentencePiece-style BPE that merges by token score, with <0xXX> byte fallback and
//     spaces written as U+2581;
//   - "gpt2": byte-level BPE over a merge list, after the pre-tokenizer named by
//     tokenizer.ggml.pre has cut the text into words;
//   - "bert": WordPiece with llama.cpp's normalisation (lower case, the first code point of each
//     character's NFD, control characters dropped, punctuation and CJK characters split off).
//
// It owns special-token recognition in the input, BOS/EOS/SEP insertion, token attributes, the
// end-of-generation set, detokenisation, and streaming decoding that never splits a UTF-8
// character. A Tokenizer is immutable after New and safe for concurrent use.
package tokenizer

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
)

// Metadata is the read side of a GGUF file's key/value metadata (*gguf.File satisfies it). Each
// accessor reports false when the key is absent or holds another type.
type Metadata interface {
	String(key string) (string, bool)
	Int(key string) (int64, bool)
	Bool(key string) (bool, bool)
	Strings(key string) ([]string, bool)
	Floats(key string) ([]float32, bool)
	Ints(key string) ([]int64, bool)
}

// TokenType is a token's type as tokenizer.ggml.token_type stores it.
type TokenType int32

// Token types (llama.cpp's llama_token_type).
const (
	TypeUndefined   TokenType = 0
	TypeNormal      TokenType = 1
	TypeUnknown     TokenType = 2
	TypeControl     TokenType = 3
	TypeUserDefined TokenType = 4
	TypeUnused      TokenType = 5
	TypeByte        TokenType = 6
)

func (t TokenType) String() string {
	switch t {
	case TypeNormal:
		return "normal"
	case TypeUnknown:
		return "unknown"
	case TypeControl:
		return "control"
	case TypeUserDefined:
		return "user-defined"
	case TypeUnused:
		return "unused"
	case TypeByte:
		return "byte"
	}
	return "undefined"
}

// NoToken stands for an absent special token.
const NoToken int32 = -1

// Token attributes (llama.cpp's llama_token_attr): the type as a bit, plus what the loader adds.
const (
	attrUnknown     uint16 = 1 << 0
	attrUnused      uint16 = 1 << 1
	attrNormal      uint16 = 1 << 2
	attrControl     uint16 = 1 << 3
	attrUserDefined uint16 = 1 << 4
	attrByte        uint16 = 1 << 5
	attrLStrip      uint16 = 1 << 7
	attrRStrip      uint16 = 1 << 8

	attrSpecial = attrUnknown | attrControl // rendered only when asked for
)

type modelKind int

const (
	modelSPM modelKind = iota // "llama"
	modelBPE                  // "gpt2"
	modelWPM                  // "bert"
)

type preKind int

const (
	preDefault preKind = iota
	preGPT2
	preLlama3
	preQwen2
	preDeepseekLLM
	preDeepseekCoder
	preFalcon
	preStarcoder
	preGPT4o
)

// Vocab describes a tokenizer's vocabulary. It is owned by its Tokenizer: read it, do not modify
// it.
type Vocab struct {
	Model string // tokenizer.ggml.model: "llama", "gpt2" or "bert"
	Pre   string // tokenizer.ggml.pre as stored ("" when absent)
	Size  int    // number of tokens

	// Special tokens; NoToken when the vocabulary has none.
	BOS, EOS, EOT, EOM, UNK, PAD, SEP, CLS, Mask int32

	AddBOS bool // Encode with addSpecial puts BOS first
	AddEOS bool // Encode with addSpecial puts EOS last

	tokens []string
	scores []float32
	attrs  []uint16
	toID   map[string]int32
	eog    []int32  // sorted
	eogSet []uint64 // bit set over ids
}

// ID returns the id of the token whose text is text.
func (v *Vocab) ID(text string) (int32, bool) {
	id, ok := v.toID[text]
	return id, ok
}

// Token returns the text of token id as the vocabulary stores it ("" when id is out of range).
func (v *Vocab) Token(id int32) string {
	if id < 0 || int(id) >= len(v.tokens) {
		return ""
	}
	return v.tokens[id]
}

// Score returns the score of token id (0 when absent or out of range).
func (v *Vocab) Score(id int32) float32 {
	if id < 0 || int(id) >= len(v.scores) {
		return 0
	}
	return v.scores[id]
}

// Type returns the type of token id after the loader's adjustments (tokens recognised as
// end-of-turn markers become control tokens, for example); TypeUndefined when out of range.
func (v *Vocab) Type(id int32) TokenType {
	if id < 0 || int(id) >= len(v.attrs) {
		return TypeUndefined
	}
	a := v.attrs[id]
	switch {
	case a&attrControl != 0:
		return TypeControl
	case a&attrUserDefined != 0:
		return TypeUserDefined
	case a&attrUnknown != 0:
		return TypeUnknown
	case a&attrByte != 0:
		return TypeByte
	case a&attrUnused != 0:
		return TypeUnused
	case a&attrNormal != 0:
		return TypeNormal
	}
	return TypeUndefined
}

// IsEOG reports whether id ends generation (EOS, EOT, EOM and the end-of-turn markers the
// vocabulary is known to use).
func (v *Vocab) IsEOG(id int32) bool {
	if id < 0 || int(id) >= v.Size {
		return false
	}
	return v.eogSet[id>>6]&(1<<(uint(id)&63)) != 0
}

// EOG returns the end-of-generation ids in increasing order (a new slice).
func (v *Vocab) EOG() []int32 { return slices.Clone(v.eog) }

// Tokenizer encodes text to token ids and decodes them back.
type Tokenizer struct {
	vocab Vocab
	model modelKind
	pre   preKind
	steps []splitFunc

	toID map[string]int32

	// pieces holds every token's text when detokenised with special tokens shown, token i at
	// pieces[pieceOff[i]:pieceOff[i+1]].
	pieces   []byte
	pieceOff []uint32 // [Size+1]

	// byte-level BPE: merge ranks keyed by the ids of the two halves in parts.
	parts        map[string]int32
	ranks        map[uint64]int32
	partTok      []int32      // token id of each part's text, NoToken if it is not a token
	runePart     [0x144]int32 // part id of each byte-alphabet code point, -1 if none
	ignoreMerges bool

	// SentencePiece
	addSpacePrefix bool
	byteTok        [256]int32 // byte fallback tokens, NoToken where missing
	spmWordSplit   bool       // no token has U+2581 right after another character

	// WordPiece normalisation (see encodeWPM)
	maxTokenLen int
	lowercase   bool // map each code point to its simple lower case
	nfd         bool // map each code point to the first code point of its NFD
	dropMarks   bool // drop marks (Mn, Mc, Me), after nfd

	// special tokens matched in raw text, longest first
	specials []int32
	trie     specialTrie

	scratch sync.Pool // *scratch
}

// Vocab returns the vocabulary description.
func (t *Tokenizer) Vocab() *Vocab { return &t.vocab }

const (
	keyModel   = "tokenizer.ggml.model"
	keyPre     = "tokenizer.ggml.pre"
	keyTokens  = "tokenizer.ggml.tokens"
	keyScores  = "tokenizer.ggml.scores"
	keyTypes   = "tokenizer.ggml.token_type"
	keyMerges  = "tokenizer.ggml.merges"
	keyAddBOS  = "tokenizer.ggml.add_bos_token"
	keyAddEOS  = "tokenizer.ggml.add_eos_token"
	keyAddSEP  = "tokenizer.ggml.add_sep_token"
	keyPrefix  = "tokenizer.ggml.add_space_prefix"
	keyLower   = "tokenizer.ggml.normalizer.lowercase"
	keyAccents = "tokenizer.ggml.normalizer.strip_accents"
	keyBOS     = "tokenizer.ggml.bos_token_id"
	keyEOS     = "tokenizer.ggml.eos_token_id"
	keyCLS     = "tokenizer.ggml.cls_token_id"
	keySEP     = "tokenizer.ggml.seperator_token_id" // sic
)

// New builds the tokenizer described by md's tokenizer.ggml.* keys, with llama.cpp's defaults
// where keys are absent. Byte-level BPE ("gpt2") supports these tokenizer.ggml.pre values:
// default (or absent), gpt-2 and its aliases (mpt, olmo, phi-2, jais, ...), llama3/llama-bpe and
// aliases (dbrx, smaug-bpe, chatglm-bpe, glm4, falcon3, pixtral, ...), qwen2 and aliases
// (stablelm2, deepseek-r1-qwen, megrez, hunyuan, ...), deepseek-llm, deepseek-coder, falcon,
// starcoder and refact (with command-r, smollm, codeshell, exaone, minerva-7b); any other is an
// error, as is a tokenizer model other than "llama", "gpt2" and "bert".
func New(md Metadata) (*Tokenizer, error) {
	classOnce.Do(buildClassTable)

	name, ok := md.String(keyModel)
	if !ok {
		return nil, fmt.Errorf("tokenizer: %s missing", keyModel)
	}
	t := &Tokenizer{}
	v := &t.vocab
	v.Model = name
	v.Pre, _ = md.String(keyPre)

	// Defaults per model, as llama.cpp's llama_vocab::impl::load sets them.
	var addSEP bool
	switch name {
	case "llama":
		t.model = modelSPM
		v.BOS, v.EOS, v.UNK, v.SEP, v.PAD, v.Mask = 1, 2, 0, NoToken, NoToken, NoToken
		t.addSpacePrefix, v.AddBOS = true, true
	case "bert":
		t.model = modelWPM
		v.BOS, v.EOS, v.UNK, v.SEP, v.PAD, v.Mask = 101, NoToken, 100, 102, 0, 103
		v.AddBOS, addSEP = true, true
	case "gpt2":
		t.model = modelBPE
		v.BOS, v.EOS, v.UNK, v.SEP, v.PAD, v.Mask = 11, 11, NoToken, NoToken, NoToken, NoToken
	default:
		return nil, fmt.Errorf("tokenizer: unsupported tokenizer model %q", name)
	}
	v.EOT, v.EOM, v.CLS = NoToken, NoToken, NoToken
	if t.model == modelBPE {
		if err := t.setPre(v.Pre); err != nil {
			return nil, err
		}
		t.steps = preSteps(t.pre)
	}
	if b, ok := md.Bool(keyPrefix); ok {
		t.addSpacePrefix = b
	}

	tokens, ok := md.Strings(keyTokens)
	if !ok {
		return nil, fmt.Errorf("tokenizer: %s missing or not an array of strings", keyTokens)
	}
	n := len(tokens)
	if n == 0 || n > math.MaxInt32 {
		return nil, fmt.Errorf("tokenizer: %s has %d tokens", keyTokens, n)
	}
	v.Size = n

	scores, ok := md.Floats(keyScores)
	if !ok {
		if is, ok := md.Ints(keyScores); ok {
			scores = make([]float32, len(is))
			for i, s := range is {
				scores[i] = float32(s)
			}
		}
	}
	if scores != nil && len(scores) < n {
		return nil, fmt.Errorf("tokenizer: %s has %d entries for %d tokens", keyScores, len(scores), n)
	}
	types, hasTypes := md.Ints(keyTypes)
	if hasTypes && len(types) < n {
		return nil, fmt.Errorf("tokenizer: %s has %d entries for %d tokens", keyTypes, len(types), n)
	}

	// Token texts are copied into one string the tokenizer owns, so that it outlives md.
	v.tokens = make([]string, n)
	total := 0
	for i, s := range tokens {
		if s == "" {
			s = fmt.Sprintf("[EMPTY_%d]", i)
		}
		v.tokens[i] = s
		total += len(s)
	}
	var sb strings.Builder
	sb.Grow(total)
	for _, s := range v.tokens {
		sb.WriteString(s)
	}
	arena := sb.String()
	v.scores = make([]float32, n)
	v.attrs = make([]uint16, n)
	t.toID = make(map[string]int32, n)
	v.toID = t.toID
	for i, s := range v.tokens {
		s = arena[:len(s)]
		arena = arena[len(s):]
		v.tokens[i] = s
		if j, dup := t.toID[s]; dup {
			return nil, fmt.Errorf("tokenizer: duplicate token %q has ids %d and %d", s, j, i)
		}
		t.toID[s] = int32(i)
		t.maxTokenLen = max(t.maxTokenLen, len(s))
		v.tokens[i] = s
		if scores != nil {
			v.scores[i] = scores[i]
		}
		v.attrs[i] = attrNormal
		if hasTypes {
			v.attrs[i] = typeAttr(types[i])
		}
	}

	if t.model == modelBPE {
		if err := t.loadMerges(md); err != nil {
			return nil, err
		}
	}

	t.readSpecialIDs(md)
	if b, ok := md.Bool(keyAddBOS); ok {
		v.AddBOS = b
	}
	if b, ok := md.Bool(keyAddEOS); ok {
		v.AddEOS = b
	}
	if b, ok := md.Bool(keyAddSEP); ok {
		addSEP = b
	}
	if v.AddBOS && v.BOS == NoToken {
		return nil, fmt.Errorf("tokenizer: %s is true, but %s is not set", keyAddBOS, keyBOS)
	}
	if v.AddEOS && v.EOS == NoToken {
		return nil, fmt.Errorf("tokenizer: %s is true, but %s is not set", keyAddEOS, keyEOS)
	}
	if addSEP && v.SEP == NoToken {
		return nil, fmt.Errorf("tokenizer: %s is true, but %s is not set", keyAddSEP, keySEP)
	}
	if t.model == modelWPM {
		t.setNormalizer(md)
	}

	t.markSpecialTokens(md)
	t.buildSpecials()
	if err := t.buildPieces(); err != nil {
		return nil, err
	}
	if t.model == modelSPM {
		t.buildByteTokens()
		t.spmWordSplit = true
		for _, s := range v.tokens {
			if strings.Contains(strings.TrimLeft(s, "\u2581"), "\u2581") {
				t.spmWordSplit = false
				break
			}
		}
	}
	return t, nil
}

// setNormalizer chooses WordPiece's normalisation. Without the normaliser keys it is that of
// llama.cpp at commit c392e509, which reads none: lower case, the first code point of each code
// point's NFD, marks kept (so "cafe" followed by U+0301 is one word, [UNK] for a vocabulary
// without a token for the mark). A file that carries the keys was written for a newer llama.cpp
// and is read as that one reads it (llama_vocab::impl::load and
// llm_tokenizer_wpm_session::preprocess after ggml-org/llama.cpp#24371): lowercase (default
// true), strip_accents (default lowercase), and with strip_accents the NFD mapping and the
// dropping of every mark. Newer llama.cpp applies those defaults to a file without the keys too,
// so it drops the marks that c392e509 keeps.
func (t *Tokenizer) setNormalizer(md Metadata) {
	lower, hasLower := md.Bool(keyLower)
	strip, hasStrip := md.Bool(keyAccents)
	if !hasLower && !hasStrip {
		t.lowercase, t.nfd, t.dropMarks = true, true, false
		return
	}
	if !hasLower {
		lower = true
	}
	if !hasStrip {
		strip = lower
	}
	t.lowercase, t.nfd, t.dropMarks = lower, strip, strip
}

func typeAttr(tt int64) uint16 {
	switch TokenType(tt) {
	case TypeNormal:
		return attrNormal
	case TypeUnknown:
		return attrUnknown
	case TypeControl:
		return attrControl
	case TypeUserDefined:
		return attrUserDefined
	case TypeUnused:
		return attrUnused
	case TypeByte:
		return attrByte
	}
	return 0
}

// setPre selects the pre-tokenizer named by tokenizer.ggml.pre, with the flags llama.cpp ties to
// it.
func (t *Tokenizer) setPre(pre string) error {
	v := &t.vocab
	switch pre {
	case "", "default":
		t.pre = preDefault
	case "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano":
		t.pre = preLlama3
		t.ignoreMerges = true
		v.AddBOS = true
	case "dbrx", "smaug-bpe":
		t.pre = preLlama3
	case "chatglm-bpe", "glm4":
		t.pre = preLlama3
		v.BOS = NoToken
	case "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open":
		t.pre = preQwen2
	case "deepseek-llm":
		t.pre = preDeepseekLLM
	case "deepseek-coder":
		t.pre = preDeepseekCoder
	case "falcon":
		t.pre = preFalcon
	case "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
		"mellum", "mpt", "olmo", "jais", "exaone4", "trillion", "granite-docling":
		t.pre = preGPT2
	case "starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2":
		t.pre = preStarcoder
	case "gpt-4o", "llama4":
		t.pre = preGPT4o
	default:
		return fmt.Errorf("tokenizer: unsupported pre-tokenizer %q", pre)
	}
	return nil
}

// loadMerges reads tokenizer.ggml.merges ("left right" per entry, earlier merges first).
func (t *Tokenizer) loadMerges(md Metadata) error {
	merges, ok := md.Strings(keyMerges)
	if !ok {
		return fmt.Errorf("tokenizer: %s missing or not an array of strings", keyMerges)
	}
	t.parts = make(map[string]int32, len(merges)+256)
	t.ranks = make(map[uint64]int32, len(merges))
	part := func(s string) int32 {
		if id, ok := t.parts[s]; ok {
			return id
		}
		if tok, ok := t.toID[s]; ok {
			s = t.vocab.tokens[tok] // share the token's text
		} else {
			s = strings.Clone(s)
		}
		id := int32(len(t.parts))
		t.parts[s] = id
		return id
	}
	for rank, m := range merges {
		if len(m) < 2 {
			continue
		}
		k := strings.IndexByte(m[1:], ' ')
		if k < 0 {
			continue // llama.cpp files such an entry under ("", "")
		}
		k++
		key := uint64(part(m[:k]))<<32 | uint64(part(m[k+1:]))
		if _, dup := t.ranks[key]; !dup {
			t.ranks[key] = int32(rank)
		}
	}
	t.partTok = make([]int32, len(t.parts))
	for s, p := range t.parts {
		t.partTok[p] = NoToken
		if id, ok := t.toID[s]; ok {
			t.partTok[p] = id
		}
	}
	for r := range t.runePart {
		t.runePart[r] = -1
		if p, ok := t.parts[string(rune(r))]; ok {
			t.runePart[r] = p
		}
	}
	return nil
}

// readSpecialIDs applies the tokenizer.ggml.*_token_id keys over the model defaults. Ids out of
// range are ignored, as llama.cpp does, and defaults out of range are dropped.
func (t *Tokenizer) readSpecialIDs(md Metadata) {
	v := &t.vocab
	n := int64(v.Size)
	get := func(key string, id *int32) {
		if *id >= 0 && int64(*id) >= n {
			*id = NoToken
		}
		if x, ok := md.Int(key); ok && x >= 0 && x < n {
			*id = int32(x)
		}
	}
	get(keyBOS, &v.BOS)
	get(keyEOS, &v.EOS)
	get("tokenizer.ggml.eot_token_id", &v.EOT)
	get("tokenizer.ggml.eom_token_id", &v.EOM)
	get("tokenizer.ggml.unknown_token_id", &v.UNK)
	get(keySEP, &v.SEP)
	get("tokenizer.ggml.padding_token_id", &v.PAD)
	get("tokenizer.ggml.mask_token_id", &v.Mask)
	get(keyCLS, &v.CLS)
	if t.model == modelWPM && v.CLS != NoToken {
		if _, ok := md.Int(keyBOS); !ok {
			v.BOS = v.CLS
		}
	}
}

// Token texts llama.cpp recognises whatever their stored type.
var (
	eotTexts = []string{"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
		"<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>"}
	eomTexts    = []string{"<|eom_id|>"}
	fimPreTexts = []string{"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
		"\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"}
	fimSufTexts = []string{"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
		"\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"}
	fimMidTexts = []string{"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
		"\u2581<MID>", "<|code_middle|>", "<|middle|>"}
	fimPadTexts = []string{"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}
	fimRepTexts = []string{"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}
	fimSepTexts = []string{"<|file_sep|>"}
	eogTexts    = []string{"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
		"<|calls|>", "<end_of_turn>", "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]",
		"[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
		"<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~["}
)

// markSpecialTokens finds end-of-turn, end-of-message and fill-in-the-middle tokens by their
// text, promotes them to control tokens, and builds the end-of-generation set, following
// llama.cpp (which walks its token map in hash order; here the lowest id wins).
func (t *Tokenizer) markSpecialTokens(md Metadata) {
	v := &t.vocab
	n := int64(v.Size)
	readID := func(keys ...string) int32 {
		id := NoToken
		for _, k := range keys {
			if x, ok := md.Int(k); ok && x >= 0 && x < n {
				id = int32(x)
			}
		}
		return id
	}
	fimPre := readID("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id")
	fimSuf := readID("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id")
	fimMid := readID("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id")
	fimPad := readID("tokenizer.ggml.fim_pad_token_id")
	fimRep := readID("tokenizer.ggml.fim_rep_token_id")
	fimSep := readID("tokenizer.ggml.fim_sep_token_id")

	find := func(id *int32, texts []string) {
		if *id != NoToken {
			return
		}
		best := NoToken
		for _, s := range texts {
			if j, ok := t.toID[s]; ok && (best == NoToken || j < best) {
				best = j
			}
		}
		if best != NoToken {
			*id = best
			v.attrs[best] |= attrControl
		}
	}
	find(&v.EOT, eotTexts)
	find(&v.EOM, eomTexts)
	find(&fimPre, fimPreTexts)
	find(&fimSuf, fimSufTexts)
	find(&fimMid, fimMidTexts)
	find(&fimPad, fimPadTexts)
	find(&fimRep, fimRepTexts)
	find(&fimSep, fimSepTexts)

	for i, s := range v.tokens {
		if v.attrs[i]&attrControl != 0 && strings.Contains(s, "unused") {
			v.attrs[i] |= attrUnused
		}
	}

	eog := map[int32]bool{}
	for _, id := range []int32{fimPad, fimRep, fimSep} {
		if id != NoToken {
			eog[id] = true
		}
	}
	for _, s := range eogTexts {
		if id, ok := t.toID[s]; ok {
			eog[id] = true
			v.attrs[id] |= attrControl
		}
	}
	for _, s := range []string{"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"} {
		if id, ok := t.toID[s]; ok {
			v.attrs[id] = attrUserDefined
		}
	}
	for _, id := range []int32{v.EOS, v.EOT, v.EOM} {
		if id != NoToken {
			eog[id] = true
		}
	}
	has := func(s string) (int32, bool) {
		id, ok := t.toID[s]
		return id, ok && eog[id]
	}
	// gpt-oss and Solar Open end a message with <|end|> but a turn with <|return|>/<|call|>.
	_, ret := has("<|return|>")
	_, call := has("<|call|>")
	_, calls := has("<|calls|>")
	_, flush := has("<|flush|>")
	if end, ok := has("<|end|>"); ok && ((ret && (call || calls)) || ((call || calls) && flush)) {
		delete(eog, end)
		v.attrs[end] = attrUserDefined
	}
	// Gemma 4 and PaddleOCR use </s> as plain text.
	if _, ok := has("<|tool_response>"); ok {
		if s, ok := has("</s>"); ok {
			delete(eog, s)
			v.attrs[s] = attrNormal
		}
	}
	for id := range eog {
		v.eog = append(v.eog, id)
	}
	slices.Sort(v.eog)
	v.eogSet = make([]uint64, (v.Size+63)/64)
	for _, id := range v.eog {
		v.eogSet[id>>6] |= 1 << (uint(id) & 63)
	}

	// Per-model attributes llama.cpp sets by name.
	pre, _ := md.String(keyPre)
	arch, _ := md.String("general.architecture")
	modelName, _ := md.String("general.name")
	modelName = strings.ToLower(modelName)
	setAttr := func(s string, a uint16, on bool) {
		if id, ok := t.toID[s]; ok {
			if on {
				v.attrs[id] |= a
			} else {
				v.attrs[id] &^= a
			}
		}
	}
	switch {
	case containsAny(pre, "jina-v2-de", "jina-v2-es", "jina-v2-code") || containsAny(arch, "nomic-bert-moe", "jina-bert-v3"):
		setAttr("<mask>", attrLStrip, true)
	case containsAny(modelName, "phi-3", "phi3"):
		for i, a := range v.attrs {
			if a&(attrControl|attrUserDefined|attrUnknown) != 0 {
				v.attrs[i] |= attrRStrip
			}
		}
		setAttr("</s>", attrRStrip, true)
		for _, s := range []string{"<unk>", "<s>", "<|endoftext|>"} {
			setAttr(s, attrRStrip, false)
		}
	case containsAny(modelName, "modern-bert"):
		setAttr("[MASK]", attrLStrip, true)
	}
}

func containsAny(s string, subs ...string) bool {
	for _, x := range subs {
		if strings.Contains(s, x) {
			return true
		}
	}
	return false
}

// buildSpecials lists the tokens matched in raw text before tokenisation (control, unknown and
// user-defined ones), longest first, and indexes them for a quick presence scan.
func (t *Tokenizer) buildSpecials() {
	v := &t.vocab
	for i, a := range v.attrs {
		if a&(attrControl|attrUserDefined|attrUnknown) != 0 {
			t.specials = append(t.specials, int32(i))
		}
	}
	slices.SortStableFunc(t.specials, func(a, b int32) int {
		return len(v.tokens[b]) - len(v.tokens[a])
	})
	t.trie.build(v.tokens, t.specials)
}

// buildPieces renders every token as llama.cpp's token_to_piece does with special tokens shown.
func (t *Tokenizer) buildPieces() error {
	v := &t.vocab
	t.pieceOff = make([]uint32, v.Size+1)
	total := 0
	for _, s := range v.tokens {
		total += len(s)
	}
	if total > math.MaxUint32/2 {
		return errors.New("tokenizer: token texts too large")
	}
	t.pieces = make([]byte, 0, total)
	for i, s := range v.tokens {
		t.pieceOff[i] = uint32(len(t.pieces))
		a := v.attrs[i]
		switch {
		case a&(attrSpecial|attrUserDefined) != 0:
			t.pieces = append(t.pieces, s...)
		case a&attrNormal != 0:
			if t.model == modelBPE {
				t.pieces = appendByteDecoded(t.pieces, s)
			} else {
				t.pieces = appendUnescaped(t.pieces, s)
			}
		case a&attrByte != 0:
			if b, ok := byteTokenValue(s); ok {
				t.pieces = append(t.pieces, b)
			}
		}
	}
	t.pieceOff[v.Size] = uint32(len(t.pieces))
	return nil
}

// appendUnescaped appends s with every U+2581 turned back into a space.
func appendUnescaped(dst []byte, s string) []byte {
	for {
		i := strings.Index(s, "\u2581")
		if i < 0 {
			return append(dst, s...)
		}
		dst = append(dst, s[:i]...)
		dst = append(dst, ' ')
		s = s[i+len("\u2581"):]
	}
}

// appendByteDecoded maps a byte-level BPE token back to the bytes it stands for. A code point
// outside the byte alphabet is written as llama.cpp's llama_decode_text writes it.
func appendByteDecoded(dst []byte, s string) []byte {
	for i := 0; i < len(s); {
		r, n := decodeRune(s, i)
		if r >= 0 && int(r) < len(runeToByte) && runeToByte[r] >= 0 {
			dst = append(dst, byte(runeToByte[r]))
		} else {
			dst = append(dst, "[UNK_BYTE_0x"...)
			for _, b := range appendRune(nil, r) {
				dst = fmt.Appendf(dst, "%02x", b)
			}
			dst = append(dst, s...)
			dst = append(dst, ']')
		}
		i += n
	}
	return dst
}

// byteTokenValue parses the byte of a "<0xXX>" token as llama.cpp does (strtol over the two
// characters after "<0x", stopping at the first one that is not hexadecimal).
func byteTokenValue(s string) (byte, bool) {
	if len(s) < 3 {
		return 0, false
	}
	v := 0
	for i := 3; i < len(s) && i < 5; i++ {
		c := s[i]
		var d int
		switch {
		case c >= '0' && c <= '9':
			d = int(c - '0')
		case c >= 'a' && c <= 'f':
			d = int(c-'a') + 10
		case c >= 'A' && c <= 'F':
			d = int(c-'A') + 10
		default:
			return byte(v), true
		}
		v = v*16 + d
	}
	return byte(v), true
}

// buildByteTokens finds the byte fallback tokens of a SentencePiece vocabulary: "<0xXX>", or
// failing that the one-byte token itself.
func (t *Tokenizer) buildByteTokens() {
	const hex = "0123456789ABCDEF"
	for b := range 256 {
		t.byteTok[b] = NoToken
		if id, ok := t.toID[string([]byte{'<', '0', 'x', hex[b>>4], hex[b&15], '>'})]; ok {
			t.byteTok[b] = id
		} else if id, ok := t.toID[string([]byte{byte(b)})]; ok {
			t.byteTok[b] = id
		}
	}
}

// specialTrie indexes the special token texts byte by byte so that one pass over the input finds
// which of them occur in it.
type specialTrie struct {
	first [256]bool
	next  map[uint64]int32 // node<<8 | byte -> child node
	term  []int32          // per node: index into Tokenizer.specials of the token ending there, or -1
}

func (tr *specialTrie) build(tokens []string, specials []int32) {
	tr.next = make(map[uint64]int32)
	tr.term = []int32{-1}
	for k, id := range specials {
		s := tokens[id]
		tr.first[s[0]] = true
		node := int32(0)
		for i := 0; i < len(s); i++ {
			key := uint64(node)<<8 | uint64(s[i])
			child, ok := tr.next[key]
			if !ok {
				child = int32(len(tr.term))
				tr.term = append(tr.term, -1)
				tr.next[key] = child
			}
			node = child
		}
		tr.term[node] = int32(k)
	}
}

// scan marks present[k] for every special token k that occurs in s and reports whether any does.
func (tr *specialTrie) scan(s string, present []bool) bool {
	any := false
	for i := 0; i < len(s); i++ {
		if !tr.first[s[i]] {
			continue
		}
		node := int32(0)
		for j := i; j < len(s); j++ {
			child, ok := tr.next[uint64(node)<<8|uint64(s[j])]
			if !ok {
				break
			}
			node = child
			if k := tr.term[node]; k >= 0 {
				present[k] = true
				any = true
			}
		}
	}
	return any
}
