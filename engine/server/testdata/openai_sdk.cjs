// Drives inferrail engine with the official OpenAI Node SDK: models, chat and
// completions, streaming and not, chat with n = 2, the Responses API (a stored response continued and
// retrieved, a background response cancelled and
// a background stream resumed), embeddings, an error, and request ids. Prints one JSON
// object for TestOpenAINodeSDK. Usage: BASE_URL=http://127.0.0.1:PORT node openai_sdk.cjs
const OpenAI = require('openai');

async function main() {
  const client = new OpenAI({ baseURL: process.env.BASE_URL + '/v1', apiKey: 'unused', maxRetries: 0 });
  const model = 'inferrail-sim';
  const messages = [
    { role: 'system', content: 'You are terse.' },
    { role: 'user', content: 'hello there' },
  ];
  const out = {};

  const models = await client.models.list();
  out.models = models.data.map((m) => m.id);

  const chat = await client.chat.completions.create({ model, messages, max_tokens: 5 });
  out.chat = { id: chat.id, object: chat.object, content: chat.choices[0].message.content, role: chat.choices[0].message.role, finish: chat.choices[0].finish_reason, usage: chat.usage };

  const stream = await client.chat.completions.create({ model, messages, max_tokens: 6, stream: true, stream_options: { include_usage: true } });
  const cs = { text: '', chunks: 0, usage: null, finish: null, role: null };
  for await (const c of stream) {
    cs.chunks++;
    if (c.usage) cs.usage = c.usage;
    for (const ch of c.choices) {
      if (ch.delta.role) cs.role = ch.delta.role;
      if (ch.delta.content) cs.text += ch.delta.content;
      if (ch.finish_reason) cs.finish = ch.finish_reason;
    }
  }
  out.chatStream = cs;

  const cmpl = await client.completions.create({ model, prompt: 'alpha beta gamma ', max_tokens: 4 });
  out.completion = { id: cmpl.id, object: cmpl.object, text: cmpl.choices[0].text, finish: cmpl.choices[0].finish_reason, usage: cmpl.usage };

  const cstream = await client.completions.create({ model, prompt: 'alpha beta gamma ', max_tokens: 7, stream: true, stream_options: { include_usage: true } });
  const ps = { text: '', chunks: 0, usage: null, finish: null };
  for await (const c of cstream) {
    ps.chunks++;
    if (c.usage) ps.usage = c.usage;
    for (const ch of c.choices) {
      ps.text += ch.text;
      if (ch.finish_reason) ps.finish = ch.finish_reason;
    }
  }
  out.completionStream = ps;

  // n = 2, whole and streamed (the SDK's stream helper gathers the
  // chunks into choices by index).
  const pick = (cs) => cs.map((c) => ({ index: c.index, words: (c.message.content || '').trim().split(/\s+/).length, finish: c.finish_reason }));
  const two = await client.chat.completions.create({ model, messages, max_tokens: 4, n: 2 });
  out.chatN = { choices: pick(two.choices), distinct: two.choices[0].message.content !== two.choices[1].message.content, usage: two.usage };
  const twoStream = await client.chat.completions.stream({ model, messages, max_tokens: 4, n: 2, stream_options: { include_usage: true } }).finalChatCompletion();
  out.chatNStream = { choices: pick(twoStream.choices), distinct: twoStream.choices[0].message.content !== twoStream.choices[1].message.content, usage: twoStream.usage };

  // The Responses API: the engine (or the gateway's replicas) keeps responses
  // (--responses-store), so one can be continued and read back.
  const r = await client.responses.create({ model, instructions: 'You are terse. '.repeat(8), input: 'hello there', max_output_tokens: 5 });
  out.response = { id: r.id, object: r.object, status: r.status, text: r.output_text, usage: r.usage };
  const rstream = await client.responses.create({ model, input: 'hello again', max_output_tokens: 6, stream: true });
  const rs = { text: '', deltas: 0, events: 0, last: null, usage: null };
  for await (const e of rstream) {
    rs.events++;
    rs.last = e.type;
    if (e.type === 'response.output_text.delta') {
      rs.deltas++;
      rs.text += e.delta;
    }
    if (e.response && e.response.usage) rs.usage = e.response.usage;
  }
  out.responseStream = rs;
  const next = await client.responses.create({ model, previous_response_id: r.id, input: 'and then?', max_output_tokens: 3 });
  out.responseNext = { previous: next.previous_response_id, inputTokens: next.usage.input_tokens, cached: next.usage.input_tokens_details.cached_tokens };
  const got = await client.responses.retrieve(r.id);
  out.retrieved = got.id;
  // Background mode: queued at once, then cancelled while it runs.
  const bg = await client.responses.create({ model, input: 'a long story', max_output_tokens: 3000, background: true });
  const stopped = await client.responses.cancel(bg.id);
  out.background = { status: bg.status, background: bg.background, cancelled: stopped.status };
  // A background stream left after its first event, resumed from there
  // (retrieve with stream and starting_after) to its end.
  const bgs = await client.responses.create({ model, input: 'another story', max_output_tokens: 200, background: true, stream: true });
  let first = null;
  for await (const e of bgs) {
    first = e;
    break; // leaves the stream: the generation goes on
  }
  const resumed = await client.responses.retrieve(first.response.id, { stream: true, starting_after: first.sequence_number });
  const rb = { firstType: first.type, firstSeq: first.sequence_number, resumedFirstSeq: null, last: null, outputTokens: null };
  for await (const e of resumed) {
    if (rb.resumedFirstSeq === null) rb.resumedFirstSeq = e.sequence_number;
    rb.last = e.type;
    if (e.response && e.response.usage) rb.outputTokens = e.response.usage.output_tokens;
  }
  out.backgroundStream = rb;

  // The SDK asks for base64 and decodes it.
  const emb = await client.embeddings.create({ model, input: 'alpha beta gamma' });
  out.embedding = { object: emb.object, n: emb.data.length, dim: emb.data[0].embedding.length, promptTokens: emb.usage.prompt_tokens };

  try {
    await client.chat.completions.create({ model: 'no-such-model', messages });
    out.error = null;
  } catch (e) {
    out.error = { status: e.status, message: e.message, type: e.type ?? null };
  }

  const { data, response } = await client.chat.completions
    .create({ model, messages, max_tokens: 2 }, { headers: { 'X-Request-Id': 'sdk-1' } })
    .withResponse();
  out.requestId = { header: response.headers.get('x-request-id'), id: data.id };

  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
