# slurm_job.sh — the body of the sbatch scripts in scripts/slurm/: runs a recipe whose ranks srun
# starts, passes the job's stop signal on to them, and requeues the job when the run stopped early,
# so that the next start continues from the checkpoint (the recipes pass --resume auto).
#
# The sbatch scripts ask for --signal=B:USR1@SECONDS: SLURM signals only this batch shell, which
# sends USR1 to srun; srun forwards it to every rank; the ranks agree on the step to stop after,
# checkpoint and exit 0; then this shell requeues the job (scontrol requeue; SLURM_RESTART_COUNT
# counts the starts). SIGTERM (scancel, preemption) is passed on the same way without a requeue:
# a preempting scheduler requeues --requeue jobs itself.
#
# Environment: RECIPE (scripts/run_gpt2_124M.sh; relative to the repository), and every variable
# of the recipe (scripts/lib/recipe.sh: TRAIN_GPT, DATA_DIR, EVAL_DATA, OUT_DIR, LAUNCHER, ...).
# usage (in an sbatch script, from the repository root): run_job [train_gpt flags for the recipe]
# shellcheck shell=bash

run_job() {
  local recipe=${RECIPE:-scripts/run_gpt2_124M.sh}
  [ -x "$recipe" ] || { echo "slurm job: RECIPE '$recipe' is not an executable recipe under $PWD" >&2; exit 1; }
  local restarts=${SLURM_RESTART_COUNT:-0}
  # A number before bash computes with it (arithmetic would evaluate a value like 'a[$(cmd)0]').
  [[ $restarts =~ ^[0-9]{1,9}$ ]] ||
    { echo "slurm job: SLURM_RESTART_COUNT='$restarts': expected a whole number" >&2; exit 1; }
  echo "slurm job ${SLURM_JOB_ID:-?}: start $((restarts + 1)) (SLURM_RESTART_COUNT=$restarts)," \
       "${SLURM_NTASKS:-?} tasks on ${SLURM_JOB_NODELIST:-?}, $(date '+%F %T'), $recipe"
  job_stop='' job_pid=''
  trap 'job_stop=USR1; [ -z "$job_pid" ] || kill -USR1 "$job_pid" 2>/dev/null || true' USR1
  trap 'job_stop=TERM; [ -z "$job_pid" ] || kill -TERM "$job_pid" 2>/dev/null || true' TERM
  "$recipe" "$@" &
  job_pid=$!
  [ -z "$job_stop" ] || kill "-$job_stop" "$job_pid" 2>/dev/null || true
  # A trapped signal interrupts wait; wait again until the recipe's srun has ended.
  local status
  while :; do
    status=0
    wait "$job_pid" || status=$?
    kill -0 "$job_pid" 2>/dev/null || break
  done
  if [ "$job_stop" = USR1 ] && [ "$status" -eq 0 ]; then
    echo "slurm job ${SLURM_JOB_ID:-?}: stopped at a checkpoint before the time limit; requeued to continue with --resume auto"
    scontrol requeue "$SLURM_JOB_ID"
  fi
  return "$status"
}
