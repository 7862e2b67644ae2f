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
	"github.com/parleyhq/parley/runtime/pooling"
	"github.com/parleyhq/parley/runtime/sched"
	"github.com/parleyhq/parley/runtime/sched/asr"
	"github.com/parleyhq/parley/runtime/sched/tts"
	"github.com/parleyhq/parley/runtime/server"
	"github.com/parleyhq/parley/runtime/tensor"
)

func runServe(e *env, args []string) (err error) {
	fs := newFlags(e, "serve", "-m [ALIAS=]MODEL [-m ...] | --models-dir DIR [flags]")
	bf := addBackendFlags(fs)
	var modelArgs multiFlag
	fs.Var(&modelArgs, "m", "model file, or ALIAS=FILE, where FILE may be hf://owner/repo[@rev]/file.gguf or hf://owner/repo[@rev]:QUANT (downloaded once into $PARLEY_CACHE; repeatable; the variable holds them comma-separated); a Whisper model (whisper.cpp ggml file, or GGUF of architecture whisper) is served as a speech recognition model, a Pocket TTS checkpoint (safetensors with tokenizer.model beside it, or GGUF) as a speech synthesis model")
	fs.alias("m", "model")
	host := fs.String("host", "127.0.0.1", "address to listen on")
	port := fs.Int("port", 8080, "port to listen on (0: any free port, printed at start)")
	ctxLen := fs.Int("ctx", 0, "positions per sequence (0: the model's training context; more than it is honoured, with a warning)")
	parallel := fs.Int("parallel", 8, "most sequences decoded together per model")
	kvMiB := fs.Int("kv-mem", 0, "KV-cache memory budget per model in MiB (0: ctx × parallel positions, cut to fit half the memory available, three quarters of a GPU's)")
	stepTokens := fs.Int("step-tokens", 512, "token budget of one batched step (decode tokens plus prompt chunks)")
	queue := fs.Int("queue", 64, "waiting requests per model beyond which requests get 429")
	apiKey := fs.String("api-key", "", "require this bearer token (a browser's WebSocket may send it as the subprotocol openai-insecure-api-key.KEY)")
	cors := fs.String("cors", "", "comma-separated origins browsers may call from (* for any); a request from any other origin is refused with 403")
	allowedHosts := fs.String("allowed-hosts", "", "comma-separated host names requests may address besides the loopback ones (localhost, 127.0.0.1, [::1]), which alone are accepted on a loopback address (.example.com: it and its subdomains; *: any)")
	chatTemplate := fs.String("chat-template", "", "chat template of the language models served, in place of their own: a Jinja file, or one of "+strings.Join(server.ChatTemplateNames(), ", "))
	maxBody := fs.Int64("max-body", 4<<20, "largest request body in bytes")
	timeout := fs.Duration("timeout", 10*time.Minute, "longest a generation may run")
	bodyTimeout := fs.Duration("body-timeout", 5*time.Minute, "longest a request body may take to arrive; a slower one is answered 408")
	grace := fs.Duration("shutdown-grace", 30*time.Second, "on SIGTERM, how long in-flight requests and live transcriptions may finish")
	logFormat := fs.String("log-format", "text", "log format: text or json")
	logLevel := fs.String("log-level", "info", "log level: trace, debug, info, warn, error")
	kvType := fs.String("kv-type", "f16", kvTypeUsage)
	asrParallel := fs.Int("asr-parallel", 4, "most transcriptions decoded together per speech model")
	asrQueue := fs.Int("asr-queue", 16, "waiting transcriptions per speech model beyond which requests get 429")
	ttsParallel := fs.Int("tts-parallel", tts.DefaultMaxActive, "most syntheses stepped together per speech synthesis model")
	ttsQueue := fs.Int("tts-queue", 16, "waiting syntheses per speech synthesis model beyond which requests get 429")
	ttsDecThreads := fs.Int("tts-decoder-threads", 0, decoderThreadsUsage)
	asrEncode := fs.Int("asr-encode-batch", 1, "most audio windows encoded in one batched encoder call (1..--asr-parallel; more pays on a GPU, not on a CPU)")
	maxAudio := fs.Int64("max-audio-body", 25<<20, "largest audio upload in bytes")
	maxAudioDur := fs.Duration("max-audio-duration", 2*time.Hour, "longest audio accepted for transcription")
	maxStreams := fs.Int("max-streams", 16, "live transcription sessions (/v1/audio/stream, /v1/realtime) open at once")
	maxSpeechStreams := fs.Int("max-speech-streams", 16, "live synthesis sessions (/v1/audio/speech/stream) open at once")
	maxVoices := fs.Int("max-voices", 32, "voices uploaded to /v1/audio/voices kept per speech synthesis model (the least recently used are dropped beyond)")
	maxVoiceDur := fs.Duration("max-voice-duration", 30*time.Second, "longest voice prompt uploaded to /v1/audio/voices")
	voicesDir := fs.String("voices-dir", "", "directory the voices uploaded to /v1/audio/voices are kept in (a folder per speech synthesis model: ID.safetensors, the voice state, and ID.json), read back at start; default: kept in memory only")
	streamChunk := fs.Duration("stream-chunk", asr.DefaultChunk, "audio a streaming recogniser's live session (Parakeet) encodes at a time (80 ms to 30 s)")
	streamLeft := fs.Duration("stream-left-context", asr.DefaultLeftContext, "audio before each chunk a streaming recogniser encodes with it (0 to 60 s)")
	streamRight := fs.Duration("stream-right-context", asr.DefaultRightContext, "audio after each chunk a streaming recogniser waits for and encodes with it (0 to 60 s)")
	asrBeam := fs.Int("asr-beam", 1, "beam size of transcriptions (1: greedy)")
	asrBestOf := fs.Int("asr-best-of", asr.DefaultParams().BestOf, "candidates sampled at temperatures above 0 (transcriptions' fallback)")
	embeddings := fs.Bool("embeddings", false, "language models also serve /v1/embeddings (pooling as the file says, else the last token's); embedding models (GGUF of architecture bert) always do")
	var ttsVoices multiFlag
	fs.Var(&ttsVoices, "tts-voice", "a voice of the speech synthesis models, NAME=FILE (a Pocket TTS voice-state .safetensors; repeatable), besides those a checkpoint holds")
	prefix := fs.Bool("prefix-cache", true, "reuse the KV blocks of prompt prefixes shared between requests")
	modelsDir := fs.String("models-dir", "", "directory whose model files (GGUF, whisper.cpp ggml .bin, Pocket TTS .safetensors) are served on demand, each named after its file: loaded on its first request, unloaded when idle")
	var maxMemory byteSize
	fs.Var(&maxMemory, "max-memory", "memory the on-demand models loaded at once may take (e.g. 8GiB; estimated from their files: weights, KV cache, scratch); the least recently used idle ones are unloaded to make room (default: the memory available once the other models are loaded, and on CUDA no more than the device's free memory)")
	keepAlive := keepAliveFlag(5 * time.Minute)
	fs.Var(&keepAlive, "keep-alive", "how long an on-demand model stays loaded after its last request (a duration, or seconds; 0: unload at once; negative: until its memory is needed); a request's keep_alive field overrides it")
	loadTimeout := fs.Duration("load-timeout", 5*time.Minute, "longest a request waits for its on-demand model to load (or for memory to load it in) before it is answered 503")
	var fileModels []configModel // a config file's models list
	fs.models = &fileModels
	pos, err := fs.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usagef("unexpected arguments %q", pos)
	}
	if _, inFile := fs.fromFile["model"]; fs.isSet("m") && !inFile {
		fileModels = nil // -m or $PARLEY_MODEL replaces the config file's models
	}
	if len(modelArgs) == 0 && len(fileModels) == 0 && *modelsDir == "" {
		return usagef("at least one -m MODEL (or --models-dir DIR) is required")
	}
	if *loadTimeout <= 0 {
		return usagef("--load-timeout must be positive")
	}
	if *port < 0 || *port > 65535 {
		return usagef("%s %d: want a port number from 0 to 65535", fs.from("port"), *port)
	}
	if *parallel < 1 || *stepTokens < 1 || *queue < 0 || *ctxLen < 0 || *kvMiB < 0 || *maxBody < 1 {
		return usagef("--parallel, --step-tokens and --max-body must be positive; --queue, --ctx and --kv-mem not negative")
	}
	if *ctxLen > llama.MaxContextSlots {
		return usagef("%s %d: want 0 (the model's context) to %d", fs.from("ctx"), *ctxLen, llama.MaxContextSlots)
	}
	if *asrParallel < 1 || *asrQueue < 0 || *maxAudio < 1 || *maxAudioDur <= 0 || *maxStreams < 1 || *maxSpeechStreams < 1 || *maxVoices < 1 || *maxVoiceDur < time.Second || *asrEncode < 1 || *asrEncode > min(*asrParallel, 64) {
		return usagef("--asr-parallel, --max-audio-body, --max-audio-duration, --max-streams, --max-speech-streams and --max-voices must be positive, --max-voice-duration at least 1s; --asr-queue not negative; --asr-encode-batch 1..--asr-parallel (64 at most)")
	}
	if *ttsDecThreads < 0 || *ttsDecThreads > 1024 {
		return usagef("--tts-decoder-threads must be 0 to 1024")
	}
	if *ttsParallel < 1 || *ttsParallel > 64 || *ttsQueue < 1 {
		return usagef("--tts-parallel must be 1 to 64, --tts-queue positive")
	}
	if *streamChunk < 80*time.Millisecond || *streamChunk > 30*time.Second || *streamLeft < 0 || *streamLeft > time.Minute || *streamRight < 0 || *streamRight > time.Minute {
		return usagef("--stream-chunk must be 80ms to 30s, --stream-left-context and --stream-right-context 0 to 60s")
	}
	if *grace < 0 || *bodyTimeout <= 0 {
		return usagef("--shutdown-grace must not be negative, --body-timeout must be positive")
	}
	if *streamLeft == 0 {
		*streamLeft = -1 // none (0 is asr's default)
	}
	if *streamRight == 0 {
		*streamRight = -1
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
	var tmpl string
	if *chatTemplate != "" {
		if tmpl, err = readChatTemplate(fs.from("chat-template"), *chatTemplate); err != nil {
			return err
		}
	}
	logger, err := newLogger(e, *logFormat, *logLevel)
	if err != nil {
		return usageError{err}
	}
	if *logFormat == "json" {
		// From here on every line is a JSON record, the error that ends the command too.
		defer func() {
			if err != nil {
				logger.Error("exit", "err", err.Error())
				err = reportedError{err}
			}
		}()
	}
	// Each model has the flags' options, or a config file's models entry's own.
	def := modelOptions{ctx: *ctxLen, parallel: *parallel, kvMiB: *kvMiB, stepTokens: *stepTokens, queue: *queue,
		kvType: *kvType, chatTemplate: *chatTemplate, prefix: *prefix, asrParallel: *asrParallel, asrQueue: *asrQueue, asrEncode: *asrEncode, keepAlive: time.Duration(keepAlive)}
	type spec = serveSpec
	var specs, lazy []spec // loaded at start, and on demand
	seen := map[string]bool{}
	for _, m := range fileModels {
		path, name, opt, err := m.options(def)
		if err != nil {
			return err
		}
		if name == "" {
			name = strings.TrimSuffix(filepath.Base(path), filepath.Ext(path))
		}
		if seen[name] {
			return usagef("%s: model alias %q given twice", m.where, name)
		}
		if hub.IsRemote(path) {
			if err := hub.CheckName(path); err != nil {
				return usageError{fmt.Errorf("%s: %w", m.where, err)}
			}
		}
		sp := spec{name: name, path: path, opt: opt, kv: kv, tmpl: tmpl}
		if err := opt.check(m.where); err != nil {
			return err
		}
		if opt.kvType != def.kvType {
			if sp.kv, err = tensor.ParseDType(opt.kvType); err != nil || (sp.kv != tensor.F16 && sp.kv != tensor.BF16 && sp.kv != tensor.F32) {
				return usagef("%s: kv-type %q: want f16, bf16 or f32", m.where, opt.kvType)
			}
		}
		if opt.chatTemplate != def.chatTemplate {
			if sp.tmpl, err = readChatTemplate(m.where+": chat-template", opt.chatTemplate); err != nil {
				return err
			}
		}
		seen[name] = true
		if opt.onDemand {
			lazy = append(lazy, sp)
			continue
		}
		specs = append(specs, sp)
	}
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
		if hub.IsRemote(path) {
			if err := hub.CheckName(path); err != nil {
				return usageError{fmt.Errorf("-m %q: %w", m, err)}
			}
		}
		seen[name] = true
		specs = append(specs, spec{name: name, path: path, opt: def, kv: kv, tmpl: tmpl})
	}

	if *modelsDir != "" {
		found, err := scanModelsDir(*modelsDir, logger.Warn)
		if err != nil {
			return usagef("--models-dir: %v", err)
		}
		if len(found) == 0 && len(specs)+len(lazy) == 0 {
			return usagef("--models-dir %s holds no model file (.gguf, .bin, .safetensors)", *modelsDir)
		}
		for _, sp := range found {
			if seen[sp.name] {
				return usagef("--models-dir: model %q (%s) has the name of another model", sp.name, sp.path)
			}
			seen[sp.name] = true
			sp.opt, sp.kv, sp.tmpl = def, kv, tmpl
			lazy = append(lazy, sp)
		}
	}
	if err := bf.check(); err != nil {
		return err
	}
	// Every local file's header is read before the server listens: a corrupt or truncated file
	// ends the command before it has said it is listening. (A download is checked once it is
	// there.)
	for _, sp := range append(specs[:len(specs):len(specs)], lazy...) {
		if !hub.IsRemote(sp.path) {
			if _, err := models.Check(sp.path); err != nil {
				return fmt.Errorf("%s: %w", sp.name, err)
			}
		}
	}
	var hosts []string
	for _, h := range strings.Split(*allowedHosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, h)
		}
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
	// On a loopback address only loopback host names (and --allowed-hosts) are served: a web
	// page that makes its own name resolve to 127.0.0.1 (DNS rebinding) is refused.
	loopback := false
	if a, ok := ln.Addr().(*net.TCPAddr); ok {
		loopback = a.IP.IsLoopback()
	}
	checkHost := loopback || len(hosts) > 0
	if !loopback && *apiKey == "" {
		logger.Warn("listening on a non-loopback address without --api-key: anyone who can reach it can use every endpoint", "addr", ln.Addr().String())
	}
	var handler atomic.Pointer[http.Handler]
	loading := server.Loading(server.Config{AllowedOrigins: origins, CheckHost: checkHost, AllowedHosts: hosts, Logger: logger})
	handler.Store(&loading)
	hs := &http.Server{
		Handler:           http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*handler.Load()).ServeHTTP(w, r) }),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	logger.Info("listening", "addr", ln.Addr().String(), "url", "http://"+ln.Addr().String())
	if *logFormat != "json" {
		fmt.Fprintf(e.stderr, "parley: listening on http://%s\n", ln.Addr())
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	note := func(n string) { logger.Info(n) }
	be, err := bf.start(note)
	if err != nil {
		hs.Close()
		return err
	}
	defer be.Close()
	logger.Info("backend", "name", be.Name())

	steps := server.NewStepMetrics()
	var served []*server.Model
	var speechModels []*server.SpeechModel
	var ttsModels []*server.TTSModel
	var scheds []*sched.Scheduler
	var embedders []*sched.Embedder
	var speechEngines []asr.Recognizer
	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	env := serveEnv{logger: logger, steps: steps, asrParams: &asrParams, ttsVoices: ttsVoices, ttsConfig: tts.Config{MaxActive: *ttsParallel, MaxQueue: *ttsQueue}, ttsDecoderThreads: *ttsDecThreads, embeddings: *embeddings, kvShare: len(specs)}
	for i, sp := range specs {
		be := be
		if _, records := be.(backend.Recorder); records && i > 0 {
			// A backend that records its steps (CUDA graphs) records everything called on it
			// meanwhile: each model, stepped by its own goroutine, gets a backend of its own (on
			// a GPU, its own stream).
			if be, err = bf.start(note); err != nil {
				hs.Close()
				return fmt.Errorf("%s: %w", sp.name, err)
			}
			closers = append(closers, func() { be.Close() })
		}
		if hub.IsRemote(sp.path) {
			if sp.path, err = resolveRemote(ctx, e, sp, *logFormat); err != nil {
				hs.Close()
				return err
			}
		}
		op, err := openServed(sp, be, env)
		if err != nil {
			hs.Close()
			return err
		}
		closers = append(closers, op.close)
		scheds = append(scheds, op.scheds...)
		embedders = append(embedders, op.embedders...)
		switch {
		case op.tts != nil:
			ttsModels = append(ttsModels, op.tts)
		case op.speech != nil:
			speechModels = append(speechModels, op.speech)
			speechEngines = append(speechEngines, op.recognizer)
		default:
			served = append(served, op.model)
		}
	}
	var onDemand []*server.OnDemandModel
	budget := int64(0)
	if len(lazy) > 0 {
		for i := range lazy {
			if hub.IsRemote(lazy[i].path) {
				if lazy[i].path, err = resolveRemote(ctx, e, lazy[i], *logFormat); err != nil {
					hs.Close()
					return err
				}
			}
		}
		budget = memoryBudget(int64(maxMemory), be)
		if onDemand, err = onDemandModels(lazy, be, bf, budget, env); err != nil {
			hs.Close()
			return err
		}
		logger.Info("on-demand models", "count", len(onDemand), "budget_mib", budget>>20, "keep_alive", time.Duration(keepAlive), "load_timeout", *loadTimeout)
	}
	srv, err := server.New(server.Config{OnDemand: onDemand, MaxMemory: budget, LoadTimeout: *loadTimeout, APIKey: *apiKey, AllowedOrigins: origins, CheckHost: checkHost, AllowedHosts: hosts, MaxBodyBytes: *maxBody, BodyTimeout: *bodyTimeout, RequestTimeout: *timeout, Logger: logger, Steps: steps,
		SpeechModels: speechModels, TTSModels: ttsModels, MaxAudioBytes: *maxAudio, MaxAudioDuration: *maxAudioDur, Stream: server.StreamConfig{MaxSessions: *maxStreams,
			Session: asr.SessionConfig{Chunk: *streamChunk, LeftContext: *streamLeft, RightContext: *streamRight}},
		Voices: server.VoiceConfig{MaxVoices: *maxVoices, MaxDuration: *maxVoiceDur, Dir: *voicesDir}, SpeechStream: server.SpeechStreamConfig{MaxSessions: *maxSpeechStreams}}, served)
	if err != nil {
		hs.Close()
		return err
	}
	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	var wg sync.WaitGroup
	for _, es := range embedders {
		wg.Add(1)
		go func(es *sched.Embedder) {
			defer wg.Done()
			if err := es.Run(runCtx); err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, sched.ErrClosed) {
				logger.Error("embedding scheduler stopped", "err", err)
			}
		}(es)
	}
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
	logger.Info("ready", "models", len(served), "speech_models", len(speechModels), "tts_models", len(ttsModels), "on_demand_models", len(onDemand))

	select {
	case err := <-serveErr:
		cancelRun()
		wg.Wait()
		return err
	case <-ctx.Done():
	}
	// Graceful shutdown: drain (/health answers 503 "draining" so that a load balancer takes the
	// instance out, new requests are refused with 503) while in-flight requests and live
	// transcriptions finish, up to the grace period; then stop listening, cancel what is left,
	// and give the handlers a few seconds to tell their clients so (an error event and [DONE]
	// for a stream, 503 for a transcription).
	logger.Info("shutting down", "grace", *grace)
	sctx, cancel := context.WithTimeout(context.Background(), *grace)
	defer cancel()
	liveDone := make(chan struct{})
	go func() {
		defer close(liveDone)
		if err := srv.Shutdown(sctx); err != nil {
			logger.Warn("live transcriptions cut at the end of the grace period", "err", err)
		}
	}()
	srv.Drain(sctx)
	srv.SetReady(false)
	shutErr := hs.Shutdown(sctx)
	<-liveDone
	cctx, ccancel := context.WithTimeout(context.Background(), 10*time.Second)
	if err := srv.CloseModels(cctx); err != nil {
		logger.Warn("on-demand models still in use at exit", "err", err)
	}
	ccancel()
	if shutErr != nil && !errors.Is(shutErr, context.DeadlineExceeded) {
		logger.Error("shutdown", "err", shutErr)
	}
	for _, s := range scheds {
		s.Close()
	}
	for _, es := range embedders {
		es.Close()
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

// resolveRemote downloads sp's hf:// model once into the cache and returns its local path.
func resolveRemote(ctx context.Context, e *env, sp serveSpec, logFormat string) (string, error) {
	// The progress bar redraws one line: on a terminal, and not between JSON records.
	var progress io.Writer
	if logFormat != "json" && isTerminal(e.stderr) {
		progress = e.stderr
	}
	local, err := hub.Resolve(ctx, sp.path, hub.Options{Progress: progress})
	if err != nil {
		return "", fmt.Errorf("%s: %w", sp.name, err)
	}
	return local, nil
}

// decoderEmbedder runs llm as an embedder on a context of its own, of steps of stepTokens tokens
// (the longest input), pooling as the file says, else with the last token's hidden state.
func decoderEmbedder(llm *models.LLM, stepTokens int, kv tensor.DType, seqs, queue int, onStep func(time.Duration, int, int), closers *[]func()) (*sched.Embedder, error) {
	p, err := llm.Pooling()
	if err != nil {
		return nil, err
	}
	if p == pooling.Unspecified {
		p = pooling.Last
	}
	c, err := llm.Model.NewContext(llama.ContextConfig{StepTokens: stepTokens, MaxSeqs: max(seqs, 16), KVSlots: stepTokens, KVType: kv})
	if err != nil {
		return nil, err
	}
	*closers = append(*closers, func() { c.Close() })
	dm, err := sched.NewDecoderEmbedModel(c, p)
	if err != nil {
		return nil, err
	}
	return sched.NewEmbedder(dm, sched.EmbedConfig{MaxQueue: queue, OnStep: onStep})
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
		opts.ReplaceAttr = secondsAttr
		return slog.New(slog.NewJSONHandler(e.stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// secondsAttr writes a duration as seconds (a number) in JSON records, where slog would write
// integer nanoseconds.
func secondsAttr(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.Float64(a.Key, a.Value.Duration().Seconds())
	}
	return a
}

// readChatTemplate is the source of --chat-template's template: a built-in one by name, else the
// file value names.
func readChatTemplate(from, value string) (string, error) {
	if src, ok := server.BuiltinChatTemplate(value); ok {
		return src, nil
	}
	b, err := os.ReadFile(value)
	if errors.Is(err, os.ErrNotExist) {
		return "", usagef("%s %q: no such file, nor a built-in template (%s)", from, value, strings.Join(server.ChatTemplateNames(), ", "))
	}
	if err != nil {
		return "", err
	}
	if err := server.CheckChatTemplate(string(b)); err != nil {
		return "", fmt.Errorf("%s %q: %w", from, value, err)
	}
	return string(b), nil
}

// templateSource says where a served model's chat template comes from, for its log record.
func templateSource(flag, own string) string {
	switch {
	case flag != "":
		return flag
	case own != "":
		return "the model's"
	}
	return "none"
}
