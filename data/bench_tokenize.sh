#!/usr/bin/env bash
# Measures ./tokenize on the default corpus text (the 66 books of the KJV, 4.2 MB) with 1 and
# 2 threads, as 66 documents and as one document, best of 3 runs each; then the single-threaded
# JavaScript encoders the tokenizer check uses: tiktoken (WebAssembly) and gpt-3-encoder.
# Figures are MB/s of UTF-8 input, excluding start-up (loading the vocabulary or the module).
# Then, where scripts/install_deps.sh fetched Llama 3's vocabulary, the same for --encoding llama3
# against tiktoken loaded with Meta's ranks (reference.js llama3), and both whole processes on the
# 66 books (start-up included: reading and checking the vocabulary; Node.js, WebAssembly and the
# ranks), wall and CPU (user + system) seconds, the best of 3 runs each.
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

[ -f data/llama3_bpe/tokenizer.model ] || { echo "no data/llama3_bpe/tokenizer.model: Llama 3 not measured (scripts/install_deps.sh)"; exit 0; }
for threads in 1 2; do
  best_rate "--encoding llama3 --threads $threads:" ./tokenize --encoding llama3 --threads "$threads" --out-dir "$tmp/out" --name b "$tmp"/books/*.txt
done
node test/checks/tokenizer/reference.js --bench llama3 "$tmp"/books/*.txt
# whole_process LABEL COMMAND...: the best wall and the best CPU seconds of 3 runs
whole_process() {
  local label=$1 wall=999 cpu=999 times
  shift
  for _ in 1 2 3; do
    times=$( { TIMEFORMAT='%R %U %S'; time "$@" > /dev/null 2>&1; } 2>&1 )
    read -r r u s <<< "$times"
    wall=$(echo "if ($r < $wall) $r else $wall" | bc)
    cpu=$(echo "c = $u + $s; if (c < $cpu) c else $cpu" | bc)
  done
  printf 'whole process, %-40s %5.2f s wall %5.2f s CPU\n' "$label:" "$wall" "$cpu"
}
whole_process "tokenize --encoding llama3 (66 books)" ./tokenize --encoding llama3 --out-dir "$tmp/out" --name b "$tmp"/books/*.txt
whole_process "node reference.js llama3 (66 books)" node test/checks/tokenizer/reference.js llama3 "$tmp"/books/*.txt
