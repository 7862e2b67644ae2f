package main

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/parleyhq/parley/runtime/backend"
	"github.com/parleyhq/parley/runtime/models"
	"github.com/parleyhq/parley/runtime/models/bert"
	"github.com/parleyhq/parley/runtime/models/llama"
	"github.com/parleyhq/parley/runtime/sched"
	"github.com/parleyhq/parley/runtime/sched/asr"
	"github.com/parleyhq/parley/runtime/sched/tts"
	"github.com/parleyhq/parley/runtime/server"
	"github.com/parleyhq/parley/runtime/tensor"
)

// serveSpec is one model serve is to serve: its alias, file and options.
type serveSpec struct {
	name, path string
	opt        modelOptions
	kv         tensor.DType
	tmpl       string // the chat template replacing the model's own, if any
	// plan, when set, is the context and KV cache the model gets (an on-demand model's, fixed
	// when its memory is estimated); else it is planned when the model is opened.
	plan    *kvPlan
	fromDir bool // found in --models-dir: left out, with a warning, when it cannot be served
}

// serveEnv is what opening a served model needs besides its spec and backend.
type serveEnv struct {
	logger    *slog.Logger
	steps     *server.StepMetrics
	asrParams *asr.Params
	ttsVoices []string
	ttsConfig tts.Config // batching and queueing of speech synthesis models
	// ttsDecoderThreads, when positive, gives each speech synthesis model's Mimi decoder a
	// backend of its own with that many threads (tts.Config.Decoder).
	ttsDecoderThreads int
	embeddings        bool
	kvShare           int // models loaded at start, which share the KV-cache budget
}

// openedModel is a model opened for serving: what the server is given, the schedulers whose
// loops the caller runs and closes, and how to release the rest.
type openedModel struct {
	model      *server.Model
	speech     *server.SpeechModel
	tts        *server.TTSModel
	scheds     []*sched.Scheduler
	embedders  []*sched.Embedder
	recognizer asr.Recognizer
	closers    []func()
}

// close releases what openServed opened, last first.
func (o *openedModel) close() {
	for i := len(o.closers) - 1; i >= 0; i-- {
		o.closers[i]()
	}
}

