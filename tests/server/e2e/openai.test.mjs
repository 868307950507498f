// openai.test.mjs - `kiln serve` on stories260K through the official OpenAI npm client:
// completions and chat (whole and streamed), logprobs, stop strings, seeds, every error
// class, an aborted stream, /v1/models, and the graceful shutdown. Greedy expectations come
// from llama2.c's run.c (../shared/golden/llama2c-greedy.json).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { after, before, describe, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import {
  KILN_BIN,
  SLOW,
  goldenCases,
  metrics,
  postJson,
  sanitizerReports,
  startServer,
  waitMetrics,
} from './harness.mjs';

const KEY = 'sk-kiln-e2e';
const MODEL = 'stories260K';
let srv;
let client;

before(async () => {
  srv = await startServer(['--api-key', KEY, '--model-name', MODEL, '--max-body', '65536', '-t', '1']);
  client = new OpenAI({ apiKey: KEY, baseURL: `${srv.url}/v1`, maxRetries: 0, timeout: 60000 * SLOW });
});

after(async () => {
  if (!srv) return;
  const r = await srv.stop('SIGTERM');
  assert.equal(r.code, 0, `exit ${r.code} ${r.signal}: ${r.stderr.slice(-2000)}`);
  assert.equal(sanitizerReports(r.stderr), '');
  assert.match(r.stderr, /chat template: ChatML fallback/);
  assert.match(r.stderr, /kiln serve: stopped/);
});

async function detokenize(ids) {
  const r = await postJson(srv.url, '/detokenize', { tokens: ids }, KEY);
  assert.equal(r.status, 200, r.text);
  return r.json.prompt;
}

/** run.c's continuation of a golden case, as text, limited to n tokens. */
async function goldenText(c, n) {
  const full = await detokenize([...c.prompt_ids, ...c.generated_ids.slice(0, n)]);
  const prompt = await detokenize(c.prompt_ids);
  assert.ok(full.startsWith(prompt));
  return full.slice(prompt.length);
}

/** Collect a chat or completion stream, checking its shape chunk by chunk. */
async function collect(stream, kind) {
  let text = '';
  let finish = null;
  let usage = null;
  let n = 0;
  const logprobs = [];
  for await (const chunk of stream) {
    assert.equal(usage, null, 'a chunk after the usage chunk');
    if (chunk.choices.length === 0) {
      assert.ok(chunk.usage, 'a chunk without choices must carry usage');
      usage = chunk.usage;
      continue;
    }
    assert.equal(finish, null, 'a choice chunk after the finish chunk');
    const ch = chunk.choices[0];
    assert.equal(ch.index, 0);
    if (kind === 'chat') {
      assert.equal(chunk.object, 'chat.completion.chunk');
      if (n === 0) assert.equal(ch.delta.role, 'assistant', 'the role delta comes first');
      text += ch.delta.content ?? '';
      if (ch.logprobs?.content) logprobs.push(...ch.logprobs.content);
    } else {
      assert.equal(chunk.object, 'text_completion');
      text += ch.text;
      if (ch.logprobs) logprobs.push(ch.logprobs);
    }
    if (ch.finish_reason !== null) finish = ch.finish_reason;
    n++;
  }
  assert.notEqual(finish, null, 'the stream has a finish chunk');
  return { text, finish, usage, n, logprobs };
}

