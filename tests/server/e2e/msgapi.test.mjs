// msgapi.test.mjs - `kiln serve` on stories260K through the official clients of the APIs that
// are not chat/completions (issue 20): @anthropic-ai/sdk (messages.create, messages.stream,
// errors), openai (responses.create whole and streamed, previous_response_id, retrieve,
// delete) and the Vercel AI SDK (generateText through the default OpenAI provider, which calls
// /v1/responses, and streamText). Greedy requests; each reply must equal the chat route's for
// the equivalent chat request (the same engine, the same template).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';
import { createOpenAI } from '@ai-sdk/openai';
import { generateText, jsonSchema, streamText, tool } from 'ai';
import { SLOW, metrics, sanitizerReports, startServer } from './harness.mjs';

const KEY = 'sk-kiln-msgapi';
const MODEL = 'stories260K';
let srv;
let anthropic;
let openai;

before(async () => {
  // --ctx past the model's 512: room for the tools' system text (Hermes, for the ChatML fallback)
  srv = await startServer(['--api-key', KEY, '--model-name', MODEL, '-t', '1', '--response-store-max', '1M', '--ctx', '2048']);
  anthropic = new Anthropic({ apiKey: KEY, baseURL: srv.url, maxRetries: 0, timeout: 60000 * SLOW });
  openai = new OpenAI({ apiKey: KEY, baseURL: `${srv.url}/v1`, maxRetries: 0, timeout: 60000 * SLOW });
});

after(async () => {
  if (!srv) return;
  const r = await srv.stop('SIGTERM');
  assert.equal(r.code, 0, `exit ${r.code} ${r.signal}: ${r.stderr.slice(-2000)}`);
  assert.equal(sanitizerReports(r.stderr), '');
});

/** The chat route's greedy reply to messages. */
async function chatReply(messages, maxTokens, extra = {}) {
  const r = await openai.chat.completions.create({ model: MODEL, messages, max_tokens: maxTokens, temperature: 0, ...extra });
  return { text: r.choices[0].message.content, finish: r.choices[0].finish_reason, usage: r.usage };
}

const SYSTEM = 'You are a storyteller.';
// kiln's "fill" forces the reply to begin with a tool call in the Hermes markup (the ChatML
// fallback's format), cut at its closing tag by a stop string: a tiny model "calls" a tool
const CALL = 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';
const FORCE = { fill: { content: CALL } };
const USER = 'Tell me a story about a dog.';

