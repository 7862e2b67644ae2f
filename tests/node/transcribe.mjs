// Drives a running `parley serve` with the official openai client's audio API and prints one JSON
// object with what it got back, for the Go integration test to check.
//
//   node transcribe.mjs BASE_URL MODEL WAV_FILE
import fs from "node:fs";
import OpenAI from "openai";

const [baseURL, model, wav] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: process.env.PARLEY_API_KEY || "none", maxRetries: 0 });
const out = {};

const models = await client.models.list();
out.models = models.data.map((m) => m.id).sort();

const file = () => fs.createReadStream(wav);
out.json = await client.audio.transcriptions.create({ file: file(), model });
out.text = await client.audio.transcriptions.create({ file: file(), model, response_format: "text" });
out.srt = await client.audio.transcriptions.create({ file: file(), model, response_format: "srt" });
out.verbose = await client.audio.transcriptions.create({
  file: file(), model, response_format: "verbose_json", timestamp_granularities: ["word", "segment"],
});

try {
  await client.audio.transcriptions.create({ file: file(), model: "no-such-model" });
  out.unknown_model_error = null;
} catch (e) {
  out.unknown_model_error = { status: e.status, code: e.code ?? e.error?.code ?? null };
}

process.stdout.write(JSON.stringify(out) + "\n");
