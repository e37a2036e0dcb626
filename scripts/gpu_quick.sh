#!/usr/bin/env bash
# shellcheck disable=SC2317  # the stages and their helpers are called by name ("stage_$name")
# The GPU proof for a short job (a debug partition, a borrowed node): from the pack alone
# (make gpu-pack on a machine with the CUDA toolkit; no compiler, network or root here), the most
# important evidence first, within SECONDS (default 420) of wall time. Stages, in order, each with
# its estimate on one H100; a stage whose estimate does not fit the time left is skipped and says
# so, and every command runs under the time left, so the run ends within SECONDS:
#   device       nvidia-smi; driver against the CUDA runtime; the NCCL and cuBLASLt found; ldd of
#                every packed binary (nothing missing)                                        10 s
#   smoke        the nano model, fp32 and bf16, 5 steps: finite, falling losses                  30 s
#   parity       PyTorch on the GPU against the packed CPU reference; train_gpt fp32 and bf16
#                against PyTorch, per-step loss and gradient norm (1e-4 and 2e-2 relative)       60 s
#   hf           a llama-nano trained 2 steps on the pack's Llama 3 shards and exported with
#                --export-hf: dev/hf_llama_check.py checks the directory against model.bin and its
#                loss by its own forward pass and by transformers' LlamaForCausalLM             30 s
#   throughput   d12, T=1024, B=64 (then 32 and 8 while time allows): 15 steps timed after 3,
#                tokens/s, ms/step, MFU, peak memory against the plan; Llama 3.2 1B at T=2048,
#                B=8 the same way (where the pack has Llama 3 shards); --profile 5 at B=64      120 s
#   fp8          --fp8 against bf16 in the same job, d48 (T=1024, B=8) and Llama 3.2 1B (T=2048, B=8,
#                where the pack has Llama 3 shards): tokens/s of each, their ratio (issue 35's
#                target: 1.25x) and the last losses                                            100 s
#   fp8_profile  --profile of the fp8 stage's --fp8 runs: each step's device time split into the
#                FP8 products, the bf16 ones, the FP8 casts, attention and the rest, and the
#                heaviest sites (logs/fp8_profile/*.json)                                        90 s
#   fp8_loss     d12 (T=1024, B=16) 1,000 steps in bf16 and with --fp8, the same data: the validation
#                losses after the last step within 0.5% (issue 35)                               80 s
#   moe          moe-nano (T=128, B=64) and Llama 3.2 1B with 4 experts, top-2 (T=2048, B=4), each
#                with real routing and --moe-balanced-routing: tokens/s and imbalance (issue 36)  90 s
#   attention    ours against PyTorch's SDPA at d12's training shape, forward and forward+backward 60 s
#   tests        the packed kernel and model test binaries                                       120 s
#   determinism  one 20-step nano run twice: every record and model.bin bit-identical             40 s
#   sanitizer    compute-sanitizer memcheck on one training step; racecheck on the flash
#                attention test while time remains; a device the sanitizer refuses is a SKIP    90 s
#   large        d48 one step at the largest B of 8, 4, 2, 1 that fits (nothing written); where
#                NCCL lets ranks share a GPU (>= 2.30), 2 ranks at ZeRO 1, ZeRO 3 and TP 2
#                against one rank                                                              120 s
# Each stage writes OUT/NAME.json (status PASS|FAIL|SKIP, one line of figures, seconds) and
# OUT/summary.md is rewritten the moment it is known, so a job killed at its limit leaves every
# finished stage. Training runs write under /dev/shm (QUICK_TMP), checkpoints off.
#
# usage: scripts/gpu_quick.sh [SECONDS]        (or make gpu-quick; from a checkout with gpu-pack/
#                                               beside it, or as gpu-pack/scripts/gpu_quick.sh)
# environment: QUICK_OUT   results folder (default: ./gpu-quick where it is started)
#              GPU_PACK    the pack (default: the pack this script sits in, else ./gpu-pack)
#              QUICK_STAGES  stages to run (default: all, in the order above)
#              QUICK_TMP   scratch for the runs (default: /dev/shm, else /tmp)
#              PYTHON      a python3 with a CUDA PyTorch (default: python3)
#              QUICK_DRY_RUN=1  the rehearsal on a machine without a GPU (test/checks/gpu_quick.sh):
#                          QUICK_TRAINER is run in place of train_gpt, QUICK_TEST_DIR's test builds
#                          in place of the packed ones (QUICK_TESTS: which), the models are small,
#                          the stages that need a GPU's own tools say SKIP
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
if [ -z "${GPU_PACK:-}" ] && [ -f "$here/../MANIFEST" ]; then GPU_PACK=$here/..; fi
pack=${GPU_PACK:-gpu-pack}
out=${QUICK_OUT:-$PWD/gpu-quick}
budget=${1:-420}
dry_run=${QUICK_DRY_RUN:-0}
all_stages=(device smoke parity hf throughput fp8 fp8_profile fp8_loss moe attention tests determinism sanitizer large)
declare -A estimate=([device]=10 [smoke]=30 [parity]=60 [hf]=30 [throughput]=120 [fp8]=100 [fp8_profile]=90 [fp8_loss]=80 [moe]=90
                     [attention]=60 [tests]=120 [determinism]=40 [sanitizer]=90 [large]=120)

