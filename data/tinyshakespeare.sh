#!/usr/bin/env bash
# Downloads tiny Shakespeare (1,115,394 bytes of plays, public domain; the char-rnn data set)
# and tokenizes it into data/tinyshakespeare/: one document, the first 32,768 tokens are the
# validation shard (tiny_val_000000.bin), the rest tiny_train_000000.bin (~300k tokens).
# Needs network access, curl or wget, and ./tokenize with its vocabulary
# (scripts/install_deps.sh). TINYSHAKESPEARE_URL overrides the source (e.g. a mirror).
# usage: data/tinyshakespeare.sh [OUT_DIR]   (default data/tinyshakespeare)
set -euo pipefail
cd "$(dirname "$0")/.."
out_dir=${1:-data/tinyshakespeare}
url=${TINYSHAKESPEARE_URL:-https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt}
expected_bytes=1115394

make -s tokenize
mkdir -p "$out_dir"
text=$out_dir/input.txt
if [ ! -f "$text" ] || [ "$(wc -c < "$text")" -ne "$expected_bytes" ]; then
  echo "tinyshakespeare: downloading $url"
  if command -v curl >/dev/null 2>&1; then
    curl --fail --silent --show-error --location --output "$text.part" "$url"
  elif command -v wget >/dev/null 2>&1; then
    wget --quiet --output-document="$text.part" "$url"
  else
    echo "tinyshakespeare: neither curl nor wget is installed" >&2
    exit 1
  fi
  mv "$text.part" "$text"
fi
size=$(wc -c < "$text")
if [ "$size" -ne "$expected_bytes" ]; then
  echo "tinyshakespeare: $text has $size bytes, expected $expected_bytes (wrong file?)" >&2
  exit 1
fi
./tokenize --out-dir "$out_dir" --name tiny --val-tokens 32768 "$text"
