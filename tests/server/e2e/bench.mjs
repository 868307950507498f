// bench.mjs - serving figures of `kiln serve` over loopback, to set next to the in-process
// `kiln bench` (same model, prompt and generation lengths, concurrency levels).
//
//   KILN_BIN=build/kiln KILN_MODEL=../shared/models/stories260K/stories260K-f32.gguf \
//     node tests/server/e2e/bench.mjs [--concurrency 1,8,64] [--prompt-tokens 128]
//     [--gen-tokens 128] [--threads N] [--repeat 3]
//
// Like kiln bench, each level submits C requests at once: synthetic prompts of ordinary token
// ids (ids 3..511 for the 512-token stories vocab; no control tokens), exactly --gen-tokens
// greedy tokens each (ignore_eos), streamed (SSE) through POST /v1/completions by raw fetch
// (one connection per client). Reported per level (median of --repeat runs):
//   requests/s   C / wall time (first request sent to last stream ended)
//   TTFT p50/p99 request sent to the first text chunk (nearest-rank percentiles)
// The same numbers from `kiln bench --json` (requests/s = C / wall_s) are printed beside.
import { execFileSync } from 'node:child_process';
import { startServer } from './harness.mjs';

const args = process.argv.slice(2);
const opt = (name, def) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1] : def;
};
const levels = opt('concurrency', '1,8,64').split(',').map(Number);
const P = Number(opt('prompt-tokens', '128'));
const G = Number(opt('gen-tokens', '128'));
const threads = opt('threads', '');
const repeat = Number(opt('repeat', '3'));
const maxC = Math.max(...levels);

let seed = 12345;
const rand = () => {
  seed = (seed * 1103515245 + 12345) % 2147483648;
  return seed;
};

async function oneRequest(url, prompt) {
  const t0 = performance.now();
  const r = await fetch(`${url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt, max_tokens: G, temperature: 0, ignore_eos: true, stream: true }),
  });
  if (r.status !== 200) throw new Error(`status ${r.status}: ${await r.text()}`);
  let ttft = null;
  let buf = '';
  const dec = new TextDecoder();
  for await (const part of r.body) {
    buf += dec.decode(part, { stream: true });
    if (ttft === null && buf.includes('"text"')) ttft = performance.now() - t0;
    const cut = buf.lastIndexOf('\n\n');
    if (cut >= 0) buf = buf.slice(cut + 2);
  }
  return { ttft, end: performance.now() };
}

const pct = (v, p) => v[Math.min(v.length, Math.max(1, Math.ceil((p / 100) * v.length))) - 1];
const median = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)];

async function level(url, c) {
  const prompts = Array.from({ length: c }, () => Array.from({ length: P }, () => 3 + (rand() % 509)));
  const t0 = performance.now();
  const res = await Promise.all(prompts.map((p) => oneRequest(url, p)));
  const wall = Math.max(...res.map((r) => r.end)) - t0;
  const ttft = res.map((r) => r.ttft).sort((a, b) => a - b);
  return { rps: (c * 1000) / wall, p50: pct(ttft, 50), p99: pct(ttft, 99), wall };
}

const kvTokens = String(maxC * (P + G + 16));
const extra = ['-q', '--kv-tokens', kvTokens, '--max-seqs', String(Math.max(256, maxC))];
if (threads) extra.push('-t', threads);
const srv = await startServer(extra);
await level(srv.url, 1); // warm-up
const server = {};
for (const c of levels) {
  const runs = [];
  for (let i = 0; i < repeat; i++) runs.push(await level(srv.url, c));
  server[c] = { rps: median(runs.map((r) => r.rps)), p50: median(runs.map((r) => r.p50)), p99: median(runs.map((r) => r.p99)) };
}
await srv.stop();

const benchArgs = ['bench', '-m', process.env.KILN_MODEL, '--concurrency', levels.join(','), '--prompt-tokens', String(P), '--gen-tokens', String(G), '--json'];
if (threads) benchArgs.push('-t', threads);
const inproc = {};
for (let i = 0; i < repeat; i++) {
  const j = JSON.parse(execFileSync(process.env.KILN_BIN, benchArgs, { encoding: 'utf8' }));
  for (const l of j.levels) {
    (inproc[l.concurrency] ??= []).push({ rps: l.concurrency / l.wall_s, p50: l.ttft_ms_p50, p99: l.ttft_ms_p99 });
  }
}

console.log(`stories260K, prompt ${P} tokens, ${G} generated tokens per request, streamed; median of ${repeat} runs`);
console.log('clients | server req/s | server TTFT p50 / p99 ms | kiln bench req/s | kiln bench TTFT p50 / p99 ms');
for (const c of levels) {
  const s = server[c];
  const b = inproc[c];
  const br = { rps: median(b.map((x) => x.rps)), p50: median(b.map((x) => x.p50)), p99: median(b.map((x) => x.p99)) };
  console.log(
    `${String(c).padStart(7)} | ${s.rps.toFixed(1).padStart(12)} | ${s.p50.toFixed(1).padStart(10)} / ${s.p99.toFixed(1).padEnd(11)} | ` +
      `${br.rps.toFixed(1).padStart(16)} | ${br.p50.toFixed(1).padStart(13)} / ${br.p99.toFixed(1)}`,
  );
}
