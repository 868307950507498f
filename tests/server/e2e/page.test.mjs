// page.test.mjs - the built-in chat page at GET / (issue 20), on stories260K:
//   - the route: text/html, a Content-Security-Policy whose hashes are those of the page's own
//     <style> and <script> (computed here with node:crypto), nothing loaded from elsewhere;
//   - the Markdown renderer (the page's own function, cut out of the served page between its
//     md:begin/md:end markers) on hostile strings: nothing but its own tags comes out;
//   - in a real browser (Debian's chromium driven by playwright-core, headless; skipped with a
//     message when chromium is absent): a two-turn conversation at temperature 0 whose streamed
//     text equals the API's greedy reply for the same messages, the per-reply stats (tok/s,
//     cached prompt tokens), the stop button (on a throttled connection, so the reply is still
//     streaming when it is clicked), and model text carrying <img onerror> and <script> (made
//     with kiln's `fill`, added to the page's request by a playwright route) shown as text.
// One screenshot of the conversation is written to $KILN_PAGE_SCREENSHOT (default: the
// system's temporary directory, kiln-chat-page.png).
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { SLOW, postJson, sanitizerReports, startServer } from './harness.mjs';

const MODEL = 'stories260K';
const CHROMIUM = process.env.KILN_CHROMIUM || '/usr/bin/chromium';
const NO_BROWSER = existsSync(CHROMIUM)
  ? false
  : `chromium is not installed at ${CHROMIUM} (apt-get install chromium, or set KILN_CHROMIUM)`;
const SHOT = process.env.KILN_PAGE_SCREENSHOT || join(tmpdir(), 'kiln-chat-page.png');
const EOS = 2; // stories260K's end of sequence

let srv;
let page;
let browser;

before(async () => {
  srv = await startServer(['--model-name', MODEL, '-t', '1']);
  const r = await fetch(`${srv.url}/`);
  page = { status: r.status, headers: r.headers, text: await r.text() };
});

after(async () => {
  if (browser) await browser.close();
  if (!srv) return;
  const r = await srv.stop('SIGTERM');
  assert.equal(sanitizerReports(r.stderr), '');
});

/** The text between <tag> and </tag> in the page. */
function element(tag) {
  const a = page.text.indexOf(`<${tag}>`);
  const b = page.text.indexOf(`</${tag}>`);
  assert.ok(a >= 0 && b > a, `no <${tag}> in the page`);
  return page.text.slice(a + tag.length + 2, b);
}

const sha256 = (s) => `'sha256-${createHash('sha256').update(s, 'utf8').digest('base64')}'`;

