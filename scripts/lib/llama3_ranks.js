// llama3_ranks.js — writes Meta's Llama 3 tokenizer.model (tiktoken's rank format: one
// "base64(token bytes) rank" line per token, rank = id, in id order) from a Hugging Face
// tokenizer.json of Llama 3, whose vocabulary spells each byte as one printable character
// (GPT-2's byte-to-character table). scripts/install_deps.sh runs it and checks the sha256.
// usage: node llama3_ranks.js TOKENIZER_JSON > tokenizer.model
'use strict';
const fs = require('fs');

function fail(message) {
  process.stderr.write(`llama3_ranks.js: ${message}\n`);
  process.exit(1);
}

// GPT-2's table: printable Latin-1 bytes ('!'..'~', 0xA1..0xAC, 0xAE..0xFF) stand for
// themselves, the other 68 bytes, in increasing order, for U+0100, U+0101, ...
const byteOf = new Map();
let substitute = 256;
for (let b = 0; b < 256; ++b) {
  const printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
  byteOf.set(String.fromCodePoint(printable ? b : substitute++), b);
}

const [file] = process.argv.slice(2);
if (!file) fail('usage: node llama3_ranks.js TOKENIZER_JSON > tokenizer.model');
let vocab;
try {
  vocab = JSON.parse(fs.readFileSync(file, 'utf8')).model.vocab;
} catch (error) {
  fail(`${file}: ${error.message}`);
}
const byId = [];
for (const [text, id] of Object.entries(vocab)) {
  const bytes = [...text].map((c) => byteOf.get(c));
  if (bytes.some((b) => b === undefined)) fail(`${file}: token ${JSON.stringify(text)} is not in the byte spelling`);
  byId[id] = Buffer.from(bytes);
}
if (byId.length !== 128000 || byId.includes(undefined)) fail(`${file}: expected ids 0..127999 in model.vocab`);
process.stdout.write(byId.map((bytes, id) => `${bytes.toString('base64')} ${id}\n`).join(''));
