# recipe.sh — what the recipes (scripts/run_gpt2_*.sh, scripts/run_gpt3_6.7B.sh, scripts/run_llama3_*.sh) share: the data, binary and launcher
# from the environment, the checks before anything starts (one line each), the micro-batch that
# makes the recipe's total batch on this many ranks, printing the command, and --plan mode.
#
# A recipe sets, then calls run_recipe "$@":
#   recipe_name         e.g. gpt2_124M (messages, default --out-dir runs/NAME)
#   recipe_data         default DATA_DIR (llm.c shards: DIR/*_train_*.bin, DIR/*_val_*.bin)
#   recipe_micro_batch  the largest --batch-size per rank it uses (what fits an 80 GB GPU)
#   recipe_eval_every   --eval-every for HellaSwag (dropped with EVAL_DATA=none)
#   recipe_eval_data    optional: the default EVAL_DATA (data/hellaswag/hellaswag_val.bin, GPT-2 ids)
#   recipe_flags        array of train_gpt --flag value pairs (the hyperparameters)
#   recipe_nproc        optional: ranks when neither NPROC nor SLURM_NTASKS says (default 8)
# Environment (all optional):
#   TRAIN_GPT   the binary (./train_gpt; ./train_gpt_cpu runs the same flags on the CPU)
#   DATA_DIR    shard folder (the recipe's recipe_data)
#   EVAL_DATA   HellaSwag file (recipe_eval_data; none: no HellaSwag evaluation)
#   OUT_DIR     runs/NAME; must be on a filesystem every node sees when ranks span nodes
#   NPROC       ranks (SLURM_NTASKS inside a SLURM job, else recipe_nproc or 8: one node of 8 GPUs)
#   LAUNCHER    mpirun | srun (ranks exchange the NCCL id through a file in OUT_DIR) |
#               srun-pmix (srun --mpi=pmix; MPI carries the id) | none (one process);
#               default: srun inside a SLURM job, else mpirun, none when NPROC=1
#   MPIRUN_ARGS, SRUN_ARGS   extra launcher options (split on spaces)
#   PLAN=1      print train_gpt's memory plan for NPROC ranks against GPU_MEMORY GiB (80; exit status 2
#               when it does not fit) instead of
#               training: needs no GPU and no data
# Arguments are train_gpt flags; each replaces the recipe's flag of the same name or is added
# (--init-from replaces --model).
# shellcheck shell=bash disable=SC2154  # recipe_* are set by the recipe that sources this file

recipe_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=scripts/lib/flags.sh
source "$recipe_root/scripts/lib/flags.sh"

recipe_fail() {
  echo "$recipe_name: $*" >&2
  exit 1
}

# positive_number FLAG VALUE: exits with one line unless VALUE is a whole number from 1 to
# 999999999 (so that no product bash computes from it and NPROC overflows).
positive_number() {
  [[ $2 =~ ^[1-9][0-9]{0,8}$ ]] || recipe_fail "$1 '$2': expected a whole number from 1 to 999999999"
}

# The words, each quoted where the shell needs it, so the printed command can be pasted.
quoted() {
  local line
  printf -v line '%q ' "$@"
  printf '%s' "${line% }"
}

