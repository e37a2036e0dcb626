#!/usr/bin/env bash
# The recipes (scripts/run_gpt2_*.sh, scripts/run_gpt3_6.7B.sh, scripts/run_llama3_*.sh over
# scripts/lib/recipe.sh):
#   - a missing binary, missing shards or a missing HellaSwag file: exit 1 with one line naming it;
#   - PLAN=1: the binary itself (train_gpt_cpu --plan) accepts every flag the recipe passes, checks
#     the total batch against 8 ranks, and the plan fits an 80 GiB GPU;
#   - the command is printed, then run as printed (a stand-in binary, mpirun and srun on PATH echo
#     their arguments): each launcher's form, flags given to the recipe replace its own
#     (--init-from replaces --model), --resume auto, and the micro-batch follows the rank count;
#   - numeric flag values (and SLURM_RESTART_COUNT) are checked as numbers before any arithmetic;
#   - the Llama 3 recipes: Llama 3 token shards and HellaSwag file by default, their plans (1B on
#     8 ranks, 8B on 16 at T = 8192) fit 80 GiB, and scripts/slurm/llama3_8b.sbatch starts the 8B
#     recipe under srun on 16 tasks;
#   - the Llama 3.1 70B recipe: TP 8 x PP 4 on 32 ranks, its plan, a rank count TP x PP does not
#     divide refused in one line, and scripts/slurm/llama3_70b.sbatch starting it on 32 tasks.
# usage: recipes.sh cpu|gpu   (gpu: skipped; the scripts are the same for both builds)
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
[ "$mode" = cpu ] || { echo "skipped: the CPU build runs the recipe check"; exit 77; }
require_files "$bin"
unset "${!SLURM_@}" TRAIN_GPT DATA_DIR EVAL_DATA OUT_DIR NPROC LAUNCHER PLAN GPU_MEMORY MPIRUN_ARGS SRUN_ARGS

# Stand-ins that print how they were called.
mkdir -p "$tmp/bin" "$tmp/data"
for tool in mpirun srun train_gpt; do
  printf '#!/bin/sh\necho "%s called:" "$@"\n' "$tool" >"$tmp/bin/$tool"
  chmod +x "$tmp/bin/$tool"
done
touch "$tmp/data/fw_train_000001.bin" "$tmp/data/fw_val_000000.bin" "$tmp/hellaswag.bin"
stub_env=(env PATH="$tmp/bin:$PATH" TRAIN_GPT="$tmp/bin/train_gpt" DATA_DIR="$tmp/data" EVAL_DATA="$tmp/hellaswag.bin"
          OUT_DIR="$tmp/out")

# expect_one_line NAME PATTERN CMD...: CMD exits 1 and prints exactly one line, matching PATTERN.
expect_one_line() {
  local name=$1 pattern=$2 status=0 before=$failures; shift 2
  "$@" >"$tmp/out.log" 2>&1 || status=$?
  [ "$status" -eq 1 ] || fail "$name: exit status $status, expected 1"
  [ "$(wc -l <"$tmp/out.log")" -eq 1 ] || fail "$name: $(wc -l <"$tmp/out.log") lines, expected one"
  grep -qE "$pattern" "$tmp/out.log" || fail "$name: output does not match '$pattern'"
  [ "$failures" -eq "$before" ] || cat "$tmp/out.log"
}

# count FLAG FILE: how often FLAG occurs as a word in FILE's last line (the launched command).
count() { tail -n 1 "$2" | tr ' ' '\n' | grep -cx -- "$1"; }

