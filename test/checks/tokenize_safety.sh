#!/usr/bin/env bash
# ./tokenize never loses data: its output appears whole or not at all, and it never writes over or
# deletes its own input.
#   - a run that fails (a bad JSON line at document 3,002, after several shards were written) or is
#     stopped by SIGTERM leaves --out-dir exactly as it was, the earlier dataset of the same --name
#     included: no shard half-written, no temporary file left; SIGTERM ends it with status 143;
#   - an input that is one of the files the run would write, replace or remove (a shard of its
#     --name, the higher-numbered shard it would remove as stale, the tokenizer file) is refused in
#     one line before anything is read, however it is named (a symlink, a hard link, standard input);
#   - the same for --encoding llama3 (a failed run, its llama3_tokenizer.bin and its shards as
#     inputs), when data/llama3_bpe/tokenizer.model is there.
# usage: tokenize_safety.sh cpu|gpu   (gpu: skipped, the tool is host-only; TOKENIZE=PATH runs
# another build, e.g. an older one to show a check fails on it)
set -u
cd "$(dirname "$0")/../.." || exit 1
[ "${1:-cpu}" = cpu ] || exit 77
tok=${TOKENIZE:-./tokenize}
[ -x "$tok" ] || { echo "FAIL: $tok is missing (make tokenize)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
tree_digest() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 md5sum; find . | sort); }
# expect_refused NAME PATTERN COMMAND...: non-zero exit, one line on stderr matching PATTERN.
expect_refused() {
  local name=$1 pattern=$2
  shift 2
  if "$@" >/dev/null 2>"$tmp/refused.err"; then fail "$name: exited 0"; return; fi
  { [ "$(wc -l <"$tmp/refused.err")" -eq 1 ] && grep -qE "$pattern" "$tmp/refused.err"; } ||
    fail "$name: expected one line matching '$pattern', got: $(cat "$tmp/refused.err")"
}

# The earlier dataset: 4 shards of 1000 tokens.
out=$tmp/out
yes 'In the beginning was the word, and the word was with the tokenizer.' | head -c 60000 >"$tmp/book.txt"
"$tok" --quiet --out-dir "$out" --name t --val-tokens 1000 --shard-tokens 1000 "$tmp/book.txt" ||
  { fail "the first run failed"; exit 1; }
before=$(tree_digest "$out")

# ---- a bad line at document 3,002: several shards are complete when it is found
for i in $(seq 3001); do printf '{"text": "document %d of many, long enough to fill shards"}\n' "$i"; done >"$tmp/bad.jsonl"
printf '{"text": oops}\n' >>"$tmp/bad.jsonl"
expect_refused "bad JSON line" "bad.jsonl:3002: invalid JSON" \
  "$tok" --quiet --format jsonl --out-dir "$out" --name t --val-tokens 1000 --shard-tokens 1000 --threads 2 "$tmp/bad.jsonl"
[ "$(tree_digest "$out")" = "$before" ] || fail "the failed run changed $out: $(cd "$out" && echo *)"

# ---- SIGTERM while shards are being written (the input is a pipe that stays open)
mkfifo "$tmp/fifo"
(head -c 300000 "$tmp/bad.jsonl" | sed 's/.*/The quick brown fox &/'; exec sleep 30) >"$tmp/fifo" &
writer=$!
"$tok" --quiet --out-dir "$out" --name t --shard-tokens 1000 - <"$tmp/fifo" 2>"$tmp/term.err" &
pid=$!
for _ in $(seq 100); do
  [ "$(find "$out" -newer "$tmp/bad.jsonl" -name 't_*' | wc -l)" -ge 3 ] && break
  sleep 0.1
done
[ "$(find "$out" -newer "$tmp/bad.jsonl" -name 't_*' | wc -l)" -ge 3 ] || fail "SIGTERM: the run wrote no shard within 10 s"
kill -TERM "$pid"
wait "$pid"
rc=$?
kill "$writer" 2>/dev/null
wait "$writer" 2>/dev/null
[ "$rc" -eq 143 ] || fail "SIGTERM: exit status $rc, expected 143"
[ "$(tree_digest "$out")" = "$before" ] || fail "SIGTERM changed $out: $(cd "$out" && echo *)"

