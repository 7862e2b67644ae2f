package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/gguf"
	"github.com/parleyhq/parley/runtime/models"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/models/pockettts"
	"github.com/parleyhq/parley/runtime/sched"
	"github.com/parleyhq/parley/runtime/server"
)

// keepAliveFlag is a keep-alive: a duration ("5m") or seconds ("300"); negative keeps a model
// loaded until its memory is needed, 0 unloads it when its last request ends.
type keepAliveFlag time.Duration

func (k *keepAliveFlag) String() string { return time.Duration(*k).String() }
func (k *keepAliveFlag) Set(s string) error {
	d, err := server.ParseKeepAlive(s)
	if err != nil {
		return errors.New("want a duration such as 5m, or seconds")
	}
	*k = keepAliveFlag(d)
	return nil
}

// byteSize is a size in bytes: a number with an optional unit (K, M, G, T, or KiB, MiB, GiB,
// TiB, all powers of 1024; KB, MB, GB, TB, powers of 1000).
type byteSize int64

func (b *byteSize) String() string { return strconv.FormatInt(int64(*b), 10) }
func (b *byteSize) Set(s string) error {
	t := strings.TrimSpace(s)
	i := strings.IndexFunc(t, func(c rune) bool { return !(c >= '0' && c <= '9' || c == '.') })
	num, unit := t, ""
	if i >= 0 {
		num, unit = t[:i], strings.ToUpper(strings.TrimSpace(t[i:]))
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f < 0 {
		return errors.New("want a size such as 8GiB, 512MiB or a number of bytes")
	}
	mul := map[string]float64{"": 1, "B": 1, "K": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GIB": 1 << 30, "T": 1 << 40, "TIB": 1 << 40,
		"KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[unit]
	if mul == 0 || f*mul > 1<<62 {
		return errors.New("want a size such as 8GiB, 512MiB or a number of bytes")
	}
	*b = byteSize(f * mul)
	return nil
}

// splitPart matches the name of a split GGUF model's file: PREFIX-0000I-of-0000N.gguf.
var splitPart = regexp.MustCompile(`^(.*)-(\d{5})-of-(\d{5})\.gguf$`)

// scanModelsDir lists the model files of dir: GGUF files (a split model by its first file),
// whisper.cpp ggml files (.bin) and Pocket TTS checkpoints (.safetensors), each named after its
// file without the extension. A file whose header does not read as a model is left out, with
// a warning.
func scanModelsDir(dir string, warn func(msg string, args ...any)) ([]serveSpec, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []serveSpec
	for _, de := range ents {
		name := de.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		path := filepath.Join(dir, name)
		if fi, err := os.Stat(path); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		ext := strings.ToLower(filepath.Ext(name))
		alias := strings.TrimSuffix(name, filepath.Ext(name))
		switch ext {
		case ".gguf":
			if m := splitPart.FindStringSubmatch(name); m != nil {
				if m[2] != "00001" {
					continue // opened with the first
				}
				alias = m[1]
			}
		case ".bin":
		case ".safetensors":
			if ok, err := pockettts.IsModelFile(path); err != nil || !ok {
				continue // a voice, or other weights
			}
		default:
			continue
		}
		if _, err := models.Check(path); err != nil {
			warn("not a model file: left out", "path", path, "err", err)
			continue
		}
		out = append(out, serveSpec{name: alias, path: path, fromDir: true})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// memoryBudget is the memory the on-demand models may take together: maxMemory when given,
// else the host memory available now; on a backend that reports its own memory (CUDA), no more
// than the device has free now. 0: unknown, no bound.
func memoryBudget(maxMemory int64, be backend.Backend) int64 {
	budget := maxMemory
	if budget == 0 {
		budget = hostAvailable()
	}
	if m, ok := be.(backend.MemoryReporter); ok {
		if free, err := m.FreeMemory(); err == nil && free > 0 && (budget == 0 || free < budget) {
			budget = free
		}
	}
	return budget
}

// estimate is the memory sp's model takes loaded, read from its file without loading it:
// a language model's weights, its KV cache as planned for half of what budget leaves beside
// the weights (the plan
// is kept in sp, so that the load allocates what was counted) and its step's scratch (logits
// and activations); an embedding model's weights and a quarter more; a speech model's weights
// and as much again for its caches and scratch.
func estimate(sp *serveSpec, kind models.Kind, budget int64, embeddings bool) (int64, error) {
	fi, err := os.Stat(sp.path)
	if err != nil {
		return 0, err
	}
	switch kind {
	case models.KindSpeechRecognition:
		return 2 * fi.Size(), nil
	case models.KindSpeechSynthesis:
		n := fi.Size()
		if ti, err := os.Stat(filepath.Join(filepath.Dir(sp.path), pockettts.TokenizerFile)); err == nil {
			n += ti.Size()
		}
		return 2 * n, nil
	}
	f, err := gguf.Open(sp.path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var weights int64
	for _, t := range f.Tensors {
		weights += t.Size
	}
	if kind == models.KindEmbedding {
		return weights + weights/4, nil
	}
	cfg, err := llama.ConfigFrom(f)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", sp.path, err)
	}
	perPos := int64(cfg.Layers) * int64(cfg.KVHeads*cfg.HeadDim) * 2 * int64(sp.kv.TypeSize())
	kvBudget := int64(0)
	if sp.opt.kvMiB == 0 && budget > 0 {
		kvBudget = max((budget-weights)/2, perPos) // room left for other models
	}
	plan := planKV(sp.opt.ctx, sp.opt.kvMiB, sp.opt.parallel, cfg.Context, perPos, kvBudget)
	if err := plan.check(*sp, cfg.Context, kvBudget); err != nil {
		return 0, err
	}
	sp.plan = &plan
	step := int64(min(sp.opt.stepTokens, plan.ctx*sp.opt.parallel))
	scratch := step * int64(cfg.Vocab+4*cfg.Dim+2*cfg.FFN) * 4
	n := weights + int64(plan.slots)*perPos + scratch
	if embeddings {
		n += int64(min(sp.opt.stepTokens, plan.ctx))*perPos + scratch
	}
	return n, nil
}

// onDemandModels are the server's on-demand models of specs: sizes estimated, each loaded on
// its own backend where the backend records its steps.
func onDemandModels(specs []serveSpec, be backend.Backend, bf backendFlags, budget int64, env serveEnv) ([]*server.OnDemandModel, error) {
	var out []*server.OnDemandModel
	for _, sp := range specs {
		kind, err := models.Check(sp.path)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sp.name, err)
		}
		bytes, err := estimate(&sp, kind, budget, env.embeddings)
		if err != nil && sp.fromDir {
			env.logger.Warn("model left out", "model", sp.name, "path", sp.path, "err", err)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sp.name, err)
		}
		if budget > 0 && bytes > budget {
			env.logger.Warn("model larger than the memory budget: its requests will be refused", "model", sp.name, "memory_mib", bytes>>20, "budget_mib", budget>>20)
		}
		k := map[models.Kind]server.ModelKind{models.KindLLM: server.KindLLM, models.KindEmbedding: server.KindEmbedding,
			models.KindSpeechRecognition: server.KindSpeechRecognition, models.KindSpeechSynthesis: server.KindSpeechSynthesis}[kind]
		env.logger.Info("on-demand model", "model", sp.name, "path", sp.path, "kind", k, "memory_mib", bytes>>20, "keep_alive", sp.opt.keepAlive)
		out = append(out, &server.OnDemandModel{Name: sp.name, Kind: k, Bytes: bytes, KeepAlive: sp.opt.keepAlive,
			Load: func(context.Context) (*server.Loaded, error) { return loadOnDemand(sp, be, bf, env) }})
	}
	return out, nil
}

// loadOnDemand opens sp's model and runs its schedulers until the server closes it.
func loadOnDemand(sp serveSpec, be backend.Backend, bf backendFlags, env serveEnv) (*server.Loaded, error) {
	closeBE := func() {}
	if _, records := be.(backend.Recorder); records {
		own, err := bf.start(func(n string) { env.logger.Info(n) })
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sp.name, err)
		}
		be, closeBE = own, func() { own.Close() }
	}
	op, err := openServed(sp, be, env)
	if err != nil {
		closeBE()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, s := range op.scheds {
		wg.Go(func() {
			if err := s.Run(ctx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, sched.ErrClosed) {
				env.logger.Error("scheduler stopped", "model", sp.name, "err", err)
			}
		})
	}
	for _, es := range op.embedders {
		wg.Go(func() {
			if err := es.Run(ctx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, sched.ErrClosed) {
				env.logger.Error("embedding scheduler stopped", "model", sp.name, "err", err)
			}
		})
	}
	return &server.Loaded{Model: op.model, Speech: op.speech, TTS: op.tts, Close: func() {
		for _, s := range op.scheds {
			s.Close()
		}
		for _, es := range op.embedders {
			es.Close()
		}
		if op.recognizer != nil {
			op.recognizer.Close()
		}
		cancel()
		wg.Wait()
		op.close()
		closeBE()
		env.logger.Info("model unloaded", "model", sp.name)
	}}, nil
}