describe('models', () => {
  test('/v1/models lists the served model', async () => {
    const page = await client.models.list();
    assert.equal(page.data.length, 1);
    assert.equal(page.data[0].id, MODEL);
    assert.equal(page.data[0].object, 'model');
    const m = await client.models.retrieve(MODEL);
    assert.equal(m.id, MODEL);
    await assert.rejects(client.models.retrieve('gpt-4o'), (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
  });
});

describe('completions', () => {
  test('greedy continuations equal llama2.c (token-array prompts)', async () => {
    for (const c of goldenCases()) {
      const n = Math.min(c.generated_ids.length, 48);
      const r = await client.completions.create({ model: MODEL, prompt: c.prompt_ids, max_tokens: n, temperature: 0 });
      assert.equal(r.object, 'text_completion');
      assert.match(r.id, /^cmpl-/);
      assert.equal(r.model, MODEL);
      assert.equal(r.choices.length, 1);
      assert.equal(r.choices[0].text, await goldenText(c, n), `prompt ${JSON.stringify(c.prompt)}`);
      assert.equal(r.choices[0].finish_reason, 'length');
      assert.equal(r.usage.prompt_tokens, c.prompt_ids.length);
      assert.equal(r.usage.completion_tokens, n);
      assert.equal(r.usage.total_tokens, n + c.prompt_ids.length);
      assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
    }
  });

  test('a text prompt tokenizes like run.c and continues the same way', async () => {
    const c = goldenCases().find((x) => x.prompt === 'Once upon a time');
    const r = await client.completions.create({ model: MODEL, prompt: c.prompt, max_tokens: 30, temperature: 0 });
    assert.equal(r.usage.prompt_tokens, c.prompt_ids.length);
    assert.equal(r.choices[0].text, await goldenText(c, 30));
    const tk = await postJson(srv.url, '/tokenize', { prompt: c.prompt }, KEY);
    assert.deepEqual(tk.json.tokens, c.prompt_ids);
  });

  test('streamed text equals the whole response; usage comes last', async () => {
    const req = { model: MODEL, prompt: 'Lily and Tom went to the park', max_tokens: 40, temperature: 0 };
    const whole = await client.completions.create(req);
    const s = await collect(
      await client.completions.create({ ...req, stream: true, stream_options: { include_usage: true } }),
      'completion',
    );
    assert.equal(s.text, whole.choices[0].text);
    assert.equal(s.finish, whole.choices[0].finish_reason);
    assert.deepEqual(s.usage, whole.usage);
  });

  test('logprobs in the completions shape', async () => {
    const r = await client.completions.create({
      model: MODEL, prompt: 'Once upon a time', max_tokens: 12, temperature: 0, logprobs: 3,
    });
    const lp = r.choices[0].logprobs;
    assert.equal(lp.tokens.length, 12);
    assert.equal(lp.token_logprobs.length, 12);
    assert.equal(lp.top_logprobs.length, 12);
    assert.equal(lp.text_offset.length, 12);
    assert.equal(lp.tokens.join(''), r.choices[0].text);
    for (let i = 0; i < 12; i++) {
      assert.ok(lp.token_logprobs[i] <= 0);
      const top = lp.top_logprobs[i];
      assert.ok(Object.keys(top).length >= 1 && Object.keys(top).length <= 4);
      // Greedy: the sampled token is the most likely one.
      assert.ok(Math.abs(Math.max(...Object.values(top)) - lp.token_logprobs[i]) < 1e-6);
      assert.ok(Math.abs(top[lp.tokens[i]] - lp.token_logprobs[i]) < 1e-6);
      if (i > 0) assert.equal(lp.text_offset[i], lp.text_offset[i - 1] + [...lp.tokens[i - 1]].length);
    }
    // OpenAI counts offsets from the start of prompt + completion
    assert.equal(lp.text_offset[0], 'Once upon a time'.length);
    // Streamed: the same tokens and logprobs, spread over the chunks.
    const s = await collect(
      await client.completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 12, temperature: 0, logprobs: 3, stream: true }),
      'completion',
    );
    assert.deepEqual(s.logprobs.flatMap((x) => x.tokens), lp.tokens);
    assert.deepEqual(s.logprobs.flatMap((x) => x.text_offset), lp.text_offset);
    const slp = s.logprobs.flatMap((x) => x.token_logprobs);
    slp.forEach((v, i) => assert.ok(Math.abs(v - lp.token_logprobs[i]) < 1e-6));
  });

  test('a stop string ends the text before it, streamed or not', async () => {
    const c = goldenCases().find((x) => x.prompt === 'Once upon a time');
    const cont = await goldenText(c, 40);
    for (const stop of [['Lily'], 'girl', ['zzz', 'named L']]) {
      const first = Math.min(...[stop].flat().map((s) => (cont.indexOf(s) < 0 ? Infinity : cont.indexOf(s))));
      assert.ok(Number.isFinite(first));
      const want = cont.slice(0, first);
      const req = { model: MODEL, prompt: c.prompt, max_tokens: 40, temperature: 0, stop };
      const r = await client.completions.create(req);
      assert.equal(r.choices[0].text, want);
      assert.equal(r.choices[0].finish_reason, 'stop');
      const s = await collect(await client.completions.create({ ...req, stream: true }), 'completion');
      assert.equal(s.text, want); // no part of the stop string was ever sent
      assert.equal(s.finish, 'stop');
    }
  });

  test('a seed reproduces a sampled completion', async () => {
    const req = { model: MODEL, prompt: 'One day, a big bear', max_tokens: 24, temperature: 1, seed: 1234 };
    const a = await client.completions.create(req);
    const b = await client.completions.create(req);
    assert.equal(a.choices[0].text, b.choices[0].text);
    const s = await collect(await client.completions.create({ ...req, stream: true }), 'completion');
    assert.equal(s.text, a.choices[0].text);
    const texts = new Set();
    for (const seed of [1, 2, 3, 4, 5]) texts.add((await client.completions.create({ ...req, seed })).choices[0].text);
    assert.ok(texts.size >= 2, 'different seeds give different samples');
  });

  test('unknown fields are ignored', async () => {
    const r = await client.completions.create({
      model: MODEL, prompt: 'Hi', max_tokens: 2, temperature: 0, user: 'me', metadata_x: { a: [1] }, suffix: '',
    });
    assert.equal(r.choices.length, 1);
  });
});