// openServed opens the model of sp (a local file) on be, as its kind says: a language model with
// its scheduler (and an embedder with --embeddings), an embedding model, a speech recognition
// model with its scheduler, or a speech synthesis model.
func openServed(sp serveSpec, be backend.Backend, env serveEnv) (_ *openedModel, err error) {
	logger, steps := env.logger, env.steps
	o := &openedModel{}
	defer func() {
		if err != nil {
			o.close()
		}
	}()
	t0 := time.Now()
	if kind, err := models.Check(sp.path); err != nil {
		return nil, fmt.Errorf("%s: %w", sp.name, err)
	} else if kind == models.KindSpeechSynthesis {
		synth, closeSynth, err := openSynth(be, sp.path, env.ttsVoices, env.ttsConfig, env.ttsDecoderThreads)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sp.name, err)
		}
		o.closers = append(o.closers, closeSynth)
		o.tts = &server.TTSModel{Name: sp.name, Synth: synth}
		logger.Info("speech synthesis model loaded", "model", sp.name, "path", sp.path, "voices", strings.Join(synth.Voices(), ","), "took", time.Since(t0).Round(time.Millisecond))
		return o, nil
	} else if kind == models.KindSpeechRecognition {
		we, err := models.OpenRecognizer(sp.path, be, asr.Config{MaxActive: sp.opt.asrParallel, MaxQueue: sp.opt.asrQueue, EncodeBatch: sp.opt.asrEncode,
			OnStep: steps.OnStep(sp.name), Logger: logger.With("model", sp.name)})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sp.name, err)
		}
		o.closers = append(o.closers, func() { we.Close() })
		o.speech = &server.SpeechModel{Name: sp.name, Recognizer: we.Recognizer, Params: env.asrParams}
		o.recognizer = we.Recognizer
		logger.Info("speech model loaded", "model", sp.name, "path", sp.path, "family", we.Family, "multilingual", we.Multilingual(), "parallel", sp.opt.asrParallel, "took", time.Since(t0).Round(time.Millisecond))
		return o, nil
	}
	if kind, _ := models.Probe(sp.path); kind == models.KindEmbedding {
		enc, err := models.OpenEncoder(sp.path, be)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sp.name, err)
		}
		o.closers = append(o.closers, func() { enc.Close() })
		bc, err := enc.Model.NewContext(bert.ContextConfig{StepTokens: max(sp.opt.stepTokens, enc.Model.Positions)})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sp.name, err)
		}
		o.closers = append(o.closers, func() { bc.Close() })
		em, err := sched.NewEncoderEmbedModel(bc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sp.name, err)
		}
		es, err := sched.NewEmbedder(em, sched.EmbedConfig{MaxQueue: sp.opt.queue, OnStep: steps.OnStep(sp.name)})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sp.name, err)
		}
		o.embedders = append(o.embedders, es)
		o.model = &server.Model{Name: sp.name, Tokenizer: enc.Text(), Embedder: es}
		logger.Info("embedding model loaded", "model", sp.name, "path", sp.path, "dim", enc.Model.Dim, "pooling", bc.Pooling(), "took", time.Since(t0).Round(time.Millisecond))
		return o, nil
	}
	llm, err := models.OpenLLM(sp.path, be)
	if err != nil {
		return nil, err
	}
	o.closers = append(o.closers, func() { llm.Close() })
	m := llm.Model
	perPos := kvBytesPerPos(m, sp.kv)
	var budget int64
	var plan kvPlan
	if sp.plan != nil {
		plan = *sp.plan
	} else {
		if sp.opt.kvMiB == 0 {
			budget = kvBudget(be) / int64(max(env.kvShare, 1)) // shared by the models served
		}
		plan = planKV(sp.opt.ctx, sp.opt.kvMiB, sp.opt.parallel, llm.TrainingContext(), perPos, budget)
		if err := plan.check(sp, llm.TrainingContext(), budget); err != nil {
			return nil, err
		}
	}
	n, slots := plan.ctx, plan.slots
	if plan.capped {
		logger.Warn("KV cache cut to fit memory; --ctx and --kv-mem choose", "model", sp.name, "trained_ctx", llm.TrainingContext(), "ctx", n,
			"kv_slots", slots, "wanted_slots", int64(n)*int64(sp.opt.parallel), "budget_mib", budget>>20)
	}
	if sp.opt.ctx > llm.TrainingContext() {
		logger.Warn("--ctx is beyond the model's training context: generations past it may degrade", "model", sp.name, "ctx", n, "trained_ctx", llm.TrainingContext())
	}
	if plan.tight {
		logger.Warn("one sequence of --ctx needs more than the KV memory budget", "model", sp.name, "ctx", n,
			"needs_mib", int64(n)*perPos>>20, "budget_mib", budget>>20)
	}
	c, err := m.NewContext(llama.ContextConfig{StepTokens: sp.opt.stepTokens, MaxSeqs: sp.opt.parallel, KVSlots: slots, KVType: sp.kv, SeqContext: n})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sp.name, err)
	}
	o.closers = append(o.closers, func() { c.Close() })
	s, err := sched.New(sched.NewLlamaModel(c), llm.Text(), sched.Config{
		MaxQueue: sp.opt.queue, StepTokens: sp.opt.stepTokens, MaxActive: sp.opt.parallel, MaxContext: n, PrefixCache: sp.opt.prefix, OnStep: steps.OnStep(sp.name), Logger: logger.With("model", sp.name),
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", sp.name, err)
	}
	o.scheds = append(o.scheds, s)
	chat := llm.ChatTemplate()
	if sp.tmpl != "" {
		chat = sp.tmpl // --chat-template replaces the file's own
	}
	sm := &server.Model{Name: sp.name, Tokenizer: llm.Text(), ChatTemplate: chat, Sched: s, Ctx: n}
	if env.embeddings {
		es, err := decoderEmbedder(llm, min(sp.opt.stepTokens, n), sp.kv, sp.opt.parallel, sp.opt.queue, steps.OnStep(sp.name), &o.closers)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", sp.name, err)
		}
		o.embedders = append(o.embedders, es)
		sm.Embedder = es
	}
	o.model = sm
	logger.Info("model loaded", "model", sp.name, "path", sp.path, "arch", m.Arch, "ctx", n, "kv_slots", c.Pool().Slots(), "parallel", sp.opt.parallel, "prefix_cache", sp.opt.prefix, "chat_template", templateSource(sp.opt.chatTemplate, llm.ChatTemplate()), "embeddings", env.embeddings, "took", time.Since(t0).Round(time.Millisecond))
	return o, nil
}

// check refuses a plan that cannot serve sp: --kv-mem too small for one sequence, or a default
// context cut below minCutCtx by a budget of budget bytes.
func (p kvPlan) check(sp serveSpec, trained int, budget int64) error {
	if sp.opt.kvMiB > 0 && p.slots < p.ctx {
		return fmt.Errorf("%s: --kv-mem %d MiB holds %d positions, less than one sequence of %d", sp.name, sp.opt.kvMiB, p.slots, p.ctx)
	}
	if p.capped && p.ctx < min(trained, minCutCtx) {
		return fmt.Errorf("%s: %d MiB of memory for the KV cache hold only %d positions; give --kv-mem (MiB) or a smaller --ctx or --parallel", sp.name, budget>>20, p.ctx)
	}
	return nil
}
