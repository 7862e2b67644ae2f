// Package tts runs speech synthesis jobs on a Pocket TTS model (runtime/models/pockettts): the
// text front end's chunks, each generated from a fresh copy of the voice state, the frame loop
// with upstream's stop rule (EOS, then FramesAfterEOS frames, or the chunk's frame budget), the
// flow head's sampling noise, and the streaming Mimi decoder turning each latent frame into
// audio as soon as it is made.
//
// A Synthesizer runs one synthesis at a time; concurrent calls wait their turn (or their
// context's end). Batching many
// syntheses into one FlowLM step and one decoder step (the model's steps already take many
// sequences and slots) is the next layer on top of this one.
package tts

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"

	"github.com/parleyhq/parley/runtime/kvcache"
	"github.com/parleyhq/parley/runtime/models/pockettts"
)

// DefaultTemperature is upstream's sampling temperature: the flow head starts from noise of
// variance Temperature.
const DefaultTemperature = 0.7

// DefaultKVSlots is the FlowLM cache of a Synthesizer in positions: a voice prompt, a chunk's
// text (at most 50 tokens) and its frame budget (at most 234 frames for 50 tokens).
const DefaultKVSlots = 1024

// ErrInput wraps the errors of a request that cannot be synthesised as given: an empty text, no
// voice or an unknown voice name, a bad temperature, recorded noise not in whole rows (a
// server answers 400).
var ErrInput = errors.New("tts: bad request")

// ErrNoiseExhausted is returned when recorded noise (Request.Noise) has fewer rows than the
// synthesis takes frame steps.
var ErrNoiseExhausted = errors.New("tts: the recorded noise has run out")

// Config sizes a Synthesizer.
type Config struct {
	KVSlots int                   // FlowLM cache positions; 0 means DefaultKVSlots
	Text    pockettts.TextOptions // the text front end's settings (the checkpoint's)
	// Voices are the voice states requests may name (VoiceName): a checkpoint's predefined
	// voices, or voice files loaded at start.
	Voices map[string]*pockettts.Voice
}

// Request is one synthesis.
type Request struct {
	Text  string
	Voice *pockettts.Voice
	// VoiceName names one of Config.Voices, when Voice is nil.
	VoiceName string
	// Temperature is the variance of the flow head's starting noise; 0 makes the synthesis
	// deterministic (x0 = 0). Negative means DefaultTemperature.
	Temperature float64
	// Seed seeds the noise when Noise is nil.
	Seed uint64
	// Noise, when not nil, is the flow head's x0 of every frame step in order, LatentDim values
	// a step, across the text's chunks (the step that ends a chunk at EOS included): recorded
	// noise, for comparing with a reference. Temperature does not scale it.
	Noise []float32
}

// Synthesizer generates speech with one model, one synthesis at a time.
type Synthesizer struct {
	turn chan struct{} // held (full) while a synthesis or a voice cloning runs
	m    *pockettts.Model
	tok  pockettts.Tokenizer
	cfg  Config
	f    *pockettts.FlowLM
	dec  *pockettts.Decoder

	in, out, x0, eos, audio []float32
}

// New makes a Synthesizer over m, with the checkpoint's tokenizer.
func New(m *pockettts.Model, tok pockettts.Tokenizer, cfg Config) (*Synthesizer, error) {
	if tok == nil {
		return nil, errors.New("tts: the model has no tokenizer")
	}
	if cfg.KVSlots <= 0 {
		cfg.KVSlots = DefaultKVSlots
	}
	mc := m.Config()
	if cfg.Text.FrameRate <= 0 {
		cfg.Text.FrameRate = mc.FrameRate()
	}
	f, err := m.NewFlowLM(pockettts.FlowLMConfig{StepTokens: 64, MaxSeqs: 1, KVSlots: cfg.KVSlots})
	if err != nil {
		return nil, err
	}
	dec, err := m.NewDecoder(1)
	if err != nil {
		f.Close()
		return nil, err
	}
	L := mc.LatentDim
	return &Synthesizer{m: m, tok: tok, cfg: cfg, f: f, dec: dec, turn: make(chan struct{}, 1),
		in: make([]float32, L), out: make([]float32, L), x0: make([]float32, L), eos: make([]float32, 1),
		audio: make([]float32, mc.FrameSamples())}, nil
}

// Close releases the Synthesizer's cache and decoder state; the model stays open.
func (s *Synthesizer) Close() error {
	s.turn <- struct{}{}
	defer func() { <-s.turn }()
	return errors.Join(s.dec.Close(), s.f.Close())
}

// SampleRate is the audio's sample rate in Hz.
func (s *Synthesizer) SampleRate() int { c := s.m.Config(); return c.SampleRate }

