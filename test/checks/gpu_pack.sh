#!/usr/bin/env bash
# The short GPU job's two halves, proven here without a GPU (docs/GPU.md, "A short job"):
#   make gpu-pack: gpu-pack/ within 48 MiB, its MANIFEST (commit, compiler, the glibc and driver
#   the binaries need, a sha256 that holds for every file), and its closure: every library a packed
#   binary loads is in the pack, the C/C++ base or the CUDA set (with libmpi taken out of a copy,
#   the closure check fails naming it and its package);
#   scripts/gpu_quick.sh in its rehearsal (QUICK_DRY_RUN=1: a stand-in nvidia-smi, the CPU trainer
#   and CPU test builds in place of the packed GPU ones): `gpu_quick.sh 420` ends within 420 s with
#   a stage file per stage and a summary; a budget too small for a stage's estimate skips it and
#   says so; a run killed after its second stage leaves those two stage files and their summary.
# usage: gpu_pack.sh cpu|gpu   (gpu: skipped; a GPU node runs scripts/gpu_quick.sh itself)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
[ "${1:-cpu}" = cpu ] || exit 77
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "ok: $*"; }

if ! make --no-print-directory gpu-pack > "$tmp/pack.log" 2>&1; then
  echo "FAIL: make gpu-pack: $(tail -n 3 "$tmp/pack.log")"; exit 1
fi
tail -n 1 "$tmp/pack.log"
size=$(du -sk gpu-pack | cut -f1)
if [ "$size" -le $((48 * 1024)) ]; then ok "gpu-pack is $((size / 1024)) MiB (limit 48)"; else fail "gpu-pack is $((size / 1024)) MiB, over 48"; fi
for line in '^commit [0-9a-f]{40}' '^compiler: .*g\+\+.*; nvcc [0-9.]+' '^needs glibc [0-9.]+ or later; NVIDIA driver [0-9.]+ or later'; do
  if grep -qE -- "$line" gpu-pack/MANIFEST; then ok "MANIFEST: $(grep -m 1 -E -- "$line" gpu-pack/MANIFEST)"
  else fail "MANIFEST lacks a line matching $line"; fi
done
if (cd gpu-pack && grep -E '^[0-9a-f]{64}  [0-9]+  ' MANIFEST | awk '{print $1 "  " $3}' | sha256sum --quiet -c -) > "$tmp/sha.log" 2>&1; then
  ok "every file's sha256 in the MANIFEST holds ($(grep -cE '^[0-9a-f]{64} ' gpu-pack/MANIFEST) files)"
else
  fail "MANIFEST sha256 mismatch: $(head -n 3 "$tmp/sha.log")"
fi
for file in train_gpt tokenize build/bench_attention build/gpu/test/kernels/test_flash_attention \
            build/gpu/test/kernels/test_matmul build/gpu/test/kernels/test_layernorm build/gpu/test/kernels/test_classifier \
            build/gpu/test/kernels/test_vocab_parallel_classifier build/gpu/test/model/test_gpt2 \
            build/gpu/test/model/test_recompute build/reference/parity/model.bin data/gpt2_bpe/encoder.json scripts/gpu_quick.sh; do
  [ -f "gpu-pack/$file" ] || fail "gpu-pack/$file is missing"
done
# Every packed script's imports of the repository's own dev/ modules are packed too (the first
# GPU run's parity stage failed on a missing dev/reference_common.py).
if missing=$(/usr/bin/python3 - gpu-pack/dev <<'PY'
import ast, os, sys
d = sys.argv[1]
for name in sorted(os.listdir(d)):
    if name.endswith(".py"):
        for node in ast.walk(ast.parse(open(os.path.join(d, name)).read())):
            for module in ([a.name for a in node.names] if isinstance(node, ast.Import) else
                           [node.module] if isinstance(node, ast.ImportFrom) and node.module else []):
                if os.path.exists(f"dev/{module}.py") and not os.path.exists(f"{d}/{module}.py"):
                    print(f"{name} imports dev/{module}.py")
PY
) && [ -z "$missing" ]; then ok "the packed dev/ scripts' own imports are packed"; else fail "gpu-pack/dev: $missing"; fi
if bash scripts/gpu_pack.sh --check-closure gpu-pack > "$tmp/closure.log" 2>&1; then ok "$(tail -n 1 "$tmp/closure.log")"
else fail "closure: $(cat "$tmp/closure.log")"; fi
# Planted: the pack without OpenMPI's library.
cp -r gpu-pack "$tmp/broken-pack"
rm "$tmp"/broken-pack/lib/libmpi.so.*
if bash scripts/gpu_pack.sh --check-closure "$tmp/broken-pack" > "$tmp/broken.log" 2>&1; then
  fail "the closure check passed a pack without libmpi"
