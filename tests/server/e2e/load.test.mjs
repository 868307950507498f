// load.test.mjs - 64 concurrent streaming clients (the OpenAI npm client, completions and
// chat mixed) against one `kiln serve` on stories260K: every stream must be complete and
// well formed, the greedy outputs must equal the same requests sent one at a time, and the
// KV pool must be back to zero blocks in use afterwards (read from /metrics).
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import OpenAI from 'openai';
import { SLOW, sanitizerReports, startServer, waitMetrics } from './harness.mjs';

const N = 64;
let srv;
let client;

before(async () => {
  srv = await startServer(['--model-name', 'stories260K', '--max-connections', '256']);
  client = new OpenAI({ apiKey: 'none', baseURL: `${srv.url}/v1`, maxRetries: 0, timeout: 120000 * SLOW });
});

after(async () => {
  if (!srv) return;
  const r = await srv.stop('SIGINT');
  assert.equal(r.code, 0, r.stderr.slice(-2000));
  assert.equal(sanitizerReports(r.stderr), '');
});

const names = ['Lily', 'Tom', 'Ben', 'Sue', 'Max', 'Mia', 'Sam', 'Ann'];
const things = ['a red ball', 'a big dog', 'a little bird', 'a shiny box', 'the park', 'a cake', 'the sea', 'a tree'];

function requestFor(i) {
  const prompt = `Once upon a time, ${names[i % 8]} saw ${things[Math.floor(i / 8) % 8]}`;
  const max_tokens = 16 + (i % 5) * 12;
  if (i % 2 === 0) return { kind: 'completion', body: { model: 'stories260K', prompt, max_tokens, temperature: 0 } };
  return {
    kind: 'chat',
    body: { model: 'stories260K', messages: [{ role: 'user', content: prompt }], max_tokens, temperature: 0 },
  };
}

/** Run one streamed request and check its shape; resolves { text, finish, usage }. */
async function runStream(i) {
  const { kind, body } = requestFor(i);
  const req = { ...body, stream: true, stream_options: { include_usage: true } };
  const stream = kind === 'chat' ? await client.chat.completions.create(req) : await client.completions.create(req);
  let text = '';
  let finish = null;
  let usage = null;
  let n = 0;
  let id = null;
  for await (const chunk of stream) {
    id ??= chunk.id;
    assert.equal(chunk.id, id, 'one id per stream');
    assert.equal(usage, null, `stream ${i}: a chunk after the usage chunk`);
    if (chunk.choices.length === 0) {
      usage = chunk.usage;
      continue;
    }
    assert.equal(finish, null, `stream ${i}: a chunk after the finish chunk`);
    assert.equal(chunk.usage, null);
    const ch = chunk.choices[0];
    if (kind === 'chat') {
      if (n === 0) assert.deepEqual(ch.delta, { role: 'assistant', content: '' }, `stream ${i}: role first`);
      else assert.equal(ch.delta.role, undefined);
      text += ch.delta.content ?? '';
    } else {
      text += ch.text;
    }
    if (ch.finish_reason !== null) finish = ch.finish_reason;
    n++;
  }
  assert.ok(['stop', 'length'].includes(finish), `stream ${i}: finish ${finish}`);
  assert.ok(usage, `stream ${i}: no usage chunk`);
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
  if (finish === 'length') assert.equal(usage.completion_tokens, body.max_tokens);
  assert.ok(!text.includes('\uFFFD') || finish === 'length', `stream ${i}: partial UTF-8`);
  return { text, finish, usage };
}

test(`${N} concurrent streaming clients: complete, well formed, equal to one at a time`, { timeout: 300000 * SLOW }, async () => {
  const t0 = Date.now();
  const concurrent = await Promise.all(Array.from({ length: N }, (_, i) => runStream(i)));
  const tConc = Date.now() - t0;
  const m = await waitMetrics(srv.url, (x) => x.kiln_kv_blocks_used === 0 && x.kiln_num_requests_running === 0);
  assert.equal(m.kiln_kv_blocks_used, 0, 'KV pool back to zero blocks');
  assert.equal(m.kiln_num_requests_running, 0);
  assert.equal(m.kiln_num_requests_waiting, 0);

  const t1 = Date.now();
  for (let i = 0; i < N; i++) {
    const one = await runStream(i);
    assert.equal(concurrent[i].text, one.text, `request ${i}: batched output differs from the one-at-a-time output`);
    assert.equal(concurrent[i].finish, one.finish);
    // cached_tokens depends on what ran before (a one-at-a-time rerun hits the prefix cache
    // the concurrent run filled); the counts must not
    const strip = (u) => ({ ...u, prompt_tokens_details: undefined });
    assert.deepEqual(strip(concurrent[i].usage), strip(one.usage));
    const c = concurrent[i].usage.prompt_tokens_details.cached_tokens;
    assert.ok(Number.isInteger(c) && c >= 0 && c < one.usage.prompt_tokens, `cached ${c}`);
  }
  const tSeq = Date.now() - t1;
  console.log(`# ${N} concurrent streams in ${tConc} ms; one at a time in ${tSeq} ms`);

  // A request is counted when its connection reports it complete, just after the client
  // has read its last byte: wait for the count (bounded).
  const okCount = (x) => (x['kiln_http_requests_total{endpoint="/v1/completions",status="200"}'] ?? 0) +
    (x['kiln_http_requests_total{endpoint="/v1/chat/completions",status="200"}'] ?? 0);
  const fin = await waitMetrics(srv.url, (x) => okCount(x) === 2 * N);
  assert.equal(fin.kiln_kv_blocks_used, 0);
  assert.equal(okCount(fin), 2 * N);
  assert.equal(fin['kiln_time_to_first_token_seconds_count'], 2 * N);
  const logLines = () => srv.stderr.split('\n').filter((l) => / POST \/v1\/(chat\/)?completions 200 prompt=\d+ cached=\d+ completion=\d+ ttft_ms=[\d.]+ total_ms=[\d.]+ finish=(stop|length)$/.test(l));
  for (let i = 0; i < 100 && logLines().length < 2 * N; i++) await sleep(10);
  assert.equal(logLines().length, 2 * N, 'one log line per request');
});