describe('Anthropic Messages (@anthropic-ai/sdk)', () => {
  test('messages.create equals the chat route', async () => {
    const ref = await chatReply([{ role: 'system', content: SYSTEM }, { role: 'user', content: USER }], 24);
    const m = await anthropic.messages.create({
      model: MODEL, max_tokens: 24, temperature: 0, system: SYSTEM, messages: [{ role: 'user', content: USER }],
      metadata: { user_id: 'e2e' },
    });
    assert.equal(m.type, 'message');
    assert.equal(m.role, 'assistant');
    assert.match(m.id, /^msg_/);
    assert.equal(m.model, MODEL);
    assert.equal(m.content.length, 1);
    assert.equal(m.content[0].type, 'text');
    assert.equal(m.content[0].text, ref.text);
    assert.equal(m.stop_reason, ref.finish === 'length' ? 'max_tokens' : 'end_turn');
    assert.equal(m.stop_sequence, null);
    assert.equal(m.usage.output_tokens, ref.usage.completion_tokens);
    assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, ref.usage.prompt_tokens);
    assert.equal(m.usage.cache_creation_input_tokens, 0);
  });

  test('messages.stream: text events and the final message equal messages.create', async () => {
    const req = { model: MODEL, max_tokens: 30, temperature: 0, system: [{ type: 'text', text: SYSTEM }], messages: [{ role: 'user', content: USER }] };
    const whole = await anthropic.messages.create(req);
    const stream = anthropic.messages.stream(req);
    let text = '';
    const types = [];
    stream.on('text', (t) => { text += t; });
    stream.on('streamEvent', (e) => types.push(e.type));
    const fin = await stream.finalMessage();
    assert.equal(text, whole.content[0].text);
    assert.equal(fin.content[0].text, whole.content[0].text);
    assert.equal(fin.stop_reason, whole.stop_reason);
    assert.equal(fin.usage.output_tokens, whole.usage.output_tokens);
    assert.equal(fin.usage.input_tokens + fin.usage.cache_read_input_tokens,
      whole.usage.input_tokens + whole.usage.cache_read_input_tokens);
    assert.equal(types[0], 'message_start');
    assert.equal(types[1], 'content_block_start');
    assert.deepEqual(types.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
  });

  test('stop_sequences and an assistant prefill', async () => {
    const base = await anthropic.messages.create({ model: MODEL, max_tokens: 30, temperature: 0, messages: [{ role: 'user', content: USER }] });
    const t = base.content[0].text;
    const stop = t.slice(Math.floor(t.length / 2), Math.floor(t.length / 2) + 3);
    const m = await anthropic.messages.create({ model: MODEL, max_tokens: 30, temperature: 0, stop_sequences: [stop], messages: [{ role: 'user', content: USER }] });
    assert.equal(m.stop_reason, 'stop_sequence');
    assert.equal(m.stop_sequence, stop);
    assert.equal(m.content[0].text, t.slice(0, t.indexOf(stop)));
    // the reply continues a final assistant message, as the chat route's does
    const msgs = [{ role: 'user', content: USER }, { role: 'assistant', content: 'Once upon a time' }];
    const p = await anthropic.messages.create({ model: MODEL, max_tokens: 16, temperature: 0, messages: msgs });
    const ref = await chatReply(msgs, 16);
    assert.equal(p.content[0].text, ref.text);
    assert.ok(!p.content[0].text.startsWith('Once upon a time'));
  });

  test('a tool_use block, whole and through messages.stream', async () => {
    const req = {
      model: MODEL, max_tokens: 90, temperature: 0, stop_sequences: ['</tool_call>'], ...FORCE,
      tools: [{ name: 'get_weather', description: 'Weather of a city', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }],
      messages: [{ role: 'user', content: 'Weather in Paris?' }],
    };
    const m = await anthropic.messages.create(req);
    assert.equal(m.stop_reason, 'tool_use');
    assert.deepEqual(m.content.map((b) => b.type), ['text', 'tool_use']);
    assert.equal(m.content[1].name, 'get_weather');
    assert.deepEqual(m.content[1].input, { city: 'Paris' });
    const fin = await anthropic.messages.stream(req).finalMessage();
    assert.equal(fin.stop_reason, 'tool_use');
    assert.deepEqual(fin.content[1].input, { city: 'Paris' }); // from the input_json_delta pieces
    // the result goes back as a tool_result block
    const next = await anthropic.messages.create({
      ...req, fill: undefined, stop_sequences: undefined, max_tokens: 8,
      messages: [...req.messages, { role: 'assistant', content: m.content },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: m.content[1].id, content: 'sunny' }] }],
    });
    assert.equal(next.type, 'message');
  });

  test('errors come back as the SDK\'s typed errors', async () => {
    await assert.rejects(
      anthropic.messages.create({ model: MODEL, max_tokens: 8, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'base64', media_type: 'image/png', data: 'AAAA' } }] }] }),
      (e) => e instanceof Anthropic.BadRequestError && e.status === 400 && e.error?.error?.type === 'invalid_request_error' && /image/.test(e.message),
    );
    const bad = new Anthropic({ apiKey: 'wrong', baseURL: srv.url, maxRetries: 0 });
    await assert.rejects(
      bad.messages.create({ model: MODEL, max_tokens: 8, messages: [{ role: 'user', content: 'x' }] }),
      (e) => e instanceof Anthropic.AuthenticationError && e.status === 401,
    );
  });
});

