#!/usr/bin/env bash
# Damaged checkpoints and failed writes (docs/CHECKPOINTS.md). From a run with checkpoints at
# steps 4 and 8, the step-8 checkpoint is damaged: truncated at random offsets (model file and
# state), its manifest missing or cut, a byte flipped (model file and state). Each time
# --resume auto reports the damage, resumes from step 4 and reproduces the undamaged run exactly;
# --resume DIR on the damaged one is an error. Another world size or dtype is refused. A
# checkpoint write that fails (file size limit, like a full disk) is a clear error that leaves
# the previous checkpoint complete, also where retention would delete it once the new one is
# complete; an output directory that takes no files fails before training; on a small tmpfs, a
# run without room for the checkpoints it keeps at once fails before training, and a disk that
# fills up mid-run (another writer) stops the run without harm to the last checkpoint.
# usage: checkpoint_corrupt.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"
trap 'umount "$tmp/small" 2>/dev/null; rm -rf "$tmp"' EXIT

common=(--init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$ref/train.bin" --shuffle 1
        --batch-size 2 --seq-len 32 --max-steps 8 --lr 2e-3 --warmup-steps 2 --val-every 4 --val-steps 1
        --checkpoint-every 4 --keep-checkpoints 0)
base=$tmp/base
if ! "$bin" "${common[@]}" --out-dir "$base" >"$base.log" 2>&1; then
  fail "base run failed"; cat "$base.log"; exit 1
fi

# Damages FILE: "truncate" at a random offset, or "flip" one random byte. Prints the offset.
damage() {
  "$python" - "$1" "$2" <<'EOF'
import os, random, sys
kind, path = sys.argv[1], sys.argv[2]
size = os.path.getsize(path)
offset = random.randrange(size)
if kind == "truncate":
    os.truncate(path, offset)
else:
    with open(path, "r+b") as f:
        f.seek(offset); b = f.read(1); f.seek(offset); f.write(bytes([b[0] ^ 0x5A]))
print(offset)
EOF
}

same_run() {
  "$python" - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'EOF'
import json, sys
def load(p):
    return [{k: v for k, v in json.loads(l).items() if k not in ("ms", "tokens_per_s", "mfu")} for l in open(p)]
sys.exit(0 if load(sys.argv[1]) == load(sys.argv[2]) else 1)
EOF
}

n=0
for case in "truncate state_r00000.bin" "truncate state_r00000.bin" "truncate model.bin" "flip state_r00000.bin" \
            "flip model.bin" "remove manifest.json" "truncate manifest.json"; do
  read -r kind file <<<"$case"
  n=$((n + 1))
  dir=$tmp/case$n
  cp -r "$base" "$dir"
  target=$dir/checkpoint_00000008/$file
  where=""
  case $kind in
    remove) rm "$target" ;;
    *) where=" at byte $(damage "$kind" "$target")" ;;
  esac
  label="$kind $file$where"
  if "$bin" "${common[@]}" --resume auto --out-dir "$dir" >"$dir.log" 2>&1; then
    grep -q "warning: --resume auto: skipping $dir/checkpoint_00000008: " "$dir.log" ||
      fail "$label: the damaged checkpoint was not reported"
    grep -q "resumed from $dir/checkpoint_00000004: 4 step" "$dir.log" || fail "$label: did not resume from step 4"
    same_run "$base" "$dir" || fail "$label: the resumed run differs from the undamaged one"
    cmp -s "$base/model.bin" "$dir/model.bin" || fail "$label: final model.bin differs"
    [ -f "$dir/checkpoint_00000008/manifest.json" ] || fail "$label: the step-8 checkpoint was not rewritten"
  else
    fail "$label: --resume auto failed"; cat "$dir.log"
  fi
  grep -m1 skipping "$dir.log"
done

# --resume DIR on a damaged checkpoint: an error naming the problem.
cp -r "$base" "$tmp/explicit"
damage flip "$tmp/explicit/checkpoint_00000008/state_r00000.bin" >/dev/null
if "$bin" "${common[@]}" --resume "$tmp/explicit/checkpoint_00000008" --out-dir "$tmp/explicit" >"$tmp/explicit.log" 2>&1; then
  fail "--resume DIR accepted a corrupt checkpoint"
else
  grep -q "^error: --resume .*checkpoint_00000008: not a complete checkpoint: state_r00000.bin has CRC-32C" \
    "$tmp/explicit.log" || fail "--resume DIR message: $(cat "$tmp/explicit.log")"
fi

# A write that fails mid-checkpoint (files limited to 1 MiB: the model file fits, the state does
# not; SIGXFSZ ignored so the write returns EFBIG as a full disk returns ENOSPC). With
# --keep-checkpoints 1 the step-4 checkpoint would go once step 8's is complete: it stays.
full=$tmp/full
cp -r "$base" "$full"
rm -r "$full/checkpoint_00000008"
with_flags common --keep-checkpoints 1
if (trap '' XFSZ; ulimit -f 1024; exec "$bin" "${flags[@]}" --resume auto --out-dir "$full") >"$full.log" 2>&1; then
  fail "a failed checkpoint write did not fail the run"
else
  grep -q "^error: writing checkpoint $full/checkpoint_00000008: .*state_r00000.bin.tmp: write failed: File too large" \
    "$full.log" || fail "failed-write message: $(tail -1 "$full.log")"
  [ ! -e "$full/checkpoint_00000008" ] || fail "the failed checkpoint's directory was left behind"
  [ -f "$full/checkpoint_00000004/manifest.json" ] || fail "the failed write cost the previous checkpoint"
  if "$bin" "${common[@]}" --resume auto --out-dir "$full" >"$full.again.log" 2>&1; then
    grep -q "resumed from $full/checkpoint_00000004: 4 step" "$full.again.log" || fail "after the failed write: no resume from step 4"
    same_run "$base" "$full" || fail "after the failed write: the resumed run differs"
  else
    fail "resuming after the failed write failed"; cat "$full.again.log"
  fi
