#!/usr/bin/env bash
# A checkpoint's state files must come from one run: a resume cross-checks each rank's state file
# against the manifest and the others (run identity: seed, step, configuration hash), so files of
# two runs put together under a rebuilt manifest (sizes and CRC-32Cs made to match) are refused,
# naming the file:
#   - one process: run B's state file under run A's manifest and model (another seed);
#   - two ranks (mpirun, ZeRO 1, resumed on one rank, which reads both): rank 1's file from run B.
# And state files of format version 2 (before the configuration hash) still resume, to the same
# bits as version 3.
# usage: checkpoint_identity.sh cpu|gpu
set -u
# shellcheck source=test/checks/lib/trainer.sh
source "$(dirname "$0")/lib/trainer.sh" "$@"
require_files "$bin" "$ref/model.bin" "$ref/train.bin"
require_ranks 2

common=(--init-from "$ref/model.bin" --train-data "$ref/train.bin" --val-data "$ref/train.bin" --seq-len 32 --lr 2e-3
        --warmup-steps 2 --val-every 0 --dtype fp32)

# mix DIR FROM FILE: DIR's FILE replaced by FROM's, DIR's manifest rebuilt to match it.
mix() {
  [ "$2/$3" -ef "$1/$3" ] || cp "$2/$3" "$1/$3"
  "$python" - "$1" "$3" <<'PY'
import json, sys
directory, name = sys.argv[1:]
table = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
    table.append(c)
data = open(f"{directory}/{name}", "rb").read()
crc = 0xFFFFFFFF
for b in data:
    crc = (crc >> 8) ^ table[(crc ^ b) & 0xFF]
manifest = json.load(open(f"{directory}/manifest.json"))
for f in manifest["files"]:
    if f["name"] == name:
        f["bytes"], f["crc32c"] = len(data), f"{crc ^ 0xFFFFFFFF:08x}"
json.dump(manifest, open(f"{directory}/manifest.json", "w"), indent=2)
PY
}

# expect_mixed_refused NAME FILE CHECKPOINT: resuming CHECKPOINT on one process stops naming FILE.
expect_mixed_refused() {
  local status=0
  "$bin" "${common[@]}" --batch-size "$4" --max-steps 3 --resume "$3" --out-dir "$tmp/resumed_$1" \
    >"$tmp/$1.log" 2>"$tmp/$1.err" || status=$?
  [ "$status" -eq 1 ] || fail "$1: exit status $status, expected 1"
  grep -qE "^error: --resume $3: $3/$2: from another run than the manifest's: seed 2, configuration [0-9a-f]{16}; the manifest's: seed 1, configuration [0-9a-f]{16}" \
    "$tmp/$1.err" || fail "$1: $(cat "$tmp/$1.err")"
  ! grep -q '^step ' "$tmp/$1.log" || fail "$1: it trained"
}

# ---- one process
for seed in 1 2; do
  "$bin" "${common[@]}" --batch-size 2 --seed "$seed" --max-steps 2 --out-dir "$tmp/one_$seed" >"$tmp/one_$seed.log" 2>&1 ||
    { fail "run with seed $seed failed"; cat "$tmp/one_$seed.log"; exit 1; }
done
cp -r "$tmp/one_1/checkpoint_00000002" "$tmp/one_mixed"
mix "$tmp/one_mixed" "$tmp/one_2/checkpoint_00000002" state_r00000.bin
expect_mixed_refused one_rank state_r00000.bin "$tmp/one_mixed" 2

# ---- two ranks
for seed in 1 2; do
  mpirun -np 2 "${mpi_opts[@]}" "$bin" "${common[@]}" --batch-size 1 --zero 1 --seed "$seed" --max-steps 2 \
    --out-dir "$tmp/two_$seed" >"$tmp/two_$seed.log" 2>&1 || { fail "2-rank run with seed $seed failed"; cat "$tmp/two_$seed.log"; exit 1; }
done
cp -r "$tmp/two_1/checkpoint_00000002" "$tmp/two_mixed"
mix "$tmp/two_mixed" "$tmp/two_2/checkpoint_00000002" state_r00001.bin
expect_mixed_refused two_ranks state_r00001.bin "$tmp/two_mixed" 2

# ---- version 2 state files (no configuration hash) resume to the same bits
cp -r "$tmp/one_1/checkpoint_00000002" "$tmp/v2"
"$python" - "$tmp/v2/state_r00000.bin" <<'PY'
import struct, sys
path = sys.argv[1]
data = bytearray(open(path, "rb").read())
version, header_bytes = struct.unpack_from("<II", data, 8)
assert (version, header_bytes) == (3, 176), (version, header_bytes)
struct.pack_into("<II", data, 8, 2, 168)
open(path, "wb").write(data[:168] + data[176:])  # the configuration hash at offset 168 goes
PY
mix "$tmp/v2" "$tmp/v2" state_r00000.bin
for from in one_1/checkpoint_00000002 v2; do
  "$bin" "${common[@]}" --batch-size 2 --max-steps 3 --resume "$tmp/$from" --out-dir "$tmp/from_${from%%/*}" \
    >"$tmp/from_${from%%/*}.log" 2>&1 || { fail "resume from $from failed"; tail -n 2 "$tmp/from_${from%%/*}.log"; }
done
cmp -s "$tmp/from_one_1/model.bin" "$tmp/from_v2/model.bin" || fail "a version 2 checkpoint resumed to other weights"

[ "$failures" -eq 0 ] && echo "checkpoint_identity: all checks passed"
[ "$failures" -eq 0 ]
