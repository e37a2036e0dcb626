#!/usr/bin/env bash
# Multi-rank checkpoints (docs/CHECKPOINTS.md): under mpirun with 2 ranks, shuffling on, for
# ZeRO 0, 1 and 2 in fp32 and bf16 (ZeRO 0: fp32 only), a 6-step run equals a run with
# --checkpoint-every 3 whose rank 1 dies abruptly after step 4 (TRAIN_GPT_TEST_EXIT_AFTER_STEP;
# mpirun then ends the job), followed by --resume auto: every metrics.jsonl record (timing fields
# aside) and the final model.bin byte for byte. Also: the checkpoint holds one state file per rank
# with that rank's optimizer shard, listed in the manifest with world size and ZeRO stage (resuming
# on other ranks or stages: checkpoint_reshard.sh); a damaged state file of rank 1 makes
# every rank fall back to the previous checkpoint (resume auto) or refuse it (resume DIR); a
# finished run resumed at --max-steps only rewrites model.bin.
# usage: checkpoint_distributed.sh cpu|gpu   (gpu: needs 2 GPUs, else skipped)
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"
require_ranks 2
mpi_opts+=(-x TRAIN_GPT_TEST_EXIT_AFTER_STEP)
export TRAIN_GPT_TEST_EXIT_AFTER_STEP=

common=(--init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$ref/train.bin" --shuffle 1
        --batch-size 1 --seq-len 16 --max-steps 6 --lr 2e-3 --warmup-steps 2 --val-every 3 --val-steps 1)

# ranks N ARGS...: train_gpt under mpirun with N ranks (1: without mpirun).
ranks() {
  local n=$1; shift
  if [ "$n" -eq 1 ]; then "$bin" "${common[@]}" "$@"; else mpirun -np "$n" "${mpi_opts[@]}" "$bin" "${common[@]}" "$@"; fi
}

# Same records (step, losses, lr, norm, skipped; not ms / tokens_per_s / mfu) in both metrics files.
same_metrics() {
  "$python" - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'PY'
import json, sys
def load(p):
    return [{k: v for k, v in json.loads(l).items() if k not in ("ms", "tokens_per_s", "mfu")} for l in open(p)]
a, b = load(sys.argv[1]), load(sys.argv[2])
if a != b or len(a) != 8:
    print(f"  {len(a)} vs {len(b)} records")
    for x, y in zip(a, b):
        if x != y: print(f"  straight {x}\n  resumed  {y}"); break
    sys.exit(1)
PY
}

