package server

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"

	"github.com/parleyhq/parley/runtime/sched"
)

// Embedder computes a model's embeddings: *sched.Embedder, which batches the inputs of every
// request in flight.
type Embedder interface {
	// Embed returns one embedding per input (token ids), normalised to unit length.
	Embed(ctx context.Context, inputs [][]int32) ([][]float32, error)
	// Dim is the width of an embedding.
	Dim() int
	// MaxTokens is the most tokens one input may have.
	MaxTokens() int
	// Stats is a snapshot for /metrics.
	Stats() sched.LoopStats
}

// maxEmbedInputs bounds the inputs of one request, as OpenAI's limit does.
const maxEmbedInputs = 2048

type embeddingRequest struct {
	Model          string          `json:"model"`
	Input          json.RawMessage `json:"input"`
	EncodingFormat *string         `json:"encoding_format"`
	Dimensions     *int            `json:"dimensions"`
	KeepAlive      json.RawMessage `json:"keep_alive"` // an on-demand model's, as Ollama's
}

// parseEmbedInput reads input: a string, an array of strings, an array of token ids, or an
// array of arrays of token ids; none of them empty.
func parseEmbedInput(raw json.RawMessage, vocab int) ([]*promptInput, *apiError) {
	if isNull(raw) {
		return nil, invalid("input", "Missing required parameter: 'input'.")
	}
	if p, e, ok := parseOneInput(raw, vocab, "input"); ok {
		if e != nil {
			return nil, e
		}
		return []*promptInput{p}, nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, invalid("input", "Invalid 'input': expected a string, an array of strings, an array of token ids or an array of arrays of token ids.")
	}
	if len(list) == 0 {
		return nil, invalid("input", "Invalid 'input': empty array. Expected an array with minimum length 1.")
	}
	if len(list) > maxEmbedInputs {
		return nil, invalid("input", fmt.Sprintf("Invalid 'input': at most %d inputs are allowed, but got %d.", maxEmbedInputs, len(list)))
	}
	out := make([]*promptInput, len(list))
	for i, b := range list {
		what := fmt.Sprintf("input[%d]", i)
		p, e, ok := parseOneInput(b, vocab, what)
		if !ok {
			return nil, invalid("input", fmt.Sprintf("Invalid '%s': expected a string or an array of token ids.", what))
		}
		if e != nil {
			return nil, e
		}
		out[i] = p
	}
	return out, nil
}

// parseOneInput is parseOnePrompt with errors naming input.
func parseOneInput(raw json.RawMessage, vocab int, what string) (*promptInput, *apiError, bool) {
	p, e, ok := parseOnePrompt(raw, vocab, what)
	if e != nil {
		e = invalid("input", e.Message)
	}
	return p, e, ok
}

type embeddingObject struct {
	Object    string `json:"object"`
	Index     int    `json:"index"`
	Embedding any    `json:"embedding"` // []float32, or a base64 string
}

func (s *Server) embeddings(w http.ResponseWriter, r *http.Request) {
	body, e := readBody(r)
	if e != nil {
		writeError(w, e)
		return
	}
	var req embeddingRequest
	if e := decodeBody(body, &req); e != nil {
		writeError(w, e)
		return
	}
	m, e := s.model(r, req.Model, req.KeepAlive)
	if e != nil {
		writeError(w, e)
		return
	}
	if m.Embedder == nil {
		writeError(w, invalidCode("model", "model_not_supported", fmt.Sprintf("The model '%s' does not compute embeddings; use an embedding model (or serve this one with embeddings enabled).", m.Name)))
		return
	}
	b64 := false
	if f := req.EncodingFormat; f != nil {
		switch *f {
		case "float":
		case "base64":
			b64 = true
		default:
			writeError(w, invalid("encoding_format", fmt.Sprintf("Invalid 'encoding_format': expected float or base64, but got %q.", *f)))
			return
		}
	}
	dim := m.Embedder.Dim()
	if d := req.Dimensions; d != nil && *d != dim {
		if *d < 1 {
			writeError(w, invalid("dimensions", fmt.Sprintf("Invalid 'dimensions': expected a value >= 1, but got %d.", *d)))
			return
		}
		writeError(w, unsupported("dimensions", fmt.Sprintf("other than the model's %d (the model was not trained to be shortened)", dim)))
		return
	}
	ins, e := parseEmbedInput(req.Input, m.vocab)
	if e != nil {
		writeError(w, e)
		return
	}
	most := m.Embedder.MaxTokens()
	toks := make([][]int32, len(ins))
	total := 0
	for i, in := range ins {
		t := in.tokens
		if in.isText {
			var err error
			if t, err = m.Tokenizer.Encode(in.text); err != nil || len(t) == 0 {
				writeError(w, invalid("input", fmt.Sprintf("Invalid 'input': input %d could not be tokenized.", i)))
				return
			}
		}
		if len(t) > most {
			writeError(w, invalidCode("input", "context_length_exceeded", fmt.Sprintf("This model's maximum context length is %d tokens, however input %d has %d tokens. Please reduce the length of the input.", most, i, len(t))))
			return
		}
		toks[i] = t
		total += len(t)
	}
	vecs, err := m.Embedder.Embed(r.Context(), toks)
	if err != nil {
		ri := info(r.Context())
		switch {
		case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
			return // the client is gone
		case errors.Is(err, sched.ErrQueueFull):
			writeError(w, &apiError{Status: http.StatusTooManyRequests, Message: "The server is busy; retry shortly.", Type: typeRateLimit, Code: strptr("queue_full"), RetryAfter: 1})
		case errors.Is(err, sched.ErrClosed):
			writeError(w, &apiError{Status: http.StatusServiceUnavailable, Message: "The server is shutting down.", Type: typeUnavailable, RetryAfter: 5})
		case errors.Is(err, sched.ErrInvalid):
			writeError(w, invalid("input", "Invalid 'input': "+err.Error()))
		default:
			ri.log.Error("embedding failed", "model", m.Name, "err", err)
			writeError(w, internalError())
		}
		return
	}
	data := make([]embeddingObject, len(vecs))
	for i, v := range vecs {
		data[i] = embeddingObject{Object: "embedding", Index: i, Embedding: v}
		if b64 {
			var buf bytes.Buffer
			buf.Grow(4 * len(v))
			for _, x := range v {
				binary.Write(&buf, binary.LittleEndian, math.Float32bits(x))
			}
			data[i].Embedding = base64.StdEncoding.EncodeToString(buf.Bytes())
		}
	}
	writeJSON(w, struct {
		Object string            `json:"object"`
		Data   []embeddingObject `json:"data"`
		Model  string            `json:"model"`
		Usage  struct {
			PromptTokens int `json:"prompt_tokens"`
			TotalTokens  int `json:"total_tokens"`
		} `json:"usage"`
	}{Object: "list", Data: data, Model: m.Name, Usage: struct {
		PromptTokens int `json:"prompt_tokens"`
		TotalTokens  int `json:"total_tokens"`
	}{total, total}})
}
