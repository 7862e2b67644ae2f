// Package pooling turns the hidden states a model computes for each token into one embedding per
// sequence, and normalises embeddings, as llama.cpp does: the pooling types of enum
// llama_pooling_type (src/llama.cpp, append_pooling; the rows each type reads are set up in
// src/llama-context.cpp, llama_set_inputs) and common_embd_normalize (common/common.cpp), at
// commit c392e5094deaf2d1a7c18683214f007fad3fe42b.
//
// It is shared by every model that embeds: encoders (runtime/models/bert) and decoder models run
// as embedders (runtime/models/llama's final hidden states). A model computes the batch rows that
// Rows lists; Reduce pools them into one vector per sequence and Normalize scales each vector,
// on the host. It owns no model and no backend.
package pooling

import (
	"fmt"
	"math"

	"github.com/parleyhq/parley/runtime/gguf"
)

// Type is how a sequence's hidden states become its embedding.
type Type int

const (
	// Unspecified is no choice: a context takes the file's, and a file without one means None,
	// as llama.cpp resolves LLAMA_POOLING_TYPE_UNSPECIFIED.
	Unspecified Type = iota
	// None: no pooling; every token's hidden state is an embedding of its own.
	None
	// Mean: the mean of the sequence's hidden states.
	Mean
	// CLS: the hidden state of the sequence's first token (BERT's [CLS]).
	CLS
	// Last: the hidden state of the sequence's last token (decoder embedders, Qwen3-Embedding).
	Last
	// Rank: a reranker's score, from a classification head over the first token's hidden state.
	// Rows and Reduce refuse it: the head is the model's to compute.
	Rank
)

var names = [...]string{Unspecified: "unspecified", None: "none", Mean: "mean", CLS: "cls", Last: "last", Rank: "rank"}

func (t Type) String() string {
	if t >= 0 && int(t) < len(names) {
		return names[t]
	}
	return fmt.Sprintf("pooling type %d", int(t))
}

// Parse returns the type named s (none, mean, cls, last, rank: llama.cpp's --pooling names).
func Parse(s string) (Type, error) {
	for t, n := range names {
		if n == s && Type(t) != Unspecified {
			return Type(t), nil
		}
	}
	return Unspecified, fmt.Errorf("pooling: unknown pooling type %q (none, mean, cls, last or rank)", s)
}

// FromLlama converts a value of llama.cpp's enum llama_pooling_type (as a file's
// <arch>.pooling_type holds it: 0 none, 1 mean, 2 cls, 3 last, 4 rank; -1 unspecified).
func FromLlama(v int64) (Type, error) {
	switch v {
	case -1:
		return Unspecified, nil
	case 0, 1, 2, 3, 4:
		return Type(v + 1), nil
	}
	return Unspecified, fmt.Errorf("pooling: pooling type %d is none of llama.cpp's (0 none, 1 mean, 2 cls, 3 last, 4 rank)", v)
}

// Read returns the pooling type f's metadata gives arch's models (<arch>.pooling_type), or
// Unspecified when it gives none.
func Read(f *gguf.File, arch string) (Type, error) {
	key := arch + ".pooling_type"
	if _, ok := f.Value(key); !ok {
		return Unspecified, nil
	}
	v, ok := f.Int(key)
	if !ok {
		return Unspecified, fmt.Errorf("pooling: model metadata %s is not an integer", key)
	}
	return FromLlama(v)
}

// Resolve is the pooling a context runs: its own choice where it made one, else the file's, else
// None (llama.cpp: the context's parameter, then the model's, then none).
func Resolve(context, file Type) Type {
	switch {
	case context != Unspecified:
		return context
	case file != Unspecified:
		return file
	}
	return None
}

// check validates t and lens (each sequence at least one token) and returns the number of
// tokens.
func check(t Type, lens []int) (int, error) {
	switch t {
	case None, Mean, CLS, Last:
	case Rank:
		return 0, fmt.Errorf("pooling: rank pooling (a reranker's classification head) is not supported")
	default:
		return 0, fmt.Errorf("pooling: %v is not a pooling to run (resolve it first)", t)
	}
	n := 0
	for i, l := range lens {
		if l <= 0 {
			return 0, fmt.Errorf("pooling: sequence %d has %d tokens", i, l)
		}
		if n += l; n > math.MaxInt32 {
			return 0, fmt.Errorf("pooling: %d sequences hold more than %d tokens", len(lens), math.MaxInt32)
		}
	}
	return n, nil
}