elif grep -q '^closure: train_gpt loads libmpi.so.[0-9]* (.*package libopenmpi' "$tmp/broken.log"; then
  ok "without libmpi: $(grep -m 1 '^closure: train_gpt loads libmpi' "$tmp/broken.log")"
else
  fail "without libmpi the closure check did not name it with its package: $(head -n 3 "$tmp/broken.log")"
fi
rm -rf "$tmp/broken-pack"

# ---- the rehearsal
mkdir -p "$tmp/bin"
cat > "$tmp/bin/nvidia-smi" <<'EOF'
#!/usr/bin/env bash
# A stand-in for a rehearsal: one H100 with the oldest driver CUDA 13 takes.
case "$*" in
  *memory.used*) echo 1000 ;;
  *--query-gpu=*) echo "NVIDIA H100 80GB HBM3 (stand-in), 81559, 580.65.06, 9.0" ;;
  *) echo "GPU 0: NVIDIA H100 80GB HBM3 (stand-in)" ;;
esac
EOF
chmod +x "$tmp/bin/nvidia-smi"
rehearsal=(env "PATH=$tmp/bin:$PATH" QUICK_DRY_RUN=1 "QUICK_TRAINER=$PWD/train_gpt_cpu" "QUICK_TEST_DIR=$PWD/build/cpu/test"
           "QUICK_TESTS=kernels/test_layernorm kernels/test_classifier" "QUICK_TMP=$tmp" PYTHON=/usr/bin/python3
           bash gpu-pack/scripts/gpu_quick.sh)
quick() { QUICK_OUT=$1 "${rehearsal[@]}" "$2"; }  # OUT SECONDS: the rehearsal into OUT
stages=(device smoke parity hf throughput fp8 fp8_profile fp8_loss moe attention tests determinism sanitizer large)
start=$(date +%s)
quick "$tmp/full" 420 > "$tmp/full.log" 2>&1
status=$? seconds=$(( $(date +%s) - start ))
sed 's/^/  | /' "$tmp/full.log"
if [ "$seconds" -le 420 ]; then ok "gpu_quick.sh 420 ended in $seconds s (exit $status)"; else fail "gpu_quick.sh 420 took $seconds s"; fi
for stage in "${stages[@]}"; do
  if [ -f "$tmp/full/$stage.json" ] && grep -q "^| $stage | " "$tmp/full/summary.md"; then :; else fail "no $stage.json or summary row"; fi
done
for want in 'device PASS' 'smoke PASS' 'parity PASS' 'throughput PASS' 'fp8 PASS' 'fp8_profile PASS' 'fp8_loss PASS' 'moe PASS' 'attention SKIP' 'tests PASS' 'determinism PASS' 'sanitizer SKIP' 'large PASS'; do
  read -r stage verdict <<< "$want"
  got=$(sed -n "s/^STAGE $stage: \([A-Z]*\).*/\1/p" "$tmp/full.log")
  if [ "$got" = "$verdict" ]; then ok "stage $stage: $verdict"; else fail "stage $stage: $got, expected $verdict"; fi
done
grep -q '^# GPU quick run (420 s)' "$tmp/full/summary.md" || fail "summary.md has no title"

# A budget that fits the first stages only: the rest say why they did not run.
quick "$tmp/short" 45 > "$tmp/short.log" 2>&1
if grep -qE '^STAGE parity: SKIP \(its estimate of 60 s does not fit the [0-9]+ s left of 45\)$' "$tmp/short.log" &&
   grep -q '^STAGE device: PASS' "$tmp/short.log"; then
  ok "a 45 s budget: $(grep -m 1 '^STAGE parity' "$tmp/short.log")"
else
  fail "a 45 s budget did not skip parity by its estimate: $(grep '^STAGE' "$tmp/short.log" | paste -sd '|')"
fi

# Killed once its second stage is in the summary, so in its third (as a job at its time limit):
# the finished stages and their summary stay.
QUICK_OUT=$tmp/cut setsid "${rehearsal[@]}" 420 > "$tmp/cut.log" 2>&1 &
runner=$!
for _ in $(seq 1 600); do grep -qs '^| smoke | ' "$tmp/cut/summary.md" && break; sleep 0.2; done
kill -KILL -- -"$runner" 2>/dev/null; wait "$runner" 2>/dev/null
if [ -f "$tmp/cut/device.json" ] && [ -f "$tmp/cut/smoke.json" ] && [ ! -f "$tmp/cut/parity.json" ] &&
   grep -q '^| device | PASS' "$tmp/cut/summary.md" && grep -q '^| smoke | PASS' "$tmp/cut/summary.md"; then
  ok "killed during parity: device.json, smoke.json and their summary remain"
else
  fail "a killed run lost its finished stages: $(ls "$tmp/cut"); $(grep '^|' "$tmp/cut/summary.md" 2>/dev/null | paste -sd ' ')"
fi
[ "$failures" -eq 0 ]