// Voices returns the names of Config.Voices, sorted.
func (s *Synthesizer) Voices() []string {
	names := make([]string, 0, len(s.cfg.Voices))
	for n := range s.cfg.Voices {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// FrameSamples is the number of samples each latent frame becomes.
func (s *Synthesizer) FrameSamples() int { c := s.m.Config(); return c.FrameSamples() }

// Chunks splits text as a synthesis of it will: the front end's chunks, each with its frame
// budget. It checks the text (ErrEmptyText and the front end's errors).
func (s *Synthesizer) Chunks(text string) ([]pockettts.Chunk, error) {
	return pockettts.SplitText(s.tok, text, s.cfg.Text)
}

// CloneVoice makes the voice state of a voice prompt (mono audio at SampleRate).
func (s *Synthesizer) CloneVoice(audio []float32) (*pockettts.Voice, error) {
	s.turn <- struct{}{}
	defer func() { <-s.turn }()
	return s.f.CloneVoice(audio)
}

// noise supplies x0 of each frame step.
type noise struct {
	rec   []float32
	rng   *rand.Rand
	scale float64
}

func (n *noise) next(x0 []float32) error {
	switch {
	case n.rec != nil:
		if len(n.rec) < len(x0) {
			return ErrNoiseExhausted
		}
		copy(x0, n.rec)
		n.rec = n.rec[len(x0):]
	case n.scale == 0:
		clear(x0)
	default:
		for i := range x0 {
			x0[i] = float32(n.rng.NormFloat64() * n.scale)
		}
	}
	return nil
}

// Speak synthesises r, calling emit with each frame's audio (FrameSamples samples at
// SampleRate, in [-1, 1] before clamping; the slice is reused after emit returns) as soon as it
// is decoded. An error from emit, or ctx's end, stops the synthesis and is returned.
func (s *Synthesizer) Speak(ctx context.Context, r Request, emit func(audio []float32) error) error {
	voice := r.Voice
	if voice == nil && r.VoiceName != "" {
		if voice = s.cfg.Voices[r.VoiceName]; voice == nil {
			return fmt.Errorf("%w: no voice named %q (have %s)", ErrInput, r.VoiceName, strings.Join(s.Voices(), ", "))
		}
	}
	if voice == nil {
		return fmt.Errorf("%w: no voice", ErrInput)
	}
	if math.IsNaN(r.Temperature) || math.IsInf(r.Temperature, 0) {
		return fmt.Errorf("%w: temperature %v", ErrInput, r.Temperature)
	}
	chunks, err := s.Chunks(r.Text)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInput, err)
	}
	temp := r.Temperature
	if temp < 0 {
		temp = DefaultTemperature
	}
	nz := &noise{rec: r.Noise, scale: math.Sqrt(temp), rng: rand.New(rand.NewPCG(r.Seed, 0x9e3779b97f4a7c15))}
	if r.Noise != nil && len(r.Noise)%len(s.x0) != 0 {
		return fmt.Errorf("%w: %d noise values are not whole rows of %d", ErrInput, len(r.Noise), len(s.x0))
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	select { // wait for the synthesis before this one, or for ctx's end
	case s.turn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.turn }()
	for _, c := range chunks {
		if err := s.chunk(ctx, c, voice, nz, emit); err != nil {
			return err
		}
	}
	return nil
}

// chunk generates and decodes one chunk from a fresh copy of the voice state.
func (s *Synthesizer) chunk(ctx context.Context, c pockettts.Chunk, v *pockettts.Voice, nz *noise, emit func([]float32) error) error {
	need := v.Positions + len(c.Tokens) + c.MaxFrames
	if need > s.cfg.KVSlots {
		return fmt.Errorf("tts: the voice (%d positions), a chunk's %d tokens and its %d frames need %d cache positions, more than the %d there are",
			v.Positions, len(c.Tokens), c.MaxFrames, need, s.cfg.KVSlots)
	}
	seq := s.f.Pool().NewSeq(need)
	defer seq.Release()
	seqs := []*kvcache.Seq{seq}
	if err := s.f.SetVoice(seq, v); err != nil {
		return err
	}
	if err := s.f.Text(seqs, [][]int32{c.Tokens}); err != nil {
		return err
	}
	if err := s.dec.Reset(0); err != nil {
		return err
	}
	nan := float32(math.NaN())
	for i := range s.in {
		s.in[i] = nan // the BOS embedding takes the place of a first frame's input
	}
	eosStep := -1
	for step := range c.MaxFrames {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := nz.next(s.x0); err != nil {
			return err
		}
		if err := s.f.Step(seqs, s.in, s.x0, s.out, s.eos); err != nil {
			return err
		}
		if eosStep < 0 && s.eos[0] > pockettts.EOSThreshold {
			eosStep = step
		}
		if eosStep >= 0 && step >= eosStep+c.FramesAfterEOS {
			break // this step's latent is dropped
		}
		copy(s.in, s.out)
		if err := s.dec.Step([]int{0}, s.out, s.audio); err != nil {
			return err
		}
		if err := emit(s.audio); err != nil {
			return err
		}
	}
	return nil
}