for combo in fp32:0 fp32:1 bf16:1 bf16:2; do
  dtype=${combo%:*} zero=${combo#*:}
  name=$dtype-zero$zero
  straight=$tmp/$name-straight
  if ! ranks 2 --dtype "$dtype" --zero "$zero" --out-dir "$straight" >"$straight.log" 2>&1; then
    fail "$name: straight run failed"; tail -n 20 "$straight.log"; continue
  fi

  # Killed: rank 1 exits abruptly after step 4, so step 3's checkpoint is complete (rank 1 could
  # not finish step 4 before rank 0, done with the manifest, joined step 4's collectives).
  killed=$tmp/$name-killed
  if TRAIN_GPT_TEST_EXIT_AFTER_STEP=1:4 ranks 2 --dtype "$dtype" --zero "$zero" --checkpoint-every 3 \
      --out-dir "$killed" >"$killed.log" 2>&1; then
    fail "$name: the run with a dying rank exited 0"; tail -n 5 "$killed.log"; continue
  fi
  grep -q 'rank 1: exiting after step 4' "$killed.log" || { fail "$name: rank 1 did not die after step 4"; tail -n 5 "$killed.log"; continue; }
  ckpt=$killed/checkpoint_00000003
  [ -f "$ckpt/manifest.json" ] || { fail "$name: no complete step-3 checkpoint"; continue; }
  [ -e "$killed/checkpoint_00000006" ] && fail "$name: a step-6 checkpoint exists although rank 1 died after step 4"
  "$python" - "$ckpt" "$zero" <<'PY' || fail "$name: manifest or state files wrong"
import json, os, struct, sys
d, zero = sys.argv[1], int(sys.argv[2])
m = json.load(open(f"{d}/manifest.json"))
names = [f["name"] for f in m["files"]]
ok = m["world_size"] == 2 and m["zero_stage"] == zero and names == ["model.bin", "state_r00000.bin", "state_r00001.bin"]
P = m["num_parameters"]
shards = []
for r in (0, 1):
    h = open(f"{d}/state_r{r:05d}.bin", "rb").read(168)
    rank, world, stage = struct.unpack_from("<3I", h, 16)
    num, bucket_layers, count = struct.unpack_from("<3Q", h, 40)
    ok &= (rank, world, stage, num, bucket_layers) == (r, 2, zero, P, 2)  # 32 MiB: both layers in one bucket
    shards.append(count)
if zero == 0:
    ok &= shards == [P, P]
else:  # each of the 2 buckets (the layers, wte/wpe/lnf) halved, rank 0's half rounded up to 8
    ok &= sum(shards) == P and 0 <= shards[0] - shards[1] <= 2 * 16
if not ok: print(f"  manifest {m['world_size']} {m['zero_stage']} {names}, state counts {shards} of {P}")
sys.exit(0 if ok else 1)
PY

  if ranks 2 --dtype "$dtype" --zero "$zero" --checkpoint-every 3 --resume auto --out-dir "$killed" \
      >"$killed.resume.log" 2>&1; then
    grep -q "resumed from $ckpt: 3 step" "$killed.resume.log" || fail "$name: did not resume from step 3"
    same_metrics "$straight" "$killed" || fail "$name: killed + resumed metrics differ from the straight run"
    cmp -s "$straight/model.bin" "$killed/model.bin" || fail "$name: killed + resumed model.bin differs"
    cmp -s "$straight/checkpoint_00000006/model.bin" "$killed/checkpoint_00000006/model.bin" ||
      fail "$name: the step-6 checkpoints' model.bin differ"
  else
    fail "$name: resume failed"; tail -n 20 "$killed.resume.log"
  fi
done

# A checkpoint at --max-steps: nothing to train; rank 0 rewrites model.bin from it, all ranks end.
done_dir=$tmp/fp32-zero1-straight
cp "$done_dir/model.bin" "$tmp/final.bin"
if ranks 2 --dtype fp32 --zero 1 --resume auto --out-dir "$done_dir" >"$tmp/done.log" 2>&1; then
  grep -q 'already reached --max-steps 6: nothing to train' "$tmp/done.log" || fail "at --max-steps: no 'nothing to train'"
  cmp -s "$tmp/final.bin" "$done_dir/model.bin" || fail "at --max-steps: model.bin changed"
else
  fail "resuming a finished 2-rank run failed"; tail -n 5 "$tmp/done.log"
fi

# A damaged state file of rank 1 (rank 0 verifies every file): --resume auto falls back to the
# previous checkpoint on every rank, --resume DIR refuses it.
damaged=$tmp/bf16-zero1-killed
cp "$damaged/checkpoint_00000006/state_r00001.bin" "$tmp/state_r00001.bin"
printf 'X' | dd of="$damaged/checkpoint_00000006/state_r00001.bin" bs=1 seek=200 conv=notrunc 2>/dev/null
if ranks 2 --dtype bf16 --zero 1 --resume auto --out-dir "$damaged" >"$tmp/damaged.log" 2>&1; then
  grep -q "skipping $damaged/checkpoint_00000006: state_r00001.bin has CRC-32C" "$tmp/damaged.log" ||
    fail "damaged state file: no skip warning"
  grep -q "resumed from $damaged/checkpoint_00000003: 3 step" "$tmp/damaged.log" ||
    fail "damaged state file: did not fall back to step 3"
  cmp -s "$tmp/bf16-zero1-straight/model.bin" "$damaged/model.bin" || fail "damaged: the rerun from step 3 differs"
else
  fail "resume auto past a damaged state file failed"; tail -n 5 "$tmp/damaged.log"
fi
printf 'X' | dd of="$damaged/checkpoint_00000006/state_r00001.bin" bs=1 seek=200 conv=notrunc 2>/dev/null
if ranks 2 --dtype bf16 --zero 1 --resume "$damaged/checkpoint_00000006" --out-dir "$damaged" >"$tmp/damaged.log" 2>&1; then
  fail "--resume DIR of a damaged checkpoint was not refused"
else
  grep -q "not a complete checkpoint: state_r00001.bin has CRC-32C" "$tmp/damaged.log" ||
    { fail "--resume DIR damaged: message"; tail -n 3 "$tmp/damaged.log"; }
fi

[ "$failures" -eq 0 ] && echo "checkpoint_distributed: all checks passed"
[ "$failures" -eq 0 ]
