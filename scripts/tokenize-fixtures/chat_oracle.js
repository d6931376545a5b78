// Chat oracle: the reference tokenizers library's ids for every rendered
// chat conversation of one model in the chat-template golden file
// (router/tokenize/chat/testdata/parity.json, rendered by Python Jinja2),
// written as a compact gzip fixture.
// usage: node chat_oracle.js <tokenizer.json> <parity.json> <model name> <out.json.gz>
// out: {oracle, model, with_prefix, with_suffix,
//       cases: [{name, text_bytes, ids, with_special}]}
//   ids: encode(text, add_special_tokens=false), vLLM's chat rule;
//   with_special: null when encode(text, true) is with_prefix + ids + with_suffix,
//   else those ids. Cases whose render failed in the golden file are left out.
const fs = require('fs');
const zlib = require('zlib');
const { Tokenizer } = require('tokenizers');
(async () => {
  const [tokPath, parityPath, model, outPath] = process.argv.slice(2);
  const tok = Tokenizer.fromFile(tokPath);
  const parity = JSON.parse(fs.readFileSync(parityPath, 'utf8'));
  const marker = (await tok.encode('x', null, { addSpecialTokens: false })).getIds();
  const markerWith = (await tok.encode('x', null, { addSpecialTokens: true })).getIds();
  const at = markerWith.findIndex((_, i) => marker.every((v, k) => markerWith[i + k] === v));
  const prefix = markerWith.slice(0, at);
  const suffix = markerWith.slice(at + marker.length);
  const res = {
    oracle: 'tokenizers@' + require('tokenizers/package.json').version,
    model, renderer: parity.renderer, with_prefix: prefix, with_suffix: suffix, cases: [],
  };
  for (const c of parity.cases) {
    if (c.template !== model || c.text === null || c.text === undefined) continue;
    const ids = (await tok.encode(c.text, null, { addSpecialTokens: false })).getIds();
    const ws = (await tok.encode(c.text, null, { addSpecialTokens: true })).getIds();
    const expect = prefix.concat(ids, suffix);
    const same = expect.length === ws.length && expect.every((v, i) => v === ws[i]);
    res.cases.push({ name: c.name, text_bytes: Buffer.byteLength(c.text, 'utf8'), ids, with_special: same ? null : ws });
  }
  if (res.cases.length === 0) {
    console.error(`${parityPath}: no rendered cases for template ${model}`);
    process.exit(1);
  }
  fs.writeFileSync(outPath, zlib.gzipSync(JSON.stringify(res), { level: 9 }));
  console.log(`${model}: ${res.cases.length} chats -> ${outPath}`);
})().catch((e) => { console.error(e); process.exit(1); });