# ---- inputs that are outputs
cp "$tmp/book.txt" "$out/t_train_000009.bin"  # named like a stale shard the run would remove
before=$(tree_digest "$out")
expect_refused "input named like a stale shard" \
  "^tokenize: $out/t_train_000009.bin is $out/t_train_000009.bin, which this run writes or removes" \
  "$tok" --quiet --out-dir "$out" --name t "$out/t_train_000009.bin"
ln -s "$out/t_train_000009.bin" "$tmp/link.txt"
expect_refused "symlink to a shard" "^tokenize: $tmp/link.txt is $out/t_train_000009.bin, which this run writes" \
  "$tok" --quiet --out-dir "$out" --name t "$tmp/book.txt" "$tmp/link.txt"
ln "$out/t_train_000000.bin" "$tmp/hard.txt"
expect_refused "hard link to a shard" "^tokenize: $tmp/hard.txt is $out/t_train_000000.bin, which this run writes" \
  "$tok" --quiet --out-dir "$out" --name t "$tmp/hard.txt"
expect_refused "tokenizer file" "^tokenize: $out/gpt2_tokenizer.bin is $out/gpt2_tokenizer.bin, which this run writes" \
  "$tok" --quiet --out-dir "$out" --name other "$out/gpt2_tokenizer.bin"
expect_refused "standard input from a shard" "^tokenize: standard input is $out/t_val_000000.bin, which this run writes" \
  "$tok" --quiet --out-dir "$out" --name t - <"$out/t_val_000000.bin"
[ "$(tree_digest "$out")" = "$before" ] || fail "a refused run changed $out"
# Not an output: a shard of another --name is an ordinary input.
"$tok" --quiet --out-dir "$out" --name u "$out/t_train_000009.bin" || fail "an input named like another --name's shard was refused"

# ---- --encoding llama3: its uint32 shards and llama3_tokenizer.bin are staged and protected alike
if [ -f data/llama3_bpe/tokenizer.model ]; then
  lout=$tmp/llama3
  "$tok" --quiet --encoding llama3 --out-dir "$lout" --name t --val-tokens 1000 --shard-tokens 1000 "$tmp/book.txt" ||
    fail "llama3: the first run failed"
  before=$(tree_digest "$lout")
  expect_refused "llama3: bad JSON line" "bad.jsonl:3002: invalid JSON" \
    "$tok" --quiet --encoding llama3 --format jsonl --out-dir "$lout" --name t --val-tokens 1000 --shard-tokens 1000 \
    --threads 2 "$tmp/bad.jsonl"
  [ "$(tree_digest "$lout")" = "$before" ] || fail "llama3: the failed run changed $lout: $(cd "$lout" && echo *)"
  expect_refused "llama3: tokenizer file" \
    "^tokenize: $lout/llama3_tokenizer.bin is $lout/llama3_tokenizer.bin, which this run writes" \
    "$tok" --quiet --encoding llama3 --out-dir "$lout" --name other "$lout/llama3_tokenizer.bin"
  expect_refused "llama3: a shard" "^tokenize: $lout/t_train_000000.bin is $lout/t_train_000000.bin, which this run writes" \
    "$tok" --quiet --encoding llama3 --out-dir "$lout" --name t "$lout/t_train_000000.bin"
  [ "$(tree_digest "$lout")" = "$before" ] || fail "llama3: a refused run changed $lout"
else
  echo "tokenize_safety: no data/llama3_bpe/tokenizer.model (scripts/install_deps.sh): the --encoding llama3 part is skipped"
fi

[ "$failures" -eq 0 ] && echo "tokenize_safety: all checks passed"
[ "$failures" -eq 0 ]