for size in 124M 350M 774M 1558M; do
  recipe=scripts/run_gpt2_$size.sh
  [ -x "$recipe" ] || { fail "$recipe is missing or not executable"; continue; }

  expect_one_line "$size missing binary" "^gpt2_$size: train_gpt binary '$tmp/nothing' not found" \
    env TRAIN_GPT="$tmp/nothing" "$recipe"
  expect_one_line "$size missing shards" "^gpt2_$size: no shards match '$tmp/none/\*_train_\*.bin'" \
    env TRAIN_GPT="$bin" DATA_DIR="$tmp/none" "$recipe"
  expect_one_line "$size missing HellaSwag" "^gpt2_$size: --eval-data '$tmp/none.bin' not found" \
    env TRAIN_GPT="$bin" DATA_DIR="$tmp/data" EVAL_DATA="$tmp/none.bin" "$recipe"

  # The real binary's --plan parses and checks every flag (any unknown flag, a total batch that is
  # not a multiple of B x T x 8 ranks, T above the model's: exit 1).
  if env TRAIN_GPT="$bin" PLAN=1 "$recipe" >"$tmp/plan.log" 2>&1; then
    head -n 1 "$tmp/plan.log" | grep -q "^gpt2_$size: memory plan for 8 rank(s)" || fail "$size: no plan command line"
    grep -q "ZeRO stage 1 over 8 rank(s)" "$tmp/plan.log" || fail "$size: plan not for ZeRO-1 over 8 ranks"
    grep -qE "^  total per rank .* of 80.00 GiB: fits$" "$tmp/plan.log" || fail "$size: does not fit 80 GiB"
  else
    fail "$size: train_gpt --plan refused the recipe's flags"; cat "$tmp/plan.log"
  fi

  # The printed command is the one run; the caller's flags replace the recipe's.
  if "${stub_env[@]}" LAUNCHER=none NPROC=1 "$recipe" --lr 1e-4 --init-from m.bin >"$tmp/run.log" 2>&1; then
    printed=$(head -n 1 "$tmp/run.log") launched=$(tail -n 1 "$tmp/run.log")
    words=()
    eval "words=(${printed#"gpt2_$size: "})"  # the printed line, as a shell reads it
    [ "${words[*]:1}" = "${launched#"train_gpt called: "}" ] || fail "$size: printed '$printed', ran '$launched'"
    for flag in --lr --init-from --out-dir --resume --train-data --val-data --eval-data --eval-every \
                --total-batch-tokens --batch-size; do
      [ "$(count "$flag" "$tmp/run.log")" -eq 1 ] || fail "$size: $flag given $(count "$flag" "$tmp/run.log") times"
    done
    [ "$(count --model "$tmp/run.log")" -eq 0 ] || fail "$size: --model kept beside --init-from"
    grep -q -- "--lr 1e-4 " "$tmp/run.log" || fail "$size: --lr 1e-4 not passed"
    grep -q -- "--resume auto" "$tmp/run.log" || fail "$size: no --resume auto"
  else
    fail "$size: the recipe failed with stand-ins"; cat "$tmp/run.log"
  fi
done

# GPT-3 6.7B: 16 ranks by default, TP 8 x DP 2; its plan fits 80 GiB and the micro-batch is
# counted over the data-parallel ranks.
recipe=scripts/run_gpt3_6.7B.sh
if env TRAIN_GPT="$bin" PLAN=1 "$recipe" >"$tmp/plan.log" 2>&1; then
  head -n 1 "$tmp/plan.log" | grep -q "^gpt3_6.7B: memory plan for 16 rank(s)" || fail "6.7B: no plan for 16 ranks"
  grep -q "ZeRO stage 1 over 16 rank(s) in tensor-parallel groups of 8 (sequence parallel)" "$tmp/plan.log" ||
    fail "6.7B: plan not for TP 8 x DP 2 at ZeRO 1"
  grep -qE "^  total per rank .* of 80.00 GiB: fits$" "$tmp/plan.log" || fail "6.7B: does not fit 80 GiB"
  grep -q "^tensor-parallel communication per optimizer step" "$tmp/plan.log" || fail "6.7B: no TP traffic line"
else
  fail "6.7B: train_gpt --plan refused the recipe's flags"; cat "$tmp/plan.log"
fi
"${stub_env[@]}" "$recipe" >"$tmp/tp.log" 2>&1
grep -q "^mpirun called: -np 16 $tmp/bin/train_gpt .*--tp 8 .*--batch-size 32" "$tmp/tp.log" ||
  { fail "6.7B: not mpirun -np 16 with --tp 8 and --batch-size 32 (2M tokens / (2048 x 2 data ranks) / 16 steps)"
    cat "$tmp/tp.log"; }
expect_one_line "6.7B on 12 ranks" "^gpt3_6.7B: --tp 8 does not divide the 12 ranks" "${stub_env[@]}" NPROC=12 "$recipe"

