// Package decode owns the last step of generation: turning one position's logits into the next
// token (Sampler), reporting log-probabilities of the raw distribution (TopLogprobs, Logprob,
// Logprobs, LogSumExp), and deciding when generation stops and which text may be shown so far
// (Stopper). For transducer speech models (Parakeet) TDT is the greedy decision rule over a joint
// network's output row: which token, which duration, and which encoder frame comes next.
//
// Everything a Sampler or Stopper needs is allocated when it is built, and stepping either one
// allocates nothing, so a serving loop can own one of each per sequence and step them all
// without garbage. Neither type is safe for concurrent use; distinct values are independent.
//
// The sampling chain follows llama.cpp's default order: logit bias, repetition / presence /
// frequency penalties, top-k, top-p, min-p, temperature, then a seeded draw. A temperature of
// zero or below selects greedy decoding: the argmax after bias and penalties, ties going to the
// lowest token id.
package decode
