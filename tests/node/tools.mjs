// Drives a running `parley serve` with the official openai client through chat requests that
// offer tools, and prints one JSON object with what it got back, for the Go integration test.
//
//   node tools.mjs BASE_URL MODEL
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: process.env.PARLEY_API_KEY || "none", maxRetries: 0 });
const out = {};

const tools = [
  { type: "function", function: { name: "get_weather", description: "Weather in a city", parameters: { type: "object", properties: { city: { type: "string", maxLength: 8 }, unit: { enum: ["c", "f"] } }, required: ["city", "unit"], additionalProperties: false } } },
  { type: "function", function: { name: "add", parameters: { type: "object", properties: { a: { type: "integer" }, b: { type: "integer" } }, required: ["a", "b"], additionalProperties: false } } },
];
const messages = [{ role: "user", content: "2+2?" }];
// A conversation with an assistant's call and the tool's answer, as the client sends them back.
const history = [
  { role: "user", content: "Rome?" },
  { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "get_weather", arguments: '{"city":"Rome","unit":"c"}' } }] },
  { role: "tool", tool_call_id: "c1", content: "21" },
];
const simplify = (calls) => (calls ?? []).map((c) => ({ id: c.id, type: c.type, name: c.function.name, arguments: c.function.arguments }));

for (const [name, tool_choice] of [["required", "required"], ["named", { type: "function", function: { name: "add" } }]]) {
  const r = await client.chat.completions.create({ model, messages, tools, tool_choice, temperature: 0 });
  const m = r.choices[0].message;
  out[name] = { finish_reason: r.choices[0].finish_reason, content: m.content, calls: simplify(m.tool_calls) };

  // The client's stream helper assembles the deltas into the final message.
  const stream = client.chat.completions.stream({ model, messages, tools, tool_choice, temperature: 0 });
  const final = await stream.finalChatCompletion();
  out[name + "_stream"] = { finish_reason: final.choices[0].finish_reason, calls: simplify(final.choices[0].message.tool_calls) };
}

const one = await client.chat.completions.create({ model, messages, tools, tool_choice: "required", parallel_tool_calls: false, temperature: 0.9, seed: 4, n: 3 });
out.single = one.choices.map((c) => simplify(c.message.tool_calls).length);

const auto = await client.chat.completions.create({ model, messages, tools, max_tokens: 16, temperature: 0 });
out.auto = { finish_reason: auto.choices[0].finish_reason, has_content: typeof auto.choices[0].message.content === "string", calls: simplify(auto.choices[0].message.tool_calls).length };

const h = await client.chat.completions.create({ model, messages: history, tools, tool_choice: "none", max_tokens: 4, temperature: 0 });
out.history = { finish_reason: h.choices[0].finish_reason, calls: simplify(h.choices[0].message.tool_calls).length, usage: h.usage.prompt_tokens };

try {
  await client.chat.completions.create({ model, messages, tools, tool_choice: { type: "function", function: { name: "absent" } } });
  out.absent_error = null;
} catch (e) {
  out.absent_error = { status: e.status, param: e.param ?? null };
}

process.stdout.write(JSON.stringify(out) + "\n");
