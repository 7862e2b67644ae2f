// Drives a running `parley serve`'s /v1/realtime with the official openai client's Realtime
// WebSocket classes (GA and beta, and GA opened with a minted client secret) and prints one JSON object with what it got back, for the Go
// integration test to check. Needs Node's WebSocket: node --experimental-websocket on Node 20.
//
//   node --experimental-websocket realtime.mjs BASE_URL MODEL PCM24_FILE PCM16_FILE
//
// The files are raw 16-bit little-endian mono PCM, at 24 kHz (OpenAI's pcm16) and at 16 kHz.
import fs from "node:fs";
import OpenAI from "openai";
import { OpenAIRealtimeWebSocket } from "openai/realtime/websocket";
import { OpenAIRealtimeWebSocket as BetaRealtimeWebSocket } from "openai/beta/realtime/websocket";

const [baseURL, model, pcmFile, pcm16File] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: process.env.PARLEY_API_KEY || "none", maxRetries: 0 });
const pcm = fs.readFileSync(pcmFile);
const pcm16 = fs.readFileSync(pcm16File);

// The client builds a wss:// URL from the base URL; a plain-HTTP server needs ws://.
const plain = (extra) => (url) => {
  url.protocol = url.protocol === "wss:" && baseURL.startsWith("http:") ? "ws:" : url.protocol;
  extra?.(url);
};

// session collects a socket's events; next(type) waits for the next event of that type.
function session(rt) {
  const events = [];
  const errors = [];
  const waiters = [];
  rt.on("event", (ev) => {
    events.push(ev);
    for (const w of waiters.splice(0)) w();
  });
  rt.on("error", (err) => {
    errors.push({ message: err.message, code: err.error?.code ?? null, param: err.error?.param ?? null, event_id: err.error?.event_id ?? null });
    for (const w of waiters.splice(0)) w();
  });
  let seen = 0;
  const next = (type, ms = 120000) => new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`no ${type} in ${ms} ms; events: ${JSON.stringify(events.map((e) => e.type))}`)), ms);
    const check = () => {
      for (; seen < events.length; seen++) {
        if (events[seen].type === type) {
          clearTimeout(timer);
          resolve(events[seen++]);
          return;
        }
      }
      waiters.push(check);
    };
    check();
  });
  const quiet = (ms) => new Promise((resolve) => {
    let n = -1;
    const tick = () => {
      if (events.length === n) return resolve();
      n = events.length;
      setTimeout(tick, ms);
    };
    tick();
  });
  return { events, errors, next, quiet };
}

const b64 = (buf) => buf.toString("base64");
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const out = {};

// GA: session.update with session.type "transcription", manual turns, the transcripts' logprobs
// included; the audio appended whole and committed is one item. A bad event gets an error event and the session goes on. Then the
// same at 16 kHz, the rate set by a session update.
{
  const rt = await OpenAIRealtimeWebSocket.create(client, { model, onURL: plain() });
  const s = session(rt);
  const created = await s.next("session.created");
  rt.send({
    type: "session.update",
    session: {
      type: "transcription",
      include: ["item.input_audio_transcription.logprobs"],
      audio: { input: { format: { type: "audio/pcm", rate: 24000 }, transcription: { model, language: "en" }, turn_detection: null } },
    },
  });
  const updated = await s.next("session.updated");
  rt.send({ type: "input_audio_buffer.append", event_id: "bad_1", audio: "not base64!" });
  rt.send({ type: "input_audio_buffer.append", audio: b64(pcm) });
  rt.send({ type: "input_audio_buffer.commit" });
  const committed = await s.next("input_audio_buffer.committed");
  const delta = await s.next("conversation.item.input_audio_transcription.delta");
  const completed = await s.next("conversation.item.input_audio_transcription.completed");
  rt.send({ type: "session.update", session: { type: "transcription", audio: { input: { format: { type: "audio/pcm", rate: 16000 } } } } });
  await s.next("session.updated");
  rt.send({ type: "input_audio_buffer.append", audio: b64(pcm16) });
  rt.send({ type: "input_audio_buffer.commit" });
  const committed16 = await s.next("input_audio_buffer.committed");
  const completed16 = await s.next("conversation.item.input_audio_transcription.completed");
  rt.send({ type: "input_audio_buffer.clear" });
  await s.next("input_audio_buffer.cleared");
  rt.close();
  out.ga = {
    subprotocol: rt.socket.protocol, session_created: created.session, session_updated: updated.session,
    committed, delta, completed, committed16, completed16, errors: s.errors, types: s.events.map((e) => e.type),
  };
}

// Beta: ?intent=transcription, transcription_session.update with server_vad; the audio streamed
// in 100 ms appends comes back as items announced by speech_started.
{
  const rt = await BetaRealtimeWebSocket.create(client, { model, onURL: plain((u) => u.searchParams.set("intent", "transcription")) });
  const s = session(rt);
  const created = await s.next("transcription_session.created");
  rt.send({
    type: "transcription_session.update",
    session: {
      input_audio_format: "pcm16",
      input_audio_transcription: { model, language: "en" },
      turn_detection: { type: "server_vad", threshold: 0.5, prefix_padding_ms: 300, silence_duration_ms: 500 },
    },
  });
  const updated = await s.next("transcription_session.updated");
  const chunk = 4800; // 100 ms
  for (let i = 0; i < pcm.length; i += chunk) {
    rt.send({ type: "input_audio_buffer.append", audio: b64(pcm.subarray(i, i + chunk)) });
    await sleep(25);
  }
  rt.send({ type: "input_audio_buffer.commit" });
  await s.next("conversation.item.input_audio_transcription.completed");
  await s.quiet(3000);
  rt.close();
  const of = (t) => s.events.filter((e) => e.type === t);
  out.beta = {
    subprotocol: rt.socket.protocol, session_created: created.session, session_updated: updated.session,
    speech_started: of("input_audio_buffer.speech_started"), speech_stopped: of("input_audio_buffer.speech_stopped"),
    committed: of("input_audio_buffer.committed"), deltas: of("conversation.item.input_audio_transcription.delta"),
    completed: of("conversation.item.input_audio_transcription.completed"), errors: s.errors,
  };
}

// A browser's flow: a backend holding the API key mints a client secret
// (client.realtime.clientSecrets), and the socket opens with the secret alone, in the settings it
// was minted with: the same audio and settings as the GA session's first item.
{
  const secret = await client.realtime.clientSecrets.create({
    expires_after: { anchor: "created_at", seconds: 120 },
    session: { type: "transcription", audio: { input: { transcription: { model, language: "en" }, turn_detection: null } } },
  });
  const browser = new OpenAI({ baseURL, apiKey: secret.value, maxRetries: 0 });
  const rt = await OpenAIRealtimeWebSocket.create(browser, { model, onURL: plain() });
  const s = session(rt);
  const created = await s.next("session.created");
  rt.send({ type: "input_audio_buffer.append", audio: b64(pcm) });
  rt.send({ type: "input_audio_buffer.commit" });
  const completed = await s.next("conversation.item.input_audio_transcription.completed");
  rt.close();
  out.minted = { value: secret.value, expires_at: secret.expires_at, session: secret.session, session_created: created.session, completed, errors: s.errors };
}

process.stdout.write(JSON.stringify(out) + "\n");
process.exit(0);
