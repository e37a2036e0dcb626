#!/usr/bin/env bash
# Hugging Face Llama directories in and out of the trainer (--init-from DIR, --export-hf DIR):
# a random tiny Llama written by dev/hf_llama_check.py (GQA, Llama 3 RoPE scaling, untied, fp32)
# gives the validation loss its independent forward pass computes (rotate-half RoPE: the import
# undid Hugging Face's q/k permutation); after one step the run's --export-hf directory holds
# exactly its model.bin's tensors in Hugging Face's names, shapes, dtype and q/k order and gives the
# same loss again; a step from the exported directory, from its 2-shard split and from model.bin
# writes byte-identical model files (and equal losses); a tied bf16 model exports as BF16; and each
# setting we do not implement (another rope_scaling, biases, experts, a model_type, tie flags the
# tensors contradict, a missing shard or tensor, a wrong shape), GPT-2 with --export-hf and
# --export-hf with --save 0 are refused in one line naming the key, tensor or file, writing nothing.
# usage: hf_llama.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/train.bin" "$ref/model.bin"
check=(dev/hf_llama_check.py)
data=(--train-data "$ref/train.bin" --val-data "$ref/train.bin" --val-steps 1 --batch-size 2 --seq-len 32)

"$python" "${check[@]}" make "$tmp/A" --rope-scaling || { echo "FAIL: hf_llama_check.py make"; exit 1; }

# The validation loss train_gpt prints for --init-from SOURCE (fp32, no step).
val_loss() {
  "$bin" --init-from "$1" "${data[@]}" --dtype fp32 --max-steps 0 2>&1 | sed -nE 's/^val loss ([0-9.]+) .*/\1/p'
}
# One fp32 step from SOURCE into $tmp/NAME (model.bin in fp32); extra flags follow.
step_from() {
  local source=$1 name=$2
  shift 2
  "$bin" --init-from "$source" "${data[@]}" --dtype fp32 --max-steps 1 --val-every 0 --save-dtype fp32 \
    --out-dir "$tmp/$name" "$@" >"$tmp/$name.log" 2>&1 || { fail "$name: exited non-zero"; tail -n 5 "$tmp/$name.log"; }
}
loss_of() { "$python" -c 'import json, sys; print(json.loads(open(sys.argv[1]).readline())["train_loss"])' "$tmp/$1/metrics.jsonl"; }

loss=$(val_loss "$tmp/A")
[ -n "$loss" ] || fail "no validation loss from --init-from a Hugging Face directory"
"$python" "${check[@]}" check "$tmp/A" --data "$ref/train.bin" --batch 2 --seq-len 32 --loss "${loss:-0}" >"$tmp/A.check" ||
  { fail "--init-from DIR's loss is not the Hugging Face forward pass's:"; cat "$tmp/A.check"; }

# Export after a step; the directory is model.bin's tensors, and gives model.bin's loss.
step_from "$tmp/A" run --export-hf "$tmp/E"
"$python" "${check[@]}" check "$tmp/E" --model-bin "$tmp/run/model.bin" --data "$ref/train.bin" --batch 2 --seq-len 32 \
  --loss "$(val_loss "$tmp/run/model.bin")" >"$tmp/E.check" ||
  { fail "the exported directory is not model.bin's model:"; cat "$tmp/E.check"; }

# Re-import: one step from model.bin, from the export and from its shards, bit for bit alike.
"$python" "${check[@]}" edit "$tmp/E" "$tmp/S" --shards 2 || fail "hf_llama_check.py edit --shards 2"
[ -f "$tmp/S/model-00002-of-00002.safetensors" ] || fail "no second shard written"
step_from "$tmp/run/model.bin" from_bin
step_from "$tmp/E" from_hf
step_from "$tmp/S" from_shards
for name in from_hf from_shards; do
  cmp -s "$tmp/from_bin/model.bin" "$tmp/$name/model.bin" || fail "$name: model.bin differs from the step from model.bin's"
  [ "$(loss_of from_bin)" = "$(loss_of "$name")" ] || fail "$name: loss $(loss_of "$name"), from model.bin $(loss_of from_bin)"
done

# A tied bf16 model exports as BF16 with no lm_head.weight.
"$python" "${check[@]}" make "$tmp/B" --tied --dtype bf16 --kv-heads 1 --seed 2 || fail "hf_llama_check.py make --tied"
"$bin" --init-from "$tmp/B" "${data[@]}" --max-steps 1 --val-every 0 --out-dir "$tmp/run_bf16" --export-hf "$tmp/EB" \
  >"$tmp/run_bf16.log" 2>&1 || { fail "bf16 tied run exited non-zero"; tail -n 5 "$tmp/run_bf16.log"; }
"$python" "${check[@]}" check "$tmp/EB" --model-bin "$tmp/run_bf16/model.bin" >"$tmp/EB.check" ||
  { fail "the bf16 tied export is not model.bin's model:"; cat "$tmp/EB.check"; }

