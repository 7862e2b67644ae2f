// Package grammar constrains generation to a formal language: a GBNF grammar (llama.cpp's
// format) or a JSON Schema compiled to one. It turns a grammar into a mask over the vocabulary at
// each step, so that whatever the model's weights, the text produced is in the language.
//
// The pieces and their lifetimes:
//
//   - Grammar: a parsed grammar, lowered to bytes (ParseGBNF, FromJSONSchema). Immutable; one per
//     distinct grammar text, shareable by every request that uses it.
//   - Vocab: every token's bytes in a trie (NewVocab). Immutable; one per model, built once.
//   - Automaton: a Grammar over a Vocab (NewAutomaton). It determinises the grammar lazily (each
//     state a set of parser stacks) and caches each state's transitions and token mask, so
//     repeated states cost a lookup. Safe for concurrent use; one per request (shared by its
//     sequences), or kept across requests with the same grammar.
//   - Matcher: one sequence's position in the Automaton: Mask gives the tokens allowed next,
//     Accept advances by a token, Complete says whether end of generation is allowed. A
//     Matcher is a small value; Clone copies it for n > 1 or beam search. MinBytes, Fits and
//     MaskWithin steer a sequence that must end within a number of tokens to a complete text.
//   - Cache: the Automata of one Vocab by key (a grammar's or a schema's text), least recently
//     used dropped first, so that a grammar seen before starts warm.
//
// A server uses it so: per model, NewVocab from the tokenizer's pieces and end-of-generation
// ids; per request, ParseGBNF or FromJSONSchema (a *SyntaxError or *SchemaError is the
// client's fault: answer 400 before generating) and NewAutomaton; per sequence, NewMatcher (or
// Clone); per step, Mask, then decode.Sampler.SampleMasked with it, then Accept of the drawn
// token; an end-of-generation token is in the mask exactly when Complete, and accepting it ends
// the Matcher.
//
// The recogniser follows llama.cpp's llama-grammar.cpp (commit c392e509): a grammar is a list
// of rules, each a list of alternatives ending in END; a parser stack is a list of positions,
// the top one always on a terminal; rule references are expanded when they reach the top and
// a reference in tail position does not grow the stack. Unlike llama.cpp, terminals are byte
// sets (character classes are lowered to their UTF-8 byte sequences at compile time), so a
// token is matched byte by byte with no UTF-8 decoding at run time, and the set of stacks after
// each byte is interned as one state of a lazily built DFA. A mask is computed by walking the
// vocabulary's trie and the DFA together; a subtree whose bytes all keep the DFA in its state
// (a string's body, for instance) is accepted whole without visiting it. A state that loops on
// many bytes (inside a string) starts from the Vocab's mask of the tokens spelt within those
// bytes, computed once per Vocab and shared by every state and Automaton with the same loop,
// and walks only the subtrees holding a byte that leaves it (a quote, a backslash), so that
// the first visit to a string in a new context costs its transitions, not a bit per token.
// Each state also knows the fewest bytes that complete the grammar from it (from every rule's
// shortest derivation, computed when the grammar is lowered).
package grammar
