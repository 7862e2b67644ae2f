// Package decode owns the last step of generation: turning one position's logits into the next
// token (Sampler), reporting log-probabilities of the raw distribution (TopLogprobs, Logprob,
// Logprobs, LogSumExp), deciding when generation stops and which text may be shown so far
// (Stopper), and the search policies that run several hypotheses of one output, as a speech
// recogniser does: beam-search bookkeeping (Beams), the scores and choice among finished
// hypotheses (SequenceScore, BestOf), and temperature fallback (Fallback, Temperatures,
// TokenEntropy, Compression); for transducer speech models (Parakeet), TDT, the greedy decision
// rule over a joint network's output row: which token, which duration, and which encoder frame
// comes next, and TDTBeamSearch, a beam search over the same rows that says which prediction
// steps and joint rows it needs next and leaves computing them, batched across streams, to its
// caller. What a Whisper hypothesis is, and the forward passes that extend any hypothesis, are
// the scheduler's (runtime/sched/asr).
//
// Everything a Sampler or Stopper needs is allocated when it is built, and stepping either one
// allocates nothing, so a serving loop can own one of each per sequence and step them all
// without garbage. Neither type is safe for concurrent use; distinct values are independent.
//
// The sampling chain follows llama.cpp's default order: logit bias, repetition / presence /
// frequency penalties, top-k, top-p, min-p, temperature, then a seeded draw. A temperature of
// zero or below selects greedy decoding: the argmax after bias and penalties, ties going to the
// lowest token id.
//
// SampleMasked draws among the tokens a mask allows, the mask applied before everything else;
// package grammar (runtime/decode/grammar) computes such masks from a GBNF grammar or a JSON
// Schema, so that the output is guaranteed to parse.
package decode