describe('chat', () => {
  const messages = [
    { role: 'system', content: 'You tell short stories.' },
    { role: 'user', content: [{ type: 'text', text: 'A story' }, { type: 'text', text: 'about a cat.' }] },
  ];

  test('whole and streamed chat completions agree', async () => {
    const r = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 30, temperature: 0 });
    assert.equal(r.object, 'chat.completion');
    assert.match(r.id, /^chatcmpl-/);
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(typeof r.choices[0].message.content, 'string');
    assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
    assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0);
    const s = await collect(
      await client.chat.completions.create({
        model: MODEL, messages, max_completion_tokens: 30, temperature: 0, stream: true, stream_options: { include_usage: true },
      }),
      'chat',
    );
    assert.equal(s.text, r.choices[0].message.content);
    assert.equal(s.finish, r.choices[0].finish_reason);
    // The repeat may take the first one's prompt blocks from the prefix cache: the same
    // usage but for cached_tokens.
    const { prompt_tokens_details: sd, ...su } = s.usage;
    const { prompt_tokens_details: rd, ...ru } = r.usage;
    assert.deepEqual(su, ru);
    assert.ok(sd.cached_tokens >= rd.cached_tokens && sd.cached_tokens < s.usage.prompt_tokens);
  });

  test('logprobs in the chat shape, whole and streamed', async () => {
    const req = { model: MODEL, messages, max_tokens: 10, temperature: 0, logprobs: true, top_logprobs: 2 };
    const r = await client.chat.completions.create(req);
    const content = r.choices[0].logprobs.content;
    assert.ok(content.length >= 1);
    // Pieces of byte-fallback tokens are partial UTF-8 (their strings hold U+FFFD).
    const partial = content.some((x) => x.token.includes('\uFFFD'));
    if (!partial) assert.equal(content.map((x) => x.token).join(''), r.choices[0].message.content);
    assert.equal(Buffer.concat(content.map((x) => Buffer.from(x.bytes))).toString('utf8'), r.choices[0].message.content);
    for (const e of content) {
      assert.equal(typeof e.token, 'string');
      assert.ok(e.logprob <= 0);
      assert.ok(Array.isArray(e.bytes));
      if (!e.token.includes('\uFFFD')) assert.equal(Buffer.from(e.bytes).toString('utf8'), e.token);
      assert.equal(e.top_logprobs.length, 2);
      assert.ok(Math.abs(e.top_logprobs[0].logprob - e.logprob) < 1e-6);
      assert.ok(e.top_logprobs[1].logprob <= e.top_logprobs[0].logprob);
    }
    const s = await collect(await client.chat.completions.create({ ...req, stream: true }), 'chat');
    assert.deepEqual(s.logprobs.map((x) => x.token), content.map((x) => x.token));
    s.logprobs.forEach((x, i) => assert.ok(Math.abs(x.logprob - content[i].logprob) < 1e-6));
  });

  test('raw SSE: data lines, role first, finish last, then [DONE]', async () => {
    const r = await fetch(`${srv.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { authorization: `Bearer ${KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({ messages, max_tokens: 6, stream: true, stream_options: { include_usage: true } }),
    });
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /^text\/event-stream/);
    const events = (await r.text()).split('\n\n');
    assert.equal(events.pop(), '');
    for (const e of events) assert.match(e, /^data: /);
    assert.equal(events.at(-1), 'data: [DONE]');
    const chunks = events.slice(0, -1).map((e) => JSON.parse(e.slice(6)));
    assert.deepEqual(chunks[0].choices[0].delta, { role: 'assistant', content: '' });
    const usageChunk = chunks.at(-1);
    assert.deepEqual(usageChunk.choices, []);
    assert.equal(usageChunk.usage.completion_tokens, 6);
    const fin = chunks.at(-2);
    assert.equal(fin.choices[0].finish_reason, 'length');
    for (const c of chunks.slice(0, -2)) assert.equal(c.choices[0].finish_reason, null);
    for (const c of chunks.slice(0, -1)) assert.equal(c.usage, null);
  });
});

