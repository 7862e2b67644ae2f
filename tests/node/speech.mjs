// Drives a running `parley serve` with a speech synthesis model through the official openai
// client's audio.speech API (and fetch for the voice upload, which the client has no method
// for) and prints one JSON object with what it got back, for the Go integration test to check.
//
//   node speech.mjs BASE_URL MODEL VOICE PROMPT_WAV
import crypto from "node:crypto";
import fs from "node:fs";
import OpenAI from "openai";

const [baseURL, model, voice, promptWav] = process.argv.slice(2);
const apiKey = process.env.PARLEY_API_KEY || "none";
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0 });
const sha = (b) => crypto.createHash("sha256").update(b).digest("hex");
const input = "Hello world.";
const out = {};

// wav, whole
const wav = Buffer.from(await (await client.audio.speech.create({ model, voice, input, response_format: "wav" })).arrayBuffer());
out.wav = { bytes: wav.length, riff: wav.subarray(0, 4).toString(), data_size: wav.readUInt32LE(40), pcm_sha256: sha(wav.subarray(44)) };

// pcm, streamed: the body read as a stream, chunk by chunk
const res = await client.audio.speech.create({ model, voice, input, response_format: "pcm", stream_format: "audio" });
const chunks = [];
for await (const chunk of res.body) chunks.push(Buffer.from(chunk));
const pcm = Buffer.concat(chunks);
out.pcm = { bytes: pcm.length, chunks: chunks.length, sha256: sha(pcm), content_type: res.headers.get("content-type") };

// the voice upload, then speech with the uploaded voice as OpenAI's {id}
const form = new FormData();
form.append("file", new Blob([fs.readFileSync(promptWav)], { type: "audio/wav" }), "prompt.wav");
form.append("name", "prompt");
const up = await fetch(baseURL + "/audio/voices", { method: "POST", body: form, headers: { Authorization: `Bearer ${apiKey}` } });
const uploaded = await up.json();
out.upload = { status: up.status, id: uploaded.id, name: uploaded.name };
const cloned = Buffer.from(await (await client.audio.speech.create({ model, voice: { id: uploaded.id }, input, response_format: "pcm" })).arrayBuffer());
out.cloned = { bytes: cloned.length, sha256: sha(cloned) };

try {
  await client.audio.speech.create({ model, voice, input, response_format: "mp3" });
  out.mp3_error = null;
} catch (e) {
  out.mp3_error = { status: e.status, param: e.param ?? e.error?.param ?? null, message: e.message };
}

process.stdout.write(JSON.stringify(out) + "\n");