die() { echo "gpu_quick: $*" >&2; exit 2; }
if ! [[ $budget =~ ^[0-9]+$ ]] || [ "$budget" -lt 10 ]; then die "SECONDS must be a whole number of seconds >= 10, got '$budget'"; fi
[ -f "$pack/MANIFEST" ] || die "no pack at $pack (no MANIFEST): run 'make gpu-pack' where the CUDA toolkit is and bring gpu-pack/ along, or set GPU_PACK"
pack=$(cd "$pack" && pwd)
mkdir -p "$out" || die "cannot create $out"
out=$(cd "$out" && pwd)
tmp_root=${QUICK_TMP:-/dev/shm}
if [ ! -d "$tmp_root" ] || [ ! -w "$tmp_root" ]; then tmp_root=/tmp; fi
work=$(mktemp -d "$tmp_root/gpu_quick.XXXXXX") || die "cannot create a scratch folder in $tmp_root"
trap 'rm -rf "$work"' EXIT
logs=$out/logs
started=$(date +%s)

# Seconds left of the budget; run CMD... under it (a command still running at the budget's end is
# killed: its stage says it was cut).
left() {
  local now
  now=$(date +%s)
  echo $(( budget - now + started ))
}
limited() {
  local seconds
  seconds=$(( $(left) - 2 ))
  [ "$seconds" -gt 0 ] || return 124
  timeout -k 3 "$seconds" "$@"
}
report() { python3 "$pack/scripts/acceptance_report.py" "$@"; }
json_string() { python3 -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$1"; }
py() { "$python" -c "$@"; }

cd "$pack" || die "cannot enter $pack"
python=${PYTHON:-python3}
trainer=./train_gpt
[ "$dry_run" = 1 ] && trainer=${QUICK_TRAINER:?QUICK_DRY_RUN=1 needs QUICK_TRAINER (the CPU trainer)}

# ---- where the node's libraries are: the pack's, then CUDA's (cuBLASLt), NCCL's
cuda_home=${CUDA_HOME:-/usr/local/cuda}
find_library() {  # NAME: the first directory holding NAME among the places a node keeps it
  local dir
  for dir in "$cuda_home/lib64" "$cuda_home/targets/x86_64-linux/lib" /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib \
             $("$python" -c 'import glob, site; print(" ".join(sorted(glob.glob(p + "/nvidia/*/lib") for p in site.getsitepackages())))' 2>/dev/null | tr -d "[]',"); do
    compgen -G "$dir/$1*" >/dev/null 2>&1 && { echo "$dir"; return 0; }
  done
  return 1
}
library_path=$pack/lib
for name in libcublasLt.so libnccl.so; do
  if dir=$(find_library "$name"); then library_path+=":$dir"; fi
done
export LD_LIBRARY_PATH=$library_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nccl_file=$(for d in ${LD_LIBRARY_PATH//:/ }; do compgen -G "$d/libnccl.so*"; done 2>/dev/null | head -n 1)
nccl_version=$( [ -n "$nccl_file" ] && grep -a -o -m 1 'NCCL version [0-9][0-9.]*' "$nccl_file" | head -n 1 | awk '{print $3}')
cublas_file=$(for d in ${LD_LIBRARY_PATH//:/ }; do compgen -G "$d/libcublasLt.so.*"; done 2>/dev/null | sort -V | tail -n 1)

# Shapes: the real ones on a GPU, small ones in the rehearsal (the CPU trainer).
# shellcheck disable=SC2034  # the moe shapes are read by name (stage_moe's nameref)
if [ "$dry_run" = 1 ]; then
  d12=(--model nano --seq-len 64); big_batches=(4 2 1); timed=3 warm=1 profile_steps=3
  llama=(--model llama-nano --seq-len 32); llama_batch=2
  fp8_loss=(--model nano --seq-len 64 --batch-size 2 --max-steps 6 --val-steps 2)
  moe_small=(--model moe-nano --seq-len 32); moe_mid=(--model llama-nano --seq-len 32 --moe-experts 4 --moe-top-k 2)
  declare -A moe_batch=([moe_small]=2 [moe_mid]=2)
  d48=(--model micro --seq-len 64); fp8_batch=4; det=(--model nano --batch-size 2 --seq-len 32 --max-steps 6 --val-every 3 --val-steps 2)
  # The model tests' tiny reference (dev/gpt2_reference.py's defaults: B=2, T=32) stands in for
  # the parity reference, which takes minutes on a CPU.
  parity=(build/reference/tiny 2 32)
  device_name="none (dry run)"
else
  d12=(--model d12 --seq-len 1024); big_batches=(64 32 8); timed=15 warm=3 profile_steps=5
  llama=(--model llama3.2-1b --seq-len 2048); llama_batch=8
  fp8_loss=(--model d12 --seq-len 1024 --batch-size 16 --max-steps 1000)
  moe_small=(--model moe-nano --seq-len 128); moe_mid=(--model llama3.2-1b --seq-len 2048 --moe-experts 4 --moe-top-k 2)
  declare -A moe_batch=([moe_small]=64 [moe_mid]=4)
  d48=(--model d48 --seq-len 1024); fp8_batch=8; det=(--model nano --batch-size 8 --seq-len 128 --max-steps 20 --val-every 10 --val-steps 4)
  parity=(build/reference/parity 4 256)  # the reference's directory, B and T (its parity.args)
  device_name=$(nvidia-smi -i 0 --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
fi
export ACCEPTANCE_DEVICE=${device_name:-unknown}
export ACCEPTANCE_COMMIT
ACCEPTANCE_COMMIT=$(sed -n 's/^commit //p' MANIFEST)
# What every measurement run shares: no validation, nothing written but metrics.
quiet=(--val-every 0 --save 0)

train() {  # NAME ARGS...: one trainer run into $work/NAME, its log in $logs/$stage/NAME.log
  local name=$1; shift
  limited "$trainer" "$@" --out-dir "$work/$name" > "$logs/$stage/$name.log" 2>&1
}
# Finite and falling losses in a run's metrics.jsonl: prints "first → last (N steps)".
falling() {
  py 'import json, math, sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
l = [x["train_loss"] for x in r if "train_loss" in x]
ok = len(l) == int(sys.argv[2]) and all(math.isfinite(v) for v in l) and l[-1] < l[0]
print(f"{l[0]:.4f} -> {l[-1]:.4f} ({len(l)} steps)" if l else "no train records")
sys.exit(0 if ok else 1)' "$1" "$2"
}

# ---- stages: each sets status (PASS|FAIL|SKIP), text and figures (KEY=VALUE)

stage_device() {
  local query name memory driver cc need missing=0 file libs glibc glibc_need
  if [ "$dry_run" = 1 ]; then query=$(nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader,nounits 2>&1)
  else query=$(nvidia-smi -i 0 --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader,nounits 2>&1); fi
  nvidia-smi > "$logs/device/nvidia-smi.txt" 2>&1
  IFS=, read -r name memory driver cc <<< "$query"
  need=$(sed -n 's/.*NVIDIA driver \([0-9.]*\) or later.*/\1/p' MANIFEST)
  status=PASS
  text="${name# }, ${memory# } MiB, compute ${cc# }, driver ${driver# }"
  if [ -z "${driver# }" ] || [ "$(printf '%s\n' "$need" "${driver# }" | sort -V | head -n 1)" != "$need" ]; then
    status=FAIL; text+=" (the pack's CUDA runtime needs $need or later)"
  else
    text+=" (>= $need)"
  fi
  glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{print $2}')
  glibc_need=$(sed -n 's/^needs glibc \([0-9.]*\) or later.*/\1/p' MANIFEST)
  if [ -z "$glibc" ] || [ "$(printf '%s\n' "$glibc_need" "$glibc" | sort -V | head -n 1)" != "$glibc_need" ]; then
    status=FAIL; text+="; glibc ${glibc:-unknown}, the pack needs $glibc_need"
  else
    text+="; glibc $glibc (>= $glibc_need)"
  fi
  text+="; NCCL ${nccl_version:-not found}${nccl_file:+ ($nccl_file)}; cuBLASLt ${cublas_file##*/libcublasLt.so.}"
  [ -n "$cublas_file" ] || text+="not found"
  for file in train_gpt tokenize build/bench_attention build/gpu/test/*/*; do
    [ -f "$file" ] || continue
    ldd "$file" > "$logs/device/ldd.${file//\//_}.txt" 2>&1
    libs=$(grep 'not found' "$logs/device/ldd.${file//\//_}.txt" | awk '{print $1}' | paste -sd ' ')
    if [ -n "$libs" ]; then missing=$((missing + 1)); text+="; $file: missing $libs"; fi
  done
  [ "$missing" -eq 0 ] && text+="; every packed binary's libraries found" || status=FAIL
  [ -z "$nccl_file" ] && status=FAIL
  figures=("name=${name# }" "memory_mib=${memory# }" "driver=${driver# }" "driver_needed=$need" "compute_capability=${cc# }"
           "glibc=${glibc:-unknown}" "nccl=${nccl_version:-none}" "nccl_library=${nccl_file:-none}" "cublaslt_library=${cublas_file:-none}"
           "pack=$(json_string "$(head -n 5 MANIFEST | tail -n 4 | paste -sd ';')")")
}

stage_smoke() {
  local dtype summary
  status=PASS; text=""
  for dtype in fp32 bf16; do
    if train "nano-$dtype" --model nano --batch-size 4 --seq-len 64 --max-steps 5 --dtype "$dtype" "${quiet[@]}" &&
       summary=$(falling "$work/nano-$dtype/metrics.jsonl" 5); then
      text+="${text:+; }$dtype: loss $summary"
    else
      status=FAIL; text+="${text:+; }$dtype: FAILED (${summary:-exit $?}; logs/smoke/nano-$dtype.log: $(tail -n 1 "$logs/smoke/nano-$dtype.log"))"
    fi
    figures+=("$dtype=$(json_string "${summary:-failed}")")
  done
}

stage_hf() {
  local shards=(data/llama3/*_val_*.bin) loss
  local data=(--train-data "data/llama3/*_train_*.bin" --val-data "data/llama3/*_val_*.bin" --batch-size 2 --seq-len 32
              --val-steps 1 --dtype fp32)
  if [ ! -f "${shards[0]}" ]; then status=SKIP; text="the pack has no Llama 3 shards (no vocabulary at make gpu-pack)"; return; fi
  if ! train hf-run --model llama-nano "${data[@]}" --max-steps 2 --val-every 0 --export-hf "$work/hf-export"; then
    status=FAIL; text="training with --export-hf failed (logs/hf/hf-run.log: $(tail -n 1 "$logs/hf/hf-run.log"))"; return
  fi
  loss=$(limited "$trainer" --init-from "$work/hf-run/model.bin" "${data[@]}" --max-steps 0 --out-dir "$work/hf-loss" 2>&1 |
         sed -nE 's/^val loss ([0-9.]+) .*/\1/p')
  if limited "$python" dev/hf_llama_check.py check "$work/hf-export" --model-bin "$work/hf-run/model.bin" \
       --data "${shards[0]}" --batch 2 --seq-len 32 --loss "${loss:-0}" > "$logs/hf/check.log" 2>&1; then
    status=PASS
  else
    status=FAIL
  fi
  text="export of a 2-step llama-nano (val loss ${loss:-none}): $(grep -E '^(loss here|transformers|FAIL)' "$logs/hf/check.log" | paste -sd ';')"
  figures=("hf_check=$(json_string "$(paste -sd '|' "$logs/hf/check.log")")")
}

stage_parity() {
  local ref=${parity[0]} args dtype tol errors loss_err norm_err against agree
  against=$ref/reference.json
  status=PASS; text=""
  if [ "$dry_run" != 1 ] && read -r -a args < "$ref/parity.args" && py 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    if limited "$python" dev/gpt2_reference.py --device cuda --out "$work/parity-cuda" "${args[@]}" > "$logs/parity/reference-cuda.log" 2>&1 &&
       agree=$(report ref-agree "$ref/reference.json" "$work/parity-cuda/reference.json" 1e-4); then
      text="PyTorch CUDA vs the packed CPU reference: $agree"; against=$work/parity-cuda/reference.json
    else
      status=FAIL; text="PyTorch CUDA reference failed or disagrees with the CPU one (${agree:-logs/parity/reference-cuda.log})"
    fi
  else
    text="no CUDA PyTorch: against the packed CPU reference only"
  fi
  figures=("torch_cuda_vs_cpu=${agree:-null}")
  for spec in "fp32 1e-4" "bf16 2e-2"; do
    read -r dtype tol <<< "$spec"
    if ! train "parity-$dtype" --init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$ref/train.bin" \
         --dtype "$dtype" --shuffle 0 --batch-size "${parity[1]}" --seq-len "${parity[2]}" --max-steps 10 --lr 1e-3 --lr-schedule constant \
         --warmup-steps 0 --weight-decay 0.1 --grad-clip 1.0 --beta1 0.9 --beta2 0.95 --adam-eps 1e-8 "${quiet[@]}"; then
      status=FAIL; text+="; $dtype: train_gpt failed (logs/parity/parity-$dtype.log: $(tail -n 1 "$logs/parity/parity-$dtype.log"))"; continue
    fi
    errors=$(report parity "$against" "$work/parity-$dtype/metrics.jsonl" "$tol") || status=FAIL
    read -r loss_err norm_err <<< "$errors"
    text+="; $dtype: loss $loss_err, grad norm $norm_err (limit $tol)"
    figures+=("${dtype}_loss_max_rel_err=${loss_err:-null}" "${dtype}_grad_norm_max_rel_err=${norm_err:-null}")
  done
}

# One measured run: GPU memory sampled by nvidia-smi while it runs; sets run_ok and run_figures.
measured() {
  local name=$1 batch=$2 sampler peak baseline; shift 2
  baseline=$(nvidia-smi -i 0 --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | tr -dc '0-9')
  nvidia-smi -i 0 --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$work/$name.memory" 2>/dev/null &
  sampler=$!
  train "$name" "$@" --batch-size "$batch"; run_ok=$?
  kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
  peak=$(sort -n "$work/$name.memory" 2>/dev/null | tail -n 1 | tr -dc '0-9')
  peak_mib=$(( ${peak:-0} - ${baseline:-0} ))
}

stage_throughput() {
  local batch figures_json line
  status=PASS; text=""
  for batch in "${big_batches[@]}"; do
    if [ "$batch" != "${big_batches[0]}" ] && [ "$(left)" -lt $(( estimate[throughput] / 3 )) ]; then
      text+="; B=$batch: not run ($(left) s left)"; continue
    fi
    measured "d12-b$batch" "$batch" "${d12[@]}" --max-steps $((warm + timed)) "${quiet[@]}"
    if [ "$run_ok" -eq 0 ] && figures_json=$(report throughput "$logs/throughput/d12-b$batch.log" "$work/d12-b$batch/metrics.jsonl" \
                                               "$batch" "${d12[3]}" "$warm" "$ACCEPTANCE_DEVICE"); then
      line=$(py 'import json, sys; d = json.loads(sys.argv[1])
print("%s ms/step, %s tok/s, MFU %s%%, plan %s MiB" % (d["ms_per_step"], d["tokens_per_s"], d["mfu_percent"], d["planned_mib"]))' "$figures_json")
      text+="${text:+; }${d12[1]} B=$batch: $line, $peak_mib MiB used"
      figures+=("${d12[1]}_b$batch=$figures_json" "${d12[1]}_b${batch}_peak_used_mib=$peak_mib")
    else
      [ "$batch" = "${big_batches[0]}" ] && status=FAIL
      text+="${text:+; }${d12[1]} B=$batch: FAILED (logs/throughput/d12-b$batch.log: $(tail -n 1 "$logs/throughput/d12-b$batch.log"))"
    fi
  done
  if ! compgen -G "data/llama3/*_train_*.bin" >/dev/null; then
    text+="; ${llama[1]}: not run (the pack has no Llama 3 shards: its vocabulary was missing at make gpu-pack)"
  elif [ "$(left)" -lt $(( estimate[throughput] / 3 )) ]; then
    text+="; ${llama[1]}: not run ($(left) s left)"
  else
    measured llama "$llama_batch" "${llama[@]}" --train-data "data/llama3/*_train_*.bin" \
      --val-data "data/llama3/*_val_*.bin" --max-steps $((warm + timed)) "${quiet[@]}"
    if [ "$run_ok" -eq 0 ] && figures_json=$(report throughput "$logs/throughput/llama.log" "$work/llama/metrics.jsonl" \
                                               "$llama_batch" "${llama[3]}" "$warm" "$ACCEPTANCE_DEVICE"); then
      line=$(py 'import json, sys; d = json.loads(sys.argv[1])
print("%s ms/step, %s tok/s, MFU %s%%, plan %s MiB" % (d["ms_per_step"], d["tokens_per_s"], d["mfu_percent"], d["planned_mib"]))' "$figures_json")
      text+="; ${llama[1]} T=${llama[3]} B=$llama_batch: $line, $peak_mib MiB used"
      figures+=("${llama[1]}=$figures_json")
    else
      status=FAIL
      text+="; ${llama[1]}: FAILED (logs/throughput/llama.log: $(tail -n 1 "$logs/throughput/llama.log"))"
    fi
  fi
  if [ "$(left)" -lt 20 ]; then text+="; profile: not run ($(left) s left)"; return; fi
  if train profile "${d12[@]}" --batch-size "${big_batches[0]}" --profile "$profile_steps" "${quiet[@]}"; then
    cp "$work/profile/profile.json" "$logs/throughput/profile.json" 2>/dev/null
    text+="; --profile $profile_steps at B=${big_batches[0]}: logs/throughput/profile.log and profile.json"
    figures+=("profile=$(json_string "$(grep -A 12 -m 1 -i 'kernel' "$logs/throughput/profile.log" | paste -sd '|')")")
  else
    status=FAIL; text+="; --profile failed (logs/throughput/profile.log)"
  fi
}

stage_fp8() {
  local model batch kind figures_json rate line
  local -A tps
  status=PASS; text=""
  for model in d48 llama; do
    local -n shape=$model
    local data=()
    batch=$fp8_batch
    if [ "$model" = llama ]; then
      if ! compgen -G "data/llama3/*_train_*.bin" >/dev/null; then text+="; ${shape[1]}: not run (no Llama 3 shards)"; continue; fi
      data=(--train-data "data/llama3/*_train_*.bin" --val-data "data/llama3/*_val_*.bin")
    fi
    for kind in bf16 fp8; do
      local flags=("${shape[@]}" "${data[@]}" --max-steps $((warm + timed)) "${quiet[@]}")
      [ "$kind" = fp8 ] && flags+=(--fp8 1)
      if [ "$(left)" -lt 20 ]; then text+="${text:+; }${shape[1]} $kind: not run ($(left) s left)"; continue; fi
      measured "$model-$kind" "$batch" "${flags[@]}"
      if [ "$run_ok" -eq 0 ] && figures_json=$(report throughput "$logs/fp8/$model-$kind.log" "$work/$model-$kind/metrics.jsonl" \
                                                 "$batch" "${shape[3]}" "$warm" "$ACCEPTANCE_DEVICE"); then
        tps[$model-$kind]=$(py 'import json, sys; print(json.loads(sys.argv[1])["tokens_per_s"])' "$figures_json")
        line=$(py 'import json, sys; r = [json.loads(l) for l in open(sys.argv[1]) if "train_loss" in l]; print(r[-1]["train_loss"])' \
               "$work/$model-$kind/metrics.jsonl")
        text+="${text:+; }${shape[1]} B=$batch $kind: ${tps[$model-$kind]} tok/s, last loss $line, $peak_mib MiB used"
        figures+=("${model}_$kind=$figures_json")
      else
        status=FAIL
        text+="${text:+; }${shape[1]} $kind: FAILED (logs/fp8/$model-$kind.log: $(tail -n 1 "$logs/fp8/$model-$kind.log"))"
      fi
    done
    if [ -n "${tps[$model-bf16]:-}" ] && [ -n "${tps[$model-fp8]:-}" ]; then
      rate=$(py 'import sys; print("%.3f" % (float(sys.argv[2]) / float(sys.argv[1])))' "${tps[$model-bf16]}" "${tps[$model-fp8]}")
      text+=" (fp8/bf16 ${rate}x; target 1.25x)"
      figures+=("${model}_fp8_speedup=$rate")
    fi
  done
}

# Where an --fp8 step's device time goes (issue 35's speed-up): the fp8 stage's runs under
# --profile, the sites summed by kind.
stage_fp8_profile() {
  local model split
  status=PASS; text=""
  for model in d48 llama; do
    local -n shape=$model
    local data=()
    if [ "$model" = llama ]; then
      if ! compgen -G "data/llama3/*_train_*.bin" >/dev/null; then text+="; ${shape[1]}: not run (no Llama 3 shards)"; continue; fi
      data=(--train-data "data/llama3/*_train_*.bin" --val-data "data/llama3/*_val_*.bin")
    fi
    if [ "$(left)" -lt 30 ]; then text+="${text:+; }${shape[1]}: not run ($(left) s left)"; continue; fi
    if train "$model-fp8-profile" "${shape[@]}" "${data[@]}" --batch-size "$fp8_batch" --fp8 1 --profile "$profile_steps" \
         "${quiet[@]}" && cp "$work/$model-fp8-profile/profile.json" "$logs/fp8_profile/$model.json" &&
       split=$(py 'import json, sys
d = json.load(open(sys.argv[1]))
kinds = {"FP8 products": 0.0, "bf16 products": 0.0, "FP8 casts": 0.0, "attention": 0.0, "the rest": 0.0}
for s in d["sites"]:
    n = s["site"]
    kind = ("FP8 products" if n.startswith("cublasLt fp8") else "bf16 products" if n.startswith("cublasLt") else
            "FP8 casts" if "fp8" in n else "attention" if "attention" in n else "the rest")
    kinds[kind] += s["ms_per_step"]
top = ", ".join("%s %.1f ms" % (s["site"][:48], s["ms_per_step"]) for s in d["sites"][:3])
print("step %.1f ms, device %.1f ms: %s; heaviest: %s" % (d["step_ms"], d["device_ms_per_step"],
      ", ".join("%s %.1f ms" % kv for kv in kinds.items()), top))' "$logs/fp8_profile/$model.json"); then
      text+="${text:+; }${shape[1]} B=$fp8_batch --fp8: $split"
      figures+=("${model}_fp8_profile=$(json_string "$split")")
    else
      status=FAIL; text+="${text:+; }${shape[1]}: --profile failed (logs/fp8_profile/$model-fp8-profile.log)"
    fi
  done
}

# Issue 35's loss check: bf16 and --fp8 trained side by side from the same seed and data order;
# the --fp8 run's validation loss at the last step within 0.5% of bf16's (one step's training loss
# is one batch's: the first H200 run had 0.58% there and 0.23% over the last 20 steps).
stage_fp8_loss() {
  local kind
  status=PASS; text=""
  for kind in bf16 fp8; do
    local flags=("${fp8_loss[@]}" --val-every 1000000 --save 0)
    [ "$kind" = fp8 ] && flags+=(--fp8 1)
    if ! train "$kind" "${flags[@]}"; then
      status=FAIL; text+="${text:+; }$kind: FAILED (logs/fp8_loss/$kind.log: $(tail -n 1 "$logs/fp8_loss/$kind.log"))"; return
    fi
  done
  if ! text=$(py 'import json, sys
records = [list(map(json.loads, open(p))) for p in sys.argv[1:3]]
(bt, ft), (bv, fv) = ([[r[key] for r in rs if key in r] for rs in records] for key in ("train_loss", "val_loss"))
val = abs(fv[-1] - bv[-1]) / bv[-1]
tail = abs(sum(ft[-20:]) - sum(bt[-20:])) / sum(bt[-20:])
print("step %d: val loss bf16 %.4f, fp8 %.4f (%.2f%%; target 0.5%%); train loss over the last 20 steps %.2f%% apart"
      % (len(bt), bv[-1], fv[-1], 100 * val, 100 * tail))
sys.exit(0 if len(bt) == len(ft) and val <= 0.005 else 1)' "$work/bf16/metrics.jsonl" "$work/fp8/metrics.jsonl"); then status=FAIL; fi
  figures+=("loss=$(json_string "$text")")
}

# Issue 36's speed check: the same mixtures with real routing and with --moe-balanced-routing
# (every expert the same rows), side by side: the small preset and a Llama 3.2 1B with 4 experts.
stage_moe() {
  local model kind figures_json
  status=PASS; text=""
  if ! compgen -G "data/llama3/*_train_*.bin" >/dev/null; then status=SKIP; text="not run (no Llama 3 shards)"; return; fi
  for model in moe_small moe_mid; do
    local -n shape=$model
    for kind in real balanced; do
      local flags=("${shape[@]}" --train-data "data/llama3/*_train_*.bin" --val-data "data/llama3/*_val_*.bin"
                   --max-steps $((warm + timed)) "${quiet[@]}")
      [ "$kind" = balanced ] && flags+=(--moe-balanced-routing 1)
      if [ "$(left)" -lt 20 ]; then text+="${text:+; }${shape[1]} $kind: not run ($(left) s left)"; continue; fi
      measured "$model-$kind" "${moe_batch[$model]}" "${flags[@]}"
      if [ "$run_ok" -eq 0 ] && figures_json=$(report throughput "$logs/moe/$model-$kind.log" "$work/$model-$kind/metrics.jsonl" \
                                                 "${moe_batch[$model]}" "${shape[3]}" "$warm" "$ACCEPTANCE_DEVICE"); then
        text+="${text:+; }${shape[1]}${shape[4]:+ with ${shape[5]} experts} B=${moe_batch[$model]} $kind: $(py 'import json, sys
d = json.loads(sys.argv[1]); print("%s tok/s, %s ms/step" % (d["tokens_per_s"], d["ms_per_step"]))' "$figures_json"), imbalance $(py 'import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if "train_loss" in l]; print(r[-1]["expert_imbalance"])' "$work/$model-$kind/metrics.jsonl")"
        figures+=("${model}_$kind=$figures_json")
      else
        status=FAIL
        text+="${text:+; }${shape[1]} $kind: FAILED (logs/moe/$model-$kind.log: $(tail -n 1 "$logs/moe/$model-$kind.log"))"
      fi
    done
  done
}

stage_attention() {
  if [ "$dry_run" = 1 ]; then status=SKIP; text="dry run: bench_attention and SDPA need a GPU"; return; fi
  if limited build/bench_attention --shape 8,12,1024,64 --python "$python" > "$logs/attention/bench.log" 2>&1; then
    status=PASS; text="d12's shape B=8 NH=12 T=1024 HD=64 (logs/attention/bench.log): $(grep -i -E 'tflop|sdpa|flash' "$logs/attention/bench.log" | tail -n 6 | paste -sd ';')"
  else
    status=FAIL; text="bench_attention failed: $(tail -n 2 "$logs/attention/bench.log" | paste -sd ' ')"
  fi
  figures=("bench=$(json_string "$(tail -n 20 "$logs/attention/bench.log")")")
}

stage_tests() {
  local test binary name line passed=0 failed=0 failures=() tests
  read -r -a tests <<< "${QUICK_TESTS:-$(cd build/gpu/test && find . -mindepth 2 -maxdepth 2 -name 'test_*' -printf '%P\n' | sort | paste -sd ' ')}"
  status=PASS
  for test in "${tests[@]}"; do
    binary=build/gpu/test/$test
    [ "$dry_run" = 1 ] && binary=${QUICK_TEST_DIR:?QUICK_DRY_RUN=1 needs QUICK_TEST_DIR}/$test
    name=${test//\//_}
    if [ "$(left)" -lt 10 ]; then failures+=("$test: not run (time)"); status=FAIL; continue; fi
    (cd "$pack" && limited "$binary") > "$logs/tests/$name.log" 2>&1
    line=$(grep -E '^(All tests passed|test cases:)' "$logs/tests/$name.log" | tail -n 1)
    if [[ $line =~ ^All\ tests\ passed ]]; then passed=$((passed + 1))
    else failed=$((failed + 1)); status=FAIL; failures+=("$test: ${line:-$(tail -n 1 "$logs/tests/$name.log")}"); fi
  done
  text="$passed of ${#tests[@]} test binaries passed"
  [ ${#failures[@]} -eq 0 ] || text+="; $(printf '%s; ' "${failures[@]}")"
  figures=("binaries=$(json_string "${tests[*]}")" "passed=$passed" "failed=$failed")
}

stage_determinism() {
  local run same
  status=PASS
  for run in a b; do
    train "determinism-$run" "${det[@]}" --seed 1337 || { status=FAIL; text="run $run failed (logs/determinism/determinism-$run.log)"; return; }
  done
  same=$(report same-run "$work/determinism-a/metrics.jsonl" "$work/determinism-b/metrics.jsonl") || status=FAIL
  if cmp -s "$work/determinism-a/model.bin" "$work/determinism-b/model.bin"; then text="$same; model.bin identical"
  else status=FAIL; text="$same; model.bin differs"; fi
  figures=("args=$(json_string "${det[*]}")")
}

stage_sanitizer() {
  local sanitizer=$cuda_home/bin/compute-sanitizer result
  command -v compute-sanitizer >/dev/null 2>&1 && sanitizer=$(command -v compute-sanitizer)
  if [ ! -x "$sanitizer" ]; then status=SKIP; text="no compute-sanitizer (at $sanitizer or on PATH)"; return; fi
  limited "$sanitizer" --tool memcheck --error-exitcode 99 --print-limit 20 "$trainer" --model nano --batch-size 1 \
    --seq-len 32 --max-steps 1 "${quiet[@]}" --out-dir "$work/sanitizer" > "$logs/sanitizer/memcheck.log" 2>&1
  result=$?
  if grep -q -i 'device not supported\|not supported on this\|unsupported device' "$logs/sanitizer/memcheck.log"; then
    status=SKIP; text="the sanitizer refuses this device: $(grep -m 1 -i 'not supported' "$logs/sanitizer/memcheck.log")"; return
  fi
  case $result in
    0) status=PASS; text="memcheck, one training step: clean" ;;
    124 | 137) status=FAIL; text="memcheck cut by the time budget" ;;
    *) status=FAIL; text="memcheck exited $result: $(grep -m 1 'ERROR SUMMARY' "$logs/sanitizer/memcheck.log")" ;;
  esac
  if [ "$(left)" -gt 60 ] && [ -x build/gpu/test/kernels/test_flash_attention ]; then
    limited "$sanitizer" --tool racecheck --error-exitcode 99 build/gpu/test/kernels/test_flash_attention > "$logs/sanitizer/racecheck.log" 2>&1
    result=$?
    case $result in
      0) text+="; racecheck test_flash_attention: clean" ;;
      124 | 137) text+="; racecheck test_flash_attention: cut by the budget (partial)" ;;
      *) status=FAIL; text+="; racecheck test_flash_attention exited $result" ;;
    esac
  fi
}

stage_large() {
  local batch tried="" figures_json rank pids=() mode loss
  status=FAIL; text=""
  for batch in 8 4 2 1; do
    [ "$(left)" -gt 15 ] || { text="d48: no time left after $tried"; break; }
    measured "d48-b$batch" "$batch" "${d48[@]}" --max-steps 1 "${quiet[@]}"
    if [ "$run_ok" -eq 0 ] && figures_json=$(report throughput "$logs/large/d48-b$batch.log" "$work/d48-b$batch/metrics.jsonl" \
                                               "$batch" "${d48[3]}" 0 "$ACCEPTANCE_DEVICE"); then
      status=PASS
      text="${d48[1]} fits at B=$batch: one cold step $(py 'import json, sys; d = json.loads(sys.argv[1]); print(d["ms_per_step"], "ms, plan", d["planned_mib"], "MiB")' "$figures_json"), $peak_mib MiB used"
      figures+=("${d48[1]}=$figures_json")
      break
    fi
    tried+="B=$batch: $(tail -n 1 "$logs/large/d48-b$batch.log"); "
  done
  [ "$status" = PASS ] || text="${d48[1]} did not run: $tried"
  # Several ranks on one GPU need NCCL 2.30 or later (NCCL_MULTI_RANK_GPU_ENABLE).
  if [ -z "$nccl_version" ] || [ "$(printf '%s\n' 2.30 "$nccl_version" | sort -V | head -n 1)" != 2.30 ]; then
    text+="; multi-rank: SKIP (NCCL ${nccl_version:-not found}: ranks share a GPU from 2.30)"; return
  fi
  # Two ranks of B=4 each: at ZeRO they share a global batch of 8, under TP 2 both see the same 4.
  local common=(--model nano --seq-len 64 --max-steps 4 --dtype fp32 "${quiet[@]}") flag value reference
  if ! train one-b8 "${common[@]}" --batch-size 8 || ! train one-b4 "${common[@]}" --batch-size 4; then
    status=FAIL; text+="; one-rank references failed (logs/large/one-b*.log)"; return
  fi
  for mode in zero:1 zero:3 tp:2; do
    flag=--${mode%:*} value=${mode#*:} reference=one-b8
    [ "$flag" = --tp ] && reference=one-b4
    [ "$(left)" -gt 20 ] || { text+="; $flag $value: no time left"; continue; }
    pids=()
    for rank in 0 1; do
      SLURM_NTASKS=2 SLURM_PROCID=$rank SLURM_LOCALID=$rank NCCL_MULTI_RANK_GPU_ENABLE=1 \
        limited "$trainer" "${common[@]}" --batch-size 4 "$flag" "$value" --rendezvous "file:$work/rendezvous-$mode" \
        --out-dir "$work/ranks-$mode" > "$logs/large/ranks-$mode-$rank.log" 2>&1 &
      pids+=($!)
    done
    if ! wait "${pids[0]}" || ! wait "${pids[1]}"; then
      status=FAIL; text+="; 2 ranks $flag $value: failed (logs/large/ranks-$mode-*.log)"; continue
    fi
    loss=$(py 'import json, sys
a, b = ([json.loads(l) for l in open(p) if "train_loss" in l] for p in sys.argv[1:3])
print("%.3g" % max(abs(x[k] - y[k]) / abs(y[k]) for x, y in zip(a, b) for k in ("train_loss", "grad_norm")))' \
      "$work/ranks-$mode/metrics.jsonl" "$work/$reference/metrics.jsonl") || { status=FAIL; loss=unreadable; }
    text+="; 2 ranks $flag $value against one: max rel err $loss over 4 steps"
    figures+=("ranks_${mode/:/}=$loss")
  done
}

run_stage() {
  local name=$1 order=0 s start
  for s in "${all_stages[@]}"; do [ "$s" = "$name" ] && break; order=$((order + 1)); done
  status=FAIL text="" figures=()
  rm -rf "${logs:?}/$name" && mkdir -p "$logs/$name"
  start=$(date +%s.%N)
  if [ "$(left)" -lt "${estimate[$name]}" ]; then
    status=SKIP; text="its estimate of ${estimate[$name]} s does not fit the $(left) s left of $budget"
  else
    stage=$name
    "stage_$name"
  fi
  [ "$(left)" -le 2 ] && [ "$status" != SKIP ] && text+=" (cut: the $budget s budget ran out)"
  report record "$out" "$name" "$order" "$status" "$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')" \
    "$text" "estimate_s=${estimate[$name]}" "${figures[@]}" > /dev/null
  report summary "$out" "GPU quick run ($budget s)" > /dev/null
  echo "STAGE $name: $status${text:+ ($text)}"
}

read -r -a stages <<< "${QUICK_STAGES:-${all_stages[*]}}"
for s in "${stages[@]}"; do [ -n "${estimate[$s]:-}" ] || die "unknown stage '$s' in QUICK_STAGES (stages: ${all_stages[*]})"; done
rm -f "$out"/*.json "$out/summary.md"
echo "gpu_quick: $ACCEPTANCE_DEVICE; pack $pack (commit $ACCEPTANCE_COMMIT); budget $budget s; results in $out"
for s in "${stages[@]}"; do run_stage "$s"; done
echo "gpu_quick: done in $(( $(date +%s) - started )) s of $budget: $out/summary.md"
grep -q '| FAIL |' "$out/summary.md" && exit 1
exit 0
