#!/usr/bin/env bash
# Streams the 10B-token sample of FineWeb (or FineWeb-Edu, or FineWeb's 100B-token sample) from
# the Hugging Face hub and tokenizes it with ./tokenize into llm.c-style shards of 100M tokens:
#   fineweb: data/fineweb10B/fineweb_val_000000.bin (the first 100M tokens),
#            data/fineweb10B/fineweb_train_000000.bin ... (about 99 shards, ~20 GB in all)
#   edu:     data/edu_fineweb10B/edu_fineweb_val_000000.bin, edu_fineweb_train_*.bin
#   fineweb100B: data/fineweb100B/fineweb_val_000000.bin, fineweb_train_*.bin (about 1000 shards,
#            ~200 GB; the scripts/run_gpt2_{350M,774M,1558M}.sh recipes train on it)
# ENCODING=llama3 writes Llama 3 tokens (`tokenize --encoding llama3`: llm.c's Llama 3 shards,
# uint32 ids, BOS before each document) into DIR_llama3 instead (data/fineweb10B_llama3, ...): the
# scripts/run_llama3_*.sh recipes train on them. Default ENCODING=gpt2.
# Documents are streamed (nothing but the shards is kept on disk) as JSON lines into
# `tokenize --format jsonl -`, which uses every CPU.
# Needs network access, Python 3 with the `datasets` package (pip install datasets) and
# ./tokenize with its vocabulary (scripts/install_deps.sh).
# usage: data/fineweb.sh [fineweb|edu|fineweb100B] [OUT_DIR] [MAX_DOCUMENTS]
#   MAX_DOCUMENTS (default: all, about 14.9M / 9.7M) stops early, e.g. for a quick look.
set -euo pipefail
cd "$(dirname "$0")/.."
variant=${1:-fineweb}
case $variant in
  fineweb)     repo=HuggingFaceFW/fineweb     name=fineweb     sample=sample-10BT  default_dir=data/fineweb10B ;;
  edu)         repo=HuggingFaceFW/fineweb-edu name=edu_fineweb sample=sample-10BT  default_dir=data/edu_fineweb10B ;;
  fineweb100B) repo=HuggingFaceFW/fineweb     name=fineweb     sample=sample-100BT default_dir=data/fineweb100B ;;
  *) echo "fineweb: unknown variant '$variant' (fineweb, edu or fineweb100B)" >&2; exit 1 ;;
esac
encoding=${ENCODING:-gpt2}
case $encoding in
  gpt2) ;;
  llama3) default_dir=${default_dir}_llama3 ;;
  *) echo "fineweb: unknown ENCODING '$encoding' (gpt2 or llama3)" >&2; exit 1 ;;
esac
out_dir=${2:-$default_dir}
max_documents=${3:-0}
if ! [[ $max_documents =~ ^[0-9]+$ ]]; then
  echo "fineweb: MAX_DOCUMENTS must be a whole number, got '$max_documents'" >&2
  exit 1
fi
python=${PYTHON:-python3}
if ! "$python" -c 'import datasets' 2>/dev/null; then
  echo "fineweb: $python cannot import 'datasets': pip install datasets" >&2
  exit 1
fi
make -s tokenize

echo "fineweb: streaming $repo ($sample) into $out_dir/${name}_*.bin ($encoding tokens)"
"$python" - "$repo" "$sample" "$max_documents" <<'PYTHON' |
import json
import sys

from datasets import load_dataset

repo, sample, max_documents = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = open(sys.stdout.fileno(), "w", encoding="utf-8", newline="\n", buffering=1 << 20, closefd=False)
rows = load_dataset(repo, name=sample, split="train", streaming=True)
for count, row in enumerate(rows):
    if max_documents and count == max_documents:
        break
    text = row["text"]
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates cannot be UTF-8; replace them with U+FFFD as tiktoken's encode does.
        text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    out.write(json.dumps({"text": text}, ensure_ascii=False))
    out.write("\n")
out.flush()
PYTHON
  ./tokenize --encoding "$encoding" --format jsonl --out-dir "$out_dir" --name "$name" \
    --val-tokens 100000000 --shard-tokens 100000000 -
