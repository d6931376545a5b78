// Times the reference tokenizers library on the parity corpus, one string at
// a time (one core), after a fresh load (cold caches), and prints tokens/s.
// usage: node bench.js <tokenizer.json> <corpus.json.gz> [rounds]
const fs = require('fs');
const zlib = require('zlib');
const { Tokenizer } = require('tokenizers');
(async () => {
  const [tokPath, corpusPath, roundsArg] = process.argv.slice(2);
  const rounds = Number(roundsArg || 3);
  const corpus = JSON.parse(zlib.gunzipSync(fs.readFileSync(corpusPath)).toString('utf8'));
  let best = 0;
  for (let r = 0; r < rounds; r++) {
    const tok = Tokenizer.fromFile(tokPath); // fresh caches
    let n = 0;
    const t0 = process.hrtime.bigint();
    for (const s of corpus) n += (await tok.encode(s, null, { addSpecialTokens: false })).getIds().length;
    const sec = Number(process.hrtime.bigint() - t0) / 1e9;
    best = Math.max(best, n / sec);
  }
  console.log(JSON.stringify({ tokenizer: tokPath, tokens_per_s: Math.round(best) }));
})().catch((e) => { console.error(e); process.exit(1); });