describe('GET /', () => {
  test('text/html with a CSP naming the page\'s own script and style', () => {
    assert.equal(page.status, 200);
    assert.equal(page.headers.get('content-type'), 'text/html; charset=utf-8');
    assert.equal(page.headers.get('x-content-type-options'), 'nosniff');
    const csp = Object.fromEntries(
      page.headers.get('content-security-policy').split(';').map((d) => {
        const [k, ...v] = d.trim().split(/\s+/);
        return [k, v.join(' ')];
      }),
    );
    assert.equal(csp['default-src'], "'none'");
    assert.equal(csp['script-src'], sha256(element('script')));
    assert.equal(csp['style-src'], sha256(element('style')));
    assert.equal(csp['connect-src'], "'self'");
    assert.equal(csp['img-src'], "'none'");
    assert.equal(csp['frame-ancestors'], "'none'");
    assert.ok(page.text.startsWith('<!DOCTYPE html>'));
    // nothing from elsewhere: no src/href attributes, no absolute URLs
    assert.doesNotMatch(page.text, /\s(src|href)\s*=/i);
    assert.doesNotMatch(page.text, /https?:\/\//);
  });

  test('HEAD / answers, POST / is a 405, and the page needs no API key', async () => {
    const h = await fetch(`${srv.url}/`, { method: 'HEAD' });
    assert.equal(h.status, 200);
    assert.equal(h.headers.get('content-type'), 'text/html; charset=utf-8');
    const p = await postJson(srv.url, '/', {});
    assert.equal(p.status, 405);
    assert.match(p.json.error.message, /use GET/);
  });
});

describe('the Markdown renderer', () => {
  let md;
  before(() => {
    const a = page.text.indexOf('/* md:begin');
    const b = page.text.indexOf('/* md:end */');
    assert.ok(a >= 0 && b > a, 'the page has no md:begin/md:end markers');
    md = new Function(`${page.text.slice(a, b)}; return { renderMarkdown, escapeHtml };`)();
  });

  const OWN_TAGS = /<\/?(p|br|strong|em|code|pre|h1|h2|h3|ul|ol|li)>/g;
  const decode = (s) => s.replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&quot;/g, '"')
    .replace(/&#39;/g, "'").replace(/&amp;/g, '&');

  const hostile = [
    '<img src=x onerror=alert(1)>',
    '<script>alert(document.cookie)</script>',
    '"><svg onload=alert(1)>',
    "'><iframe srcdoc='<script>alert(1)</script>'>",
    '**<b onmouseover=alert(1)>bold</b>**',
    '*<i>x</i>* and `<code onclick=x>`',
    '```html\n<script>alert(1)</script>\n```',
    '# <h1 onclick=alert(1)>title',
    '- <li>item</li>\n1. <a href="javascript:alert(1)">x</a>',
    '[click](javascript:alert(1)) ![x](x onerror=alert(1))',
    '&lt;script&gt; is already escaped &amp; stays so',
    '<<script>script>alert(1)<</script>/script>',
    '<scr\u0000ipt>alert(1)</scr\u0000ipt>',
  ];

  test('hostile text: only the renderer\'s own tags, no quote or angle bracket left', () => {
    for (const s of hostile) {
      const html = md.renderMarkdown(s);
      const rest = html.replace(OWN_TAGS, '');
      assert.doesNotMatch(rest, /[<>"']/, `${JSON.stringify(s)} -> ${html}`);
      // the words come through: every letter run of the input is in the decoded text
      const text = decode(rest);
      for (const w of s.replace(/^```.*$/gm, '').match(/[A-Za-z]{3,}/g) || []) assert.ok(text.includes(w), `${w} lost in ${html}`);
    }
    // entities in the input are shown, not interpreted
    assert.match(md.renderMarkdown('&lt;b&gt;'), /&amp;lt;b&amp;gt;/);
  });

  test('the constructs it renders', () => {
    assert.equal(md.renderMarkdown('a **b** *c* `d`'), '<p>a <strong>b</strong> <em>c</em> <code>d</code></p>');
    assert.equal(md.renderMarkdown('```\nx < y\n```'), '<pre><code>x &lt; y</code></pre>');
    assert.equal(md.renderMarkdown('# T\n- a\n- b\n\n1. c'), '<h1>T</h1><ul><li>a</li><li>b</li></ul><ol><li>c</li></ol>');
    assert.equal(md.renderMarkdown('one\ntwo\n\nthree'), '<p>one<br>two</p><p>three</p>');
    assert.equal(md.renderMarkdown('`**not bold**`'), '<p><code>**not bold**</code></p>');
  });
});

describe('in chromium', { skip: NO_BROWSER }, () => {
  let chromium;
  let ctx;
  let tab;
  const problems = [];

  before(async () => {
    ({ chromium } = await import('playwright-core'));
    browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox'] });
    ctx = await browser.newContext({ viewport: { width: 1100, height: 760 } });
    tab = await ctx.newPage();
    tab.on('pageerror', (e) => problems.push(`pageerror: ${e.message}`));
    tab.on('console', (m) => {
      if (m.type() === 'error') problems.push(`console: ${m.text()}`);
    });
    await tab.goto(`${srv.url}/`);
    // the script ran (a CSP hash mismatch would block it): it has named the model
    await tab.waitForFunction(() => document.getElementById('model').textContent.startsWith('stories260K'),
      null, { timeout: 10000 * SLOW });
  });

  async function setField(id, value) {
    await tab.fill(`#${id}`, String(value));
  }
  async function ask(text) {
    const n = await tab.locator('.msg.assistant').count();
    await tab.fill('#input', text);
    await tab.press('#input', 'Enter');
    const msg = tab.locator('.msg.assistant').nth(n);
    await msg.waitFor();
    return msg;
  }
  /** Wait until the reply's data-state is `state` (done, stopped or error, set by the page). */
  async function done(msg, state = 'done') {
    const el = await msg.elementHandle();
    await tab.waitForFunction((e) => e.dataset.state !== 'streaming', el, { timeout: 60000 * SLOW });
    assert.equal(await msg.getAttribute('data-state'), state, await msg.innerText());
  }
  const history = () => tab.evaluate(() => window.kiln.history);
  const squash = (s) => s.replace(/\s+/g, ' ').trim();

  async function apiReply(messages, extra = {}) {
    const r = await postJson(srv.url, '/v1/chat/completions', { model: MODEL, messages, temperature: 0, ...extra });
    assert.equal(r.status, 200, r.text);
    return r.json.choices[0].message.content;
  }

  test('a two-turn conversation streams the API\'s greedy replies', async () => {
    const system = 'You tell short stories.';
    await setField('system', system);
    await setField('temperature', 0);
    await setField('max_tokens', 48);
    const turns = ['Tell me a story about a cat.', 'What did the cat do next?'];
    const msgs = [{ role: 'system', content: system }];
    let cached = [];
    for (const [i, t] of turns.entries()) {
      const m = await ask(t);
      await done(m);
      msgs.push({ role: 'user', content: t });
      const want = await apiReply(msgs, { max_tokens: 48 });
      const h = await history();
      assert.equal(h.length, 2 * i + 2);
      assert.deepEqual(h[2 * i], { role: 'user', content: t });
      assert.equal(h[2 * i + 1].content, want, `turn ${i + 1}`);
      assert.ok(want.length > 0);
      assert.equal(squash(await m.locator('.content').innerText()), squash(want));
      const stats = await m.locator('.stats').innerText();
      const s = /(\d+) tokens · ([\d.]+) tok\/s · (\d+) prompt tokens, (\d+) cached/.exec(stats);
      assert.ok(s, `stats: ${stats}`);
      assert.ok(Number(s[1]) > 1 && Number(s[2]) > 0, stats);
      cached.push(Number(s[4]));
      msgs.push({ role: 'assistant', content: want });
    }
    // the second turn's prompt begins with the first's: the prefix cache serves part of it
    assert.ok(cached[1] > 0, `cached tokens per turn: ${cached}`);
    await tab.screenshot({ path: SHOT });
    console.log(`# screenshot: ${SHOT}`);
    assert.deepEqual(problems, []);
  });

  test('the stop button aborts the streaming reply', async () => {
    await tab.click('#clear');
    await setField('temperature', 0);
    await setField('max_tokens', 400);
    const prompt = 'Once upon a time';
    const full = await apiReply([{ role: 'system', content: 'You tell short stories.' }, { role: 'user', content: prompt }],
      { max_tokens: 400, logit_bias: { [EOS]: -100 } });
    // slow the connection so the reply is still arriving when Stop is clicked
    const cdp = await ctx.newCDPSession(tab);
    await cdp.send('Network.enable');
    await cdp.send('Network.emulateNetworkConditions', { offline: false, latency: 0, downloadThroughput: 3000, uploadThroughput: -1 });
    await tab.route('**/v1/chat/completions', async (route) => {
      const body = JSON.parse(route.request().postData());
      body.logit_bias = { [EOS]: -100 }; // no early end: 400 tokens to stream
      await route.continue({ postData: JSON.stringify(body) });
    });
    try {
      const m = await ask(prompt);
      await tab.waitForFunction((el) => el.querySelector('.content').textContent.length > 0, await m.elementHandle(),
        { timeout: 30000 * SLOW });
      assert.equal(await tab.isEnabled('#stop'), true);
      await tab.click('#stop');
      await done(m, 'stopped');
      const got = (await history())[1].content;
      assert.ok(got.length > 0 && got.length < full.length, `stopped at ${got.length} of ${full.length}`);
      assert.ok(full.startsWith(got), 'the stopped reply is a prefix of the whole one');
      assert.equal(await tab.isEnabled('#send'), true);
      assert.equal(await tab.isEnabled('#stop'), false);
      assert.match(await m.locator('.stats').innerText(), /stopped/);
      const before = await m.locator('.content').innerText();
      await new Promise((r) => setTimeout(r, 500));
      assert.equal(await m.locator('.content').innerText(), before, 'no text after Stop');
    } finally {
      await tab.unroute('**/v1/chat/completions');
      await cdp.send('Network.emulateNetworkConditions', { offline: false, latency: 0, downloadThroughput: -1, uploadThroughput: -1 });
      await cdp.detach();
    }
  });

  test('model text with <img onerror> and <script> is shown as text', async () => {
    await tab.click('#clear');
    const evil = 'Look: <img src=x onerror="window.__pwned=1"> <script>window.__pwned=2</script> **bold**';
    // kiln's fill makes the model "write" the text; a logit bias on EOS ends it there
    await tab.route('**/v1/chat/completions', async (route) => {
      const body = JSON.parse(route.request().postData());
      body.fill = { content: evil };
      body.logit_bias = { [EOS]: 100 };
      await route.continue({ postData: JSON.stringify(body) });
    });
    try {
      const m = await ask('Say something.');
      await done(m);
      assert.equal((await history())[1].content, evil);
      const content = m.locator('.content');
      assert.equal(await content.locator('img, script, svg, iframe').count(), 0);
      assert.equal(await tab.locator('#messages img, #messages script').count(), 0);
      const shown = await content.innerText();
      assert.ok(shown.includes('<img src=x onerror="window.__pwned=1">'), shown);
      assert.ok(shown.includes('<script>window.__pwned=2</script>'), shown);
      assert.equal(await content.locator('strong').innerText(), 'bold'); // Markdown still applies
      assert.equal(await tab.evaluate(() => window.__pwned), undefined);
    } finally {
      await tab.unroute('**/v1/chat/completions');
    }
    assert.deepEqual(problems, []);
  });
});
