// reference.js — GPT-2 and Llama 3 token ids from JavaScript encoders written independently of
// ./tokenize, printed like `tokenize --print-ids`: one line of space-separated ids per document.
//
// usage: node reference.js [--bench|--bench-lines] tiktoken|gpt-3-encoder|llama3 FILE...
//   tiktoken       the npm package `tiktoken` (OpenAI's tiktoken compiled to WebAssembly,
//                  encoding "gpt2", encode_ordinary): the ids ./tokenize must reproduce
//   gpt-3-encoder  the npm package `gpt-3-encoder` (a JavaScript port of GPT-2's encoder.py)
//   llama3         the same tiktoken build loaded as Meta's Llama 3 tokenizer is: the ranks of
//                  data/llama3_bpe/tokenizer.model (or $LLAMA3_BPE_DIR) and Meta's split pattern,
//                  encode_ordinary: the ids `tokenize --encoding llama3` must reproduce
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
const llama3Dir = process.env.LLAMA3_BPE_DIR || path.join(__dirname, '..', '..', '..', 'data', 'llama3_bpe');
// Meta's pat_str for Llama 3 (its tokenizer.py), in tiktoken's Rust regex syntax.
const llama3Pattern = String.raw`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;

function fail(message) {
  process.stderr.write(`reference.js: ${message}\n`);
  process.exit(1);
}

function loadEncoder(name) {
  if (name === 'llama3') {
    const ranksFile = path.join(llama3Dir, 'tokenizer.model');
    if (!fs.existsSync(ranksFile)) fail(`${ranksFile} is missing: run scripts/install_deps.sh`);
    const { Tiktoken } = require(path.join(jsDir, 'tiktoken'));
    const encoding = new Tiktoken(fs.readFileSync(ranksFile, 'utf8'), { '<|begin_of_text|>': 128000 }, llama3Pattern);
    return (text) => encoding.encode_ordinary(text);
  }
  const dir = path.join(jsDir, name);
  if (!fs.existsSync(dir)) fail(`${dir} is missing: run scripts/install_deps.sh`);
  if (name === 'tiktoken') {
    const encoding = require(dir).get_encoding('gpt2');
    return (text) => encoding.encode_ordinary(text);
  }
  if (name === 'gpt-3-encoder') return require(dir).encode;
  fail(`unknown encoder "${name}" (tiktoken, gpt-3-encoder or llama3)`);
}

if (!encoderName || files.length === 0) {
  fail('usage: node reference.js [--bench|--bench-lines] tiktoken|gpt-3-encoder|llama3 FILE...');
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
