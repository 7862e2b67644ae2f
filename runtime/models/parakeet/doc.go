// Package parakeet is NVIDIA's Parakeet TDT speech recogniser (a FastConformer encoder, an LSTM
// prediction network and a joint network whose outputs are token logits followed by
// Token-and-Duration Transducer duration logits) as whisper.cpp's parakeet implementation
// computes it (src/parakeet.cpp at commit 233fe1f, cited below as parakeet.cpp:LINE). It owns
// what is the model's: its files, its front end and its vocabulary.
//
//   - Files: whisper.cpp's ggml form (ParseGGML, Open), read exactly as parakeet_model_load
//     reads it and validated tensor by tensor against the hyper-parameters, in F32, F16 and the
//     quantised types parakeet-quantize writes; a GGUF form with general.architecture
//     "parakeet" (ConvertGGML writes it, ReadGGUF and Open read it). A file without TDT
//     durations is a plain RNN-T (an extension: whisper.cpp requires 1 to 5 durations).
//   - Front end: FrontEnd.LogMel, the normalised log-mel spectrogram the encoder reads.
//   - Vocabulary and text: Vocab (pieces, the blank after them, text as whisper.cpp joins it)
//     and Transcript, which turns emitted tokens into timed tokens and a segment.
//   - Compute: Load binds a file's weights to a backend (batch norms folded into the depthwise
//     convolutions); Encoder runs the subsampling and the FastConformer blocks over several
//     clips in one call; ProjectEncoder gives the joint's encoder projection of its output; and
//     Decoder runs the LSTM prediction network and the joint, batched over hypotheses that
//     name their state slots.
//
// The greedy decision rule of the transducer (which token, which duration, where the next joint
// call looks) is a search policy and lives in runtime/decode (decode.TDT); running the encoder,
// the prediction network and the joint for a stream of audio is scheduled by runtime/sched/asr.
//
// Shapes are written in ggml order where they describe file tensors (ne0, the fastest
// dimension, first) and as [rows, columns] row-major elsewhere.
package parakeet
