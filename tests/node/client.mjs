// Drives a running `parley serve` with the official openai client and prints one JSON object
// with what it got back, for the Go integration test to check.
//
//   node client.mjs BASE_URL MODEL CHAT_MODEL
import OpenAI from "openai";

const [baseURL, model, chatModel] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: process.env.PARLEY_API_KEY || "none", maxRetries: 0 });
const prompt = "Once upon a time";
const out = {};

const models = await client.models.list();
out.models = models.data.map((m) => m.id).sort();

const c = await client.completions.create({ model, prompt, max_tokens: 32, temperature: 0 });
out.completion = { text: c.choices[0].text, finish_reason: c.choices[0].finish_reason, usage: c.usage };

let streamed = "";
let finish = null;
let usage = null;
const cs = await client.completions.create({
  model, prompt, max_tokens: 32, temperature: 0, stream: true, stream_options: { include_usage: true },
});
for await (const chunk of cs) {
  if (chunk.usage) usage = chunk.usage;
  for (const ch of chunk.choices) {
    streamed += ch.text;
    if (ch.finish_reason) finish = ch.finish_reason;
  }
}
out.completion_stream = { text: streamed, finish_reason: finish, usage };

const messages = [{ role: "user", content: "Tell me a story." }];
const chat = await client.chat.completions.create({ model: chatModel, messages, max_tokens: 24, temperature: 0 });
out.chat = { content: chat.choices[0].message.content, role: chat.choices[0].message.role, finish_reason: chat.choices[0].finish_reason };

let chatStreamed = "";
const chs = await client.chat.completions.create({ model: chatModel, messages, max_tokens: 24, temperature: 0, stream: true });
for await (const chunk of chs) {
  for (const ch of chunk.choices) chatStreamed += ch.delta?.content ?? "";
}
out.chat_stream = { content: chatStreamed };

try {
  await client.chat.completions.create({ model, messages, max_tokens: 8 });
  out.no_template_error = null;
} catch (e) {
  out.no_template_error = { status: e.status, code: e.code ?? e.error?.code ?? null };
}
try {
  await client.completions.create({ model: "no-such-model", prompt, max_tokens: 8 });
  out.unknown_model_error = null;
} catch (e) {
  out.unknown_model_error = { status: e.status, code: e.code ?? e.error?.code ?? null };
}

process.stdout.write(JSON.stringify(out) + "\n");