describe('n choices, echo', () => {
  const messages = [{ role: 'user', content: 'Tell me a story.' }];

  test('chat n=2: choice i is the request with seed + i; usage sums the choices', async () => {
    const r = await client.chat.completions.create({ model: MODEL, messages, n: 2, max_tokens: 12, temperature: 0.9, seed: 5 });
    assert.equal(r.choices.length, 2);
    let completion = 0;
    for (const [i, ch] of r.choices.entries()) {
      assert.equal(ch.index, i);
      const one = await client.chat.completions.create({ model: MODEL, messages, max_tokens: 12, temperature: 0.9, seed: 5 + i });
      assert.equal(ch.message.content, one.choices[0].message.content, `choice ${i}`);
      completion += one.usage.completion_tokens;
      if (i === 0) assert.equal(r.usage.prompt_tokens, one.usage.prompt_tokens);
    }
    assert.equal(r.usage.completion_tokens, completion);
  });

  test('chat n=2 streamed: chunks carry their index and reassemble into the whole response', async () => {
    const whole = await client.chat.completions.create({ model: MODEL, messages, n: 2, max_tokens: 12, temperature: 0.9, seed: 9 });
    const stream = await client.chat.completions.create({ model: MODEL, messages, n: 2, max_tokens: 12, temperature: 0.9, seed: 9, stream: true, stream_options: { include_usage: true } });
    const text = ['', ''];
    const finish = [null, null];
    let usage = null;
    for await (const chunk of stream) {
      if (chunk.choices.length === 0) {
        usage = chunk.usage;
        continue;
      }
      const ch = chunk.choices[0];
      assert.ok(ch.index === 0 || ch.index === 1);
      text[ch.index] += ch.delta.content ?? '';
      if (ch.finish_reason !== null) finish[ch.index] = ch.finish_reason;
    }
    assert.deepEqual(text, whole.choices.map((c) => c.message.content));
    assert.deepEqual(finish, whole.choices.map((c) => c.finish_reason));
    assert.equal(usage.completion_tokens, whole.usage.completion_tokens);
  });

  test('completions echo: the text begins with the prompt', async () => {
    const r = await client.completions.create({ model: MODEL, prompt: 'Once upon a time', echo: true, max_tokens: 6, temperature: 0 });
    const plain = await client.completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 6, temperature: 0 });
    assert.equal(r.choices[0].text, 'Once upon a time' + plain.choices[0].text);
  });
});

