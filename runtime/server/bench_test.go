package server

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/decode"
	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/sched"
)

// instantModel is a sched.Model whose forward pass costs nothing: each logit row puts the
// largest value on a token that depends on the row's position, so greedy decoding produces
// varied text. Scheduling, sampling, detokenising and the HTTP and SSE path then account for
// all of a request's time.
type instantModel struct {
	pool  *kvcache.Pool
	vocab int
}

func (m *instantModel) Forward(tokens []int32, b *backend.Batch, out []int32, logits []float32) error {
	for i, t := range out {
		row := logits[i*m.vocab : (i+1)*m.vocab]
		clear(row)
		row[3+int(b.Pos[t])%(m.vocab-3)] = 10
	}
	return nil
}
func (m *instantModel) Pool() *kvcache.Pool { return m.pool }
func (m *instantModel) Vocab() int          { return m.vocab }
func (m *instantModel) StepTokens() int     { return 64 }
func (m *instantModel) MaxSeqs() int        { return 8 }

// BenchmarkStreamOverhead measures what one streamed token costs above the model's forward
// pass, at batch 1: "direct" reads the scheduler's event stream in process (scheduling, greedy
// sampling over the vocabulary, detokenising); "http" runs the same request through the server
// as POST /v1/completions with "stream": true on a loopback listener, read line by line by a
// client in the same process (routing, JSON encoding of every chunk, SSE framing, a flush per
// token, the client's reads). The difference per token is the HTTP and SSE overhead, to be set
// against a decode step (BenchmarkDecodeStep in runtime/models/llama).
//
//	go test ./runtime/server -run '^$' -bench StreamOverhead
func BenchmarkStreamOverhead(b *testing.B) {
	const gen, ctx = 256, 512
	e := openLLM(b, modelPath(b))
	pool, err := kvcache.NewPool(2*ctx/16, 16)
	if err != nil {
		b.Fatal(err)
	}
	m := &instantModel{pool: pool, vocab: e.Model.Vocab}
	sc, err := sched.New(m, e.Text(), sched.Config{MaxContext: ctx})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc.Run(context.Background())
	}()
	defer func() {
		sc.Close()
		<-done
	}()
	s, err := New(Config{}, []*Model{llmModel("m", e, sc, ctx)})
	if err != nil {
		b.Fatal(err)
	}
	s.SetReady(true)
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	prompt, err := e.Tokenizer.Encode("Once upon a time", true, false)
	if err != nil {
		b.Fatal(err)
	}

	greedy := decode.DefaultParams()
	greedy.Temperature = 0
	b.Run("direct", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			st, err := sc.Submit(context.Background(), &sched.Request{
				Prompt: prompt, MaxTokens: gen, IgnoreEOS: true, Sampling: greedy,
			})
			if err != nil {
				b.Fatal(err)
			}
			n := 0
			for ev := range st.Events() {
				if ev.Token >= 0 {
					n++
				}
			}
			if n != gen {
				b.Fatalf("%d tokens, want %d", n, gen)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*gen)/1e3, "µs/token")
	})

	body := fmt.Sprintf(`{"model":"m","prompt":"Once upon a time","max_tokens":%d,"temperature":0,"ignore_eos":true,"stream":true}`, gen)
	b.Run("http", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			resp, err := http.Post(srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			sc := bufio.NewScanner(resp.Body)
			n := 0
			for sc.Scan() {
				line := sc.Bytes()
				if !bytes.HasPrefix(line, []byte("data: ")) {
					continue
				}
				if bytes.Equal(line, []byte("data: [DONE]")) {
					break
				}
				if bytes.Contains(line, []byte(`"text"`)) {
					n++
				}
			}
			resp.Body.Close()
			if n < gen {
				b.Fatalf("%d chunks, want at least %d", n, gen)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*gen)/1e3, "µs/token")
	})
}
