#!/usr/bin/env bash
# dev/pipeline_timeline.py draws a pipeline timeline (the JSON of src/dist/pipeline_check.h's
# pipeline_timeline_json, here zb-h1 at p = 2, m = 2) as a PNG of the right size whose cells have
# the right colours (forward blue, input backward green, weight backward orange, idle white), and
# refuses a missing or malformed file in one line with a non-zero exit; and what --plan
# --pp-timeline writes for a run draws with --plan's bubble.
# usage: pipeline_timeline.sh cpu|gpu   (the same in both builds; gpu: skipped)
set -u
cd "$(dirname "$0")/../.." || exit 1
[ "${1:-cpu}" = cpu ] || exit 77
python=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# r0 | F0 F1 .  b0 W0 b1 W1
# r1 | .  F0 b0 F1 b1 W0 W1
cat >"$tmp/zb.json" <<'JSON'
{"kind": "zb-h1", "stages": 2, "microbatches": 2, "virtual_stages": 1, "makespan": 7, "ranks": [[{"op": "F", "microbatch": 0, "chunk": 0, "start": 0, "cost": 1}, {"op": "F", "microbatch": 1, "chunk": 0, "start": 1, "cost": 1}, {"op": "BI", "microbatch": 0, "chunk": 0, "start": 3, "cost": 1}, {"op": "W", "microbatch": 0, "chunk": 0, "start": 4, "cost": 1}, {"op": "BI", "microbatch": 1, "chunk": 0, "start": 5, "cost": 1}, {"op": "W", "microbatch": 1, "chunk": 0, "start": 6, "cost": 1}], [{"op": "F", "microbatch": 0, "chunk": 1, "start": 1, "cost": 1}, {"op": "BI", "microbatch": 0, "chunk": 1, "start": 2, "cost": 1}, {"op": "F", "microbatch": 1, "chunk": 1, "start": 3, "cost": 1}, {"op": "BI", "microbatch": 1, "chunk": 1, "start": 4, "cost": 1}, {"op": "W", "microbatch": 0, "chunk": 1, "start": 5, "cost": 1}, {"op": "W", "microbatch": 1, "chunk": 1, "start": 6, "cost": 1}]]}
JSON
if ! out=$("$python" dev/pipeline_timeline.py "$tmp/zb.json" -o "$tmp/zb.png" --cell 10 2>&1); then
  fail "dev/pipeline_timeline.py exited non-zero: $out"
fi
[ "$out" = "zb-h1 p=2 m=2 v=1: makespan 7, bubble 0.1429 -> $tmp/zb.png" ] || fail "unexpected summary: $out"

# Decode the PNG (8-bit RGB, filter 0 rows as the script writes them) and look at cell centres.
"$python" - "$tmp/zb.png" <<'PY' || fail "the PNG's size or colours are wrong"
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
width, height = struct.unpack(">II", data[16:24])
assert (width, height) == (7 * 10 + 1, 2 * 20 + 1), (width, height)
pos, idat = 8, b""
while pos < len(data):
    length, kind = struct.unpack(">I4s", data[pos:pos + 8])
    if kind == b"IDAT":
        idat += data[pos + 8:pos + 8 + length]
    pos += 12 + length
raw = zlib.decompress(idat)
stride = 1 + 3 * width
def at(rank, t):  # the centre of rank's cell at time t
    x, y = t * 10 + 5, rank * 20 + 10
    return tuple(raw[y * stride + 1 + 3 * x:y * stride + 4 + 3 * x])
blue, green, orange, white = (66, 120, 200), (60, 160, 90), (230, 140, 40), (255, 255, 255)
expect = {(0, 0): blue, (0, 2): white, (0, 3): green, (0, 4): orange, (1, 0): white, (1, 2): green, (1, 5): orange}
for (rank, t), colour in expect.items():
    assert at(rank, t) == colour, (rank, t, at(rank, t), colour)
PY

printf '{"ranks": []}\n' >"$tmp/bad.json"
for input in "$tmp/missing.json" "$tmp/bad.json"; do
  if out=$("$python" dev/pipeline_timeline.py "$input" -o "$tmp/bad.png" 2>&1); then
    fail "$input was drawn"
  fi
  if [ "$(printf '%s\n' "$out" | wc -l)" -ne 1 ] || [[ "$out" != "$input: not a pipeline timeline"* ]]; then
    fail "$input: not one line naming the file: $out"
  fi
  [ ! -e "$tmp/bad.png" ] || fail "$input left a PNG"
done

# --plan --pp-timeline writes the run's own schedule (interleaved, 4 stages x 2 chunks, 8
# micro-batches); drawn, its bubble is the one --plan printed.
bin=./train_gpt_cpu
if [ -x "$bin" ]; then
  if "$bin" --plan --model d12 --pp 4 --pp-schedule interleaved --pp-virtual 2 --world-size 4 --batch-size 4 \
      --seq-len 1024 --total-batch-tokens 32768 --pp-timeline "$tmp/run.json" >"$tmp/plan.txt" 2>&1 &&
      drawn=$("$python" dev/pipeline_timeline.py "$tmp/run.json" -o "$tmp/run.png" 2>&1); then
    planned=$(sed -En 's/^  bubble \(unit costs\): ([0-9.]+)% of the step.*/\1/p' "$tmp/plan.txt")
    "$python" - "$drawn" "$planned" <<'PY' || fail "--pp-timeline's drawing ($drawn) and --plan's bubble ($planned%) disagree"
import re, sys
drawn = float(re.search(r"bubble ([0-9.]+)", sys.argv[1]).group(1))
sys.exit(0 if sys.argv[2] and abs(100 * drawn - float(sys.argv[2])) < 0.051 and "interleaved p=4 m=8 v=2" in sys.argv[1] else 1)
PY
  else
    fail "--plan --pp-timeline or its drawing failed: $(tail -n 2 "$tmp/plan.txt")"
  fi
fi

[ "$failures" -eq 0 ] && echo "pipeline_timeline: PASS"
exit $((failures > 0))