describe('prefix cache', () => {
  test('a repeated long prompt reports usage.prompt_tokens_details.cached_tokens', async () => {
    const prompt = Array.from({ length: 70 }, (_, i) => 3 + ((i * 53) % 500));
    const req = { model: MODEL, prompt, max_tokens: 6, temperature: 0 };
    const first = await client.completions.create(req);
    const again = await client.completions.create(req);
    const s = await collect(
      await client.completions.create({ ...req, stream: true, stream_options: { include_usage: true } }),
      'completion',
    );
    assert.equal(first.usage.prompt_tokens_details.cached_tokens, 0);
    assert.equal(again.choices[0].text, first.choices[0].text);
    assert.equal(s.text, first.choices[0].text);
    const m = await metrics(srv.url);
    assert.equal(typeof m.kiln_prefix_cache_hits_total, 'number');
    assert.equal(typeof m.kiln_disk_cache_bytes, 'number');
    for (const u of [again.usage, s.usage]) {
      assert.equal(typeof u.prompt_tokens_details.cached_tokens, 'number');
      assert.equal(u.prompt_tokens, prompt.length);
      assert.ok(u.prompt_tokens_details.cached_tokens > 0, 'a repeated 70-token prompt hits the cache');
      assert.ok(u.prompt_tokens_details.cached_tokens < prompt.length);
    }
  });
});

describe('speculation and predictions', () => {
  const messages = [{ role: 'user', content: 'Tell me a story about a dog.' }];

  async function count(body) {
    const r = await postJson(srv.url, '/tokenize', body, KEY);
    assert.equal(r.status, 200, r.text);
    return r.json.count;
  }

  /** Prediction tokens as the server counts them: a continuation of the prompt (the
   *  conversation with the text as the assistant's message, less the conversation alone;
   *  for completions the prompt + the text, less the prompt). */
  async function predictionTokens(text, prompt) {
    if (prompt !== undefined) return (await count({ prompt: prompt + text })) - (await count({ prompt }));
    return (await count({ messages: [...messages, { role: 'assistant', content: text }] })) - (await count({ messages }));
  }

  test('prediction through the client: the same greedy text, usage.completion_tokens_details', async () => {
    const req = { model: MODEL, messages, max_tokens: 40, temperature: 0 };
    const plain = await client.chat.completions.create(req);
    const text = plain.choices[0].message.content;
    assert.ok(text.length > 20);
    assert.deepEqual(plain.usage.completion_tokens_details, { accepted_prediction_tokens: 0, rejected_prediction_tokens: 0 });
    const n = await predictionTokens(text);
    const r = await client.chat.completions.create({ ...req, prediction: { type: 'content', content: text } });
    assert.equal(r.choices[0].message.content, text);
    const d = r.usage.completion_tokens_details;
    assert.ok(d.accepted_prediction_tokens > 0, JSON.stringify(r.usage));
    assert.equal(d.accepted_prediction_tokens + d.rejected_prediction_tokens, n);
    assert.ok(r.usage.speculation.drafted_tokens > 0 && r.usage.speculation.verify_steps > 0);
    assert.equal(r.usage.completion_tokens, plain.usage.completion_tokens);
    // Text parts and a stream with include_usage give the same.
    const half = Math.floor(text.length / 2);
    const s = await collect(
      await client.chat.completions.create({
        ...req,
        prediction: { type: 'content', content: [{ type: 'text', text: text.slice(0, half) }, { type: 'text', text: text.slice(half) }] },
        stream: true,
        stream_options: { include_usage: true },
      }),
      'chat',
    );
    assert.equal(s.text, text);
    assert.equal(s.usage.completion_tokens_details.accepted_prediction_tokens + s.usage.completion_tokens_details.rejected_prediction_tokens, n);
    // Completions take it too.
    const c = await client.completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 24, temperature: 0 });
    const cp = await client.completions.create({
      model: MODEL, prompt: 'Once upon a time', max_tokens: 24, temperature: 0, prediction: { type: 'content', content: c.choices[0].text },
    });
    assert.equal(cp.choices[0].text, c.choices[0].text);
    const cd = cp.usage.completion_tokens_details;
    assert.ok(cd.accepted_prediction_tokens > 0);
    assert.equal(cd.accepted_prediction_tokens + cd.rejected_prediction_tokens, await predictionTokens(c.choices[0].text, 'Once upon a time'));
  });

  test('speculation and fill (kiln extensions) pass through the client', async () => {
    const req = { model: MODEL, messages, max_tokens: 32, temperature: 0 };
    const plain = await client.chat.completions.create(req);
    const ngram = await client.chat.completions.create({ ...req, speculation: { source: 'ngram', k: 4 } });
    assert.equal(ngram.choices[0].message.content, plain.choices[0].message.content);
    const off = await client.chat.completions.create({ ...req, speculation: false });
    assert.equal(off.choices[0].message.content, plain.choices[0].message.content);
    assert.equal(off.usage.speculation.drafted_tokens, 0);
    const fill = ' The dog was happy';
    const f = await client.chat.completions.create({ ...req, fill: { content: fill } });
    assert.ok(f.choices[0].message.content.startsWith(fill), f.choices[0].message.content);
    assert.ok(f.usage.speculation.fill_tokens > 0);
    const m = await metrics(srv.url);
    for (const k of ['kiln_spec_verify_steps_total', 'kiln_spec_drafted_tokens_total', 'kiln_spec_accepted_tokens_total', 'kiln_fill_tokens_total', 'kiln_spec_acceptance_ratio'])
      assert.equal(typeof m[k], 'number', k);
    assert.ok(m.kiln_spec_drafted_tokens_total > 0 && m.kiln_fill_tokens_total > 0);
  });

  test('400s name the field', async () => {
    const isErr400 = (param) => (e) => {
      assert.ok(e instanceof OpenAI.APIError, String(e));
      assert.equal(e.status, 400, e.message);
      assert.equal(e.param, param);
      return true;
    };
    const base = { model: MODEL, messages, max_tokens: 4 };
    await assert.rejects(client.chat.completions.create({ ...base, prediction: { type: 'text', content: 'x' } }), isErr400('prediction.type'));
    await assert.rejects(client.chat.completions.create({ ...base, speculation: { k: 33 } }), isErr400('speculation.k'));
    await assert.rejects(client.chat.completions.create({ ...base, speculation: { source: 'draft' } }), isErr400('speculation.source'));
    await assert.rejects(client.chat.completions.create({ ...base, fill: { content: 'x', policy: 'maybe' } }), isErr400('fill.policy'));
  });
});

