// make_vectors.js — writes vectors.jsonl: test texts with the ids OpenAI's tiktoken gives them
// (npm package `tiktoken`, WebAssembly build of tiktoken's Rust core, encoding "gpt2",
// encode_ordinary), one JSON object per line: {"name", "text", "ids", "gpt_3_encoder"}.
// "gpt_3_encoder" records whether the npm package `gpt-3-encoder` (a separate JavaScript port
// of GPT-2's encoder.py) agrees; where it does not, "why" says which behaviour differs.
//
// usage: node make_vectors.js > vectors.jsonl   (the tokenizer check also diffs its output
// against the committed file, so the file cannot drift from what tiktoken says)
// Texts use only characters assigned by Unicode 13, so that the Unicode tables of tiktoken's
// regex, PCRE2 and V8 agree on every character's category.
'use strict';
const path = require('path');

const jsDir = process.env.TOKENIZER_JS_DIR || path.join(__dirname, '..', '..', '..', 'data', 'js');
const tiktoken = require(path.join(jsDir, 'tiktoken')).get_encoding('gpt2');
const gpt3Encoder = require(path.join(jsDir, 'gpt-3-encoder'));

const vectors = [
  ['known vector', 'Hello world'],
  ['empty document', ''],
  ['contractions', "Hello, world! How's it going? I'm fine, you'll see; we'd've done it. They're here, we've won."],
  ['contractions are case-sensitive', "DON'T I'LL WE'RE it'S"],
  ['apostrophe runs', "'s's 's 'tis 'twas rock'n'roll ''quoted'' '' ' x'"],
  ['digits', '1234567890 3.14159 1,000,000 2024-05-20 007 +44 (0)20'],
  ['non-ASCII numbers', '\u0663\u0664\u0665 \uff12\uff10\uff12\uff14 \u2167 \u00bd x\u00b2'],
  ['runs of spaces', 'a  b   c    d     e'],
  ['runs of whitespace and newlines', 'a\t\tb\n\nc \n d  \n\n\n  e   \r\n\r\nf\n'],
  ['only spaces', '     '],
  ['leading and trailing spaces', '   leading and trailing   '],
  ['newlines before words', '\n\n\nword \n word\n\n  word'],
  ['emoji', 'I \u2764\ufe0f \ud83c\udf55 and \ud83d\udc69\u200d\ud83d\udc69\u200d\ud83d\udc67\u200d\ud83d\udc66 \ud83c\udff3\ufe0f\u200d\ud83c\udf08 \ud83d\udc4d\ud83c\udffd!'],
  ['CJK', '\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u4e2d\u6587\u6587\u672c\u3002\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8'],
  ['combining marks', 'e\u0301 cafe\u0301 n\u0303o Z\u0351\u0352\u0353algo \u0915\u093f \u0e01\u0e34'],
  ['scripts', '\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u05e2\u05d1\u05e8\u05d9\u05ea \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0939\u093f\u0928\u094d\u0926\u0940'],
  ['letters outside the BMP', '\ud835\udd18\ud835\udd2b\ud835\udd26\ud835\udd20\ud835\udd2c\ud835\udd21\ud835\udd22 \ud800\udf30\ud800\udf31\ud800\udf32'],
  ['Unicode spaces', 'a\u00a0b\u2003c\u3000d \u00a0 e\u2028f\u2029g'],
  ['NEL is whitespace', 'a\u0085b \u0085\u0085 c a \u0085b'],
  ['U+180E is not whitespace', 'a \u180e b\u180e\u180ec a \u180eb'],
  ['BOM and zero-width space are not whitespace', '\ufeffa \ufeffb\u200bc \u200b d'],
  ['control characters', 'a\u0000b\u0001c\u007fd\u000be\u000cf'],
  ['end-of-text is ordinary text', 'text<|endoftext|>more <|endoftext|>'],
  ['code', "def f(x):\n    return x**2  # square\n\nif __name__ == '__main__':\n\tprint(f(3))\n"],
  ['punctuation and URLs', 'https://example.com/a?b=c&d=e#f ... !!! ??? --- *** <div class="x">&amp;</div>'],
  ['long word (uncached, 45 bytes)', 'Pneumonoultramicroscopicsilicovolcanoconiosis'],
  ['long piece (102 bytes)', 'supercalifragilisticexpialidocious'.repeat(3)],
  ['very long letter piece (heap merge)', 'ab'.repeat(150)],
  ['very long digit piece (heap merge)', '1234567890'.repeat(50)],
  ['very long space run (heap merge)', ' '.repeat(300) + 'x' + ' '.repeat(200)],
  ['very long symbol piece (heap merge)', '-'.repeat(257) + '='.repeat(300)],
];

// Known differences of gpt-3-encoder from tiktoken, for the "why" field.
const gpt3EncoderDifferences = {
  'NEL is whitespace': "JavaScript's \\s does not include U+0085 (tiktoken's Rust \\s, White_Space, does)",
  'BOM and zero-width space are not whitespace': "JavaScript's \\s includes U+FEFF (not White_Space in Unicode)",
};

for (const [name, text] of vectors) {
  const ids = Array.from(tiktoken.encode_ordinary(text));
  const agrees = JSON.stringify(gpt3Encoder.encode(text)) === JSON.stringify(ids);
  const record = { name, text, ids, gpt_3_encoder: agrees ? 'same' : 'differs' };
  if (!agrees) {
    if (!gpt3EncoderDifferences[name]) {
      process.stderr.write(`make_vectors.js: gpt-3-encoder differs on "${name}" for no known reason\n`);
      process.exit(1);
    }
    record.why = gpt3EncoderDifferences[name];
  }
  process.stdout.write(JSON.stringify(record) + '\n');
}
