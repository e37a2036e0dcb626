#!/usr/bin/env bash
# dev/export_hf.py and dev/import_hf.py: a model file → Hugging Face GPT-2 directory → model file
# is byte-identical (fp32 from the PyTorch reference, bf16 from a short run of the binary); the
# exported safetensors, read by an independent loader here and run as Hugging Face's GPT-2 would
# (Conv1D weights: x @ W + b, unpadded tied head), gives the binary's validation loss; a model
# imported from Hugging Face trains; bad inputs fail with one line and a non-zero exit.
# usage: hf_export.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin"

if ! "$python" dev/gpt2_reference.py --out "$tmp/ref" --layers 2 --heads 2 --channels 48 --vocab 300 \
    --max-seq-len 32 --batch 2 --seq-len 16 --steps 1 --seed 77 >/dev/null 2>&1; then
  echo "FAIL: dev/gpt2_reference.py failed"; exit 1
fi
data=(--train-data "$tmp/ref/train.bin" --val-data "$tmp/ref/train.bin" --val-steps 1 --batch-size 2 --seq-len 16)
if ! "$bin" --init-from "$tmp/ref/model.bin" "${data[@]}" --dtype bf16 --max-steps 2 --val-every 0 \
    --out-dir "$tmp/run_bf16" >"$tmp/bf16.log" 2>&1; then
  fail "bf16 run exited non-zero:"; cat "$tmp/bf16.log"; exit 1
fi

# Round trips, byte for byte.
for model in "$tmp/ref/model.bin" "$tmp/run_bf16/model.bin"; do
  name=$(basename "$(dirname "$model")")
  if "$python" dev/export_hf.py "$model" "$tmp/hf_$name" >/dev/null &&
     "$python" dev/import_hf.py "$tmp/hf_$name" "$tmp/back_$name.bin" >/dev/null &&
     cmp -s "$model" "$tmp/back_$name.bin"; then
    echo "ok: $name model: export then import gives the same bytes"
  else
    fail "$name model: the round trip through Hugging Face's layout changed the file"
  fi
done

# The exported fp32 model's loss, computed from the safetensors alone, equals the binary's.
val_loss=$("$bin" --init-from "$tmp/ref/model.bin" "${data[@]}" --dtype fp32 --max-steps 0 \
  --out-dir "$tmp/eval" 2>&1 | sed -n 's/^val loss \([0-9.]*\) .*/\1/p')
if "$python" - "$tmp/hf_ref" "$tmp/ref/train.bin" "$val_loss" <<'PY'; then
import json, math, struct, sys
import numpy as np
import torch
import torch.nn.functional as F

directory, shard, want = sys.argv[1], sys.argv[2], float(sys.argv[3])
cfg = json.load(open(f"{directory}/config.json"))
raw = open(f"{directory}/model.safetensors", "rb").read()
(n,) = struct.unpack_from("<Q", raw)
header = json.loads(raw[8:8 + n])
w = {}
for name, info in header.items():
    if name != "__metadata__":
        assert info["dtype"] == "F32", info
        begin, end = info["data_offsets"]
        w[name[len("transformer."):]] = torch.from_numpy(
            np.frombuffer(raw[8 + n + begin:8 + n + end], "<f4").reshape(info["shape"]).copy())
assert "lm_head.weight" not in header and w["wte.weight"].shape[0] == cfg["vocab_size"]
tokens = np.fromfile(shard, "<u2", offset=1024).astype(np.int64)
B, T, C, H = 2, 16, cfg["n_embd"], cfg["n_head"]
inputs = torch.from_numpy(tokens[:B * T].reshape(B, T))
targets = torch.from_numpy(tokens[1:B * T + 1].reshape(B, T))

def conv1d(x, prefix):  # Hugging Face's Conv1D: weight (in, out)
    return x @ w[prefix + ".weight"] + w[prefix + ".bias"]

def ln(x, prefix):
    return F.layer_norm(x, (C,), w[prefix + ".weight"], w[prefix + ".bias"], cfg["layer_norm_epsilon"])

x = w["wte.weight"][inputs] + w["wpe.weight"][:T]
for layer in range(cfg["n_layer"]):
    p = f"h.{layer}."
    q, k, v = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn").split(C, dim=-1)
    q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
    att = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
    att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
    x = x + conv1d((att @ v).transpose(1, 2).reshape(B, T, C), p + "attn.c_proj")
    h = conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc")
    h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h ** 3)))
    x = x + conv1d(h, p + "mlp.c_proj")
logits = ln(x, "ln_f") @ w["wte.weight"].t()
got = F.cross_entropy(logits.view(B * T, -1), targets.view(B * T)).item()
err = abs(got - want) / want
print(f"  exported model's loss {got:.6f}, binary's val loss {want:.6f}, rel err {err:.1e}")
sys.exit(0 if err <= 1e-5 else 1)
PY
  echo "ok: the exported safetensors, run in Hugging Face's layout, give the binary's loss"
else
  fail "the exported model's loss differs from the binary's (val loss '$val_loss')"
fi

# A model imported from Hugging Face's layout trains.
if "$bin" --init-from "$tmp/back_ref.bin" "${data[@]}" --max-steps 2 --val-every 0 --out-dir "$tmp/imported" \
    >"$tmp/imported.log" 2>&1 && [ -s "$tmp/imported/model.bin" ]; then
  echo "ok: an imported model trains"
else
  fail "training from an imported model failed:"; cat "$tmp/imported.log"
fi

# Bad inputs: one line on stderr, non-zero exit.
head -c 4096 /dev/zero >"$tmp/junk.bin"
head -c 2000 "$tmp/ref/model.bin" >"$tmp/short.bin"
mkdir -p "$tmp/no_weights" && cp "$tmp/hf_ref/config.json" "$tmp/no_weights/"
mkdir -p "$tmp/wrong_shape" && cp "$tmp/hf_ref/model.safetensors" "$tmp/wrong_shape/"
sed 's/"n_embd": 48/"n_embd": 64/' "$tmp/hf_ref/config.json" >"$tmp/wrong_shape/config.json"
expect_error() {  # expect_error WHAT PATTERN COMMAND...
  local what=$1 pattern=$2; shift 2
  if "$@" >"$tmp/out" 2>"$tmp/err"; then fail "$what: exited 0"; return; fi
  if [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -q "$pattern" "$tmp/err"; then
    echo "ok: $what: $(cat "$tmp/err")"
  else
    fail "$what: expected one line matching '$pattern', got:"; cat "$tmp/err"
  fi
}
expect_error "export of a file that is not a model" "junk.bin: magic" "$python" dev/export_hf.py "$tmp/junk.bin" "$tmp/x"
expect_error "export of a truncated model" "short.bin: 2000 bytes, expected" \
  "$python" dev/export_hf.py "$tmp/short.bin" "$tmp/x"
expect_error "export of a missing file" "missing.bin: cannot read" \
  "$python" dev/export_hf.py "$tmp/missing.bin" "$tmp/x"
expect_error "import without model.safetensors" "model.safetensors: cannot read" \
  "$python" dev/import_hf.py "$tmp/no_weights" "$tmp/x.bin"
expect_error "import with shapes that contradict config.json" "has shape" \
  "$python" dev/import_hf.py "$tmp/wrong_shape" "$tmp/x.bin"
[ ! -e "$tmp/x.bin" ] || fail "a failed import left $tmp/x.bin behind"
[ "$failures" -eq 0 ]