describe('errors', () => {
  const isErr = (status, { code, param } = {}) => (e) => {
    assert.ok(e instanceof OpenAI.APIError, String(e));
    assert.equal(e.status, status, e.message);
    if (code !== undefined) assert.equal(e.code, code);
    if (param !== undefined) assert.equal(e.param, param);
    assert.equal(typeof e.error.message, 'string');
    return true;
  };

  test('400: malformed JSON', async () => {
    const r = await postJson(srv.url, '/v1/chat/completions', '{"messages": [', KEY);
    assert.equal(r.status, 400);
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.equal(typeof r.json.error.message, 'string');
    assert.ok('param' in r.json.error && 'code' in r.json.error);
  });

  test('400: wrong types and out-of-range values name the field', async () => {
    await assert.rejects(client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 'ten' }), isErr(400, { param: 'max_tokens' }));
    await assert.rejects(client.completions.create({ model: MODEL, prompt: 'x', temperature: 3 }), isErr(400, { param: 'temperature' }));
    await assert.rejects(client.completions.create({ model: MODEL, prompt: { a: 1 } }), isErr(400, { param: 'prompt' }));
    await assert.rejects(client.completions.create({ model: MODEL, prompt: [1, 99999] }), isErr(400, { param: 'prompt' }));
    await assert.rejects(client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }], top_p: 0 }), isErr(400, { param: 'top_p' }));
    await assert.rejects(client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }], logprobs: true, top_logprobs: 21 }), isErr(400, { param: 'top_logprobs' }));
    await assert.rejects(client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }], stop: ['a', 'b', 'c', 'd', 'e'] }), isErr(400, { param: 'stop' }));
  });

  test('400: empty messages, unknown role, n outside [1, 16]', async () => {
    await assert.rejects(client.chat.completions.create({ model: MODEL, messages: [] }), isErr(400, { param: 'messages' }));
    await assert.rejects(client.chat.completions.create({ model: MODEL, messages: [{ role: 'wizard', content: 'hi' }] }), isErr(400, { param: 'messages[0].role' }));
    await assert.rejects(client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'hi' }], n: 17 }), isErr(400, { param: 'n' }));
    await assert.rejects(client.completions.create({ model: MODEL, prompt: 'hi', n: 0 }), isErr(400, { param: 'n' }));
  });

  test('404 model_not_found: a model the server does not serve', async () => {
    await assert.rejects(client.chat.completions.create({ model: 'gpt-4', messages: [{ role: 'user', content: 'hi' }] }), isErr(404, { code: 'model_not_found', param: 'model' }));
    await assert.rejects(client.completions.create({ model: 'gpt-4', prompt: 'hi' }), isErr(404, { code: 'model_not_found', param: 'model' }));
  });

  test('400 context_over_budget: a request that can never fit', async () => {
    await assert.rejects(client.completions.create({ model: MODEL, prompt: 'Once', max_tokens: 5000 }), isErr(400, { code: 'context_over_budget' }));
    await assert.rejects(
      client.completions.create({ model: MODEL, prompt: Array(600).fill(300), max_tokens: 1 }),
      isErr(400, { code: 'context_over_budget' }),
    );
  });

  test('401: a bad API key', async () => {
    const bad = new OpenAI({ apiKey: 'sk-wrong', baseURL: `${srv.url}/v1`, maxRetries: 0 });
    await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401 && e.code === 'invalid_api_key');
    await assert.rejects(bad.completions.create({ model: MODEL, prompt: 'x' }), isErr(401));
    const r = await fetch(`${srv.url}/v1/models`);
    assert.equal(r.status, 401);
    await r.arrayBuffer();
  });

  test('404: an unknown route', async () => {
    const r = await postJson(srv.url, '/v1/embeddings', { input: 'x' }, KEY);
    assert.equal(r.status, 404);
    assert.equal(r.json.error.type, 'invalid_request_error');
    const g = await fetch(`${srv.url}/nothing/here`, { headers: { authorization: `Bearer ${KEY}` } });
    assert.equal(g.status, 404);
    assert.ok((await g.json()).error.message);
  });

  test('413: a body over --max-body', async () => {
    const r = await postJson(srv.url, '/v1/completions', { prompt: 'x'.repeat(70000) }, KEY);
    assert.equal(r.status, 413);
    assert.equal(r.json.error.code, 'request_too_large');
    // The server is fine afterwards.
    const ok = await client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 1 });
    assert.equal(ok.choices.length, 1);
  });

  test('503: the queue is full', async () => {
    const busy = await startServer(['--model-name', MODEL, '--max-seqs', '1', '--max-queue', '1', '-t', '1']);
    try {
      const c = new OpenAI({ apiKey: 'none', baseURL: `${busy.url}/v1`, maxRetries: 0, timeout: 60000 * SLOW });
      const results = await Promise.allSettled(
        Array.from({ length: 6 }, () => c.completions.create({ model: MODEL, prompt: 'Once upon a time', max_tokens: 400, ignore_eos: true })),
      );
      const ok = results.filter((r) => r.status === 'fulfilled').length;
      const rejected = results.filter((r) => r.status === 'rejected');
      assert.ok(ok >= 1, 'some requests are served');
      assert.ok(rejected.length >= 1, 'some requests find the queue full');
      for (const r of rejected) isErr(503, { code: 'queue_full' })(r.reason);
    } finally {
      const r = await busy.stop();
      assert.equal(r.code, 0);
      assert.equal(sanitizerReports(r.stderr), '');
    }
  });
});

