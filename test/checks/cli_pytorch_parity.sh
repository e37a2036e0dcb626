#!/usr/bin/env bash
# The binary, end to end, against PyTorch: a fresh reference (a model and data the binary has
# never seen) trained for 10 steps by dev/gpt2_reference.py, then by the binary through its
# CLI in both dtypes; per-step train_loss and grad_norm must agree (fp32: max rel err 1e-4,
# bf16: 2e-2). Two shapes: "small" (300 tokens, B·T = 32) and "hot" (8 tokens, B·T = 512), where
# every micro-batch has a token at more than 128 positions (checked here), so the encoder backward
# sums its bucket in segments and combines them (kernels/encoder.cuh). And as one rank, so tensor
# parallelism: fp32 on 2 ranks with --tp 2 (sequence parallel; "hot"'s 8 tokens all sit in one
# rank's vocabulary rows, the other's logits are padding alone) against the same reference, where
# mpirun is present (on a GPU machine with 2 GPUs or more). And the lm head in chunks that do not
# divide B·T: "chunked" (B·T = 1,536) under a --gpu-memory that makes the memory plan choose
# 1,024-row chunks (1,024 + 512 rows; profile.json shows the run's), fp32, 2 steps.
# usage: cli_pytorch_parity.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin"

steps=10
mpi_opts=(--oversubscribe -x SIMT_THREADS=1)
[ "$(id -u)" -eq 0 ] && mpi_opts+=(--allow-run-as-root)
# The reference's optimizer and schedule, as flags.
adamw=(--lr 1e-3 --lr-schedule constant --warmup-steps 0 --weight-decay 0.1 --grad-clip 1.0 --beta1 0.9 --beta2 0.95
       --adam-eps 1e-8 --val-every 0)

# compare REFERENCE_JSON METRICS TOLERANCE NAME: per-step train_loss and grad_norm against the
# reference's, within TOLERANCE relative.
compare() {
  "$python" - "$@" <<'EOF' || failures=$((failures + 1))
import json, math, sys
reference = json.load(open(sys.argv[1]))
records = [r for r in map(json.loads, open(sys.argv[2])) if "train_loss" in r]
tol, dtype = float(sys.argv[3]), sys.argv[4]
ok = True
for key, ref_key in (("train_loss", "losses"), ("grad_norm", "grad_norms")):
    want, got = reference[ref_key], [r[key] for r in records]
    if len(got) != len(want):
        print(f"FAIL: {dtype}: {len(got)} train records, reference has {len(want)} steps"); sys.exit(1)
    errs = [abs(g - w) / abs(w) if g is not None and math.isfinite(g) else math.inf for g, w in zip(got, want)]
    for k, (g, w, e) in enumerate(zip(got, want, errs), 1):
        print(f"  {dtype} step {k:2d} {key}: train_gpt {g:.7f}  pytorch {w:.7f}  rel err {e:.1e}")
    worst = max(errs)
    print(f"{'ok' if worst <= tol else 'FAIL'}: {dtype} {key}: max rel err {worst:.2e} (limit {tol:g})")
    ok = ok and worst <= tol
sys.exit(0 if ok else 1)
EOF
}

for config in "small 300 2 16 32" "hot 8 8 64 64"; do
  read -r name vocab batch seq_len max_seq_len <<<"$config"
  dir=$tmp/$name
  if ! "$python" dev/gpt2_reference.py --out "$dir" --layers 3 --heads 2 --channels 48 --vocab "$vocab" \
      --max-seq-len "$max_seq_len" --batch "$batch" --seq-len "$seq_len" --steps $steps --seed 4242 --lr 1e-3 \
      --weight-decay 0.1 --grad-clip 1.0; then
    echo "FAIL: dev/gpt2_reference.py failed ($name)"; exit 1
  fi
  if [ "$name" = hot ] && ! "$python" - "$dir/train.bin" $((batch * seq_len)) $steps <<'EOF'; then
