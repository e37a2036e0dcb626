#!/usr/bin/env bash
# Measures ./tokenize on the default corpus text (the 66 books of the KJV, 4.2 MB) with 1 and
# 2 threads, as 66 documents and as one document, best of 3 runs each; then the single-threaded
# JavaScript encoders the tokenizer check uses: tiktoken (WebAssembly) and gpt-3-encoder.
# Figures are MB/s of UTF-8 input, excluding start-up (loading the vocabulary or the module).
# usage: data/bench_tokenize.sh   (needs what data/make_default_corpus.sh and the check need)
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
data/make_default_corpus.sh "$tmp/default" "$tmp/books" > /dev/null
cat "$tmp"/books/*.txt > "$tmp/one_document.txt"

# best_rate LABEL COMMAND...: runs COMMAND 3 times, prints the best "(N MB/s)" of its summaries
best_rate() {
  local label=$1 best=0 rate
  shift
  for _ in 1 2 3; do
    rate=$("$@" 2>&1 | sed -n 's/.*(\([0-9.]*\) MB\/s).*/\1/p')
    best=$(echo "if ($rate > $best) $rate else $best" | bc)
  done
  printf 'tokenize %-34s %6.1f MB/s\n' "$label" "$best"
}
for threads in 1 2; do
  best_rate "--threads $threads, 66 documents:" ./tokenize --threads "$threads" --out-dir "$tmp/out" --name b "$tmp"/books/*.txt
  best_rate "--threads $threads, one document:" ./tokenize --threads "$threads" --out-dir "$tmp/out" --name b "$tmp/one_document.txt"
done
node test/checks/tokenizer/reference.js --bench tiktoken "$tmp"/books/*.txt
node test/checks/tokenizer/reference.js --bench-lines gpt-3-encoder "$tmp"/books/*.txt