describe('cancellation', () => {
  test('an aborted stream cancels its sequence and frees its KV blocks', async () => {
    // stories260K writes 400 tokens in tens of milliseconds, so on a loaded machine the
    // generation can end before the server sees the client go: then the attempt counts as
    // "length", not "cancelled". Retry a bounded number of times; a server that never
    // cancels fails every attempt. KV blocks must return to the pool after every attempt.
    const key = 'kiln_generations_total{finish_reason="cancelled"}';
    let cancelled = false;
    for (let attempt = 0; attempt < 8 && !cancelled; attempt++) {
      const before = await metrics(srv.url);
      const stream = await client.chat.completions.create({
        model: MODEL, messages: [{ role: 'user', content: 'Tell me a very long story.' }], max_tokens: 400, ignore_eos: true, stream: true,
      });
      let n = 0;
      let finished = false;
      try {
        for await (const chunk of stream) {
          if (chunk.choices[0]?.finish_reason) finished = true;
          if (++n === 3) stream.controller.abort(); // the client closes its connection
        }
      } catch (e) {
        assert.ok(e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError', String(e));
      }
      assert.equal(finished, false, 'the stream was aborted before its end');
      const m = await waitMetrics(
        srv.url,
        (x) => x.kiln_kv_blocks_used === 0 && x.kiln_num_requests_running === 0 && x[key] >= before[key],
      );
      assert.equal(m.kiln_kv_blocks_used, 0, 'KV blocks back in the pool');
      assert.equal(m.kiln_num_requests_running, 0);
      if (m[key] === before[key] + 1) {
        cancelled = true;
        // Cancelled well before its 400 tokens.
        assert.ok(m.kiln_generation_tokens_total - before.kiln_generation_tokens_total < 300);
      }
    }
    assert.ok(cancelled, 'no attempt was cancelled by the client disconnect');
    for (let i = 0; i < 50 && !/\(client disconnected\)/.test(srv.stderr); i++) await sleep(20);
    assert.match(srv.stderr, /finish=cancelled \(client disconnected\)/);
    const ok = await client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 1 });
    assert.equal(ok.choices.length, 1);
  });
});

