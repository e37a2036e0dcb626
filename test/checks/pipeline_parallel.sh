#!/usr/bin/env bash
# Pipeline parallelism (--pp) in the trainer against one process with the same global batch, on
# the tiny reference model (GPT-2, L = 2, tied embeddings: wte on the first and the last stage),
# 3 steps of 3 micro-batches: PP 2 with zb-h1, PP 2 x DP 2 with 1f1b at ZeRO 1 (the first stage at
# --recompute 3, the last at 0: --pp-recompute), and TP 2 x PP 2
# with sequence parallelism and gpipe (4 ranks), fp32, must reproduce the one-process per-step
# losses, gradient norms and validation losses within 1e-5, and PP 2 in bf16 within 2e-3 (the
# data-parallel checks' tolerance); the TP 2 x PP 2 run's step-2 checkpoint resumes on one rank
# and a one-process checkpoint on PP 2 (resharded by the whole model's parameter index), each
# reproducing step 3; the model file a PP 2 run writes (gathered from both stages) gives its last
# validation loss on one process; Llama (llama-micro: untied, GQA) at PP 2 with interleaved
# (2 chunks per rank) matches its one-process run; HellaSwag-style evaluation of a PP 2 run equals
# one process's; --profile records each stage's measured idle share beside --plan's bubble. Every
# schedule, PP 4 and Llama tied are covered at the model level by test/mpi/mpi_pipeline.cu.
# usage: pipeline_parallel.sh cpu|gpu   (gpu: needs 4 GPUs, else skipped)
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"
require_ranks 4

common=(--init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$ref/train.bin" --val-every 2
        --val-steps 1 --seq-len 16 --max-steps 3 --lr 1e-3 --warmup-steps 0 --lr-schedule linear --bucket-mib 0.1
        --total-batch-tokens 96)
run single 1 --dtype fp32 --batch-size 2 --checkpoint-every 2
run zb 2 --dtype fp32 --batch-size 2 --pp 2 --pp-schedule zb-h1 --recompute 0 && same_steps single zb 1e-5
run dp_pp 4 --dtype fp32 --batch-size 1 --pp 2 --zero 1 --pp-recompute 3,0 && same_steps single dp_pp 1e-5
run tp_pp 4 --dtype fp32 --batch-size 2 --pp 2 --tp 2 --sequence-parallel 1 --pp-schedule gpipe --checkpoint-every 2 &&
  same_steps single tp_pp 1e-5
run single_bf16 1 --batch-size 2 --save 0 && run pp_bf16 2 --batch-size 2 --pp 2 --save 0 &&
  same_steps single_bf16 pp_bf16 2e-3

# step3_matches NAME: run NAME's step 3 (train and validation) equals the single run's within 1e-5.
step3_matches() {
  "$python" - "$tmp/single/metrics.jsonl" "$tmp/$1/metrics.jsonl" <<'PY' || fail "$1: step 3 differs from one process"
import json, sys
a, b = ({("val" if "val_loss" in r else "train", r["step"]): r for r in map(json.loads, open(p)) if "step" in r}
        for p in sys.argv[1:3])
keys = [k for k in b if k[1] == 3]
worst = max((abs(b[k][f] - a[k][f]) / abs(a[k][f]) for k in keys for f in ("train_loss", "grad_norm", "val_loss")
             if f in b[k]), default=1.0)
print(f"  {sys.argv[2].split('/')[-2]}: step 3 worst relative difference {worst:.2e} over {len(keys)} records")
sys.exit(0 if len(keys) == 2 and worst <= 1e-5 else 1)
PY
}
run resumed_on_1 1 --dtype fp32 --batch-size 2 --save 0 --resume "$tmp/tp_pp/checkpoint_00000002" && step3_matches resumed_on_1
run resumed_on_pp 2 --dtype fp32 --batch-size 2 --pp 2 --save 0 --resume "$tmp/single/checkpoint_00000002" &&
  step3_matches resumed_on_pp

# The PP 2 run's model.bin, read by one process, gives the run's last validation loss.
if "$bin" --init-from "$tmp/zb/model.bin" --val-data "$ref/train.bin" --val-steps 1 --seq-len 16 --batch-size 2 \
    --dtype fp32 --max-steps 0 >"$tmp/reload.log" 2>&1; then
  "$python" - "$tmp/zb/metrics.jsonl" "$tmp/reload.log" <<'PY' || fail "zb: its model.bin does not give its last validation loss"
import json, re, sys
last = [json.loads(l)["val_loss"] for l in open(sys.argv[1]) if "val_loss" in l][-1]
got = float(re.search(r"val loss ([0-9.]+)", open(sys.argv[2]).read()).group(1))
print(f"  model.bin of PP 2: val loss {got:.6f}, the run's last {last:.6f}")
sys.exit(0 if abs(got - last) <= 1e-5 * abs(last) else 1)
PY
else
  fail "reload of the PP 2 model.bin exited non-zero"; tail -n 5 "$tmp/reload.log"
fi

# --profile under PP 2 (1f1b, 4 micro-batches): profile.json records each stage's measured idle
# share beside the schedule's bubble at unit costs, which is the one --plan prints for the run.
profile_flags=(--init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$ref/train.bin" --seq-len 16
               --batch-size 2 --total-batch-tokens 128 --pp 2 --dtype fp32)
