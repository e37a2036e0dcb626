#!/usr/bin/env bash
# --generate and --sample-every end to end, on a tiny model with GPT-2's vocabulary written by
# dev/gpt2_reference.py:
#  1. fp32 greedy text equals PyTorch's greedy decoding of the same model (float64, full
#     recomputation, prompt ids from ./tokenize --print-ids), decoded here from encoder.json;
#  2. bf16: greedy equals top-k 1 sampling; seeded sampling repeats for a seed and changes with it;
#  3. bad inputs: one line naming the flag, exit 1, nothing written;
#  4. a training run with --sample-every logs and records (metrics.jsonl) its samples, and the last
#     one equals --generate on the run's model.bin and on its final checkpoint.
# usage: generate.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" ./tokenize data/gpt2_bpe/encoder.json

model=$tmp/model
"$python" dev/gpt2_reference.py --out "$model" --vocab 50257 --layers 2 --heads 2 --channels 32 --max-seq-len 64 \
  --batch 1 --seq-len 8 --steps 4 >/dev/null 2>&1 || { echo "FAIL: dev/gpt2_reference.py could not write the model"; exit 1; }
prompt="Hello, world. The"
printf '%s' "$prompt" >"$tmp/prompt.txt"
ids=$(./tokenize --print-ids --quiet "$tmp/prompt.txt")
gen=(--generate --init-from "$model/model.bin" --prompt "$prompt" --max-new-tokens 16)

# 1. fp32 greedy against PyTorch.
if "$bin" "${gen[@]}" --temperature 0 --dtype fp32 >"$tmp/greedy.txt" 2>"$tmp/greedy.err"; then
  grep -q "generated 16 token(s) after a 5-token prompt (greedy" "$tmp/greedy.err" || fail "fp32 greedy: summary line: $(cat "$tmp/greedy.err")"
  "$python" - "$model/model.bin" "$ids" 16 "$tmp/greedy.txt" <<'EOF' || fail "fp32 greedy text differs from PyTorch's greedy decoding"
import json, sys
sys.path.insert(0, "dev")
import numpy as np, torch
import gpt2_reference as ref
path, ids, steps, got_path = sys.argv[1], [int(t) for t in sys.argv[2].split()], int(sys.argv[3]), sys.argv[4]
raw = open(path, "rb").read()
header = np.frombuffer(raw[:1024], dtype="<i4")
class Cfg: pass
cfg = Cfg()
cfg.max_seq_len, cfg.vocab, cfg.layers, cfg.heads, cfg.channels, cfg.padded_vocab = (int(x) for x in header[2:8])
values = torch.from_numpy(np.frombuffer(raw[1024:], dtype="<f4").astype(np.float64))
params, at = {}, 0
for name in ref.PARAM_NAMES:
    shape = ref.param_shapes(cfg)[name]
    n = int(np.prod(shape))
    params[name] = values[at:at + n].view(shape)
    at += n
sequence, margins = list(ids), []
with torch.no_grad():
    for _ in range(steps):
        logits = ref.model_logits(params, torch.tensor([sequence]), cfg)[0, -1, :cfg.vocab]
        top = torch.topk(logits, 2).values
        margins.append(float(top[0] - top[1]))
        sequence.append(int(torch.argmax(logits)))
# GPT-2's byte-level alphabet: printable bytes stand for themselves, the others for 256 + n in order.
printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
chars, n = {}, 0
for b in range(256):
    chars[chr(b) if b in printable else chr(256 + n)] = b
    n += b not in printable
token_text = {i: bytes(chars[c] for c in t) for t, i in json.load(open("data/gpt2_bpe/encoder.json")).items()}
want = b"".join(token_text[t] for t in sequence) + b"\n"
got = open(got_path, "rb").read()
if got != want:
    print(f"  train_gpt: {got!r}\n  PyTorch:   {want!r}\n  top-2 margins: {margins}")
    sys.exit(1)
EOF
else
  fail "fp32 greedy generation failed: $(cat "$tmp/greedy.err")"
fi