# Llama 3: 1B on one node of 8, 8B on 2 nodes (16 ranks), both at ZeRO 1 on Llama 3 tokens.
for spec in "1b|8|llama3.2-1b|fineweb10B_llama3|32" "8b|16|llama3.1-8b|fineweb100B_llama3|1"; do
  IFS='|' read -r size ranks preset data micro <<<"$spec"
  recipe=scripts/run_llama3_$size.sh name=llama3_$size
  [ -x "$recipe" ] || { fail "$recipe is missing or not executable"; continue; }
  expect_one_line "$name missing binary" "^$name: train_gpt binary '$tmp/nothing' not found" \
    env TRAIN_GPT="$tmp/nothing" "$recipe"
  expect_one_line "$name missing shards" "^$name: no shards match '$tmp/none/\*_train_\*.bin'" \
    env TRAIN_GPT="$bin" DATA_DIR="$tmp/none" "$recipe"
  expect_one_line "$name default HellaSwag" "^$name: --eval-data 'data/hellaswag/hellaswag_val_llama3.bin' not found" \
    env TRAIN_GPT="$bin" DATA_DIR="$tmp/data" "$recipe"
  if env TRAIN_GPT="$bin" PLAN=1 "$recipe" >"$tmp/plan.log" 2>&1; then
    head -n 1 "$tmp/plan.log" | grep -q "^$name: memory plan for $ranks rank(s)" || fail "$name: no plan for $ranks ranks"
    head -n 1 "$tmp/plan.log" | grep -qF -- "--train-data data/$data/" || fail "$name: default data is not data/$data"
    grep -q "^memory plan per rank: .* llama3 .* from preset $preset, .*ZeRO stage 1 over $ranks rank(s)$" "$tmp/plan.log" ||
      fail "$name: plan not for $preset at ZeRO 1 over $ranks ranks"
    grep -qE "^  RoPE table \(fp32\) " "$tmp/plan.log" || fail "$name: no RoPE table in the plan"
    grep -qE "^  total per rank .* of 80.00 GiB: fits$" "$tmp/plan.log" || fail "$name: does not fit 80 GiB"
  else
    fail "$name: train_gpt --plan refused the recipe's flags"; cat "$tmp/plan.log"
  fi
  "${stub_env[@]}" "$recipe" >"$tmp/llama.log" 2>&1
  grep -q "^mpirun called: -np $ranks $tmp/bin/train_gpt .*--train-data $tmp/data/\*_train_\*.bin .*--model $preset .*--batch-size $micro" "$tmp/llama.log" ||
    { fail "$name: not mpirun -np $ranks with --model $preset and --batch-size $micro"; cat "$tmp/llama.log"; }
done
# The 8B's sbatch script: srun over the job's 16 tasks, the 8B recipe.
(cd "$tmp" && "${stub_env[@]}" SLURM_SUBMIT_DIR="$OLDPWD" SLURM_JOB_ID=78 SLURM_NTASKS=16 \
  bash "$OLDPWD/scripts/slurm/llama3_8b.sbatch") >"$tmp/sbatch.log" 2>&1
grep -q "^srun called: --ntasks 16 --kill-on-bad-exit=1 $tmp/bin/train_gpt .*--model llama3.1-8b .*--batch-size 1 --rendezvous file:$tmp/out/.rendezvous-78-0-" \
  "$tmp/sbatch.log" || { fail "llama3_8b.sbatch: not srun of 16 tasks running the 8B recipe"; cat "$tmp/sbatch.log"; }

# Llama 3.1 70B: 32 ranks by default, TP 8 x PP 4 (one replica), interleaved; --plan takes its
# flags, the micro-batch is counted over the data-parallel ranks (32 / (8 x 4) = 1), and its
# sbatch script starts it under srun on 32 tasks.
recipe=scripts/run_llama3_70b.sh
if env TRAIN_GPT="$bin" PLAN=1 "$recipe" >"$tmp/plan.log" 2>&1; then
  head -n 1 "$tmp/plan.log" | grep -q "^llama3_70b: memory plan for 32 rank(s)" || fail "70B: no plan for 32 ranks"
  grep -q "^memory plan per rank: .* from preset llama3.1-70b, .*in tensor-parallel groups of 8 (sequence parallel), 4 pipeline stages$" \
    "$tmp/plan.log" || fail "70B: plan not for llama3.1-70b in TP groups of 8 and 4 pipeline stages"
  grep -q "^pipeline: interleaved, 4 stage(s) x 2 chunks, " "$tmp/plan.log" || fail "70B: plan without its pipeline's lines"
  [ "$(grep -c "^  stage [0-3]: layers " "$tmp/plan.log")" -eq 4 ] || fail "70B: plan without a line per stage"
  grep -qE "^  total per rank .* of 80.00 GiB: fits$" "$tmp/plan.log" || fail "70B: does not fit 80 GiB"
else
  fail "70B: train_gpt --plan refused the recipe's flags"; cat "$tmp/plan.log"
fi
"${stub_env[@]}" "$recipe" >"$tmp/pp.log" 2>&1
grep -q "^mpirun called: -np 32 $tmp/bin/train_gpt .*--model llama3.1-70b .*--tp 8 .*--pp 4 --pp-schedule interleaved --pp-virtual 2 .*--batch-size 1" \
  "$tmp/pp.log" || { fail "70B: not mpirun -np 32 with --tp 8 --pp 4 interleaved and --batch-size 1"; cat "$tmp/pp.log"; }
