// clients.test.mjs - structured output and tools through the clients' own helpers (issue 20),
// on stories260K, each output checked against its zod schema (the client's own validation and
// schema.safeParse here):
//   - openai: chat.completions.parse with response_format json_schema (zodResponseFormat),
//     whole and streamed (chat.completions.stream, finalChatCompletion), same seed, same object;
//   - the Vercel AI SDK: generateObject with a zod schema through the default provider
//     (/v1/responses, text.format json_schema), at temperature 1 over several seeds;
//   - LangChain JS (@langchain/openai ChatOpenAI): invoke and stream equal the chat route's
//     greedy reply, withStructuredOutput (zod, method jsonSchema: response_format json_schema)
//     and bindTools with tool_choice "required" and parallel_tool_calls false (the grammar
//     makes the tiny model call it, once).
// A fetch wrapper records each client's request body, to check what it actually sent.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import OpenAI from 'openai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { createOpenAI } from '@ai-sdk/openai';
import { generateObject } from 'ai';
import { ChatOpenAI } from '@langchain/openai';
import { z } from 'zod';
import { SLOW, sanitizerReports, startServer } from './harness.mjs';

const MODEL = 'stories260K';
let srv;
let openai;
const sent = []; // [path, body] of the requests made through recordingFetch

before(async () => {
  // --ctx past the model's 512: room for the Hermes tools text of the ChatML fallback.
  // --no-prefix-cache: with a grammar, a cached prompt samples differently from an uncached
  // one (see tools.test.mjs), and the whole/streamed comparisons below use one seed.
  srv = await startServer(['--model-name', MODEL, '-t', '1', '--ctx', '2048', '--no-prefix-cache']);
  openai = new OpenAI({ apiKey: 'none', baseURL: `${srv.url}/v1`, maxRetries: 0, timeout: 60000 * SLOW });
});

after(async () => {
  if (!srv) return;
  const r = await srv.stop('SIGTERM');
  assert.equal(r.code, 0, `exit ${r.code} ${r.signal}: ${r.stderr.slice(-2000)}`);
  assert.equal(sanitizerReports(r.stderr), '');
});

async function recordingFetch(url, init) {
  sent.push([new URL(String(url)).pathname, init && init.body ? JSON.parse(init.body) : null]);
  return fetch(url, init);
}
const lastSent = () => sent[sent.length - 1];

// Bounded strings and arrays: a random walk of the tiny model must be able to finish the
// object within max_tokens.
const Pet = z.object({
  name: z.string().min(1).max(10),
  kind: z.enum(['cat', 'dog', 'bird']),
  age: z.number().int().min(0).max(30),
  friendly: z.boolean(),
  toys: z.array(z.string().max(6)).min(1).max(2),
});
const messages = [{ role: 'user', content: 'Describe a pet as JSON.' }];

describe('openai: response_format json_schema', () => {
  test('chat.completions.parse: the parsed object validates, whole and streamed alike', async () => {
    const rf = zodResponseFormat(Pet, 'pet');
    assert.equal(rf.type, 'json_schema');
    for (const seed of [1, 2, 3]) {
      const req = { model: MODEL, messages, response_format: rf, max_tokens: 200, temperature: 1, seed };
      const r = await openai.chat.completions.parse(req);
      const m = r.choices[0].message;
      assert.equal(r.choices[0].finish_reason, 'stop', m.content);
      assert.ok(Pet.safeParse(m.parsed).success, m.content);
      assert.deepEqual(m.parsed, JSON.parse(m.content));
      const s = openai.chat.completions.stream(req);
      let pieces = 0;
      s.on('content', () => pieces++);
      const f = await s.finalChatCompletion();
      assert.ok(pieces >= 2, 'the JSON arrives in pieces');
      assert.equal(f.choices[0].message.content, m.content, `seed ${seed}: streamed equals whole`);
      assert.deepEqual(f.choices[0].message.parsed, m.parsed);
    }
  });

  test('a schema kiln cannot honour is a 400 the client raises', async () => {
    const bad = { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'number', multipleOf: 3 } } };
    await assert.rejects(openai.chat.completions.create({ model: MODEL, messages, response_format: bad, max_tokens: 10 }),
      (e) => e instanceof OpenAI.BadRequestError && /multipleOf/.test(e.message));
  });
});