import collections, struct, sys
data = open(sys.argv[1], "rb").read()
count = struct.unpack_from("<3i", data)[2]
tokens = struct.unpack_from(f"<{count}H", data, 1024)
rows, steps = int(sys.argv[2]), int(sys.argv[3])
hottest = [max(collections.Counter(tokens[k * rows:(k + 1) * rows]).values()) for k in range(steps)]
print(f"hot: the most positions of one token per micro-batch: {hottest}")
sys.exit(0 if min(hottest) > 128 else 1)
EOF
    echo "FAIL: hot: a micro-batch has no token at more than 128 positions"; failures=$((failures + 1))
  fi

  tp_ranks=0
  if command -v mpirun >/dev/null && { [ "$mode" = cpu ] || [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -ge 2 ]; }; then
    tp_ranks=2
  fi
  for spec in "fp32 1e-4 1" "bf16 2e-2 1" "fp32 1e-4 $tp_ranks"; do
    read -r dtype tol ranks <<<"$spec"
    launch=("$bin")
    case $ranks in
      0) continue ;;
      2) launch=(mpirun -np 2 "${mpi_opts[@]}" "$bin" --tp 2) dtype=fp32-tp2 ;;
    esac
    if ! "${launch[@]}" --init-from "$dir/model.bin" --train-data "$dir/train.bin" --dtype "${dtype%%-*}" --shuffle 0 \
        --batch-size "$batch" --seq-len "$seq_len" --max-steps $steps "${adamw[@]}" \
        --out-dir "$dir/run_$dtype" >"$dir/$dtype.log" 2>&1; then
      echo "FAIL: $name $dtype run exited non-zero:"; cat "$dir/$dtype.log"; failures=$((failures + 1)); continue
    fi
    compare "$dir/reference.json" "$dir/run_$dtype/metrics.jsonl" "$tol" "$name $dtype"
  done
done

# The lm head in chunks that do not divide B·T (1,536 rows): --gpu-memory is --plan's total with
# one 1,536-row chunk less 384 KiB (half of what a 512-row chunk of fp32 logits, Vp = 384, takes),
# so the plan takes 1,024-row chunks, 1,024 + 512 rows.
dir=$tmp/chunked
if "$python" dev/gpt2_reference.py --out "$dir" --layers 2 --heads 2 --channels 32 --vocab 300 --max-seq-len 64 \
    --batch 24 --seq-len 64 --steps 2 --seed 4243 --lr 1e-3 --weight-decay 0.1 --grad-clip 1.0; then
  chunked=(--init-from "$dir/model.bin" --train-data "$dir/train.bin" --dtype fp32 --shuffle 0 --batch-size 24
           --seq-len 64 "${adamw[@]}")
  budget=$("$bin" --plan "${chunked[@]}" --gpu-memory 1000 | "$python" -c '
import re, sys
m = re.search(r"total per rank +([0-9.]+) (B|KiB|MiB|GiB)", sys.stdin.read())
scale = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[m[2]]
print((float(m[1]) * scale - 3 * 2**17) / 2**30)')
  if "$bin" "${chunked[@]}" --profile 2 --gpu-memory "$budget" --out-dir "$dir/run" >"$dir/run.log" 2>&1; then
    "$python" - "$dir/run/profile.json" <<'EOF' || fail "chunked: the run's lm head is not 2 chunks of 1,024 rows"
import json, sys
plan = json.load(open(sys.argv[1]))["plan"]
chunks, rows = plan["lm_head_chunks_per_micro_step"], plan["lm_head_chunk_rows"]
print(f"chunked: the lm head in {chunks} chunks of {rows} rows per micro-step of 1536")
sys.exit(0 if (chunks, rows) == (2, 1024) else 1)
EOF
    compare "$dir/reference.json" "$dir/run/metrics.jsonl" 1e-4 "chunked fp32"
  else
    fail "chunked: the run exited non-zero"; tail -n 20 "$dir/run.log"
  fi
else
  fail "dev/gpt2_reference.py failed (chunked)"
fi
[ "$failures" -eq 0 ]
