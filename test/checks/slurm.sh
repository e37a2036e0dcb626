#!/usr/bin/env bash
# The sbatch scripts on a real SLURM (Debian's slurmctld + slurmd, a one-node cluster on this
# machine, started and shut down by this check): 2 tasks started by srun --mpi=pmix run the CPU
# build on the tiny reference model through the GPT-2 124M recipe (its flags overridden).
#   1. scripts/slurm/gpt2_nodes.sbatch, uninterrupted: completes without a requeue.
#   2. scripts/slurm/gpt2_1node.sbatch, preempted the way --signal=B:USR1@N does it (scancel
#      --batch --signal=USR1: the batch shell alone): the ranks stop after the same step with a
#      checkpoint, the job requeues itself and its second start (SLURM_RESTART_COUNT=1) resumes
#      with --resume auto; there USR1 reaches rank 1 alone (its pid from scontrol listpids): rank 0
#      stops after the same step, the job completes without a requeue, and a new submission of the
#      same script finishes the run.
#   Every metrics.jsonl record of 2 (timings aside) equals 1's, and so do the model files.
#   3. scripts/slurm/gpt3_6.7B.sbatch with the tiny run on --tp 2: completes, with 1's losses.
# The cluster runs as root without systemd or cgroups: auth/none, proctrack/linuxproc, state and
# logs under a temporary folder, free ports. Missing SLURM packages fail the check
# (scripts/install_deps.sh installs them).
# usage: slurm.sh cpu|gpu   (gpu: skipped; the scripts are the same for both builds)
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
[ "$mode" = cpu ] || { echo "skipped: the CPU build runs the SLURM check"; exit 77; }
require_files "$bin" "$ref/model.bin" "$ref/train.bin"
for tool in slurmctld slurmd sbatch srun scontrol scancel squeue sinfo; do
  command -v "$tool" >/dev/null ||
    { echo "FAIL: $tool not found (scripts/install_deps.sh installs slurmctld, slurmd, slurm-client)"; exit 1; }
done
# Never inherit a surrounding job's identity.
unset "${!SLURM_@}" OMPI_COMM_WORLD_SIZE OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_LOCAL_RANK PMIX_RANK

# ---- the cluster
cluster=$tmp/cluster
mkdir -p "$cluster/state" "$cluster/spool"
free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 40000))
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || { echo "$port"; return; }
  done
}
ctld_port=$(free_port) slurmd_port=$(free_port)
[ "$ctld_port" != "$slurmd_port" ] || slurmd_port=$((ctld_port + 1))
export SLURM_CONF=$cluster/slurm.conf
# cred_expire and the scheduler intervals make a requeued job start again within seconds.
cat >"$SLURM_CONF" <<EOF
ClusterName=traingpt
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/none
CredType=cred/none
AuthInfo=cred_expire=5
StateSaveLocation=$cluster/state
SlurmdSpoolDir=$cluster/spool
SlurmctldPidFile=$cluster/slurmctld.pid
SlurmdPidFile=$cluster/slurmd.pid
SlurmctldLogFile=$cluster/slurmctld.log
SlurmdLogFile=$cluster/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF

# Jobs are cancelled first (else their processes outlive the daemons), then the daemons stop.
stop_cluster() {
  local jobs pid _
  jobs=$(squeue -h -o %i 2>/dev/null)
  if [ -n "$jobs" ]; then
    # shellcheck disable=SC2086  # one job id per word
    scancel --full $jobs 2>/dev/null
    for _ in $(seq 50); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
  fi
  scontrol shutdown >/dev/null 2>&1
  local pids=()
  mapfile -t pids < <(cat "$cluster"/slurmctld.pid "$cluster"/slurmd.pid 2>/dev/null)
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    grep -q slurm "/proc/$pid/cmdline" 2>/dev/null && kill -9 "$pid"
  done
  rm -rf "$tmp"
}
trap stop_cluster EXIT

