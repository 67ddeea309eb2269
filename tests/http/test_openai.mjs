// test_openai.mjs - the official OpenAI client for node (npm `openai`, tests/http/package.json)
// against rw-worker's OpenAI-compatible routes, run by test_openai_node.sh, which starts two CPU
// workers and writes what ZeroMQ `generate` gives for the same inputs into $RW_EXPECT:
//   worker A serves the tiny fixture (its weights pushed): completions of the fixture's prompts
//     (ids) must give the fixture's greedy reference and the text and logprobs ZeroMQ gives;
//     streamed completions must add up to the same; n, batches, stop strings, errors;
//   worker B serves the fixture's shapes with Qwen3's vocabulary (random weights), so that the
//     chat format's special tokens exist: chat completions (plain, streamed, with logprobs) must
//     give the tokens ZeroMQ generate gives for the same Qwen3 chat prompt.
import fs from 'node:fs';
import OpenAI from 'openai';

const exp = JSON.parse(fs.readFileSync(process.env.RW_EXPECT, 'utf8'));
const token = process.env.RW_AUTH_TOKEN;
const A = new OpenAI({ baseURL: exp.http_a + '/v1', apiKey: token, maxRetries: 0 });
const B = new OpenAI({ baseURL: exp.http_b + '/v1', apiKey: token, maxRetries: 0 });
let passed = 0, failed = 0;
function check(cond, what) {
  if (cond) { passed++; console.log('ok   ' + what); } else { failed++; console.log('FAIL ' + what); }
}
const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

// --- models --------------------------------------------------------------------------------------
const models = await A.models.list();
check(models.data.length === 1 && models.data[0].id === 'qwen3-moe-tiny', 'models.list: ' + models.data[0]?.id);
const model = models.data[0].id;

// --- completions ---------------------------------------------------------------------------------
const c = await A.completions.create({ model, prompt: exp.prompts[0], max_tokens: 24, temperature: 0, logprobs: 2 });
const ch = c.choices[0];
check(same(ch.token_ids, exp.greedy[0]), 'completion: the fixture\'s greedy reference');
check(same(ch.token_ids, exp.zmq_a[0].tokens), 'completion: the tokens ZeroMQ generate gives');
check(ch.text === exp.zmq_a[0].text && ch.text.length > 0, 'completion: the text ZeroMQ generate gives');
check(same(ch.logprobs.token_logprobs, exp.zmq_a[0].logprobs), 'completion: ZeroMQ\'s logprobs, bit for bit');
check(ch.logprobs.tokens.length === 24 && ch.logprobs.top_logprobs.every((t) => Object.keys(t).length >= 1),
      'completion: tokens and top logprobs');
check(ch.finish_reason === 'length' && c.usage.completion_tokens === 24 &&
      c.usage.prompt_tokens === exp.prompts[0].length, 'completion: finish and usage');
check(c.object === 'text_completion' && c.id.startsWith('cmpl-'), 'completion: object and id');

const batch = await A.completions.create({ model, prompt: [exp.prompts[0], exp.prompts[1]], max_tokens: 24, temperature: 0 });
check(batch.choices.length === 2 && same(batch.choices[1].token_ids, exp.greedy[1]) &&
      same(batch.choices[0].token_ids, exp.greedy[0]), 'completion: a batch of two prompts');

const s1 = await A.completions.create({ model, prompt: exp.prompts[2], max_tokens: 16, temperature: 1, seed: 11, n: 2 });
const s2 = await A.completions.create({ model, prompt: exp.prompts[2], max_tokens: 16, temperature: 1, seed: 11, n: 2 });
check(s1.choices.length === 2 && same(s1.choices.map((x) => x.token_ids), s2.choices.map((x) => x.token_ids)),
      'completion: n = 2, seeded, reproduces');

// streamed: the chunks add up to the same text and tokens
let text = '', ids = [], finish = null, chunks = 0;
const stream = await A.completions.create({ model, prompt: exp.prompts[0], max_tokens: 24, temperature: 0, stream: true,
                                            stream_options: { include_usage: true } });
let usage = null;
for await (const chunk of stream) {
  chunks++;
  if (chunk.usage) usage = chunk.usage;
  for (const x of chunk.choices) {
    text += x.text;
    ids = ids.concat(x.token_ids || []);
    if (x.finish_reason) finish = x.finish_reason;
  }
}
check(chunks > 2, 'stream: ' + chunks + ' chunks');
check(text === exp.zmq_a[0].text && same(ids, exp.greedy[0]), 'stream: adds up to the ZeroMQ text and tokens');
check(finish === 'length' && usage && usage.completion_tokens === 24, 'stream: finish and usage chunk');

// stop strings end the text before them
const stop = exp.zmq_a[0].text.slice(3, 6);
const st = await A.completions.create({ model, prompt: exp.prompts[0], max_tokens: 24, temperature: 0, stop: [stop] });
check(st.choices[0].finish_reason === 'stop' && exp.zmq_a[0].text.startsWith(st.choices[0].text) &&
      !st.choices[0].text.includes(stop), 'completion: stop string "' + stop + '"');

// errors reach the client as API errors with their status and message
try {
  await A.completions.create({ model, prompt: exp.prompts[0], max_tokens: -1 });
  check(false, 'max_tokens -1 refused');
} catch (e) {
  check(e.status === 400 && /max_tokens/.test(e.message), 'error 400 names max_tokens: ' + e.message);
}
try {
  await new OpenAI({ baseURL: exp.http_a + '/v1', apiKey: 'wrong', maxRetries: 0 }).models.list();
  check(false, 'a wrong key refused');
} catch (e) {
  check(e.status === 401, 'wrong key: 401');
}

// --- chat (worker B: Qwen3's vocabulary) ------------------------------------------------------
const messages = [{ role: 'user', content: exp.chat_user }];
const cc = await B.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0 });
const m = cc.choices[0];
check(same(m.token_ids, exp.zmq_b.tokens), 'chat: the tokens ZeroMQ generate gives for the Qwen3 chat prompt');
check(m.message.role === 'assistant' && m.message.content === exp.zmq_b.text, 'chat: the text ZeroMQ generate gives');
check(cc.usage.prompt_tokens === exp.zmq_b.prompt_tokens && cc.object === 'chat.completion',
      'chat: usage counts the chat prompt (' + cc.usage.prompt_tokens + ' tokens)');
let ctext = '', cids = [], role = null, cfinish = null;
for await (const chunk of await B.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0, stream: true })) {
  for (const x of chunk.choices) {
    if (x.delta.role) role = x.delta.role;
    ctext += x.delta.content || '';
    cids = cids.concat(x.token_ids || []);
    if (x.finish_reason) cfinish = x.finish_reason;
  }
}
check(role === 'assistant' && ctext === exp.zmq_b.text && same(cids, exp.zmq_b.tokens) && cfinish,
      'chat stream: role, then the same text and tokens');
const cl = await B.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0, logprobs: true, top_logprobs: 2 });
const lc = cl.choices[0].logprobs.content;
check(lc.length === 16 && lc.every((t) => t.top_logprobs.length === 2 && Array.isArray(t.bytes)) &&
      same(lc.map((t) => t.logprob), exp.zmq_b.logprobs), 'chat: logprobs and top logprobs, ZeroMQ\'s values');
const ct = await B.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0, stream: true, logprobs: true,
                                            top_logprobs: 1 });
let tl = 0;
for await (const chunk of ct) for (const x of chunk.choices) tl += x.logprobs ? x.logprobs.content.length : 0;
check(tl === 16, 'chat stream with top logprobs: ' + tl + ' tokens with logprobs');

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