# 2. bf16 sampling.
run_text() { "$bin" "${gen[@]}" "$@" 2>/dev/null; }
greedy=$(run_text --temperature 0) || fail "bf16 greedy generation failed"
[[ $greedy == "$prompt"?* ]] || fail "bf16 greedy: the output does not start with the prompt: '$greedy'"
[ "$(run_text --temperature 0 --seed 9)" = "$greedy" ] || fail "bf16 greedy depends on --seed"
[ "$(run_text --temperature 1.3 --top-k 1 --seed 9)" = "$greedy" ] || fail "bf16 --top-k 1 differs from greedy"
sample7=$(run_text --temperature 1 --top-k 0 --seed 7)
[ "$(run_text --temperature 1 --top-k 0 --seed 7)" = "$sample7" ] || fail "sampling with --seed 7 twice differs"
[ "$(run_text --temperature 1 --top-k 0 --seed 8)" != "$sample7" ] || fail "--seed 8 samples what --seed 7 does"
[ "$sample7" != "$greedy" ] || fail "sampling at temperature 1 gave the greedy text"

# 3. Bad inputs: exit 1 and one line naming the flag; --generate writes nothing.
expect_error() {
  local want=$1; shift
  local err
  if err=$("$bin" "$@" --out-dir "$tmp/never" 2>&1 >/dev/null); then fail "accepted: $*"; return; fi
  if [ "$(printf '%s\n' "$err" | wc -l)" -ne 1 ] || [[ $err != *"$want"* ]]; then
    fail "$*: expected one line with '$want', got: $err"
  fi
}
long_prompt=$(printf 'word %.0s' $(seq 70))
expect_error "--generate needs a trained model" --generate --prompt "$prompt"
expect_error "tokens, more than the context of $model/model.bin (max_seq_len 64)" \
  --generate --init-from "$model/model.bin" --prompt "$long_prompt" --max-new-tokens 1
too_many=(--generate --init-from "$model/model.bin" --prompt "$prompt" --max-new-tokens 60)
expect_error "--max-new-tokens 60: the prompt's 5 token(s) and the new tokens exceed the context" "${too_many[@]}"
expect_error "at most 59 new token(s) fit" "${too_many[@]}"
expect_error "--top-k 50258: more than the vocabulary" "${gen[@]}" --top-k 50258
expect_error "--top-k: expected an integer" "${gen[@]}" --top-k -1
expect_error "--temperature: expected a number >= 0, got '-0.5'" "${gen[@]}" --temperature -0.5
expect_error "--vocab-dir $tmp/none: cannot read $tmp/none/encoder.json" "${gen[@]}" --vocab-dir "$tmp/none"
expect_error "--resume auto: no complete checkpoint in $tmp/never to generate from" --generate --resume auto
expect_error "--generate and --eval are different runs" "${gen[@]}" --eval --eval-data "$tmp/none"
[ ! -e "$tmp/never" ] || fail "a refused --generate created --out-dir"

# 4. Samples during training (fp32, greedy): steps 2 and 4, in the log and in metrics.jsonl.
out=$tmp/run
if "$bin" --init-from "$model/model.bin" --train-data "$model/train.bin" --val-data "$model/train.bin" --val-every 0 \
     --batch-size 1 --seq-len 8 --max-steps 4 --lr 1e-2 --warmup-steps 0 --dtype fp32 --out-dir "$out" \
     --sample-every 2 --prompt "Once upon" --max-new-tokens 8 --temperature 0 >"$tmp/train.log" 2>&1; then
  [ "$(grep -c '^step [0-9]/4 | sample: "Once upon' "$tmp/train.log")" -eq 2 ] || fail "training log: expected 2 sample lines"
  last=$("$python" - "$out/metrics.jsonl" <<'EOF'
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
samples = [(r["step"], r["sample"]) for r in records if "sample" in r]
steps = [r["step"] for r in records]
assert [s for s, _ in samples] == [2, 4], samples
assert steps == sorted(steps), steps
assert all(text.startswith("Once upon") for _, text in samples), samples
print(samples[-1][1], end="")
EOF
) || fail "metrics.jsonl: expected sample records at steps 2 and 4"
  again=(--generate --prompt "Once upon" --max-new-tokens 8 --temperature 0 --dtype fp32)
  [ "$("$bin" "${again[@]}" --init-from "$out/model.bin" 2>/dev/null)" = "$last" ] ||
    fail "--generate on the run's model.bin differs from the step-4 sample"
  [ "$("$bin" "${again[@]}" --resume "$out/checkpoint_00000004" 2>/dev/null)" = "$last" ] ||
    fail "--generate --resume on the final checkpoint differs from the step-4 sample"
else
  fail "training with --sample-every failed: $(tail -n 3 "$tmp/train.log")"
fi

[ "$failures" -eq 0 ] && echo "generate: all checks passed"
[ "$failures" -eq 0 ]
