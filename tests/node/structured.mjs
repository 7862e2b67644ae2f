// Drives a running `parley serve` with the official openai client through the requests that
// constrain the output (response_format, llama.cpp's grammar and json_schema fields) and prints
// one JSON object with what it got back, for the Go integration test to check.
//
//   node structured.mjs BASE_URL MODEL CHAT_MODEL
import OpenAI from "openai";

const [baseURL, model, chatModel] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: process.env.PARLEY_API_KEY || "none", maxRetries: 0 });
const out = {};

const schema = {
  type: "object",
  properties: {
    name: { type: "string", maxLength: 12 },
    age: { type: "integer" },
    pets: { type: "array", items: { enum: ["cat", "dog", "fish"] }, minItems: 1, maxItems: 3 },
    home: { type: "object", properties: { city: { type: "string", maxLength: 8 }, lat: { type: "number" } }, required: ["city", "lat"], additionalProperties: false },
  },
  required: ["name", "age", "pets", "home"],
  additionalProperties: false,
};
out.schema = schema;
const messages = [{ role: "user", content: "Hi" }];
const response_format = { type: "json_schema", json_schema: { name: "person", strict: true, schema } };

const c = await client.chat.completions.create({ model: chatModel, messages, max_tokens: 90, temperature: 1, seed: 11, n: 3, response_format, logprobs: true });
out.schema_chat = c.choices.map((ch) => ({ content: ch.message.content, finish_reason: ch.finish_reason, logprobs: ch.logprobs?.content?.length ?? 0 }));

const streamed = ["", ""];
const s = await client.chat.completions.create({ model: chatModel, messages, max_tokens: 90, temperature: 1, seed: 12, n: 2, response_format, stream: true });
for await (const chunk of s) {
  for (const ch of chunk.choices) streamed[ch.index] += ch.delta?.content ?? "";
}
out.schema_stream = streamed;

const o = await client.chat.completions.create({ model: chatModel, messages, max_tokens: 80, temperature: 0.8, seed: 13, response_format: { type: "json_object" } });
out.object_chat = o.choices[0].message.content;

// llama.cpp's fields pass through the client as extra body parameters.
const g = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 16, temperature: 1.5, seed: 14, n: 2, grammar: 'root ::= ("yes" | "no") ", " [0-9]{1,3}' });
out.grammar_completion = g.choices.map((ch) => ch.text);

const j = await client.completions.create({ model, prompt: "Once upon a time", max_tokens: 100, temperature: 1, seed: 15, json_schema: schema, stream: true });
let jt = "";
for await (const chunk of j) for (const ch of chunk.choices) jt += ch.text;
out.schema_completion = jt;

try {
  await client.chat.completions.create({ model: chatModel, messages, max_tokens: 8, response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "string", pattern: "(a)\\1" } } } });
  out.bad_schema_error = null;
} catch (e) {
  out.bad_schema_error = { status: e.status, code: e.code ?? null, param: e.param ?? null };
}
try {
  await client.completions.create({ model, prompt: "Once", max_tokens: 8, grammar: "root ::= (" });
  out.bad_grammar_error = null;
} catch (e) {
  out.bad_grammar_error = { status: e.status, code: e.code ?? null, param: e.param ?? null };
}

process.stdout.write(JSON.stringify(out) + "\n");
