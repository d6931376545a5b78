// Oracle: token ids and decodes from the reference tokenizers library (Rust,
// through its Node binding), written as a compact gzip fixture.
// usage: node oracle.js <tokenizer.json> <corpus.json.gz> <out.json.gz>
// out: {oracle, no_special: [[ids]], with_prefix, with_suffix,
//       with_special: [null | [ids]] (null when it is with_prefix + no_special + with_suffix),
//       decoded: [text] (decode(no_special, false)), decoded_skip: [text] (decode(with_special, true))}
const fs = require('fs');
const zlib = require('zlib');
const { Tokenizer } = require('tokenizers');
(async () => {
  const [tokPath, corpusPath, outPath] = process.argv.slice(2);
  const tok = Tokenizer.fromFile(tokPath);
  const corpus = JSON.parse(zlib.gunzipSync(fs.readFileSync(corpusPath)).toString('utf8'));
  const empty = (await tok.encode('', null, { addSpecialTokens: true })).getIds();
  const marker = (await tok.encode('x', null, { addSpecialTokens: false })).getIds();
  const markerWith = (await tok.encode('x', null, { addSpecialTokens: true })).getIds();
  // The prefix is what comes before "x"'s ids; the suffix is the rest of the empty string's ids.
  const at = markerWith.findIndex((_, i) => marker.every((v, k) => markerWith[i + k] === v));
  const prefix = markerWith.slice(0, at);
  const suffix = markerWith.slice(at + marker.length);
  const res = {
    oracle: 'tokenizers@' + require('tokenizers/package.json').version,
    with_prefix: prefix, with_suffix: suffix,
    no_special: [], with_special: [], decoded: [], decoded_skip: [],
  };
  for (const s of corpus) {
    const ns = (await tok.encode(s, null, { addSpecialTokens: false })).getIds();
    const ws = (await tok.encode(s, null, { addSpecialTokens: true })).getIds();
    res.no_special.push(ns);
    const expect = prefix.concat(ns, suffix);
    const same = expect.length === ws.length && expect.every((v, i) => v === ws[i]);
    res.with_special.push(same ? null : ws);
    res.decoded.push(await tok.decode(ns, false));
    res.decoded_skip.push(await tok.decode(ws, true));
  }
  if (empty.length !== prefix.length + suffix.length) {
    console.error(`${tokPath}: warning: empty string encodes to ${empty.length} ids with special tokens`);
  }
  fs.writeFileSync(outPath, zlib.gzipSync(JSON.stringify(res), { level: 9 }));
  console.log(`${tokPath}: ${corpus.length} strings -> ${outPath}`);
})().catch((e) => { console.error(e); process.exit(1); });
