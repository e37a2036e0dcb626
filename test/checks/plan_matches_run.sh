#!/usr/bin/env bash
# --plan plans the run that would start:
#   - started by mpirun or srun without --world-size, it plans for the launch's world size (here
#     the launchers' environment on one process), so --tp 2 over 2 ranks is planned, not refused;
#   - the launch's rank 0 alone prints it (rank 1 of the same launch prints nothing, same status);
#   - it refuses what the run refuses: --attention flash with --dtype fp32.
# usage: plan_matches_run.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin"
unset OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_LOCAL_RANK SLURM_NTASKS SLURM_PROCID SLURM_LOCALID

plan=(--plan --model d12 --batch-size 4 --seq-len 1024 --gpu-memory 80 --tp 2)
for launcher in mpirun srun; do
  if [ "$launcher" = mpirun ]; then env=(OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0)
  else env=(SLURM_NTASKS=2 SLURM_PROCID=0); fi
  if env "${env[@]}" "$bin" "${plan[@]}" >"$tmp/$launcher.log" 2>"$tmp/$launcher.err"; then
    grep -q "ZeRO stage [0-9] over 2 rank(s) in tensor-parallel groups of 2" "$tmp/$launcher.log" ||
      fail "$launcher: not planned for 2 ranks: $(head -n 1 "$tmp/$launcher.log")"
  else
    fail "$launcher: --plan --tp 2 over 2 launched ranks failed: $(cat "$tmp/$launcher.err")"
  fi
  if [ "$launcher" = mpirun ]; then env=(OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=1)
  else env=(SLURM_NTASKS=2 SLURM_PROCID=1); fi
  if env "${env[@]}" "$bin" "${plan[@]}" >"$tmp/$launcher-1.log" 2>&1; then
    [ ! -s "$tmp/$launcher-1.log" ] || fail "$launcher: rank 1 printed the plan too: $(head -n 1 "$tmp/$launcher-1.log")"
  else
    fail "$launcher: rank 1's --plan failed: $(cat "$tmp/$launcher-1.log")"
  fi
done

if "$bin" --plan --model d12 --dtype fp32 --attention flash --gpu-memory 80 >"$tmp/flash.log" 2>"$tmp/flash.err"; then
  fail "--plan accepted --attention flash with --dtype fp32"
else
  grep -q "^error: model preset d12: --attention flash: needs --dtype bf16" "$tmp/flash.err" ||
    fail "--plan --attention flash --dtype fp32: $(cat "$tmp/flash.err")"
fi

[ "$failures" -eq 0 ] && echo "plan_matches_run: all checks passed"
[ "$failures" -eq 0 ]