describe('Vercel AI SDK: generateObject', () => {
  test('a zod schema through the default (Responses) provider validates', async () => {
    for (const seed of [1, 2, 3]) {
      // the Responses provider sends no seed (OpenAI's Responses API has none): the fetch
      // wrapper adds kiln's, so each run samples a different, reproducible object
      const seeded = (url, init) => recordingFetch(url, { ...init, body: JSON.stringify({ ...JSON.parse(init.body), seed }) });
      const provider = createOpenAI({ apiKey: 'none', baseURL: `${srv.url}/v1`, fetch: seeded });
      const r = await generateObject({ model: provider(MODEL), schema: Pet, prompt: 'Describe a pet.', maxOutputTokens: 200, temperature: 1, maxRetries: 0 });
      assert.ok(Pet.safeParse(r.object).success, JSON.stringify(r.object));
      assert.equal(r.finishReason, 'stop');
      const [path, body] = lastSent();
      assert.equal(path, '/v1/responses');
      assert.equal(body.text.format.type, 'json_schema');
    }
  });
});

describe('LangChain JS (@langchain/openai)', () => {
  const llm = (extra = {}) =>
    new ChatOpenAI({ model: MODEL, apiKey: 'none', configuration: { baseURL: `${srv.url}/v1`, fetch: recordingFetch }, maxRetries: 0, ...extra });

  async function greedy(content, maxTokens) {
    const r = await openai.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content }], max_tokens: maxTokens, temperature: 0 });
    return r.choices[0].message.content;
  }

  test('invoke and stream equal the chat route\'s greedy reply', async () => {
    const want = await greedy('Tell me a story.', 24);
    const m = llm({ temperature: 0, maxTokens: 24 });
    const r = await m.invoke('Tell me a story.');
    assert.equal(r.content, want);
    assert.equal(r.usage_metadata.output_tokens, 24);
    let text = '';
    let chunks = 0;
    for await (const c of await m.stream('Tell me a story.')) {
      text += c.content;
      chunks++;
    }
    assert.equal(text, want);
    assert.ok(chunks >= 2, 'the text arrives in pieces');
  });

  test('withStructuredOutput(zod) sends response_format json_schema and validates', async () => {
    const m = llm({ temperature: 1, maxTokens: 200 }).withStructuredOutput(Pet, { name: 'pet', method: 'jsonSchema' });
    for (const seed of [1, 2]) {
      const r = await m.invoke('Describe a pet.', { seed });
      assert.ok(Pet.safeParse(r).success, JSON.stringify(r));
      const [path, body] = lastSent();
      assert.equal(path, '/v1/chat/completions');
      assert.equal(body.response_format.type, 'json_schema');
    }
  });

  test('bindTools with tool_choice "required": a call whose args validate', async () => {
    const Weather = z.object({ city: z.string().min(1).max(8), unit: z.enum(['c', 'f']) });
    const tool = { name: 'get_weather', description: 'The weather in a city', schema: Weather };
    const m = llm({ temperature: 1, maxTokens: 300 }).bindTools([tool], { tool_choice: 'required', parallel_tool_calls: false });
    for (const seed of [1, 2]) {
      const r = await m.invoke('Weather in Paris?', { seed });
      assert.equal(r.tool_calls.length, 1, JSON.stringify(r));
      assert.equal(r.tool_calls[0].name, 'get_weather');
      assert.ok(Weather.safeParse(r.tool_calls[0].args).success, JSON.stringify(r.tool_calls[0].args));
      assert.equal(r.response_metadata.finish_reason, 'tool_calls', JSON.stringify(r));
      const [, body] = lastSent();
      assert.equal(body.tool_choice, 'required');
      assert.equal(body.parallel_tool_calls, false);
      assert.equal(body.tools[0].function.name, 'get_weather');
    }
  });
});