describe('shutdown', () => {
  async function streamThenSignal(extraArgs, maxTokens = 1500) {
    const s = await startServer(['--model-name', MODEL, '-t', '1', '--ctx', String(maxTokens + 548), ...extraArgs]);
    const c = new OpenAI({ apiKey: 'none', baseURL: `${s.url}/v1`, maxRetries: 0, timeout: 60000 * SLOW });
    const stream = await c.completions.create({
      model: MODEL, prompt: 'Once upon a time', max_tokens: maxTokens, ignore_eos: true, stream: true, stream_options: { include_usage: true },
    });
    let signalled = false;
    const res = await collect(
      (async function* () {
        for await (const chunk of stream) {
          if (!signalled) {
            signalled = true;
            s.child.kill('SIGTERM');
          }
          yield chunk;
        }
      })(),
      'completion',
    );
    const r = await s.stop();
    assert.equal(r.code, 0, r.stderr);
    assert.equal(sanitizerReports(r.stderr), '');
    await assert.rejects(fetch(`${s.url}/health`), 'new connections are refused');
    return res;
  }

  test('SIGTERM: in-flight streams finish within the grace period', async () => {
    const res = await streamThenSignal(['--shutdown-timeout', '60']);
    assert.equal(res.finish, 'length');
    assert.equal(res.usage.completion_tokens, 1500);
  });

  test('SIGTERM without grace: streams end with a finish chunk and [DONE]', async () => {
    // long enough (attention over thousands of positions) that no machine finishes it
    // between the first chunk and the signal
    const res = await streamThenSignal(['--shutdown-timeout', '0'], 6000);
    assert.equal(res.finish, 'abort');
    assert.ok(res.usage.completion_tokens < 6000);
  });
});

describe('command line', () => {
  test('usage errors exit 2, a model that does not load exits 1', () => {
    const run = (...a) => spawnSync(KILN_BIN, ['serve', ...a], { encoding: 'utf8', timeout: 60000 * SLOW });
    assert.equal(run('--port', '99999', '-m', 'x').status, 2);
    assert.equal(run('--port', '0').status, 2); // no -m
    assert.equal(run('-m', 'x', '--bogus').status, 2);
    const r = run('-m', '/nonexistent/model.gguf', '--port', '0');
    assert.equal(r.status, 1);
    assert.match(r.stderr, /listening on http:\/\/127\.0\.0\.1:\d+/);
    assert.match(r.stderr, /nonexistent/);
    assert.equal(sanitizerReports(r.stderr), '');
    const h = run('--help');
    assert.equal(h.status, 0);
    assert.match(h.stdout, /--max-body/);
  });
});