fi

# A manifest that disagrees with its state files (world size) and another dtype are refused,
# saying what differs (another world size or ZeRO stage itself is resharding: checkpoint_reshard.sh).
cp -r "$base" "$tmp/ranks"
"$python" - "$tmp/ranks/checkpoint_00000008/manifest.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1])); m["world_size"] = 2; json.dump(m, open(sys.argv[1], "w"))
EOF
if "$bin" "${common[@]}" --resume auto --out-dir "$tmp/ranks" >"$tmp/ranks.log" 2>&1; then
  fail "a checkpoint whose manifest says 2 ranks and whose state file says 1 was resumed"
else
  grep -q "^error: --resume .*state_r00000.bin: belongs to rank 0 of 1, the manifest lists it as rank 0 of 2" "$tmp/ranks.log" ||
    fail "world-size message: $(tail -1 "$tmp/ranks.log")"
fi
if "$bin" "${common[@]}" --dtype fp32 --resume auto --out-dir "$base" >"$tmp/dtype.log" 2>&1; then
  fail "a bf16 checkpoint was resumed by an fp32 run"
else
  grep -q "^error: --resume .*: the checkpoint holds bf16 training state; run with --dtype bf16" "$tmp/dtype.log" ||
    fail "dtype message: $(tail -1 "$tmp/dtype.log")"
fi

# An output directory that takes no files: an error before the first step.
if "$bin" "${common[@]}" --out-dir /proc/self >"$tmp/proc.log" 2>&1; then
  fail "an unwritable --out-dir was accepted"
else
  grep -q "^error: --out-dir: /proc/self/.train_gpt.lock: cannot create the lock file" "$tmp/proc.log" ||
    fail "unwritable --out-dir message: $(tail -1 "$tmp/proc.log")"
  ! grep -q '^step ' "$tmp/proc.log" || fail "training started in an unwritable --out-dir"
fi

# A really full disk, on a small tmpfs (needs the right to mount one, e.g. root; else noted and
# not run). A checkpoint is ~1.9 MiB: 1 MiB cannot hold one and 3 MiB not the two of steps 4 and
# 8 this run keeps -> refused before training. On 5 MiB the run starts; once the step-4
# checkpoint is there it is paused, another writer fills the disk, and step 8's checkpoint fails
# with "No space left on device": step 4's stays (--keep-checkpoints 1 deletes it only after the
# next one is complete) and, copied elsewhere, resumes exactly.
small=$tmp/small
mkdir -p "$small"
if mount -t tmpfs -o size=1m tmpfs "$small" 2>/dev/null; then
  for size in 1 3; do
    [ "$size" = 1 ] || mount -t tmpfs -o "size=${size}m" tmpfs "$small"
    if "$bin" "${common[@]}" --out-dir "$small/out" >"$tmp/small$size.log" 2>&1; then
      fail "a $size MiB --out-dir was accepted"
    else
      grep -q "^error: --out-dir: $small/out: .* MiB free, 2 checkpoint(s) of 1.9 MiB at once (--checkpoint-every 4, --keep-checkpoints 0) and the final model file need .* MiB" \
        "$tmp/small$size.log" || fail "$size MiB: free-space message: $(tail -1 "$tmp/small$size.log")"
      ! grep -q '^step ' "$tmp/small$size.log" || fail "$size MiB: training started without space for the checkpoints"
    fi
    umount "$small"
  done
  mount -t tmpfs -o size=5m tmpfs "$small"
  with_flags common --keep-checkpoints 1
  "$bin" "${flags[@]}" --out-dir "$small/out" >"$tmp/small5.log" 2>&1 &
  pid=$!
  for _ in $(seq 3000); do [ -e "$small/out/checkpoint_00000004/manifest.json" ] && break; sleep 0.02; done
  kill -STOP "$pid"
  if [ -e "$small/out/checkpoint_00000008" ]; then
    kill -CONT "$pid"; wait "$pid"
    echo "note: the run reached step 8 before it could be paused (fast device); the disk-full case did not run"
  else
    dd if=/dev/zero of="$small/filler" bs=64k 2>/dev/null
    kill -CONT "$pid"
    if wait "$pid"; then
      fail "a run whose checkpoint cannot be written succeeded"
    else
      grep -q "^error: writing checkpoint $small/out/checkpoint_00000008: .*: No space left on device" "$tmp/small5.log" ||
        fail "disk-full message: $(tail -1 "$tmp/small5.log")"
      [ ! -e "$small/out/checkpoint_00000008" ] || fail "disk full: the partial checkpoint was left behind"
      cp -r "$small/out" "$tmp/after_full"
      "$bin" "${common[@]}" --resume auto --out-dir "$tmp/after_full" >"$tmp/after_full.log" 2>&1
      grep -q "resumed from $tmp/after_full/checkpoint_00000004: 4 step" "$tmp/after_full.log" ||
        fail "disk full: the step-4 checkpoint is not complete: $(tail -2 "$tmp/after_full.log")"
      same_run "$base" "$tmp/after_full" || fail "disk full: resuming from step 4 differs from the base run"
    fi
  fi
  umount "$small"
else
  echo "note: cannot mount a small tmpfs here; the free-space and disk-full checks did not run"
fi

[ "$failures" -eq 0 ] && echo "checkpoint_corrupt: all checks passed"
[ "$failures" -eq 0 ]
