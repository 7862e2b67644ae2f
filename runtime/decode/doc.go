// Package decode owns the last step of generation: turning one position's logits into the next
// token (Sampler), reporting log-probabilities of the raw distribution (TopLogprobs, Logprob,
// Logprobs, LogSumExp), and deciding when generation stops and which text may be shown so far
// (Stopper).
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