// Count is the number of embeddings t makes of sequences of lens tokens: one per token for
// None, one per sequence otherwise.
func Count(t Type, lens []int) int {
	if t != None {
		return len(lens)
	}
	n := 0
	for _, l := range lens {
		n += l
	}
	return n
}

// Rows appends to dst the batch rows that t reads, for sequences of lens[i] tokens laid one
// after another in the batch: the first row of each sequence (CLS), its last row (Last), or every
// row (Mean, None).
func Rows(dst []int32, t Type, lens []int) ([]int32, error) {
	if _, err := check(t, lens); err != nil {
		return dst, err
	}
	start := int32(0)
	for _, l := range lens {
		switch t {
		case CLS:
			dst = append(dst, start)
		case Last:
			dst = append(dst, start+int32(l)-1)
		default:
			for i := range int32(l) {
				dst = append(dst, start+i)
			}
		}
		start += int32(l)
	}
	return dst, nil
}

// Reduce pools: hidden holds the rows Rows lists for t and lens, dim values each, and dst
// receives Count(t, lens) rows of dim values: each sequence's mean (summed in float64), its
// first or last row, or every row (None).
func Reduce(dst, hidden []float32, dim int, t Type, lens []int) error {
	n, err := check(t, lens)
	if err != nil {
		return err
	}
	rows := n
	if t == CLS || t == Last {
		rows = len(lens)
	}
	switch {
	case dim <= 0:
		return fmt.Errorf("pooling: width %d", dim)
	case len(hidden) != rows*dim:
		return fmt.Errorf("pooling: %d hidden values for %d rows of %d", len(hidden), rows, dim)
	case len(dst) != Count(t, lens)*dim:
		return fmt.Errorf("pooling: %d values for %d embeddings of %d", len(dst), Count(t, lens), dim)
	}
	if t != Mean {
		copy(dst, hidden)
		return nil
	}
	var sum []float64
	if dim <= 4096 {
		var buf [4096]float64
		sum = buf[:dim]
	} else {
		sum = make([]float64, dim)
	}
	for s, l := range lens {
		clear(sum)
		for r := range l {
			for j, v := range hidden[r*dim : (r+1)*dim] {
				sum[j] += float64(v)
			}
		}
		hidden = hidden[l*dim:]
		out := dst[s*dim : (s+1)*dim]
		for j := range out {
			out[j] = float32(sum[j] / float64(l))
		}
	}
	return nil
}

// Norm is how Normalize scales an embedding, numbered as llama.cpp's --embd-normalize: -1 none,
// 0 the largest magnitude to 32760 (int16's range), 1 taxicab, 2 Euclidean (llama.cpp's default,
// and what OpenAI's embeddings are), p > 2 the p-norm.
type Norm int

const (
	NormNone      Norm = -1
	NormMaxAbs    Norm = 0
	NormTaxicab   Norm = 1
	NormEuclidean Norm = 2
)

// Normalize scales each row of dim values of x in place to unit norm n, computed as
// common_embd_normalize computes it: the sum in float64 over float32 squares (Euclidean) or
// float64 powers, the scale 1/norm rounded to float32 (0 for a zero row) and multiplied in
// float32.
func Normalize(x []float32, dim int, n Norm) error {
	if dim <= 0 || len(x)%dim != 0 {
		return fmt.Errorf("pooling: %d values are not rows of %d", len(x), dim)
	}
	if n < NormNone {
		return fmt.Errorf("pooling: normalisation %d (want -1 none, 0 max-abs, 1 taxicab, 2 euclidean or p > 2)", int(n))
	}
	if n == NormNone {
		return nil
	}
	for r := 0; r < len(x); r += dim {
		row := x[r : r+dim]
		var sum float64
		switch n {
		case NormMaxAbs:
			for _, v := range row {
				sum = math.Max(sum, math.Abs(float64(v)))
			}
			sum /= 32760
		case NormEuclidean:
			for _, v := range row {
				sum += float64(v * v)
			}
			sum = math.Sqrt(sum)
		default:
			p := float64(n)
			for _, v := range row {
				sum += math.Pow(math.Abs(float64(v)), p)
			}
			sum = math.Pow(sum, 1/p)
		}
		var scale float32
		if sum > 0 {
			scale = float32(1 / sum)
		}
		for i := range row {
			row[i] *= scale
		}
	}
	return nil
}
