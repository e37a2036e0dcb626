#!/usr/bin/env bash
# Checks `tokenize --encoding llama3` (src/tokenizer/llama3_bpe.*) against Meta's tokenizer run
# in JavaScript: the npm tiktoken (WebAssembly build of the Rust core Meta's tokenizer.py uses)
# loaded with Meta's ranks and split pattern (tokenizer/reference.js llama3):
#  - corner-case texts (contractions in both cases, digit runs, punctuation before newlines,
#    whitespace runs, non-ASCII, special tokens' text, pieces over 128 bytes) == tiktoken;
#  - the default corpus text (66 books, and as one 4 MB document with 1 and 2 threads), and a
#    document built to put punctuation and newlines at the cuts between work items == tiktoken;
#  - llm.c's Llama 3 shards: header 20240801 7 N, uint32 tokens, exact sizes, <|begin_of_text|>
#    128000 before every document ("This is a test sentence." -> 128000 2028 374 264 1296 11914 13),
#    the same for any thread count; llama3_tokenizer.bin (20240328 2 128256 128001) and the names
#    of the 256 special tokens; decode(encode(x)) == x, invalid UTF-8 included;
#  - bad inputs: one line on stderr, non-zero exit; a missing vocabulary names the install step.
# usage: tokenizer_llama3.sh cpu|gpu   (gpu: skipped, as tokenizer.sh)
# Needs scripts/install_deps.sh to have run. Exits 77 only when data/llama3_bpe/tokenizer.model is
# missing because install_deps.sh could not fetch it (it leaves why in fetch_failed.txt); missing
# otherwise is a failure.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
[ "${1:-cpu}" = cpu ] || exit 77

vocab=data/llama3_bpe/tokenizer.model
if [ ! -f "$vocab" ]; then
  if [ -f data/llama3_bpe/fetch_failed.txt ]; then
    echo "skipped: $vocab is missing and scripts/install_deps.sh could not fetch it: $(cat data/llama3_bpe/fetch_failed.txt)"
    exit 77
  fi
  echo "FAIL: $vocab is missing: run scripts/install_deps.sh"
  exit 1
fi

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }
begin() { failures_before=$failures; }
passed() { [ "$failures" -eq "$failures_before" ] && pass "$*"; }