slurmctld -c || { echo "FAIL: slurmctld did not start"; cat "$cluster/slurmctld.log"; exit 1; }
slurmd -N localhost || { echo "FAIL: slurmd did not start"; cat "$cluster/slurmd.log"; exit 1; }
for _ in $(seq 75); do [ "$(sinfo -h -o %T 2>/dev/null)" = idle ] && break; sleep 0.2; done
[ "$(sinfo -h -o %T 2>/dev/null)" = idle ] ||
  { echo "FAIL: the node is not idle: $(sinfo 2>&1)"; tail -n 20 "$cluster"/*.log; exit 1; }

# ---- the jobs: the recipe's flags replaced by a tiny fp32 run (a run is bit-exact across resumes)
export SIMT_THREADS=1 TRAIN_GPT=$bin LAUNCHER=srun-pmix EVAL_DATA=none
steps=40
tiny=(--init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$ref/train.bin" --dtype fp32
      --batch-size 1 --seq-len 16 --total-batch-tokens 32 --max-steps "$steps" --lr 2e-3 --warmup-steps 2
      --val-every 10 --val-steps 1)
# Overrides of the sbatch scripts' 8-GPU requests for this one-node, GPU-less cluster.
small=(--nodes=1 --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0)

# submit NAME SCRIPT: prints the job id; the job trains into $tmp/NAME and logs to $tmp/NAME.out.
submit() {
  OUT_DIR=$tmp/$1 sbatch --parsable "${small[@]}" --job-name="$1" --output="$tmp/$1.out" "$2" "${tiny[@]}"
}
# job_field JOB FIELD: a field of scontrol show job (JobState, Restarts, ...).
job_field() { scontrol show job "$1" 2>/dev/null | grep -o "\b$2=[^ ]*" | head -n 1 | cut -d= -f2; }
# wait_job_state JOB STATE RESTARTS: up to 60 s; a job that ended otherwise fails at once.
wait_job_state() {
  local _ state restarts
  for _ in $(seq 300); do
    state=$(job_field "$1" JobState) restarts=$(job_field "$1" Restarts)
    [ "$state" = "$2" ] && [ "$restarts" = "$3" ] && return 0
    [[ $state =~ ^(COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY)$ ]] && break
    sleep 0.2
  done
  fail "job $1: not $2 with $3 restart(s) (JobState=$state Restarts=$restarts)"
  return 1
}
show_log() { echo "---- $1"; tail -n 25 "$1"; }

straight_job=$(submit straight scripts/slurm/gpt2_nodes.sbatch) || { echo "FAIL: sbatch refused the job"; exit 1; }
stopped_job=$(submit stopped scripts/slurm/gpt2_1node.sbatch) || { echo "FAIL: sbatch refused the job"; exit 1; }

# 1. Uninterrupted.
wait_job_state "$straight_job" COMPLETED 0 || show_log "$tmp/straight.out"
grep -q 'requeued' "$tmp/straight.out" && fail "uninterrupted job: requeued"

# 2. The time-limit path: USR1 to the batch shell once 3 steps are done (the job starts after 1's).
wait_for_steps "$tmp/stopped" 3 || fail "preempted job: no 3 steps within 60 s"
scancel --batch --signal=USR1 "$stopped_job"
wait_job_state "$stopped_job" RUNNING 1 || show_log "$tmp/stopped.out"
first_stop=$(grep -o 'received SIGUSR1: stopped after step [0-9]*' "$tmp/stopped.out" | grep -o '[0-9]*$')
if [ -z "$first_stop" ] || [ "$first_stop" -ge "$steps" ]; then
  fail "preempted job: no stop before step $steps"; show_log "$tmp/stopped.out"
else
  # RUNNING comes before the requeued batch script's first line: wait up to 30 s for it.
  for _ in $(seq 150); do grep -q "start 2 (SLURM_RESTART_COUNT=1)" "$tmp/stopped.out" && break; sleep 0.2; done
  grep -q "start 2 (SLURM_RESTART_COUNT=1)" "$tmp/stopped.out" || fail "requeued job: no second start with SLURM_RESTART_COUNT=1"
  # Both ranks wrote their state at the stop step.
  for r in 0 1; do
    printf -v f '%s/stopped/checkpoint_%08d/state_r%05d.bin' "$tmp" "$first_stop" "$r"
    [ -s "$f" ] || fail "checkpoint of step $first_stop: no $(basename "$f")"
  done
fi

# ... and USR1 to rank 1 alone once the second start trained 2 steps: both ranks stop after the same
# step (the resumed run would refuse a checkpoint missing a rank), no requeue, a new job finishes.
[ "$failures" -eq 0 ] || exit 1
for _ in $(seq 300); do
  [ "$(grep -c train_loss "$tmp/stopped/metrics.jsonl" 2>/dev/null)" -ge $((first_stop + 2)) ] && break
  sleep 0.2
done
rank1_pid=$(scontrol listpids "$stopped_job" 2>/dev/null | awk '$3 ~ /^[0-9]+$/ && $5 == 1 { print $1; exit }')
if [ -z "$rank1_pid" ]; then
  fail "scontrol listpids: no pid for rank 1 of job $stopped_job"; scontrol listpids "$stopped_job"
else
  kill -USR1 "$rank1_pid"
  wait_job_state "$stopped_job" COMPLETED 1 || show_log "$tmp/stopped.out"
  second_stop=$(grep -o 'received SIGTERM: stopped after step [0-9]*' "$tmp/stopped.out" | grep -o '[0-9]*$')
  if [ -z "$second_stop" ] || [ "$second_stop" -le "${first_stop:-0}" ] || [ "$second_stop" -ge "$steps" ]; then
    fail "rank 1 signalled: rank 0 did not stop before step $steps"; show_log "$tmp/stopped.out"
  fi
  [ "$(grep -c requeued "$tmp/stopped.out")" -eq 1 ] || fail "a stop without the batch shell's signal requeued the job"
  resumed_job=$(OUT_DIR=$tmp/stopped sbatch --parsable "${small[@]}" --job-name=stopped --output="$tmp/stopped.out" \
                scripts/slurm/gpt2_1node.sbatch "${tiny[@]}")
  wait_job_state "$resumed_job" COMPLETED 0 || show_log "$tmp/stopped.out"
  grep -q "resumed from $tmp/stopped/checkpoint_$(printf %08d "${second_stop:-0}")" "$tmp/stopped.out" ||
    fail "the new job did not resume from step ${second_stop:-?}'s checkpoint"
fi

# 3. The GPT-3 6.7B script (tensor parallelism over a node's ranks), its recipe's model and TP 8
# replaced by the tiny run on TP 2 with the same global micro-batch (one data-parallel rank of
# B 2): completes, and its losses are the data-parallel job's.
with_flags tiny --batch-size 2 --tp 2
tp_job=$(OUT_DIR=$tmp/tp sbatch --parsable "${small[@]}" --job-name=tp --output="$tmp/tp.out" \
           scripts/slurm/gpt3_6.7B.sbatch "${flags[@]}") || fail "sbatch refused the 6.7B script"
if [ -n "$tp_job" ] && wait_job_state "$tp_job" COMPLETED 0; then
  grep -q -- "--tp 2" "$tmp/tp.out" || fail "the 6.7B job did not run with --tp 2"
  "$python" - "$tmp/straight/metrics.jsonl" "$tmp/tp/metrics.jsonl" <<'PY' || fail "the TP job's losses differ from the data-parallel job's"
import json, sys
a, b = ([json.loads(l)["train_loss"] for l in open(p) if "train_loss" in l] for p in sys.argv[1:3])
if len(a) != len(b) or any(abs(x - y) > 1e-5 * abs(x) for x, y in zip(a, b)): print(f"  {a[:3]} vs {b[:3]}"); sys.exit(1)
PY
else
  show_log "$tmp/tp.out"
fi

# The interrupted run equals the uninterrupted one: every record but the timings, and the model.
if "$python" - "$tmp/straight/metrics.jsonl" "$tmp/stopped/metrics.jsonl" "$steps" <<'PY'; then
import json, sys
def load(p):
    return [{k: v for k, v in json.loads(l).items() if k not in ("ms", "tokens_per_s", "mfu")} for l in open(p)]
a, b, steps = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
trained = [r["step"] for r in a if "train_loss" in r]
if trained != list(range(1, steps + 1)) or a != b:
    print(f"  {len(a)} vs {len(b)} records, uninterrupted steps {trained[:3]}...{trained[-3:]}")
    for x, y in zip(a, b):
        if x != y: print(f"  uninterrupted {x}\n  interrupted   {y}"); break
    sys.exit(1)
PY
  cmp -s "$tmp/straight/model.bin" "$tmp/stopped/model.bin" || fail "model.bin differs from the uninterrupted run's"
else
  fail "metrics.jsonl differs from the uninterrupted run's"
fi

if [ "$failures" -eq 0 ]; then
  echo "slurm: uninterrupted job $straight_job; job $stopped_job stopped after step $first_stop (USR1 to the batch" \
       "shell), requeued, stopped after step $second_stop (USR1 to rank 1), job $resumed_job finished: same" \
       "$steps steps as the uninterrupted run; 6.7B script's job $tp_job on TP 2: the same losses"
fi
[ "$failures" -eq 0 ]
