#!/usr/bin/env bash
# dev/export_hf.py and dev/import_hf.py: a model file → Hugging Face GPT-2 directory → model file
# is byte-identical (fp32 from the PyTorch reference, bf16 from a short run of the binary); the
# exported safetensors, read by an independent loader here and run as Hugging Face's GPT-2 would
# (Conv1D weights: x @ W + b, unpadded tied head), gives the binary's validation loss; a model
# imported from Hugging Face trains; bad inputs fail with one line and a non-zero exit — among them
# every configuration the trainer cannot run (head size, layernorm epsilon, attention scaling, an
# untied head, non-finite weights) and malformed safetensors headers — leaving no file behind.
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
# Configurations and files the trainer could not run are refused, each in one line.
# bad_import NAME PYTHON-STATEMENTS: $tmp/NAME, a copy of hf_ref whose config (cfg, a dict) and
# safetensors (header, a dict; body, bytes) the statements change.
bad_import() {
  mkdir -p "$tmp/$1"
  "$python" - "$tmp/hf_ref" "$tmp/$1" "$2" <<'PY'
import json, struct, sys
src, dst, change = sys.argv[1:]
cfg = json.load(open(f"{src}/config.json"))
data = open(f"{src}/model.safetensors", "rb").read()
(n,) = struct.unpack_from("<Q", data)
header, body = json.loads(data[8:8 + n]), data[8 + n:]
exec(change)
json.dump(cfg, open(f"{dst}/config.json", "w"))
text = json.dumps(header).encode()
open(f"{dst}/model.safetensors", "wb").write(struct.pack("<Q", len(text)) + text + body)
PY
}
bad_import no_heads 'del cfg["n_head"]'
bad_import text_heads 'cfg["n_head"] = "2"'
bad_import odd_heads 'cfg["n_head"] = 5'
bad_import small_heads 'cfg["n_head"] = 12'
bad_import list_config 'cfg = []'
bad_import epsilon 'cfg["layer_norm_epsilon"] = 1e-6'
bad_import layer_scaling 'cfg["scale_attn_by_inverse_layer_idx"] = True'
bad_import unscaled 'cfg["scale_attn_weights"] = False'
bad_import untied 'cfg["tie_word_embeddings"] = False'
bad_import no_offsets 'del header["transformer.wpe.weight"]["data_offsets"]'
bad_import text_shape 'header["transformer.wpe.weight"]["shape"] = "32x48"'
bad_import list_header 'header = [header]'
bad_import nan_weight 'import numpy as np
info = header["transformer.h.1.ln_2.bias"]
begin = info["data_offsets"][0]
body = body[:begin] + np.float32("nan").tobytes() + body[begin + 4:]'
expect_error "import without n_head" "config.json: no n_head$" "$python" dev/import_hf.py "$tmp/no_heads" "$tmp/x.bin"
expect_error "import with n_head a string" "config.json: n_head '2', expected a whole number" \
  "$python" dev/import_hf.py "$tmp/text_heads" "$tmp/x.bin"
expect_error "import with heads not dividing n_embd" "config.json: n_embd 48 / n_head 5: train_gpt needs a head size" \
  "$python" dev/import_hf.py "$tmp/odd_heads" "$tmp/x.bin"
expect_error "import with a head size of 4" "config.json: n_embd 48 / n_head 12: train_gpt needs a head size" \
  "$python" dev/import_hf.py "$tmp/small_heads" "$tmp/x.bin"
expect_error "import of a config that is a list" "config.json: a JSON list, expected an object" \
  "$python" dev/import_hf.py "$tmp/list_config" "$tmp/x.bin"
expect_error "import with another layernorm epsilon" "config.json: layer_norm_epsilon 1e-06: train_gpt implements only 1e-05" \
  "$python" dev/import_hf.py "$tmp/epsilon" "$tmp/x.bin"
expect_error "import with scale_attn_by_inverse_layer_idx" \
  "config.json: scale_attn_by_inverse_layer_idx True: train_gpt implements only false" \
  "$python" dev/import_hf.py "$tmp/layer_scaling" "$tmp/x.bin"
expect_error "import without attention scaling" "config.json: scale_attn_weights False: train_gpt implements only true" \
  "$python" dev/import_hf.py "$tmp/unscaled" "$tmp/x.bin"
expect_error "import of an untied head that is not stored" "tie_word_embeddings False and no lm_head.weight" \
  "$python" dev/import_hf.py "$tmp/untied" "$tmp/x.bin"
expect_error "import without data_offsets" "tensor transformer.wpe.weight: data_offsets None, expected" \
  "$python" dev/import_hf.py "$tmp/no_offsets" "$tmp/x.bin"
expect_error "import with a shape that is text" "tensor transformer.wpe.weight: shape '32x48', expected a list" \
  "$python" dev/import_hf.py "$tmp/text_shape" "$tmp/x.bin"
expect_error "import of a safetensors header that is a list" "header is a JSON list, expected an object" \
  "$python" dev/import_hf.py "$tmp/list_header" "$tmp/x.bin"
expect_error "import of a NaN weight" "tensor h.1.ln_2.bias: 1 non-finite value(s)" \
  "$python" dev/import_hf.py "$tmp/nan_weight" "$tmp/x.bin"
[ ! -e "$tmp/x.bin" ] || fail "a failed import left $tmp/x.bin behind"
# A write that fails at the rename (the destination is a folder) leaves no temporary file.
mkdir -p "$tmp/folder.bin/inside"
expect_error "import onto a folder" "folder.bin: Is a directory" "$python" dev/import_hf.py "$tmp/hf_ref" "$tmp/folder.bin"
[ ! -e "$tmp/folder.bin.tmp" ] || fail "a failed import left $tmp/folder.bin.tmp behind"
[ "$failures" -eq 0 ]