# Bad input: one line naming the key, tensor or file; nothing written.
bad() {  # bad NAME PATTERN SOURCE EDITS...: SOURCE edited into $tmp/bad_NAME must be refused
  local name=$1 pattern=$2 source=$3
  shift 3
  "$python" "${check[@]}" edit "$source" "$tmp/bad_$name" "$@" || { fail "$name: edit failed"; return; }
  local before
  before=$(tree_digest "$tmp/bad_$name")
  expect_refused "$name" "$pattern" --init-from "$tmp/bad_$name" "${data[@]}" --max-steps 1 --out-dir "$tmp/out_$name" \
    --export-hf "$tmp/bad_$name/again"
  [ ! -e "$tmp/out_$name" ] || fail "$name: --out-dir was created"
  [ "$before" = "$(tree_digest "$tmp/bad_$name")" ] || fail "$name: the directory changed"
}
bad rope_type "config.json: key rope_scaling.rope_type is yarn" "$tmp/A" \
  --set 'rope_scaling={"rope_type": "yarn", "factor": 4.0}'
bad attention_bias "config.json: key attention_bias is true" "$tmp/A" --set attention_bias=true
bad mlp_bias "config.json: key mlp_bias is true" "$tmp/A" --set mlp_bias=true
bad experts "config.json: key num_local_experts describes a mixture of experts" "$tmp/A" --set num_local_experts=8
bad model_type 'config.json: key model_type is "mistral"' "$tmp/A" --set 'model_type="mistral"'
bad tied_but_head "key tie_word_embeddings is true, but tensor lm_head.weight differs" "$tmp/A" \
  --set tie_word_embeddings=true
bad untied_no_head "key tie_word_embeddings is false, but the checkpoint has no tensor lm_head.weight" "$tmp/B" \
  --set tie_word_embeddings=false
bad missing_tensor "tensor model.layers.1.mlp.up_proj.weight is missing" "$tmp/A" \
  --drop model.layers.1.mlp.up_proj.weight
bad shape "tensor model.layers.0.mlp.gate_proj.weight has shape \[96,64\], config.json gives \[104,64\]" "$tmp/A" \
  --set intermediate_size=104
"$python" "${check[@]}" edit "$tmp/A" "$tmp/bad_extra_bias" || fail "edit for extra_bias failed"
"$python" - "$tmp/bad_extra_bias" <<'PY' || fail "adding a bias tensor failed"
import os, sys
sys.path.insert(0, "dev")
import numpy as np
from hf_gpt2 import read_safetensors, write_safetensors
path = os.path.join(sys.argv[1], "model.safetensors")
tensors, dtype = read_safetensors(path)
named = list(tensors.items()) + [("model.layers.0.self_attn.q_proj.bias", np.zeros(64, np.float32))]
write_safetensors(path, named, dtype, {"format": "pt"})
PY
expect_refused extra_bias "tensor model.layers.0.self_attn.q_proj.bias is not part" --init-from "$tmp/bad_extra_bias" \
  "${data[@]}" --max-steps 1 --out-dir "$tmp/out_extra_bias"
"$python" "${check[@]}" edit "$tmp/E" "$tmp/bad_shard" --shards 2 || fail "edit --shards 2"
rm -f "$tmp/bad_shard/model-00002-of-00002.safetensors"
expect_refused missing_shard "model-00002-of-00002.safetensors: shard missing" --init-from "$tmp/bad_shard" \
  "${data[@]}" --max-steps 1 --out-dir "$tmp/out_shard"
expect_refused gpt2_export "export-hf: .*Llama 3 models only" --init-from "$ref/model.bin" "${data[@]}" \
  --max-steps 1 --out-dir "$tmp/out_gpt2" --export-hf "$tmp/gpt2_hf"
expect_refused save_0 "export-hf and --save 0 contradict" --init-from "$tmp/A" "${data[@]}" --max-steps 1 \
  --out-dir "$tmp/out_save0" --save 0 --export-hf "$tmp/save0_hf"
before=$(tree_digest "$tmp/S")
expect_refused export_into_shards "model.safetensors.index.json: the directory holds a sharded checkpoint" \
  --init-from "$tmp/A" "${data[@]}" --max-steps 1 --out-dir "$tmp/out_into_shards" --export-hf "$tmp/S"
[ "$before" = "$(tree_digest "$tmp/S")" ] || fail "export_into_shards: the sharded directory changed"
for d in out_shard out_gpt2 gpt2_hf out_save0 save0_hf out_extra_bias out_into_shards; do
  [ ! -e "$tmp/$d" ] || fail "$d was created by a refused run"
done

[ "$failures" -eq 0 ] || exit 1
echo "hf_llama: import, export, shards, round trips and bad input OK"