describe('OpenAI Responses (openai)', () => {
  test('responses.create, streamed and not, equal the chat route; retrieve and delete', async () => {
    const ref = await chatReply([{ role: 'system', content: SYSTEM }, { role: 'user', content: USER }], 20);
    const r = await openai.responses.create({ model: MODEL, instructions: SYSTEM, input: USER, max_output_tokens: 20, temperature: 0 });
    assert.equal(r.object, 'response');
    assert.match(r.id, /^resp_/);
    assert.equal(r.output_text, ref.text);
    assert.equal(r.status, ref.finish === 'length' ? 'incomplete' : 'completed');
    assert.equal(r.output[0].type, 'message');
    assert.equal(r.output[0].content[0].type, 'output_text');
    assert.equal(r.usage.input_tokens, ref.usage.prompt_tokens);
    assert.equal(r.usage.output_tokens, ref.usage.completion_tokens);

    const stream = await openai.responses.create({ model: MODEL, instructions: SYSTEM, input: USER, max_output_tokens: 20, temperature: 0, stream: true });
    let text = '';
    let last = null;
    let seq = 0;
    for await (const ev of stream) {
      assert.equal(ev.sequence_number, seq++);
      if (ev.type === 'response.output_text.delta') text += ev.delta;
      last = ev;
    }
    assert.equal(text, ref.text);
    assert.equal(last.type, r.status === 'completed' ? 'response.completed' : 'response.incomplete');
    assert.equal(last.response.output_text, ref.text);

    const got = await openai.responses.retrieve(r.id);
    assert.equal(got.id, r.id);
    assert.equal(got.output_text, ref.text);
    await openai.responses.delete(r.id);
    await assert.rejects(openai.responses.retrieve(r.id), (e) => e instanceof OpenAI.NotFoundError && e.status === 404);
  });

  test('previous_response_id continues the stored conversation', async () => {
    const first = await openai.responses.create({ model: MODEL, input: USER, max_output_tokens: 16, temperature: 0 });
    const second = await openai.responses.create({ model: MODEL, previous_response_id: first.id, input: 'What happened next?', max_output_tokens: 12, temperature: 0 });
    const ref = await chatReply([
      { role: 'user', content: USER },
      { role: 'assistant', content: first.output_text },
      { role: 'user', content: 'What happened next?' },
    ], 12);
    assert.equal(second.output_text, ref.text);
    assert.equal(second.previous_response_id, first.id);
    // streamed through the helper, which accumulates the final response
    const s = openai.responses.stream({ model: MODEL, previous_response_id: first.id, input: 'What happened next?', max_output_tokens: 12, temperature: 0 });
    const fin = await s.finalResponse();
    assert.equal(fin.output_text, ref.text);
    await assert.rejects(
      openai.responses.create({ model: MODEL, previous_response_id: 'resp_unknown', input: 'x' }),
      (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && e.code === 'previous_response_not_found',
    );
    const m = await metrics(srv.url);
    assert.ok(m.kiln_response_store_entries >= 2);
  });
});

describe('Vercel AI SDK (ai + @ai-sdk/openai, the default Responses provider)', () => {
  const provider = () => createOpenAI({ apiKey: KEY, baseURL: `${srv.url}/v1` });

  test('generateText goes through /v1/responses and equals responses.create', async () => {
    const before = await metrics(srv.url);
    const r = await generateText({ model: provider()(MODEL), system: SYSTEM, prompt: USER, maxOutputTokens: 20, temperature: 0, maxRetries: 0 });
    const after = await metrics(srv.url);
    const key = 'kiln_http_requests_total{endpoint="/v1/responses",status="200"}';
    assert.equal((after[key] ?? 0) - (before[key] ?? 0), 1, 'one /v1/responses request');
    const ref = await openai.responses.create({ model: MODEL, input: [{ role: 'system', content: SYSTEM }, { role: 'user', content: USER }], max_output_tokens: 20, temperature: 0 });
    assert.equal(r.text, ref.output_text);
    assert.equal(r.finishReason, ref.status === 'completed' ? 'stop' : 'length');
    assert.equal(r.usage.outputTokens, ref.usage.output_tokens);
    assert.equal(r.usage.inputTokens, ref.usage.input_tokens);
    assert.match(r.response.id, /^resp_/);
  });

  test('a tool call comes back as the SDK\'s toolCalls', async () => {
    // the AI SDK sends only the fields it knows: a fetch wrapper adds kiln's fill and stop
    const force = async (url, init) => {
      const body = JSON.parse(init.body);
      return fetch(url, { ...init, body: JSON.stringify({ ...body, ...FORCE, stop: ['</tool_call>'] }) });
    };
    const p = createOpenAI({ apiKey: KEY, baseURL: `${srv.url}/v1`, fetch: force });
    const tools = { get_weather: tool({ description: 'Weather of a city', inputSchema: jsonSchema({ type: 'object', properties: { city: { type: 'string' } }, required: ['city'] }) }) };
    const r = await generateText({ model: p(MODEL), tools, prompt: 'Weather in Paris?', maxOutputTokens: 90, temperature: 0, maxRetries: 0 });
    assert.equal(r.finishReason, 'tool-calls');
    assert.equal(r.toolCalls.length, 1);
    assert.equal(r.toolCalls[0].toolName, 'get_weather');
    assert.deepEqual(r.toolCalls[0].input, { city: 'Paris' });
    const s = streamText({ model: p(MODEL), tools, prompt: 'Weather in Paris?', maxOutputTokens: 90, temperature: 0, maxRetries: 0 });
    const calls = await s.toolCalls;
    assert.equal(calls.length, 1);
    assert.deepEqual(calls[0].input, { city: 'Paris' });
  });

  test('streamText streams the same text', async () => {
    const ref = await generateText({ model: provider()(MODEL), prompt: USER, maxOutputTokens: 24, temperature: 0, maxRetries: 0 });
    const s = streamText({ model: provider()(MODEL), prompt: USER, maxOutputTokens: 24, temperature: 0, maxRetries: 0 });
    let text = '';
    let parts = 0;
    for await (const t of s.textStream) {
      text += t;
      parts++;
    }
    assert.equal(text, ref.text);
    assert.ok(parts >= 2, 'the text arrives in pieces');
    assert.equal(await s.finishReason, ref.finishReason);
    // a multi-turn conversation: the earlier assistant turn goes back as an item_reference
    const turn2 = await generateText({
      model: provider()(MODEL),
      messages: [{ role: 'user', content: USER }, ...ref.response.messages, { role: 'user', content: 'And then?' }],
      maxOutputTokens: 12, temperature: 0, maxRetries: 0,
    });
    const want = await chatReply([{ role: 'user', content: USER }, { role: 'assistant', content: ref.text }, { role: 'user', content: 'And then?' }], 12);
    assert.equal(turn2.text, want.text);
  });
});
