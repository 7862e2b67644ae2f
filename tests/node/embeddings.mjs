// Drives a running `parley serve` with the official openai client through /v1/embeddings and
// prints one JSON object with what it got back, for the Go integration test to check.
//
//   node embeddings.mjs BASE_URL EMBEDDING_MODEL DECODER_MODEL
import OpenAI from "openai";

const [baseURL, model, decoder] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: process.env.PARLEY_API_KEY || "none", maxRetries: 0 });
const out = {};
const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
const cos = (a, b) => a.reduce((s, x, i) => s + x * b[i], 0) / (norm(a) * norm(b));

// The client asks for base64 by default and decodes it.
const one = await client.embeddings.create({ model, input: "hello world" });
out.one = { n: one.data.length, dim: one.data[0].embedding.length, norm: norm(one.data[0].embedding), usage: one.usage, object: one.object, model: one.model };

const many = await client.embeddings.create({ model, input: ["hello world", "the cat sat on the mat", "a"], encoding_format: "float" });
out.many = { n: many.data.length, indexes: many.data.map((d) => d.index), cos_same: cos(many.data[0].embedding, one.data[0].embedding), cos_other: cos(many.data[0].embedding, many.data[1].embedding) };

const ids = await client.embeddings.create({ model, input: [[101, 7592, 2088, 102], [101, 102]] });
out.ids = { n: ids.data.length, dim: ids.data[1].embedding.length, usage: ids.usage };

const dec = await client.embeddings.create({ model: decoder, input: ["Once upon a time", "The end"] });
out.decoder = { n: dec.data.length, dim: dec.data[0].embedding.length, norm: norm(dec.data[0].embedding) };

for (const [name, req] of [
  ["dimensions_error", { model, input: "a", dimensions: 64 }],
  ["empty_error", { model, input: "" }],
]) {
  try {
    await client.embeddings.create(req);
    out[name] = null;
  } catch (e) {
    out[name] = { status: e.status, code: e.code ?? null, param: e.param ?? null };
  }
}
try {
  await client.chat.completions.create({ model, messages: [{ role: "user", content: "hi" }], max_tokens: 4 });
  out.generate_error = null;
} catch (e) {
  out.generate_error = { status: e.status, code: e.code ?? null, param: e.param ?? null };
}

process.stdout.write(JSON.stringify(out) + "\n");
