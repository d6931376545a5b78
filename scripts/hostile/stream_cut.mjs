// Streams one long chat completion through inferrail live with the official
// OpenAI Node SDK. After five chunks it prints "REPLICA <name>" (the
// x-inferrail-replica header); the harness then kills that engine. At the
// end it prints one JSON line: whether iterating the stream raised, the
// error, the chunks read and the last finish_reason.
//
// Usage: BASE_URL=http://127.0.0.1:PORT OPENAI_MODULES=/abs/.cache/node/node_modules node stream_cut.mjs
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(path.join(path.resolve(process.env.OPENAI_MODULES), 'index.js'));
const sdk = require('openai');
const OpenAI = sdk.OpenAI ?? sdk.default ?? sdk;

const out = { raised: false, error: null, errorName: null, chunks: 0, finish: null, replica: null, hung: false };
const watchdog = setTimeout(() => {
  out.hung = true;
  console.log(JSON.stringify(out));
  process.exit(0);
}, 15000);

const client = new OpenAI({ baseURL: process.env.BASE_URL + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 20000 });
try {
  const { data: stream, response } = await client.chat.completions
    .create({
      model: 'inferrail-sim',
      messages: [{ role: 'user', content: 'tell me a very long story about the sea and the ships on it ' }],
      max_tokens: 2000,
      stream: true,
    })
    .withResponse();
  out.replica = response.headers.get('x-inferrail-replica');
  for await (const chunk of stream) {
    out.chunks++;
    if (out.chunks === 5) console.log('REPLICA ' + out.replica);
    for (const choice of chunk.choices ?? []) {
      if (choice.finish_reason) out.finish = choice.finish_reason;
    }
  }
} catch (e) {
  out.raised = true;
  out.error = String(e?.message ?? e);
  out.errorName = e?.constructor?.name ?? null;
}
clearTimeout(watchdog);
console.log(JSON.stringify(out));