make -s -j2 tokenize || { echo "FAIL: make tokenize"; exit 1; }
command -v node >/dev/null || { echo "FAIL: node is missing (scripts/install_deps.sh)"; exit 1; }
[ -d data/js/tiktoken ] || { echo "FAIL: data/js/tiktoken is missing (scripts/install_deps.sh)"; exit 1; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
reference=test/checks/tokenizer/reference.js
llama=(./tokenize --encoding llama3)

# ---- corner cases, one document each (JSON strings, so the file names the characters)
mkdir -p "$tmp/vectors"
node -e '
const texts = [
  "This is a test sentence.",
  "",
  "DON\u0027T I\u0027LL we\u0027RE it\u0027S they\u0027Ve I\u0027m she\u0027D the LORD\u0027S x\u0027\u017ftuff \u0027s\u0027t\u0027re \u0027Twas \u0027TIS WE\u0027REn\u0027t x\u0027Tea x\u0027Man x\u0027Very",
  "1234567 3.14159 1,000,000 2024-05-20 007 \u0663\u0664\u0665\u0666 \u2167 x\u00b2",
  "end.\n\nNext!\r\n\r\n  x?!\n(quoted)\n\n\n...\n  \n",
  "a  b   c\t\td \n \n  e   \u00a0f\u3000g \u0085h\u2028i",
  ".word ,word (word \u00a0word \u0085word \u180eword \ufeffword",
  "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \ud83c\udf89\ud83d\udc4d\ud83c\udffd \u00dcn\u00efc\u00f6d\u00e9 \u0928\u092e\u0938\u094d\u0924\u0947 \u0645\u0631\u062d\u0628\u0627",
  "<|begin_of_text|><|end_of_text|><|eot_id|><|endoftext|>",
  "def f(x):\n    return x**2  # comment\n\n\tif x != 0:\n\t\tpass\n",
  "a".repeat(300) + " " + "7".repeat(301) + " ".repeat(300) + "!".repeat(300) + "\n".repeat(200) + "z",
];
texts.forEach((text, i) => require("fs").writeFileSync(process.argv[1] + "/" + String(i).padStart(2, "0") + ".txt", text));' "$tmp/vectors"
node "$reference" llama3 "$tmp"/vectors/*.txt > "$tmp/vectors_expected" || fail "reference.js failed on the vectors"
if "${llama[@]}" --print-ids "$tmp"/vectors/*.txt > "$tmp/vectors_ids" && cmp -s "$tmp/vectors_expected" "$tmp/vectors_ids"; then
  pass "$(find "$tmp/vectors" -name '*.txt' | wc -l) corner-case texts == tiktoken with Meta's ranks and pattern"
else
  fail "corner-case texts differ from tiktoken (expected, got):"
  diff "$tmp/vectors_expected" "$tmp/vectors_ids" | head -n 20
fi
[ "$(head -n 1 "$tmp/vectors_ids")" = "2028 374 264 1296 11914 13" ] || fail "\"This is a test sentence.\" is not 2028 374 264 1296 11914 13"

# ---- the default corpus text
data/make_default_corpus.sh "$tmp/default" "$tmp/books" > /dev/null || fail "data/make_default_corpus.sh failed"
books=("$tmp"/books/*.txt)
[ "${#books[@]}" -eq 66 ] || fail "expected 66 book texts, found ${#books[@]}"
node "$reference" llama3 "${books[@]}" > "$tmp/books_expected" || fail "reference.js failed on the books"
if "${llama[@]}" --print-ids "${books[@]}" > "$tmp/books_ids" && cmp -s "$tmp/books_expected" "$tmp/books_ids"; then
  pass "corpus ids == tiktoken's, 66 books ($(wc -w < "$tmp/books_ids") tokens)"
else
  fail "corpus ids differ from tiktoken's"
fi
cat "${books[@]}" > "$tmp/corpus.txt"
node "$reference" llama3 "$tmp/corpus.txt" > "$tmp/whole_expected" || fail "reference.js failed on the whole corpus"
# Punctuation before newlines (one piece in Llama 3's pattern), whitespace runs, contractions and
# digits next to the cuts between 64 KiB work items, in a fixed pseudo-random order.
node -e 'const parts = ["  ", "\n\n", " \n ", "\t", "word", " word", "\x27S", "\x27s", " 12", "34567", ".", ".\n", "!\r\n",
                       "?!\n\n", " \u00a0", "\u00e9", "\u65e5\u672c", "\r\n", "   x", "A", " ", "\n", "\u0085", "(", ")\n", ",\t"];
         let seed = 4242, text = "";
         while (text.length < 1500000) {
           seed = (seed * 1103515245 + 12345) % 2147483648;
           text += parts[(seed >> 8) % parts.length];
         }
         process.stdout.write(text);' > "$tmp/mixed.txt"
node "$reference" llama3 "$tmp/mixed.txt" > "$tmp/mixed_expected" || fail "reference.js failed on the mixed document"
begin
for threads in 1 2; do
  "${llama[@]}" --threads "$threads" --print-ids "$tmp/corpus.txt" > "$tmp/whole_ids"
  cmp -s "$tmp/whole_expected" "$tmp/whole_ids" || fail "corpus as one document (--threads $threads) differs from tiktoken"
  "${llama[@]}" --threads "$threads" --print-ids "$tmp/mixed.txt" > "$tmp/mixed_ids"
  cmp -s "$tmp/mixed_expected" "$tmp/mixed_ids" || fail "the mixed document (--threads $threads) differs from tiktoken"
done
passed "corpus as one 4 MB document and a $(wc -c < "$tmp/mixed.txt")-byte mixed document (cut into 64 KiB items) == tiktoken, --threads 1 and 2"

# ---- shards
begin
header_of() { od -An -t d4 -N 16 "$1" | tr -s ' ' | sed 's/^ //'; }
body_of() { od -An -v -t u4 -j 1024 "$1" | tr -s ' \n' ' ' | sed 's/^ //; s/ $//'; }
printf 'This is a test sentence.' > "$tmp/sentence.txt"
"${llama[@]}" --quiet --out-dir "$tmp/two" --name s "$tmp/sentence.txt" "$tmp/sentence.txt"
shard=$tmp/two/s_train_000000.bin
[ "$(header_of "$shard")" = "20240801 7 14 0" ] || fail "$shard header: $(header_of "$shard"), expected 20240801 7 14 0"
[ "$(stat -c %s "$shard")" -eq $((1024 + 4 * 14)) ] || fail "$shard: $(stat -c %s "$shard") bytes, expected $((1024 + 4 * 14))"
cmp -s <(head -c 1024 "$shard" | tail -c 1008) <(head -c 1008 /dev/zero) || fail "$shard: header slots 4..255 are not zero"
[ "$(body_of "$shard")" = "128000 2028 374 264 1296 11914 13 128000 2028 374 264 1296 11914 13" ] ||
  fail "two documents: $(body_of "$shard"), expected 128000 before each document's 2028 374 264 1296 11914 13"
"${llama[@]}" --quiet --out-dir "$tmp/kjv" --name kjv --val-tokens 100000 "${books[@]}"
total=$(wc -w < "$tmp/books_ids")
total=$((total + 66))  # one 128000 per book
for split in val:100000 train:$((total - 100000)); do
  shard=$tmp/kjv/kjv_${split%%:*}_000000.bin tokens=${split##*:}
  [ "$(header_of "$shard")" = "20240801 7 $tokens 0" ] || fail "$shard header: $(header_of "$shard"), expected 20240801 7 $tokens 0"
  [ "$(stat -c %s "$shard")" -eq $((1024 + 4 * tokens)) ] || fail "$shard: $(stat -c %s "$shard") bytes, expected $((1024 + 4 * tokens))"
done
# The shards' tokens are the reference ids with 128000 before each book.
cmp -s <(for file in "$tmp"/kjv/kjv_val_000000.bin "$tmp"/kjv/kjv_train_000000.bin; do tail -c +1025 "$file"; done | od -An -v -t u4 | tr -s ' \n' '\n' | sed '/^$/d') \
       <(sed 's/^/128000 /' "$tmp/books_expected" | tr -s ' \n' '\n' | sed '/^$/d') ||
  fail "the corpus shards are not tiktoken's ids with 128000 before each book"
"${llama[@]}" --quiet --threads 1 --out-dir "$tmp/kjv1" --name kjv --val-tokens 100000 "${books[@]}"
for file in kjv_val_000000.bin kjv_train_000000.bin; do
  cmp -s "$tmp/kjv/$file" "$tmp/kjv1/$file" || fail "$file differs between --threads 1 and 2"
done
passed "Llama 3 shards: header 20240801 7 N, uint32 body, exact sizes, 128000 before every document, thread-count independent"

begin
tokenizer_file=$tmp/kjv/llama3_tokenizer.bin
[ "$(header_of "$tokenizer_file")" = "20240328 2 128256 128001" ] || fail "llama3_tokenizer.bin header: $(header_of "$tokenizer_file")"
# Meta's names for ids 128000..128255 (Llama 3): the special tokens decode as their text.
expected_names=$(printf '<|begin_of_text|><|end_of_text|>'
                 for i in 0 1 2 3; do printf '<|reserved_special_token_%d|>' "$i"; done
                 printf '<|start_header_id|><|end_header_id|><|reserved_special_token_4|><|eot_id|>'
                 for ((i = 5; i <= 250; i++)); do printf '<|reserved_special_token_%d|>' "$i"; done)
node -e 'const header = new Int32Array(256); header.set([20240801, 7, 256]);
         const ids = Uint32Array.from({length: 256}, (_, i) => 128000 + i);
         process.stdout.write(Buffer.concat([Buffer.from(header.buffer), Buffer.from(ids.buffer)]));' > "$tmp/specials.bin"
[ "$("${llama[0]}" --decode --tokenizer "$tokenizer_file" "$tmp/specials.bin")" = "$expected_names" ] ||
  fail "ids 128000..128255 do not decode to Meta's special token names"
vocab_bytes=$(node -e 'let n = 0; for (const line of require("fs").readFileSync(process.argv[1], "utf8").split("\n"))
                         if (line) n += Buffer.from(line.split(" ")[0], "base64").length; console.log(n)' "$vocab")
[ "$(stat -c %s "$tokenizer_file")" -eq $((1024 + 128256 + vocab_bytes + ${#expected_names})) ] ||
  fail "llama3_tokenizer.bin: $(stat -c %s "$tokenizer_file") bytes, expected $((1024 + 128256 + vocab_bytes + ${#expected_names}))"
for book in "${books[@]}"; do printf '<|begin_of_text|>'; cat "$book"; done > "$tmp/corpus_expected"
if ! ./tokenize --decode "$tmp"/kjv/kjv_val_000000.bin "$tmp"/kjv/kjv_train_000000.bin > "$tmp/corpus_decoded" ||
   ! cmp -s "$tmp/corpus_expected" "$tmp/corpus_decoded"; then
  fail "the corpus shards do not decode back to the books"
fi
passed "llama3_tokenizer.bin: header, size, special token names; decode(encode(corpus)) == corpus"

# ---- invalid UTF-8 and arbitrary bytes. The first 256 ranks are the bytes in GPT-2's order
# (line 188 of tokenizer.model is byte 0xFF, rank 187); an invalid byte is a piece of its own.
begin
[ "$(sed -n 188p "$vocab")" = "/w== 187" ] || fail "line 188 of $vocab is not byte 0xFF with rank 187"
printf 'a\xffb' > "$tmp/invalid.txt"
[ "$("${llama[@]}" --print-ids "$tmp/invalid.txt")" = "64 187 65" ] || fail "'a\\xffb' is not 64 187 65"
{ head -c 300000 /usr/lib/bible.data; cat tokenize; printf '\xe2\x80 ok\xed\xa0\x80.\n\n'; } > "$tmp/binary"
if ! "${llama[@]}" --quiet --out-dir "$tmp/binary_out" --name b "$tmp/binary" ||
   ! ./tokenize --decode "$tmp/binary_out/b_train_000000.bin" > "$tmp/binary.decoded" ||
   ! cmp -s "$tmp/binary.decoded" <(printf '<|begin_of_text|>'; cat "$tmp/binary"); then
  fail "arbitrary bytes do not round-trip"
fi
passed "invalid UTF-8 encodes byte by byte; arbitrary bytes decode back ($(wc -c < "$tmp/binary") bytes)"

# ---- bad inputs: non-zero exit, exactly one line on stderr that names the problem
expect_error() {  # WHAT PATTERN COMMAND...
  local what=$1 pattern=$2; shift 2
  if "$@" > /dev/null 2> "$tmp/stderr"; then fail "$what: exit 0"; return; fi
  [ "$(wc -l < "$tmp/stderr")" -eq 1 ] || { fail "$what: stderr is not one line: $(cat "$tmp/stderr")"; return; }
  grep -qF -- "$pattern" "$tmp/stderr" || fail "$what: '$(cat "$tmp/stderr")' does not mention '$pattern'"
}
begin
mkdir -p "$tmp/altered"
cp "$vocab" "$tmp/altered/tokenizer.model" && printf 'x' >> "$tmp/altered/tokenizer.model"
head -c 2000 "$tmp/kjv/kjv_val_000000.bin" > "$tmp/truncated.bin"
expect_error "no vocabulary" "cannot read $tmp/nothing/tokenizer.model: No such file or directory (scripts/install_deps.sh fetches Llama 3's tokenizer.model)" \
  "${llama[@]}" --bpe-dir "$tmp/nothing" --print-ids "$tmp/sentence.txt"
expect_error "altered vocabulary" "$tmp/altered/tokenizer.model has sha256" "${llama[@]}" --bpe-dir "$tmp/altered" --print-ids "$tmp/sentence.txt"
expect_error "unknown encoding" "--encoding expects gpt2 or llama3, got \"cl100k_base\"" ./tokenize --encoding cl100k_base "$tmp/sentence.txt"
expect_error "encoding with decode" "--encoding does not apply to --decode" "${llama[@]}" --decode "$tmp/two/s_train_000000.bin"
expect_error "truncated shard" "truncated.bin: header says 100000 tokens, so 401024 bytes, but the file has 2000" ./tokenize --decode "$tmp/truncated.bin"
expect_error "Llama ids with GPT-2's tokenizer file" "is 128000, outside the vocabulary of data/default/gpt2_tokenizer.bin" \
  ./tokenize --decode --tokenizer data/default/gpt2_tokenizer.bin "$tmp/two/s_train_000000.bin"
passed "bad inputs: one-line errors, non-zero exit"

if [ "$failures" -ne 0 ]; then
  echo "tokenizer_llama3: $failures failure(s)"
  exit 1
fi
echo "tokenizer_llama3: all checks passed"