if mpirun -np 2 "${mpi_opts[@]}" "$bin" "${profile_flags[@]}" --profile 2 --out-dir "$tmp/profile" >"$tmp/profile.log" 2>&1 &&
    "$bin" "${profile_flags[@]}" --plan --world-size 2 >"$tmp/profile.plan" 2>&1; then
  "$python" - "$tmp/profile/profile.json" "$tmp/profile.plan" <<'PY' || fail "--profile's pipeline record"
import json, re, sys
p = json.load(open(sys.argv[1]))["pipeline"]
planned = float(re.search(r"bubble \(unit costs\): ([0-9.]+)%", open(sys.argv[2]).read()).group(1))
idle = p["measured_idle_per_stage"]
print(f"  profile: idle per stage {[round(100 * x, 1) for x in idle]}, planned bubble {100 * p['planned_bubble']:.1f}% (--plan: {planned}%)")
ok = p["stages"] == 2 and len(idle) == 2 and all(0 < x < 1 for x in idle) and abs(100 * p["planned_bubble"] - planned) < 0.06
sys.exit(0 if ok else 1)
PY
else
  fail "--profile 2 at PP 2 or its --plan exited non-zero"; tail -n 5 "$tmp/profile.log"
fi

# Everything else a run does under PP 2, on a GPT-2-vocabulary model: HellaSwag-style evaluation
# (the last stage's losses shared with every stage), greedy samples (rank 0 decodes from the
# parameters gathered over the stages) and validation equal one process's.
model=$tmp/gpt2vocab
"$python" dev/gpt2_reference.py --out "$model" --vocab 50257 --layers 2 --heads 4 --channels 32 --max-seq-len 64 \
  --batch 1 --seq-len 8 --steps 4 >/dev/null 2>&1 || fail "dev/gpt2_reference.py could not write the model"
"$python" - "$tmp/eval.bin" <<'PY' || fail "writing the eval file"
import sys
import numpy as np
sys.path.insert(0, "test/checks/lib")
from eval_file import write_eval_file
rng = np.random.default_rng(3)
write_eval_file(sys.argv[1], [(i % 2, rng.integers(0, 50257, 3).tolist(),
                               [rng.integers(0, 50257, 2).tolist() for _ in range(2 + i % 2)]) for i in range(4)])
PY
common=(--init-from "$model/model.bin" --train-data "$model/train.bin" --val-data "$model/train.bin" --val-every 2
        --val-steps 1 --batch-size 2 --seq-len 8 --max-steps 2 --lr 1e-2 --warmup-steps 0 --eval-data "$tmp/eval.bin"
        --eval-every 2 --sample-every 2 --prompt "Once upon" --max-new-tokens 6 --temperature 0 --dtype fp32
        --total-batch-tokens 32)
if run all_ref 1 && run all_pp2 2 --pp 2; then
  "$python" - "$tmp/all_ref/metrics.jsonl" "$tmp/all_pp2/metrics.jsonl" <<'PY' || fail "PP 2's evaluation, sample or validation differ from one process's"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
def pick(rs, key): return [r[key] for r in rs if key in r]
bad = False
for key in ("sample", "hellaswag_acc", "hellaswag_acc_norm"):
    if pick(a, key) != pick(b, key) or not pick(a, key): print(f"  {key}: {pick(a, key)} vs {pick(b, key)}"); bad = True
for key in ("val_loss", "train_loss"):
    for x, y in zip(pick(a, key), pick(b, key)):
        if abs(x - y) > 1e-5 * abs(x): print(f"  {key}: {x} vs {y}"); bad = True
sys.exit(1 if bad else 0)
PY
fi

# Llama (llama-micro: 4 layers, untied lm head, one K/V head) at PP 2 with interleaved, 2 chunks per
# rank (layers 0 and 2 on rank 0, 1 and 3 on rank 1), on Llama 3 token shards.
if [ -s data/llama3_bpe/tokenizer.model ]; then
  ./tokenize --encoding llama3 --out-dir "$tmp/llama" --name doc --val-tokens 2000 docs/*.md README.md >/dev/null 2>&1 ||
    fail "tokenize --encoding llama3"
  common=(--model llama-micro --train-data "$tmp/llama/doc_train_*.bin" --val-data "$tmp/llama/doc_val_*.bin"
          --seq-len 16 --batch-size 1 --total-batch-tokens 32 --max-steps 3 --val-every 2 --val-steps 1 --dtype fp32
          --seed 7 --save 0)
  run llama_single 1 && run llama_interleaved 2 --pp 2 --pp-schedule interleaved --pp-virtual 2 &&
    same_steps llama_single llama_interleaved 1e-5
else
  echo "  Llama part skipped: Llama 3's vocabulary is missing (scripts/install_deps.sh)"
fi

[ "$failures" -eq 0 ] && echo "pipeline_parallel: PP 2 (zb-h1, bf16), PP 2 x DP 2, TP 2 x PP 2, Llama interleaved match one process; resumes across --pp; model.bin, eval and samples"
exit $((failures > 0))
