// harness.mjs - start `kiln serve` on a free loopback port (--port 0; the port is read from
// its "listening on" line), wait until /health answers 200, stop it with a signal, and read
// /metrics. Every wait is bounded. Environment: KILN_BIN, KILN_MODEL, KILN_SHARED_DIR,
// KILN_SANITIZE ("1" when the binary is built with ASan+UBSan: timeouts are stretched).
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { setTimeout as sleep } from 'node:timers/promises';

export const KILN_BIN = process.env.KILN_BIN;
export const MODEL = process.env.KILN_MODEL;
export const SHARED = process.env.KILN_SHARED_DIR;
export const SANITIZED = process.env.KILN_SANITIZE === '1';
/** Multiplier for time bounds (sanitized builds are several times slower). */
export const SLOW = SANITIZED ? 6 : 1;

const SANITIZER_RE = /ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:|SUMMARY: \w+Sanitizer/;

/** Start a server with extra CLI args; resolves once /health is 200. */
export async function startServer(args = [], { readyMs = 60000 * SLOW } = {}) {
  if (!KILN_BIN || !MODEL) throw new Error('KILN_BIN and KILN_MODEL must be set');
  const child = spawn(KILN_BIN, ['serve', '-m', MODEL, '--host', '127.0.0.1', '--port', '0', ...args], {
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  let exited = null;
  // 'close', not 'exit': 'exit' can fire before the last of stderr has been read.
  const exitP = new Promise((resolve) => {
    child.on('close', (code, signal) => {
      exited = { code, signal };
      resolve(exited);
    });
  });
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (d) => {
    stderr += d;
  });
  const deadline = Date.now() + readyMs;
  let port = 0;
  while (!port) {
    const m = /listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(stderr);
    if (m) port = Number(m[1]);
    else if (exited) throw new Error(`kiln serve exited (${JSON.stringify(exited)}): ${stderr}`);
    else if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`kiln serve did not start listening: ${stderr}`);
    } else await sleep(10);
  }
  const url = `http://127.0.0.1:${port}`;
  for (;;) {
    try {
      const r = await fetch(`${url}/health`);
      await r.arrayBuffer();
      if (r.status === 200) break;
    } catch {
      /* not yet */
    }
    if (exited) throw new Error(`kiln serve exited: ${stderr}`);
    if (Date.now() > deadline) {
      child.kill('SIGKILL');
      throw new Error(`kiln serve never became healthy: ${stderr}`);
    }
    await sleep(20);
  }
  return {
    port,
    url,
    child,
    get stderr() {
      return stderr;
    },
    get exited() {
      return exited;
    },
    /** Send a signal and wait for the exit (SIGKILL after timeoutMs). */
    async stop(signal = 'SIGTERM', timeoutMs = 30000 * SLOW) {
      if (!exited) child.kill(signal);
      const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
      const r = await exitP;
      clearTimeout(timer);
      return { ...r, stderr };
    },
  };
}

/** The sanitizer reports in a server's stderr ('' when none). */
export function sanitizerReports(stderr) {
  if (!SANITIZER_RE.test(stderr)) return '';
  const i = stderr.search(SANITIZER_RE);
  return stderr.slice(Math.max(0, i - 200), i + 4000);
}

/** GET /metrics parsed into { 'name{labels}': number }. */
export async function metrics(url) {
  const r = await fetch(`${url}/metrics`);
  const text = await r.text();
  const out = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return out;
}

/** Poll /metrics until pred(metrics) holds (bounded); returns the last metrics. */
export async function waitMetrics(url, pred, timeoutMs = 5000 * SLOW) {
  const deadline = Date.now() + timeoutMs;
  let m;
  for (;;) {
    m = await metrics(url);
    if (pred(m) || Date.now() > deadline) return m;
    await sleep(10);
  }
}

/** The stories260K cases of ../shared/golden/llama2c-greedy.json (llama2.c run.c, greedy). */
export function goldenCases() {
  const j = JSON.parse(readFileSync(`${SHARED}/golden/llama2c-greedy.json`, 'utf8'));
  return j.cases.filter((c) => c.model === 'stories260K');
}

/** POST JSON with an optional API key; resolves { status, json, text }. */
export async function postJson(url, path, body, key) {
  const headers = { 'content-type': 'application/json' };
  if (key) headers.authorization = `Bearer ${key}`;
  const r = await fetch(`${url}${path}`, {
    method: 'POST',
    headers,
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {
    /* not JSON */
  }
  return { status: r.status, json, text, headers: r.headers };
}
