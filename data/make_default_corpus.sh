#!/usr/bin/env bash
# Regenerates the built-in corpus data/default/ bit for bit: the King James Bible (public
# domain) from Debian's bible-kjv-text, read with the `bible` program of bible-kjv, one
# document per book (66), tokenized by ./tokenize:
#   data/default/kjv_val_000000.bin    the first 100,000 tokens (Genesis, start of Exodus)
#   data/default/kjv_train_000000.bin  the rest
#   data/default/gpt2_tokenizer.bin    for decoding samples
# usage: data/make_default_corpus.sh [OUT_DIR [TEXT_DIR]]
#   OUT_DIR defaults to data/default; TEXT_DIR, if given, keeps the 66 book texts (01.txt ..).
# It installs nothing: scripts/install_deps.sh installs the packages and the GPT-2 vocabulary.
set -euo pipefail
cd "$(dirname "$0")/.."
out_dir=${1:-data/default}
keep_text_dir=${2:-}

if ! command -v bible >/dev/null 2>&1; then
  echo "make_default_corpus: the 'bible' program is missing: install the Debian package bible-kjv (scripts/install_deps.sh does)" >&2
  exit 1
fi
if [ ! -r /usr/lib/bible.data ]; then
  echo "make_default_corpus: /usr/lib/bible.data is missing: install the Debian package bible-kjv-text (scripts/install_deps.sh does)" >&2
  exit 1
fi
make -s tokenize

if [ -n "$keep_text_dir" ]; then
  mkdir -p "$keep_text_dir"
  if [ -n "$(ls -A "$keep_text_dir")" ]; then
    echo "make_default_corpus: $keep_text_dir is not empty (the book texts go there)" >&2
    exit 1
  fi
  text_dir=$keep_text_dir
else
  text_dir=$(mktemp -d)
  trap 'rm -rf "$text_dir"' EXIT
fi

# `bible -l WIDTH` pretty-prints: a "Book N" heading per chapter, then one "  V text" line
# per verse (a width this large never wraps a verse). Each book becomes one file:
#   Genesis 1 / (blank) / 1 In the beginning ... / 2 ... / (blank) / Genesis 2 / ...
bible -l 100000 'gen1:1-rev22:21' | awk -v dir="$text_dir" '
  /^[^ ].* [0-9]+$/ {
    book = $0; sub(/ [0-9]+$/, "", book)
    if (book != current) {
      if (file != "") close(file)
      current = book; books++
      file = sprintf("%s/%02d.txt", dir, books)
      printf "%s\n\n", $0 > file
    } else {
      printf "\n%s\n\n", $0 > file
    }
    next
  }
  /^  +[0-9]+ / { sub(/^ +/, ""); print > file; next }
  /^$/ { next }
  { printf "make_default_corpus: unexpected line %d from bible: %s\n", NR, $0 > "/dev/stderr"; exit 1 }
  END { if (books != 66) { printf "make_default_corpus: %d books from bible, expected 66\n", books > "/dev/stderr"; exit 1 } }'

./tokenize --quiet --out-dir "$out_dir" --name kjv --val-tokens 100000 "$text_dir"/*.txt
echo "make_default_corpus: wrote $out_dir/kjv_val_000000.bin, kjv_train_000000.bin, gpt2_tokenizer.bin (from bible-kjv-text $(dpkg-query -W -f='${Version}' bible-kjv-text 2>/dev/null || echo '?'))"
