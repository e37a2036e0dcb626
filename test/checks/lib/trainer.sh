# Shared start of the end-to-end checks that run the trainer. A check begins with
#   source "$(dirname "$0")/lib/trainer.sh" "$@"
# and gets: the repository root as working directory, mode (cpu|gpu, the first argument), bin
# (./train_gpt_cpu or ./train_gpt; $TRAIN_GPT when set, e.g. an older build to show a check
# fails on it), python (the interpreter with torch: $PYTHON when set, as make
# gpu-acceptance sets it on a GPU machine, else /usr/bin/python3), ref (the tiny PyTorch
# reference that make test generates), tmp (a directory removed at exit), failures and fail(),
# require_files to stop early when something make test builds is missing, and with_flags to vary
# a set of flags (the trainer refuses a flag given twice), wait_for_steps to wait for a running
# trainer's N-th step, require_ranks for checks that run several ranks under mpirun, for checks
# that compare runs: run (one run of the check's `common` flags), same_steps, same_step3 (a resumed
# run's last step) and, on a GPT-2-vocabulary model with an eval file (write_gpt2vocab_eval),
# same_eval_and_samples; and for checks that nothing on disk changed or that a run is refused:
# tree_digest, train_steps and expect_refused.
# shellcheck shell=bash disable=SC2034
cd "$(dirname "${BASH_SOURCE[0]}")/../../.." || exit 1
mode=${1:-cpu}
bin=${TRAIN_GPT:-./train_gpt_cpu}
[ "$mode" = gpu ] && bin=${TRAIN_GPT:-./train_gpt}
python=${PYTHON:-/usr/bin/python3}
ref=build/reference/tiny
require_files() {
  local f
  for f in "$@"; do
    [ -e "$f" ] || { echo "FAIL: $f is missing (make test builds it)"; exit 1; }
  done
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# Every file's md5 and every path below DIR: equal before and after only if nothing was written,
# replaced, removed or created there.
tree_digest() { (cd "$1" && find . -type f -print0 | sort -z | xargs -0 md5sum; find . | sort); }

# The steps of DIR/metrics.jsonl's training records, space-separated.
train_steps() {
  "$python" -c 'import json, sys; print(*[json.loads(l)["step"] for l in open(sys.argv[1]) if "train_loss" in l])' \
    "$1/metrics.jsonl"
}

# expect_refused NAME PATTERN FLAGS...: a run exits non-zero with one line on stderr matching PATTERN
# (extended regular expression) and trains no step.
expect_refused() {
  local name=$1 pattern=$2
  shift 2
  if "$bin" "$@" >"$tmp/refused.log" 2>"$tmp/refused.err"; then
    fail "$name: exited 0"
    return
  fi
  { [ "$(wc -l <"$tmp/refused.err")" -eq 1 ] && grep -qE "$pattern" "$tmp/refused.err"; } ||
    fail "$name: expected one line matching '$pattern', got: $(cat "$tmp/refused.err")"
  ! grep -q '^step ' "$tmp/refused.log" || fail "$name: it trained"
}

# The flags of the array named BASE (--flag value pairs) with each flag of OVERRIDES in place of
# BASE's of the same name, then OVERRIDES: sets the array `flags`.  usage: with_flags BASE OVERRIDES...
with_flags() {
  local -n base=$1
  shift
  flags=()
  local i o keep
  for ((i = 0; i < ${#base[@]}; i += 2)); do
    keep=1
    for o in "$@"; do [[ $o == --* && ${o%%=*} == "${base[i]}" ]] && keep=0; done
    [ $keep -eq 0 ] || flags+=("${base[i]}" "${base[i + 1]}")
  done
  flags+=("$@")
}

# Waits (up to 60 s) until DIR/metrics.jsonl holds N training records.
wait_for_steps() {
  for _ in $(seq 600); do
    [ "$(grep -c train_loss "$1/metrics.jsonl" 2>/dev/null)" -ge "$2" ] 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# For checks that run N ranks under mpirun: skips (exit 77) on a GPU machine with fewer than N
# GPUs, fails without mpirun, sets mpi_opts (mpirun's options: one simt thread per rank, as root
# too) and clears any launcher identity inherited from the calling environment.
require_ranks() {
  command -v mpirun >/dev/null || { echo "FAIL: mpirun not found"; exit 1; }
  if [ "$mode" = gpu ] && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -lt "$1" ]; then
    echo "skipped: needs at least $1 GPUs"; exit 77
  fi
  mpi_opts=(--oversubscribe -x SIMT_THREADS=1)
  [ "$(id -u)" -eq 0 ] && mpi_opts+=(--allow-run-as-root)
  export SIMT_THREADS=1
  unset OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_LOCAL_RANK SLURM_NTASKS SLURM_PROCID SLURM_LOCALID
}

# run NAME RANKS ARGS...: one training run of the check's `common` flags and ARGS (RANKS 1: without
# mpirun; more: under mpirun with mpi_opts) into $tmp/NAME, its output in $tmp/NAME.log.
run() {
  local name=$1 ranks=$2; shift 2
  local cmd=("$bin" "${common[@]}" --out-dir "$tmp/$name" "$@")
  [ "$ranks" -gt 1 ] && cmd=(mpirun -np "$ranks" "${mpi_opts[@]}" "${cmd[@]}")
  if ! "${cmd[@]}" >"$tmp/$name.log" 2>&1; then
    fail "$name: exited non-zero"; tail -n 20 "$tmp/$name.log"; return 1
  fi
}

# tiny_mixtrals: the Mixtrals of dev/mixtral_reference.py that make test builds, in $mref (softmax
# router) and $sref (sigmoid router), and in `common` the fp32 runs of 3 steps on $mref that the
# expert checks compare (validation at steps 2 and 3, nothing saved).
tiny_mixtrals() {
  mref=build/reference/mixtral
  sref=build/reference/mixtral-sigmoid
  require_files "$bin" "$mref/model.bin" "$mref/train.bin" "$sref/model.bin"
  common=(--init-from "$mref/model.bin" --train-data "$mref/train.bin" --val-data "$mref/train.bin" --dtype fp32
          --shuffle 0 --batch-size 1 --seq-len 32 --lr 1e-3 --lr-schedule constant --warmup-steps 0
          --max-steps 3 --val-every 2 --val-steps 1 --save 0)
}

# plan_matches NAME RANKS KINDS FLAGS...: run NAME (RANKS ranks, `common` with FLAGS) measured what
# --plan plans for the same flags: for each line kind of KINDS (';'-separated, e.g. "expert-parallel
# communication;communication"), --plan's line and the run's "measured ..." line say the same, and
# the plan has a line of the first kind.
plan_matches() {
  local name=$1 ranks=$2 kind planned measured
  local -a kinds
  IFS=';' read -r -a kinds <<<"$3"
  shift 3
  with_flags common "$@" --plan --world-size "$ranks"
  "$bin" "${flags[@]}" >"$tmp/$name.plan" 2>&1
  grep -q "^${kinds[0]}" "$tmp/$name.plan" || fail "$name: --plan has no ${kinds[0]} line"
  for kind in "${kinds[@]}"; do
    planned=$(grep "^$kind" "$tmp/$name.plan" | sed 's/.*: //')
    measured=$(grep "^measured $kind" "$tmp/$name.log" | sed 's/.*: //')
    [ "$planned" = "$measured" ] || fail "$name: --plan's $kind '$planned', measured '$measured'"
  done
}

# same_steps REFERENCE OTHER REL: the per-step train_loss and grad_norm of runs REFERENCE and OTHER
# (run's NAMEs), and their validation losses (steps 2 and 3 of 3 at --val-every 2), agree within REL.
same_steps() {
  "$python" - "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl" "$3" <<'PY' || fail "$2 differs from $1"
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
rel = float(sys.argv[3])
bad = len(a) != len(b) or len(a) != 5
worst = 0.0
for x, y in zip(a, b):
    for key in ("val_loss",) if "val_loss" in x else ("train_loss", "grad_norm"):
        d = abs(x[key] - y[key]) / abs(x[key])
        worst = max(worst, d)
        if d > rel:
            print(f"  step {x['step']} {key}: {x[key]} vs {y[key]} (relative {d:.2e} > {rel})"); bad = True
print(f"  {sys.argv[2].split('/')[-2]}: worst relative difference {worst:.2e}")
sys.exit(1 if bad else 0)
PY
}

# same_routing REFERENCE OTHER REL: the per-step router figures of runs REFERENCE and OTHER: the
# tokens each expert got, exactly, and the auxiliary loss within REL.
same_routing() {
  "$python" - "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl" "$3" <<'PY' || fail "$2's routing differs from $1's"
import json, sys
a, b = ([r for r in map(json.loads, open(p)) if "expert_tokens" in r] for p in sys.argv[1:3])
rel = float(sys.argv[3])
bad = len(a) != len(b) or not a
for x, y in zip(a, b):
    d = abs(x["aux_loss"] - y["aux_loss"]) / max(abs(x["aux_loss"]), 1e-30)
    if x["expert_tokens"] != y["expert_tokens"] or d > rel:
        print(f"  step {x['step']}: tokens {x['expert_tokens']} vs {y['expert_tokens']}, aux {x['aux_loss']} vs "
              f"{y['aux_loss']}"); bad = True
sys.exit(1 if bad else 0)
PY
}

# same_step3 REFERENCE OTHER: run OTHER's step 3 (training and validation: a run resumed from step
# 2's checkpoint) equals run REFERENCE's within 1e-5.
same_step3() {
  "$python" - "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl" <<'PY' || fail "$2: step 3 differs from $1's"
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

# write_gpt2vocab_eval: a 2-layer model of GPT-2's vocabulary with its token shard in $tmp/gpt2vocab
# (dev/gpt2_reference.py) and a HellaSwag-style eval file of 4 random examples in $tmp/eval.bin.
write_gpt2vocab_eval() {
  "$python" dev/gpt2_reference.py --out "$tmp/gpt2vocab" --vocab 50257 --layers 2 --heads 4 --channels 32 \
    --max-seq-len 64 --batch 1 --seq-len 8 --steps 4 >/dev/null 2>&1 || fail "dev/gpt2_reference.py could not write the model"
  "$python" - "$tmp/eval.bin" <<'PY' || fail "writing the eval file"
import sys
import numpy as np
sys.path.insert(0, "test/checks/lib")
from eval_file import write_eval_file
rng = np.random.default_rng(3)
write_eval_file(sys.argv[1], [(i % 2, rng.integers(0, 50257, 3).tolist(),
                               [rng.integers(0, 50257, 2).tolist() for _ in range(2 + i % 2)]) for i in range(4)])
PY
}

# same_eval_and_samples REFERENCE OTHER: runs REFERENCE and OTHER recorded the same samples and
# HellaSwag accuracies, and training and validation losses within 1e-5.
same_eval_and_samples() {
  "$python" - "$tmp/$1/metrics.jsonl" "$tmp/$2/metrics.jsonl" <<'PY' || fail "$2's evaluation, sample or validation differ from $1's"
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
}
