package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/hub"
	"github.com/parleyhq/parley/runtime/models"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/sched"
	"github.com/parleyhq/parley/runtime/sched/asr"
	"github.com/parleyhq/parley/runtime/server"
)

// envDefault returns $name, or def when it is unset.
func envDefault(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

func envInt(name string, def int) int {
	if v, ok := os.LookupEnv(name); ok {
		if n, err := strconv.Atoi(v); err == nil {
			return n
		}
	}
	return def
}

func runServe(e *env, args []string) error {
	fs := newFlags(e, "serve", "-m [ALIAS=]MODEL [-m ...] [flags]   (every flag also reads $PARLEY_<FLAG>)")
	bf := addBackendFlags(fs)
	var modelArgs multiFlag
	fs.Var(&modelArgs, "m", "model file, or ALIAS=FILE, where FILE may be hf://owner/repo[@rev]/file.gguf (downloaded once into $PARLEY_CACHE; repeatable; $PARLEY_MODEL, comma-separated); a Whisper model (whisper.cpp ggml file, or GGUF of architecture whisper) is served as a speech recognition model")
	host := fs.String("host", envDefault("PARLEY_HOST", "127.0.0.1"), "address to listen on")
	port := fs.Int("port", envInt("PARLEY_PORT", 8080), "port to listen on (0: any free port, printed at start)")
	ctxLen := fs.Int("ctx", envInt("PARLEY_CTX", 0), "positions per sequence (0: the model's training context)")
	parallel := fs.Int("parallel", envInt("PARLEY_PARALLEL", 8), "most sequences decoded together per model")
	kvMiB := fs.Int("kv-mem", envInt("PARLEY_KV_MEM", 0), "KV-cache memory budget per model in MiB (0: ctx × parallel positions, cut to fit half the memory available, three quarters of a GPU's)")
	stepTokens := fs.Int("step-tokens", envInt("PARLEY_STEP_TOKENS", 512), "token budget of one batched step (decode tokens plus prompt chunks)")
	queue := fs.Int("queue", envInt("PARLEY_QUEUE", 64), "waiting requests per model beyond which requests get 429")
	apiKey := fs.String("api-key", envDefault("PARLEY_API_KEY", ""), "require this bearer token")
	cors := fs.String("cors", envDefault("PARLEY_CORS", ""), "comma-separated origins browsers may call from (* for any)")
	maxBody := fs.Int64("max-body", int64(envInt("PARLEY_MAX_BODY", 4<<20)), "largest request body in bytes")
	timeout := fs.Duration("timeout", 10*time.Minute, "longest a generation may run ($PARLEY_TIMEOUT)")
	bodyTimeout := fs.Duration("body-timeout", 5*time.Minute, "longest a request body may take to arrive; a slower one is answered 408 ($PARLEY_BODY_TIMEOUT)")
	grace := fs.Duration("shutdown-grace", 30*time.Second, "on SIGTERM, how long in-flight requests and live transcriptions may finish ($PARLEY_SHUTDOWN_GRACE)")
	logFormat := fs.String("log-format", envDefault("PARLEY_LOG_FORMAT", "text"), "log format: text or json")
	logLevel := fs.String("log-level", envDefault("PARLEY_LOG_LEVEL", "info"), "log level: trace, debug, info, warn, error")
	kvType := fs.String("kv-type", envDefault("PARLEY_KV_TYPE", "f16"), kvTypeUsage)
	asrParallel := fs.Int("asr-parallel", envInt("PARLEY_ASR_PARALLEL", 4), "most transcriptions decoded together per speech model")
	asrQueue := fs.Int("asr-queue", envInt("PARLEY_ASR_QUEUE", 16), "waiting transcriptions per speech model beyond which requests get 429")
	asrEncode := fs.Int("asr-encode-batch", envInt("PARLEY_ASR_ENCODE_BATCH", 1), "most audio windows encoded in one batched encoder call (1..--asr-parallel; more pays on a GPU, not on a CPU)")
	maxAudio := fs.Int64("max-audio-body", int64(envInt("PARLEY_MAX_AUDIO_BODY", 25<<20)), "largest audio upload in bytes")
	maxAudioDur := fs.Duration("max-audio-duration", 2*time.Hour, "longest audio accepted for transcription ($PARLEY_MAX_AUDIO_DURATION)")
	maxStreams := fs.Int("max-streams", envInt("PARLEY_MAX_STREAMS", 16), "live transcription sessions (/v1/audio/stream) open at once")
	asrBeam := fs.Int("asr-beam", envInt("PARLEY_ASR_BEAM", 1), "beam size of transcriptions (1: greedy)")
	asrBestOf := fs.Int("asr-best-of", envInt("PARLEY_ASR_BEST_OF", asr.DefaultParams().BestOf), "candidates sampled at temperatures above 0 (transcriptions' fallback)")
	prefix := fs.Bool("prefix-cache", envDefault("PARLEY_PREFIX_CACHE", "true") != "false", "reuse the KV blocks of prompt prefixes shared between requests")
	if v, ok := os.LookupEnv("PARLEY_TIMEOUT"); ok {
		if d, err := time.ParseDuration(v); err == nil {
			*timeout = d
		}
	}
	if v, ok := os.LookupEnv("PARLEY_MAX_AUDIO_DURATION"); ok {
		if d, err := time.ParseDuration(v); err == nil {
			*maxAudioDur = d
		}
	}
	for _, d := range []struct {
		env string
		dst *time.Duration
	}{{"PARLEY_SHUTDOWN_GRACE", grace}, {"PARLEY_BODY_TIMEOUT", bodyTimeout}} {
		if v, ok := os.LookupEnv(d.env); ok {
			if t, err := time.ParseDuration(v); err == nil {
				*d.dst = t
			}
		}
	}
	pos, err := parse(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("unexpected arguments %q", pos)
	}
	if len(modelArgs) == 0 {
		if v := os.Getenv("PARLEY_MODEL"); v != "" {
			modelArgs = strings.Split(v, ",")
		} else {
			return usagef("at least one -m MODEL is required")
		}
	}
	if *parallel < 1 || *stepTokens < 1 || *queue < 0 || *ctxLen < 0 || *kvMiB < 0 || *maxBody < 1 {
		return usagef("--parallel, --step-tokens and --max-body must be positive; --queue, --ctx and --kv-mem not negative")
	}
	if *asrParallel < 1 || *asrQueue < 0 || *maxAudio < 1 || *maxAudioDur <= 0 || *maxStreams < 1 || *asrEncode < 1 || *asrEncode > min(*asrParallel, 64) {
		return usagef("--asr-parallel, --max-audio-body, --max-audio-duration and --max-streams must be positive; --asr-queue not negative; --asr-encode-batch 1..--asr-parallel (64 at most)")
	}
	if *grace < 0 || *bodyTimeout <= 0 {
		return usagef("--shutdown-grace must not be negative, --body-timeout must be positive")
	}
	asrParams := asr.DefaultParams()
	asrParams.BeamSize, asrParams.BestOf = *asrBeam, *asrBestOf
	if err := asrParams.Validate(); err != nil {
		return usagef("--asr-beam %d, --asr-best-of %d: %v", *asrBeam, *asrBestOf, err)
	}
	kv, err := parseKVType(*kvType)
	if err != nil {
		return err
	}
	logger, err := newLogger(e, *logFormat, *logLevel)
	if err != nil {
		return usageError{err}
	}
	type spec struct{ name, path string }
	var specs []spec
	seen := map[string]bool{}
	for _, m := range modelArgs {
		name, path, ok := strings.Cut(m, "=")
		if !ok {
			path = m
			name = strings.TrimSuffix(filepath.Base(m), filepath.Ext(m))
		}
		if name == "" || path == "" {
			return usagef("-m %q: want FILE or ALIAS=FILE", m)
		}
		if seen[name] {
			return usagef("model alias %q given twice", name)
		}
		seen[name] = true
		specs = append(specs, spec{name, path})
	}

	if err := bf.check(); err != nil {
		return err
	}

	// Listen first, so that /health answers 503 while the models load.
	ln, err := net.Listen("tcp", net.JoinHostPort(*host, strconv.Itoa(*port)))
	if err != nil {
		return err
	}
	var origins []string
	for _, o := range strings.Split(*cors, ",") {
		if o = strings.TrimSpace(o); o != "" {
			origins = append(origins, o)
		}
	}
	var handler atomic.Pointer[http.Handler]
	loading := server.Loading(server.Config{AllowedOrigins: origins, Logger: logger})
	handler.Store(&loading)
	hs := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*handler.Load()).ServeHTTP(w, r) }),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	logger.Info("listening", "addr", ln.Addr().String())
	fmt.Fprintf(e.stderr, "parley: listening on http://%s\n", ln.Addr())

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	be, err := bf.open(e)
	if err != nil {
		hs.Close()
		return err
	}
	defer be.Close()
	logger.Info("backend", "name", be.Name())

	steps := server.NewStepMetrics()
	var served []*server.Model
	var speechModels []*server.SpeechModel
	var scheds []*sched.Scheduler
	var speechEngines []asr.Recognizer
	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	for i, sp := range specs {
		t0 := time.Now()
		be := be
		if _, records := be.(backend.Recorder); records && i > 0 {
			// A backend that records its steps (CUDA graphs) records everything called on it
			// meanwhile: each model, stepped by its own goroutine, gets a backend of its own (on
			// a GPU, its own stream).
			if be, err = bf.open(e); err != nil {
				hs.Close()
				return fmt.Errorf("%s: %w", sp.name, err)
			}
			closers = append(closers, func() { be.Close() })
		}
		if hub.IsRemote(sp.path) {
			// The progress bar redraws one line: on a terminal, and not between JSON records.
			var progress io.Writer
			if *logFormat != "json" && isTerminal(e.stderr) {
				progress = e.stderr
			}
			local, err := hub.Resolve(ctx, sp.path, hub.Options{Progress: progress})
			if err != nil {
				hs.Close()
				return fmt.Errorf("%s: %w", sp.name, err)
			}
			sp.path = local
		}
		if kind, err := models.Probe(sp.path); err != nil {
			hs.Close()
			return fmt.Errorf("%s: %w", sp.name, err)
		} else if kind == models.KindSpeechRecognition {
			we, err := models.OpenRecognizer(sp.path, be, asr.Config{MaxActive: *asrParallel, MaxQueue: *asrQueue, EncodeBatch: *asrEncode,
				OnStep: steps.OnStep(sp.name), Logger: logger.With("model", sp.name)})
			if err != nil {
				hs.Close()
				return fmt.Errorf("%s: %w", sp.name, err)
			}
			closers = append(closers, func() { we.Close() })
			speechModels = append(speechModels, &server.SpeechModel{Name: sp.name, Recognizer: we.Recognizer, Params: &asrParams})
			speechEngines = append(speechEngines, we.Recognizer)
			logger.Info("speech model loaded", "model", sp.name, "path", sp.path, "family", we.Family, "multilingual", we.Multilingual(), "parallel", *asrParallel, "took", time.Since(t0).Round(time.Millisecond))
			continue
		}
		llm, err := models.OpenLLM(sp.path, be)
		if err != nil {
			hs.Close()
			return err
		}
		closers = append(closers, func() { llm.Close() })
		m := llm.Model
		perPos := kvBytesPerPos(m, kv)
		var budget int64
		if *kvMiB == 0 {
			budget = kvBudget(be) / int64(len(specs)) // shared by the models served
		}
		plan := planKV(*ctxLen, *kvMiB, *parallel, llm.TrainingContext(), perPos, budget)
		n, slots := plan.ctx, plan.slots
		if *kvMiB > 0 && slots < n {
			hs.Close()
			return fmt.Errorf("%s: --kv-mem %d MiB holds %d positions, less than one sequence of %d", sp.name, *kvMiB, slots, n)
		}
		if plan.capped && n < min(llm.TrainingContext(), minCutCtx) {
			hs.Close()
			return fmt.Errorf("%s: %d MiB of memory for the KV cache hold only %d positions; give --kv-mem (MiB) or a smaller --ctx or --parallel", sp.name, budget>>20, n)
		}
		if plan.capped {
			logger.Warn("KV cache cut to fit memory; --ctx and --kv-mem choose", "model", sp.name, "trained_ctx", llm.TrainingContext(), "ctx", n,
				"kv_slots", slots, "wanted_slots", int64(n)*int64(*parallel), "budget_mib", budget>>20)
		}
		if plan.tight {
			logger.Warn("one sequence of --ctx needs more than the KV memory budget", "model", sp.name, "ctx", n,
				"needs_mib", int64(n)*perPos>>20, "budget_mib", budget>>20)
		}
		c, err := m.NewContext(llama.ContextConfig{StepTokens: *stepTokens, MaxSeqs: *parallel, KVSlots: slots, KVType: kv, SeqContext: n})
		if err != nil {
			hs.Close()
			return fmt.Errorf("%s: %w", sp.name, err)
		}
		closers = append(closers, func() { c.Close() })
		s, err := sched.New(sched.NewLlamaModel(c), llm.Text(), sched.Config{
			MaxQueue: *queue, StepTokens: *stepTokens, MaxActive: *parallel, MaxContext: n, PrefixCache: *prefix, OnStep: steps.OnStep(sp.name), Logger: logger.With("model", sp.name),
		})
		if err != nil {
			hs.Close()
			return fmt.Errorf("%s: %w", sp.name, err)
		}
		scheds = append(scheds, s)
		served = append(served, &server.Model{Name: sp.name, Tokenizer: llm.Text(), ChatTemplate: llm.ChatTemplate(), Sched: s, Ctx: n})
		logger.Info("model loaded", "model", sp.name, "path", sp.path, "arch", m.Arch, "ctx", n, "kv_slots", c.Pool().Slots(), "parallel", *parallel, "took", time.Since(t0).Round(time.Millisecond))
	}
	srv, err := server.New(server.Config{APIKey: *apiKey, AllowedOrigins: origins, MaxBodyBytes: *maxBody, BodyTimeout: *bodyTimeout, RequestTimeout: *timeout, Logger: logger, Steps: steps,
		SpeechModels: speechModels, MaxAudioBytes: *maxAudio, MaxAudioDuration: *maxAudioDur, Stream: server.StreamConfig{MaxSessions: *maxStreams}}, served)
	if err != nil {
		hs.Close()
		return err
	}
	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	var wg sync.WaitGroup
	for _, s := range scheds {
		wg.Add(1)
		go func(s *sched.Scheduler) {
			defer wg.Done()
			if err := s.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, sched.ErrClosed) {
				logger.Error("scheduler stopped", "err", err)
			}
		}(s)
	}
	h := srv.Handler()
	handler.Store(&h)
	srv.SetReady(true)
	logger.Info("ready", "models", len(served), "speech_models", len(speechModels))

	select {
	case err := <-serveErr:
		cancelRun()
		wg.Wait()
		return err
	case <-ctx.Done():
	}
	// Graceful shutdown: stop accepting; let in-flight requests and live transcriptions finish
	// up to the grace period; then cancel what is left, and give the handlers a few seconds to
	// tell their clients so (an error event and [DONE] for a stream, 503 for a transcription).
	logger.Info("shutting down", "grace", *grace)
	srv.SetReady(false)
	sctx, cancel := context.WithTimeout(context.Background(), *grace)
	defer cancel()
	liveDone := make(chan struct{})
	go func() {
		defer close(liveDone)
		if err := srv.Shutdown(sctx); err != nil {
			logger.Warn("live transcriptions cut at the end of the grace period", "err", err)
		}
	}()
	shutErr := hs.Shutdown(sctx)
	<-liveDone
	if shutErr != nil && !errors.Is(shutErr, context.DeadlineExceeded) {
		logger.Error("shutdown", "err", shutErr)
	}
	for _, s := range scheds {
		s.Close()
	}
	for _, we := range speechEngines {
		we.Close()
	}
	cancelRun()
	wg.Wait()
	if shutErr != nil {
		fctx, fcancel := context.WithTimeout(context.Background(), 5*time.Second)
		hs.Shutdown(fctx)
		fcancel()
	}
	hs.Close()
	logger.Info("stopped")
	return nil
}

// levelTrace is below slog's Debug: per-step scheduler records.
const levelTrace = slog.Level(-8)

func newLogger(e *env, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	switch strings.ToLower(level) {
	case "trace":
		lv = levelTrace
	case "debug":
		lv = slog.LevelDebug
	case "info":
		lv = slog.LevelInfo
	case "warn":
		lv = slog.LevelWarn
	case "error":
		lv = slog.LevelError
	default:
		return nil, fmt.Errorf("--log-level %q: want trace, debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(e.stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(e.stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}
