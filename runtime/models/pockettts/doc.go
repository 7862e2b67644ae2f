// Package pockettts holds Kyutai's Pocket TTS (streaming text-to-speech at 24 kHz: a 6-layer
// FlowLM transformer over text and latent frames, a flow-matching MLP head that samples each
// 32-dimensional latent, and the streaming Mimi decoder that turns latents into audio; a Mimi
// encoder clones voices): its configuration, its weights as upstream's TTSModel.state_dict()
// safetensors file or as GGUF, voice states, and the text front end. It computes only; synthesis
// jobs are scheduled by runtime/sched/tts.
//
// Upstream: kyutai-labs/pocket-tts at commit 9514983 (version 2.1.0), config "english".
// ../shared/reference/tts/ARCHITECTURE.md describes every shape; the reference data there checks
// each stage.
package pockettts
