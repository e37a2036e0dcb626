#!/usr/bin/env bash
# The eval file for Llama 3's ids (docs/FORMATS.md, "Evaluation file", version 2), made offline by
# data/hellaswag.sh from a 3-example HellaSwag-style file (HELLASWAG_EXAMPLES=3; non-ASCII text, so
# that ids above 65535 occur):
#  - --encoding gpt2 writes llm.c's version 1, byte for byte what test/checks/lib/eval_file.py
#    writes for ./tokenize's GPT-2 ids;
#  - --encoding llama3 writes version 2: uint32 values, marker 0xFFFFFFFF, ./tokenize --encoding
#    llama3's ids, parsed here independently of the trainer's reader;
#  - train_gpt --eval of a GPT-2 model of Llama 3's vocabulary size (V=128256) on it gives every
#    completion's loss sum as PyTorch does (dev/gpt2_reference.py's forward; fp32, 1e-4 relative);
#  - a version-1 file for that model, and the version-2 file for the tiny V=500 model, are refused
#    in one line naming the file and the encoding to use.
# usage: eval_file_llama3.sh cpu|gpu   Needs scripts/install_deps.sh's vocabularies; exits 77 only
# when install_deps.sh could not fetch Llama 3's (fetch_failed.txt says why).
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin"
export SIMT_THREADS=1
if [ ! -f data/llama3_bpe/tokenizer.model ]; then
  if [ -f data/llama3_bpe/fetch_failed.txt ]; then
    echo "skipped: data/llama3_bpe is missing: $(cat data/llama3_bpe/fetch_failed.txt)"
    exit 77
  fi
  echo "FAIL: data/llama3_bpe/tokenizer.model is missing: run scripts/install_deps.sh"
  exit 1
fi

hs=$tmp/hs
mkdir -p "$hs"
cat >"$hs/hellaswag_val.jsonl" <<'EOF'
{"ind": 0, "ctx": "A man is sitting on a roof. He", "endings": ["is using wrap to wrap a pair of skis.", "is ripping level tiles off.", "is holding a rubik's cube.", "starts pulling up roofing on a roof."], "label": 3}
{"ind": 1, "ctx": "Ein Mädchen spielt Geige in Tōkyō, très bien. She", "endings": ["plays on.", "stops at 東京駅.", "smiles 😀 and waves.", "bows."], "label": 0}
{"ind": 2, "ctx": "Then", "endings": ["a", "b", "c", "d"], "label": 2}
EOF
for encoding in gpt2 llama3; do
  HELLASWAG_EXAMPLES=3 bash data/hellaswag.sh --encoding "$encoding" "$hs" >"$tmp/hs_$encoding.log" 2>&1 ||
    { fail "data/hellaswag.sh --encoding $encoding: $(tail -n 3 "$tmp/hs_$encoding.log")"; exit 1; }
  # The documents data/hellaswag.sh tokenizes: each example's context, then its endings with a space.
  "$python" -c 'import json, sys
for line in open(sys.argv[1], encoding="utf-8"):
    ex = json.loads(line)
    for text in [ex["ctx"]] + [" " + e for e in ex["endings"]]:
        print(json.dumps({"text": text}, ensure_ascii=False))' "$hs/hellaswag_val.jsonl" >"$tmp/documents.jsonl"
  ./tokenize --encoding "$encoding" --format jsonl --print-ids --quiet "$tmp/documents.jsonl" >"$tmp/ids_$encoding.txt" ||
    fail "tokenize --encoding $encoding --print-ids"
done

"$python" - "$hs" "$tmp" <<'PY' || fail "the eval files differ from the format"
import json, struct, sys
sys.path.insert(0, "test/checks/lib")
from eval_file import write_eval_file
hs, tmp = sys.argv[1], sys.argv[2]
labels = [json.loads(l)["label"] for l in open(f"{hs}/hellaswag_val.jsonl", encoding="utf-8")]
def examples(encoding):
    ids = [[int(t) for t in l.split()] for l in open(f"{tmp}/ids_{encoding}.txt")]
    return [(labels[i], ids[5 * i], ids[5 * i + 1:5 * i + 5]) for i in range(len(labels))]
write_eval_file(f"{tmp}/want_gpt2.bin", examples("gpt2"))
ok = open(f"{tmp}/want_gpt2.bin", "rb").read() == open(f"{hs}/hellaswag_val.bin", "rb").read()
print(f"{'ok' if ok else 'FAIL'}: --encoding gpt2: llm.c's version 1, byte for byte")
# Version 2 read here: header, then per example uint32 marker, bytes, index, label, count, context, completions.
raw = open(f"{hs}/hellaswag_val_llama3.bin", "rb").read()
magic, version, count, longest = struct.unpack("<4i", raw[:16])
values = struct.unpack(f"<{(len(raw) - 1024) // 4}I", raw[1024:])
got, at, sizes = [], 0, []
while at < len(values):
    marker, size, index, label, n = values[at:at + 5]
    assert marker == 0xFFFFFFFF and index == len(got), (marker, index)
    end, at = at + size // 4, at + 5
    seqs = []
    for _ in range(1 + n):
        seqs.append(list(values[at + 1:at + 1 + values[at]]))
        at += 1 + values[at]
    assert at == end, "the stated byte length"
    sizes.append(size)
    got.append((label, seqs[0], seqs[1:]))
