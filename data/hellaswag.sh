#!/usr/bin/env bash
# Downloads the HellaSwag validation set (10,042 examples, JSON lines, from the authors' GitHub
# repository rowanz/hellaswag) and writes it as an eval file (docs/FORMATS.md, "Evaluation file")
# with ./tokenize's ids: OUT_DIR/hellaswag_val.bin (GPT-2's ids, version 1: uint16 values) or,
# with --encoding llama3, OUT_DIR/hellaswag_val_llama3.bin (Llama 3's ids, version 2: uint32
# values), for `train_gpt --eval-data`. Per example: the context is the "ctx" text, the 4
# completions its "endings", each encoded with a leading space (it continues the context's last
# word), and the label the index of the right ending.
# Needs network access, curl or wget, python3 and ./tokenize with its vocabulary
# (scripts/install_deps.sh); a downloaded OUT_DIR/hellaswag_val.jsonl is reused. HELLASWAG_URL
# overrides the source (e.g. a mirror); HELLASWAG_EXAMPLES the example count it must hold (10042).
# usage: data/hellaswag.sh [--encoding gpt2|llama3] [OUT_DIR]   (default gpt2, data/hellaswag)
set -euo pipefail
cd "$(dirname "$0")/.."
encoding=gpt2
if [ "${1:-}" = --encoding ]; then
  encoding=${2:-}
  shift 2 || { echo "hellaswag: --encoding expects gpt2 or llama3" >&2; exit 2; }
fi
case $encoding in
  gpt2) bin_name=hellaswag_val.bin ;;
  llama3) bin_name=hellaswag_val_llama3.bin ;;
  *) echo "hellaswag: --encoding expects gpt2 or llama3, got \"$encoding\"" >&2; exit 2 ;;
esac
out_dir=${1:-data/hellaswag}
url=${HELLASWAG_URL:-https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl}
python=${PYTHON:-python3}
expected_examples=${HELLASWAG_EXAMPLES:-10042}

mkdir -p "$out_dir"
jsonl=$out_dir/hellaswag_val.jsonl
if [ ! -s "$jsonl" ]; then
  echo "hellaswag: downloading $url"
  status=0
  if command -v curl >/dev/null 2>&1; then
    curl --fail --silent --show-error --location --output "$jsonl.part" "$url" || status=$?
  elif command -v wget >/dev/null 2>&1; then
    wget --quiet --output-document="$jsonl.part" "$url" || status=$?
  else
    echo "hellaswag: neither curl nor wget is installed" >&2
    exit 1
  fi
  if [ "$status" -ne 0 ]; then
    rm -f "$jsonl.part"
    echo "hellaswag: cannot download $url (exit status $status; no network? HELLASWAG_URL names a mirror)" >&2
    exit 1
  fi
  mv "$jsonl.part" "$jsonl"
fi
make -s tokenize

# Five documents per example (context, then each ending), tokenized in order, one line of ids each.
documents=$out_dir/hellaswag_val.documents.jsonl
"$python" - "$jsonl" "$documents" "$expected_examples" <<'PYTHON'
import json
import sys

source, documents, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(source, encoding="utf-8") as f:
    examples = [json.loads(line) for line in f if line.strip()]
if len(examples) != expected:
    sys.exit(f"hellaswag: {source} holds {len(examples)} examples, expected {expected} (wrong file?)")
with open(documents, "w", encoding="utf-8") as out:
    for ex in examples:
        if len(ex["endings"]) != 4 or not 0 <= int(ex["label"]) < 4:
            sys.exit(f"hellaswag: {source}: example {ex.get('ind')} has no 4 endings with a label")
        for text in [ex["ctx"]] + [" " + e for e in ex["endings"]]:
            out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
PYTHON
./tokenize --encoding "$encoding" --format jsonl --print-ids --quiet "$documents" >"$documents.ids"

# Version 1 (llm.c's) stores every value as a uint16, which cannot hold Llama 3's ids; version 2
# is the same layout with every value a uint32 (docs/FORMATS.md).
"$python" - "$jsonl" "$documents.ids" "$out_dir/$bin_name" "$encoding" <<'PYTHON'
import json
import os
import struct
import sys

source, ids_path, target, encoding = sys.argv[1:5]
version, value, width = (1, "H", 2) if encoding == "gpt2" else (2, "I", 4)
marker = (1 << (8 * width)) - 1
largest = min(marker - 1, (1 << 31) - 1)  # an example's byte length (header slot 3 is an int32)
with open(source, encoding="utf-8") as f:
    labels = [int(json.loads(line)["label"]) for line in f if line.strip()]
with open(ids_path) as f:
    ids = [[int(t) for t in line.split()] for line in f]
if len(ids) != 5 * len(labels):
    sys.exit(f"hellaswag: tokenize gave {len(ids)} documents, expected {5 * len(labels)}")
stream, longest = [], 0
for i, label in enumerate(labels):
    context, endings = ids[5 * i], ids[5 * i + 1:5 * i + 5]
    example = [marker, 0, i, label, len(endings), len(context)] + context
    for ending in endings:
        example += [len(ending)] + ending
    example[1] = width * len(example)  # the example's bytes, its first two fields included
    if example[1] > largest or min(len(context), *map(len, endings)) == 0:
        sys.exit(f"hellaswag: example {i} cannot be stored (empty text or more than {largest} bytes)")
    longest = max(longest, example[1])
    stream += example
with open(target + ".tmp", "wb") as out:
    out.write(struct.pack("<256i", 20240522, version, len(labels), longest, *([0] * 252)))
    out.write(struct.pack(f"<{len(stream)}{value}", *stream))
os.replace(target + ".tmp", target)
print(f"hellaswag: {target}: {len(labels)} examples, longest {longest} bytes")
PYTHON
rm -f "$documents" "$documents.ids"