expect_one_line "70B on 16 ranks" "^llama3_70b: --tp 8 x --pp 4 does not divide the 16 ranks" "${stub_env[@]}" NPROC=16 "$recipe"
(cd "$tmp" && "${stub_env[@]}" SLURM_SUBMIT_DIR="$OLDPWD" SLURM_JOB_ID=79 SLURM_NTASKS=32 \
  bash "$OLDPWD/scripts/slurm/llama3_70b.sbatch") >"$tmp/sbatch.log" 2>&1
grep -q "^srun called: --ntasks 32 --kill-on-bad-exit=1 $tmp/bin/train_gpt .*--model llama3.1-70b .*--pp 4 .*--batch-size 1 --rendezvous file:$tmp/out/.rendezvous-79-0-" \
  "$tmp/sbatch.log" || { fail "llama3_70b.sbatch: not srun of 32 tasks running the 70B recipe"; cat "$tmp/sbatch.log"; }

# Launchers (124M): mpirun -np 8; srun with a rendezvous file in the run's folder; srun --mpi=pmix.
recipe=scripts/run_gpt2_124M.sh
"${stub_env[@]}" "$recipe" >"$tmp/mpirun.log" 2>&1
grep -q "^mpirun called: -np 8 $tmp/bin/train_gpt .*--batch-size 64" "$tmp/mpirun.log" ||
  { fail "default launcher: not mpirun -np 8 with --batch-size 64"; cat "$tmp/mpirun.log"; }
"${stub_env[@]}" SLURM_JOB_ID=77 SLURM_NTASKS=16 "$recipe" >"$tmp/srun.log" 2>&1
grep -q "^srun called: --ntasks 16 --kill-on-bad-exit=1 $tmp/bin/train_gpt .*--batch-size 32 --rendezvous file:$tmp/out/.rendezvous-77-0-" \
  "$tmp/srun.log" || { fail "in a SLURM job: not srun of 16 tasks, --batch-size 32, a rendezvous file"; cat "$tmp/srun.log"; }
"${stub_env[@]}" LAUNCHER=srun-pmix NPROC=4 "$recipe" >"$tmp/pmix.log" 2>&1
grep -q "^srun called: --ntasks 4 --kill-on-bad-exit=1 --mpi=pmix $tmp/bin/train_gpt " "$tmp/pmix.log" ||
  { fail "LAUNCHER=srun-pmix: not srun --mpi=pmix"; cat "$tmp/pmix.log"; }
grep -q -- "--rendezvous" "$tmp/pmix.log" && fail "LAUNCHER=srun-pmix: a --rendezvous (MPI carries the id)"
expect_one_line "12 ranks" "^gpt2_124M: --total-batch-tokens 524288 is not a multiple of --seq-len 1024 x 12 data-parallel ranks" \
  "${stub_env[@]}" NPROC=12 "$recipe"
expect_one_line "bad launcher" "^gpt2_124M: LAUNCHER='ssh': expected mpirun, srun, srun-pmix or none" \
  "${stub_env[@]}" LAUNCHER=ssh "$recipe"
# Numeric flags are numbers before the recipe computes with them: 0 does not divide by zero, a word
# does not trip set -u, and an array subscript holding a command substitution never runs it.
for value in 0 abc "a[\$(touch $tmp/ran)0]" 99999999999999999999; do
  for flag in --seq-len --total-batch-tokens; do
    expect_one_line "$flag $value" "^gpt2_124M: $flag '.*': expected a whole number from 1 to 999999999$" \
      "${stub_env[@]}" "$recipe" "$flag" "$value"
  done
done
[ ! -e "$tmp/ran" ] || fail "a flag value's command substitution ran"
# The sbatch body computes the start number from SLURM_RESTART_COUNT the same way.
expect_one_line "SLURM_RESTART_COUNT" "^slurm job: SLURM_RESTART_COUNT='.*': expected a whole number$" \
  env SLURM_RESTART_COUNT="a[\$(touch $tmp/ran)0]" RECIPE="$recipe" bash -c 'source scripts/lib/slurm_job.sh; run_job'
[ ! -e "$tmp/ran" ] || fail "SLURM_RESTART_COUNT's command substitution ran"
# EVAL_DATA=none trains without HellaSwag: neither --eval-data nor --eval-every.
"${stub_env[@]}" EVAL_DATA=none "$recipe" >"$tmp/noeval.log" 2>&1
grep -q -- "--eval-" "$tmp/noeval.log" && fail "EVAL_DATA=none: HellaSwag flags still passed"

[ "$failures" -eq 0 ] && echo "recipes: all checks passed"
[ "$failures" -eq 0 ]
