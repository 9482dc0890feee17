// Drives `plexus serve` with the official OpenAI client, as a user's tool
// would.  Usage: node serve_client.mjs MODE [ARGS...], with PLEXUS_URL
// (http://127.0.0.1:PORT/v1) and PLEXUS_KEY in the environment.  Prints one
// JSON document on stdout; exits 1 with the error on stderr when the
// client library itself fails.
//
//   basic PROMPT               models, completions and chat, streamed and not,
//                              stop strings, logprobs, a wrong model
//   concurrent N MAX_TOKENS [serial]
//                              N streamed completions at once (prompts from
//                              PLEXUS_PROMPTS, one per line), or one after
//                              the other, and their texts
//   cancel                     a stream abandoned after its third chunk
//   overload N MAX_TOKENS MS   N requests at once without retries, each
//                              given up after MS milliseconds: statuses
import OpenAI from "openai";

const client = new OpenAI({
  baseURL: process.env.PLEXUS_URL,
  apiKey: process.env.PLEXUS_KEY || "none",
  maxRetries: 0,
  timeout: 120000,
});
const mode = process.argv[2];
const out = {};

async function collect(stream) {
  let text = "", usage = null, finish = null, chunks = 0, role = null;
  for await (const c of stream) {
    chunks++;
    if (c.usage) usage = c.usage;
    for (const ch of c.choices) {
      if (ch.text !== undefined) text += ch.text;
      if (ch.delta && ch.delta.content) text += ch.delta.content;
      if (ch.delta && ch.delta.role) role = ch.delta.role;
      if (ch.finish_reason) finish = ch.finish_reason;
    }
  }
  return { text, usage, finish, chunks, role };
}

async function basic(prompt) {
  const models = await client.models.list();
  out.models = models.data.map((m) => m.id);
  const model = out.models[0];
  const c = await client.completions.create({
    model, prompt, max_tokens: 24, temperature: 0, logprobs: 3,
  });
  out.completion = {
    text: c.choices[0].text, finish: c.choices[0].finish_reason, usage: c.usage,
    object: c.object, id: c.id,
    logprobs_tokens: c.choices[0].logprobs.tokens.length,
    top_logprobs: Object.keys(c.choices[0].logprobs.top_logprobs[0]).length,
  };
  out.completion_stream = await collect(await client.completions.create({
    model, prompt, max_tokens: 24, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  }));
  const messages = [{ role: "user", content: prompt }];
  const chat = await client.chat.completions.create({
    model, messages, max_tokens: 16, temperature: 0, logprobs: true, top_logprobs: 2,
  });
  out.chat = {
    text: chat.choices[0].message.content, role: chat.choices[0].message.role,
    finish: chat.choices[0].finish_reason, usage: chat.usage, object: chat.object,
    logprobs: chat.choices[0].logprobs.content.length,
  };
  out.chat_stream = await collect(await client.chat.completions.create({
    model, messages, max_tokens: 16, temperature: 0, stream: true,
  }));
  // A stop string cuts the text before it.
  const words = out.completion.text.trim().split(/\s+/);
  const stop = words.length > 3 ? " " + words[3] : out.completion.text.slice(4, 7);
  const s = await client.completions.create({
    model, prompt, max_tokens: 24, temperature: 0, stop: [stop],
  });
  out.stop = { stop, text: s.choices[0].text, finish: s.choices[0].finish_reason };
  // Sampling is reproducible with a seed.
  const seeded = [];
  for (let i = 0; i < 2; i++) {
    const r = await client.completions.create({
      model, prompt, max_tokens: 12, temperature: 0.9, top_p: 0.95, seed: 7,
    });
    seeded.push(r.choices[0].text);
  }
  out.seeded = seeded;
  try {
    await client.completions.create({ model: "no-such-model", prompt, max_tokens: 2 });
    out.wrong_model = { status: 200 };
  } catch (e) {
    out.wrong_model = { status: e.status, code: e.code, type: e.type };
  }
}

async function concurrent(n, maxTokens, serial) {
  const prompts = (process.env.PLEXUS_PROMPTS || "Once upon a time").split("\n").filter(Boolean);
  const model = (await client.models.list()).data[0].id;
  const t0 = Date.now();
  const runs = [];
  for (let i = 0; i < n; i++) {
    const prompt = prompts[i % prompts.length];
    const one = async () => {
      const r = await collect(await client.completions.create({
        model, prompt, max_tokens: maxTokens, temperature: 0, stream: true,
        stream_options: { include_usage: true },
      }));
      return { prompt, ...r };
    };
    runs.push(serial ? await one() : one());
  }
  out.results = await Promise.all(runs);
  out.seconds = (Date.now() - t0) / 1000;
}

async function cancel() {
  const model = (await client.models.list()).data[0].id;
  const ac = new AbortController();
  const stream = await client.completions.create(
    { model, prompt: "Once upon a time", max_tokens: 100000, temperature: 0, stream: true },
    { signal: ac.signal });
  let chunks = 0;
  try {
    for await (const c of stream) {
      if (++chunks === 3) {
        ac.abort();
        out.aborted = true;
        break;
      }
    }
  } catch (e) {
    out.aborted = true;
  }
  out.chunks = chunks;
}

async function overload(n, maxTokens, ms) {
  const model = (await client.models.list()).data[0].id;
  const runs = [];
  for (let i = 0; i < n; i++)
    runs.push(client.completions.create({
      model, prompt: "Once upon a time", max_tokens: maxTokens, temperature: 0,
    }, { timeout: ms }).withResponse().then(
      (r) => ({ status: r.response.status }),
      (e) => ({ status: e.status === undefined ? "gave up" : e.status,
                retry_after: e.headers ? e.headers["retry-after"] : null, type: e.type })));
  out.results = await Promise.all(runs);
}

try {
  if (mode === "basic") await basic(process.argv[3] || "Once upon a time");
  else if (mode === "concurrent")
    await concurrent(+process.argv[3], +process.argv[4], process.argv[5] === "serial");
  else if (mode === "cancel") await cancel();
  else if (mode === "overload")
    await overload(+process.argv[3], +process.argv[4], +process.argv[5]);
  else throw new Error("unknown mode " + mode);
  console.log(JSON.stringify(out));
} catch (e) {
  console.error(String(e && e.stack ? e.stack : e));
  process.exit(1);
}