run_recipe() {
  local caller=("$@")
  cd "$recipe_root" || exit 1
  local bin=${TRAIN_GPT:-./train_gpt} nproc=${NPROC:-${SLURM_NTASKS:-${recipe_nproc:-8}}} plan=${PLAN:-0}
  local data=${DATA_DIR:-$recipe_data} eval_data=${EVAL_DATA:-${recipe_eval_data:-data/hellaswag/hellaswag_val.bin}}
  local out=${OUT_DIR:-runs/$recipe_name} launcher=${LAUNCHER:-}
  [[ $nproc =~ ^[1-9][0-9]{0,5}$ ]] || recipe_fail "NPROC='$nproc': expected a positive number of ranks"
  if [ -z "$launcher" ]; then
    if [ -n "${SLURM_JOB_ID:-}" ]; then launcher=srun
    elif [ "$nproc" -gt 1 ]; then launcher=mpirun
    else launcher=none; fi
  fi

  # The recipe's flags under the caller's, then the caller's.
  local pairs=(--train-data "$data/*_train_*.bin" --val-data "$data/*_val_*.bin" --out-dir "$out"
               "${recipe_flags[@]}")
  if [ "$eval_data" != none ] || [ -n "$(flag_value caller --eval-data)" ]; then
    pairs+=(--eval-data "$eval_data" --eval-every "$recipe_eval_every")
  fi
  [ "$plan" = 1 ] || pairs+=(--resume auto)
  # --init-from's header is the architecture: it replaces the recipe's --model.
  local shadowing=("${caller[@]}")
  [ -z "$(flag_value caller --init-from)" ] || shadowing+=(--model)
  defaults_not_given shadowing "${pairs[@]}"
  local flags=("${defaults[@]}" "${caller[@]}")

  # The micro-batch: the largest B up to the recipe's whose B x T x data-parallel ranks (the ranks
  # over --tp x --pp) divides the total batch (the rest is gradient accumulation) in at least --pp
  # micro-batches (a pipeline's), unless the caller chose one.
  if [ -z "$(flag_value flags --batch-size)" ]; then
    local total seq rows b tp pp data_ranks
    total=$(flag_value flags --total-batch-tokens) seq=$(flag_value flags --seq-len) tp=$(flag_value flags --tp)
    pp=$(flag_value flags --pp)
    # Checked as numbers before any arithmetic: bash would evaluate a value like 'a[$(cmd)0]'.
    positive_number --total-batch-tokens "$total"
    positive_number --seq-len "$seq"
    positive_number --tp "${tp:-1}"
    positive_number --pp "${pp:-1}"
    [ $((nproc % ${tp:-1})) -eq 0 ] || recipe_fail "--tp ${tp:-1} does not divide the $nproc ranks: choose NPROC or --tp"
    [ $((nproc % (${tp:-1} * ${pp:-1}))) -eq 0 ] ||
      recipe_fail "--tp ${tp:-1} x --pp ${pp:-1} does not divide the $nproc ranks: choose NPROC, --tp or --pp"
    data_ranks=$((nproc / (${tp:-1} * ${pp:-1})))
    [ $((total % (seq * data_ranks))) -eq 0 ] ||
      recipe_fail "--total-batch-tokens $total is not a multiple of --seq-len $seq x $data_ranks data-parallel ranks: choose NPROC or --total-batch-tokens"
    rows=$((total / (seq * data_ranks)))
    for ((b = recipe_micro_batch; b > 1; b--)); do [ $((rows % b)) -eq 0 ] && [ $((rows / b)) -ge "${pp:-1}" ] && break; done
    flags+=(--batch-size "$b")
  fi

  [ -x "$bin" ] || recipe_fail "train_gpt binary '$bin' not found: build it (make; make cpu for ./train_gpt_cpu) or set TRAIN_GPT"
  local cmd=()
  if [ "$plan" = 1 ]; then
    cmd=("$bin" "${flags[@]}" --plan --world-size "$nproc" --gpu-memory "${GPU_MEMORY:-80}")
    echo "$recipe_name: memory plan for $nproc rank(s) (PLAN=1; nothing is trained): $(quoted "${cmd[@]}")"
    exec "${cmd[@]}"
  fi

  local glob
  for glob in "$(flag_value flags --train-data)" "$(flag_value flags --val-data)"; do
    compgen -G "$glob" >/dev/null ||
      recipe_fail "no shards match '$glob' (data/fineweb.sh writes FineWeb's; set DATA_DIR or pass --train-data/--val-data)"
  done
  local eval_file
  eval_file=$(flag_value flags --eval-data)
  [ -z "$eval_file" ] || [ -f "$eval_file" ] ||
    recipe_fail "--eval-data '$eval_file' not found (data/hellaswag.sh writes it; EVAL_DATA=none trains without HellaSwag)"

  local extra_args=()
  case $launcher in
    none)
      [ "$nproc" -eq 1 ] || recipe_fail "LAUNCHER=none starts one process, not NPROC=$nproc"
      ;;
    mpirun)
      command -v mpirun >/dev/null || recipe_fail "LAUNCHER=mpirun: mpirun not found (install OpenMPI)"
      read -r -a extra_args <<< "${MPIRUN_ARGS:-}"
      cmd=(mpirun -np "$nproc" "${extra_args[@]}")
      ;;
    srun | srun-pmix)
      command -v srun >/dev/null || recipe_fail "LAUNCHER=$launcher: srun not found (run inside a SLURM job)"
      read -r -a extra_args <<< "${SRUN_ARGS:-}"
      cmd=(srun --ntasks "$nproc" --kill-on-bad-exit=1 "${extra_args[@]}")
      if [ "$launcher" = srun-pmix ]; then
        cmd+=(--mpi=pmix)
      elif [ -z "$(flag_value flags --rendezvous)" ]; then
        # A path new to this start, in the run's shared directory (rank 0 removes it at the end).
        mkdir -p "$out"
        flags+=(--rendezvous "file:$out/.rendezvous-${SLURM_JOB_ID:-0}-${SLURM_RESTART_COUNT:-0}-$$")
      fi
      ;;
    *) recipe_fail "LAUNCHER='$launcher': expected mpirun, srun, srun-pmix or none" ;;
  esac
  cmd+=("$bin" "${flags[@]}")
  echo "$recipe_name: $(quoted "${cmd[@]}")"
  exec "${cmd[@]}"
}