want = examples("llama3")
wide = max(t for _, c, cs in want for t in c + sum(cs, []))
good = (magic, version, count, longest) == (20240522, 2, 3, max(sizes)) and got == want and len(raw) % 4 == 0 and wide > 65535
print(f"{'ok' if good else 'FAIL'}: --encoding llama3: version 2, {len(values)} uint32 values, tokenize's ids (largest {wide})")
sys.exit(0 if ok and good else 1)
PY

# A GPT-2 model of V=128256, and PyTorch's loss sum of every completion on the version-2 file.
"$python" -W ignore::UserWarning test/checks/lib/wide_vocab_model.py "$tmp/wide.bin" || { fail "writing the model"; exit 1; }
T=32
"$python" -W ignore::UserWarning - "$tmp/wide.bin" "$tmp" "$T" <<'PY' || fail "PyTorch's loss sums"
import json, sys
import numpy as np
import torch
sys.path.insert(0, "dev")
import gpt2_reference as ref
model_path, tmp, T = sys.argv[1], sys.argv[2], int(sys.argv[3])
cfg, params = ref.read_model_file(model_path)
ids = [[int(t) for t in l.split()] for l in open(f"{tmp}/ids_llama3.txt")]
sums = []
with torch.no_grad():
    for i in range(len(ids) // 5):
        ctx, comps = ids[5 * i], ids[5 * i + 1:5 * i + 5]
        ctx = ctx[-(T + 1 - max(len(c) for c in comps)):]
        for c in comps:
            seq = torch.tensor([ctx + c])
            logits, _ = ref.forward(params, seq[:, :-1], seq[:, 1:], cfg)
            logp = torch.log_softmax(logits[0, :, :cfg.vocab].double(), dim=-1)
            targets = seq[0, 1:]
            sums.append(float(-logp[torch.arange(len(targets)), targets][len(ctx) - 1:].sum()))
json.dump(sums, open(f"{tmp}/expected.json", "w"))
PY
if "$bin" --eval --init-from "$tmp/wide.bin" --eval-data "$hs/hellaswag_val_llama3.bin" --dtype fp32 --batch-size 3 \
    --seq-len $T --eval-losses "$tmp/losses.jsonl" >"$tmp/eval.log" 2>&1; then
  "$python" - "$tmp/expected.json" "$tmp/losses.jsonl" <<'PY' || fail "train_gpt's loss sums differ from PyTorch's"
import json, sys
want = json.load(open(sys.argv[1]))
got = [s for l in open(sys.argv[2]) for s in json.loads(l)["loss_sum"]]
worst = max(abs(g - w) / abs(w) for g, w in zip(got, want)) if len(got) == len(want) else float("inf")
print(f"{'ok' if worst <= 1e-4 else 'FAIL'}: --eval of V=128256 on version 2: {len(got)} loss sums, max rel err {worst:.1e}")
sys.exit(0 if worst <= 1e-4 else 1)
PY
else
  fail "--eval on the version-2 file exited non-zero: $(tail -n 2 "$tmp/eval.log")"
fi

# expect_refused MODEL FILE WANT: one line on stderr, exactly "error: --eval-data: FILE: WANT".
expect_refused() {
  if "$bin" --eval --init-from "$1" --eval-data "$2" --seq-len $T >/dev/null 2>"$tmp/err"; then
    fail "$2 for $1: exit 0"
  elif [ "$(cat "$tmp/err")" != "error: --eval-data: $2: $3" ]; then
    fail "$2 for $1: expected 'error: --eval-data: $2: $3', got: $(cat "$tmp/err")"
  else
    echo "ok: $(cat "$tmp/err")"
  fi
}
expect_refused "$tmp/wide.bin" "$hs/hellaswag_val.bin" "a GPT-2 eval file (version 1, uint16 ids); the model has Llama 3's vocabulary (V=128256): make it with data/hellaswag.sh --encoding llama3"
expect_refused "$ref/model.bin" "$hs/hellaswag_val_llama3.bin" "a Llama 3 eval file (version 2, uint32 ids); the model's vocabulary (V=500) fits uint16 ids, GPT-2's kind: make it with data/hellaswag.sh --encoding gpt2"
[ "$failures" -eq 0 ] && echo "eval_file_llama3: all checks passed"
[ "$failures" -eq 0 ]
