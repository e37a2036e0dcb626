// reference.js — GPT-2 token ids from JavaScript encoders written independently of ./tokenize,
// printed like `tokenize --print-ids`: one line of space-separated ids per document.
//
// usage: node reference.js [--bench|--bench-lines] tiktoken|gpt-3-encoder FILE...
//   tiktoken       the npm package `tiktoken` (OpenAI's tiktoken compiled to WebAssembly,
//                  encoding "gpt2", encode_ordinary): the ids ./tokenize must reproduce
//   gpt-3-encoder  the npm package `gpt-3-encoder` (a JavaScript port of GPT-2's encoder.py)
// Each FILE is one document and must be valid UTF-8 (both encoders take JavaScript strings).
// --bench: print the encoding speed (MB/s of UTF-8, one thread) on stderr instead of ids.
// --bench-lines: the same, encoding each line by itself (gpt-3-encoder grows its result array
// by copying, so it is quadratic in a call's length: whole books take minutes).
// The packages are read from data/js/ (scripts/install_deps.sh unpacks them there) or from
// $TOKENIZER_JS_DIR.
'use strict';
const fs = require('fs');
const path = require('path');

const args = process.argv.slice(2);
const bench = args[0] === '--bench' || args[0] === '--bench-lines';
const byLine = args[0] === '--bench-lines';
if (bench) args.shift();
const [encoderName, ...files] = args;
const jsDir = process.env.TOKENIZER_JS_DIR || path.join(__dirname, '..', '..', '..', 'data', 'js');

function fail(message) {
  process.stderr.write(`reference.js: ${message}\n`);
  process.exit(1);
}

function loadEncoder(name) {
  const dir = path.join(jsDir, name);
  if (!fs.existsSync(dir)) fail(`${dir} is missing: run scripts/install_deps.sh`);
  if (name === 'tiktoken') {
    const encoding = require(dir).get_encoding('gpt2');
    return (text) => encoding.encode_ordinary(text);
  }
  if (name === 'gpt-3-encoder') return require(dir).encode;
  fail(`unknown encoder "${name}" (tiktoken or gpt-3-encoder)`);
}

if (!encoderName || files.length === 0) {
  fail('usage: node reference.js [--bench|--bench-lines] tiktoken|gpt-3-encoder FILE...');
}
const encode = loadEncoder(encoderName);
const decoder = new TextDecoder('utf-8', { fatal: true });
const documents = files.map((file) => {
  try {
    return decoder.decode(fs.readFileSync(file));
  } catch (error) {
    return fail(`${file}: ${error.message}`);
  }
});

if (bench) {
  const bytes = documents.reduce((sum, text) => sum + Buffer.byteLength(text), 0);
  const calls = byLine ? documents.flatMap((text) => text.split(/(?<=\n)/)) : documents;
  const start = process.hrtime.bigint();
  let tokens = 0;
  for (const text of calls) tokens += encode(text).length;
  const seconds = Number(process.hrtime.bigint() - start) / 1e9;
  process.stderr.write(`${encoderName}${byLine ? ' (line by line)' : ''}: ${(bytes / 1e6).toFixed(2)} MB -> ${tokens} tokens in ` +
                       `${seconds.toFixed(2)} s (${(bytes / 1e6 / seconds).toFixed(2)} MB/s)\n`);
} else {
  const lines = documents.map((text) => Array.from(encode(text)).join(' '));
  process.stdout.write(lines.join('\n') + '\n');
}
