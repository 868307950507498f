// tools.test.mjs - tool calling through the official OpenAI npm client (issue 20), on
// stories260K (no chat template: ChatML with the tools described in the Hermes format):
//   - chat with tools: a reply whose text is known (kiln's `fill` makes the model "write" it,
//     a logit bias on EOS ends it) comes back as message.tool_calls with finish_reason
//     "tool_calls", arguments a JSON string;
//   - streaming: the client's own accumulator (chat.completions.stream, finalChatCompletion)
//     rebuilds the same calls from the deltas;
//   - tool_choice "required": the grammar makes the tiny model call a tool whose arguments
//     match the parameters (enum, required keys, bounds checked here), whole and streamed with
//     the same seed giving the same call;
//   - the conversation continues: the assistant's tool_calls and the tool's result are sent
//     back, as an agent loop does;
//   - a bad tool_choice is a 400 the client raises as BadRequestError naming the field.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import OpenAI from 'openai';
import { SLOW, sanitizerReports, startServer } from './harness.mjs';

const MODEL = 'stories260K';
let srv;
let client;

before(async () => {
  // The Hermes tool prompt alone is ~400 of stories260K's tokens: a longer context.
  // --no-prefix-cache: with a grammar, a request whose prompt comes partly from the prefix
  // cache samples differently from the same request uncached (grammar branch at 2fe28a8; not
  // so without a grammar), which would make the same-seed whole/stream comparison below
  // depend on which request ran first.
  srv = await startServer(['--model-name', MODEL, '-t', '1', '--ctx', '2048', '--no-prefix-cache']);
  client = new OpenAI({ apiKey: 'none', baseURL: `${srv.url}/v1`, maxRetries: 0, timeout: 60000 * SLOW });
});

after(async () => {
  if (!srv) return;
  const r = await srv.stop('SIGTERM');
  assert.equal(sanitizerReports(r.stderr), '');
});

const weather = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string', minLength: 1, maxLength: 8 },
        unit: { enum: ['c', 'f'] },
        days: { type: 'integer', minimum: 1, maximum: 7 },
      },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
};
const messages = [{ role: 'user', content: 'Weather in Paris?' }];
const EOS = 2; // stories260K's end of sequence

function known(reply, extra = {}) {
  return { model: MODEL, messages, tools: [weather], max_tokens: 300, seed: 3, fill: { content: reply }, logit_bias: { [EOS]: 100 }, ...extra };
}

/** Arguments valid against weather's parameters (the keywords it uses). */
function checkArgs(args) {
  const a = JSON.parse(args);
  assert.equal(typeof a, 'object');
  assert.ok(!Array.isArray(a) && a !== null);
  for (const k of Object.keys(a)) assert.ok(['city', 'unit', 'days'].includes(k), `unexpected key ${k}`);
  assert.equal(typeof a.city, 'string');
  assert.ok(a.city.length >= 1 && [...a.city].length <= 8, `city ${JSON.stringify(a.city)}`);
  assert.ok(['c', 'f'].includes(a.unit));
  if ('days' in a) assert.ok(Number.isInteger(a.days) && a.days >= 1 && a.days <= 7);
  return a;
}

describe('tool calls', () => {
  const reply = 'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}\n</tool_call>';

  test('chat with tools: message.tool_calls and finish_reason tool_calls', async () => {
    const r = await client.chat.completions.create(known(reply));
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    assert.equal(m.content, 'Let me check. ');
    assert.equal(m.tool_calls.length, 1);
    const c = m.tool_calls[0];
    assert.equal(c.type, 'function');
    assert.match(c.id, /^call_[A-Za-z0-9]{24}$/);
    assert.equal(c.function.name, 'get_weather');
    assert.deepEqual(JSON.parse(c.function.arguments), { city: 'Paris', unit: 'c' });
  });

  test('streamed tool calls rebuild the same call (the client accumulates the deltas)', async () => {
    const whole = await client.chat.completions.create(known(reply));
    const stream = client.chat.completions.stream(known(reply, { stream: true }));
    let argDeltas = 0;
    stream.on('chunk', (chunk) => {
      for (const tc of chunk.choices[0]?.delta?.tool_calls ?? []) if (tc.function?.arguments) argDeltas++;
    });
    const fin = await stream.finalChatCompletion();
    const m = fin.choices[0].message;
    assert.equal(fin.choices[0].finish_reason, 'tool_calls');
    assert.equal(m.content, whole.choices[0].message.content);
    assert.equal(m.tool_calls.length, 1);
    assert.equal(m.tool_calls[0].function.name, 'get_weather');
    assert.equal(m.tool_calls[0].function.arguments, whole.choices[0].message.tool_calls[0].function.arguments);
    assert.ok(argDeltas > 1, `arguments came in ${argDeltas} delta(s)`);
  });

  // One call (parallel_tool_calls false, or a named function): with several allowed, a tiny
  // model rarely ends its list of calls before max_tokens.
  const choices = [
    ['required', { tool_choice: 'required', parallel_tool_calls: false }],
    ['named', { tool_choice: { type: 'function', function: { name: 'get_weather' } } }],
  ];
  for (const [label, choice] of choices) test(`tool_choice ${label}: the tiny model calls the tool with valid arguments`, async () => {
    for (const seed of [1, 2, 3]) {
      const req = { model: MODEL, messages, tools: [{ type: 'function', function: { name: 'ping', parameters: { type: 'object', properties: {}, additionalProperties: false } } }, weather], ...choice, max_tokens: 300, seed, temperature: 1 };
      const r = await client.chat.completions.create(req);
      assert.equal(r.choices[0].finish_reason, 'tool_calls', JSON.stringify(r.choices[0]));
      const calls = r.choices[0].message.tool_calls;
      assert.equal(calls.length, 1);
      assert.equal(r.choices[0].message.content, null);
      for (const c of calls) {
        if (label === 'named' || c.function.name === 'get_weather') {
          assert.equal(c.function.name, 'get_weather');
          checkArgs(c.function.arguments);
        } else {
          assert.equal(c.function.name, 'ping');
          assert.deepEqual(JSON.parse(c.function.arguments), {});
        }
      }
      const fin = await client.chat.completions.stream({ ...req, stream: true }).finalChatCompletion();
      assert.equal(fin.choices[0].finish_reason, 'tool_calls');
      assert.deepEqual(
        fin.choices[0].message.tool_calls.map((c) => [c.function.name, c.function.arguments]),
        calls.map((c) => [c.function.name, c.function.arguments]),
      );
    }
  });

  test('an agent loop: the call and its result sent back', async () => {
    const first = await client.chat.completions.create(known(reply));
    const call = first.choices[0].message.tool_calls[0];
    const r = await client.chat.completions.create({
      model: MODEL,
      tools: [weather],
      max_tokens: 8,
      messages: [
        ...messages,
        first.choices[0].message,
        { role: 'tool', tool_call_id: call.id, content: JSON.stringify({ temp: 18 }) },
      ],
    });
    assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason));
    assert.ok(r.usage.prompt_tokens > first.usage.prompt_tokens);
  });

  test('a bad tool_choice is a 400 naming the field', async () => {
    await assert.rejects(
      client.chat.completions.create({ model: MODEL, messages, tools: [weather], tool_choice: { type: 'function', function: { name: 'nope' } } }),
      (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && e.param === 'tool_choice.function.name',
    );
  });
});
