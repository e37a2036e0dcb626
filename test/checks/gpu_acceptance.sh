#!/usr/bin/env bash
# The parts of make gpu-acceptance (scripts/gpu_acceptance.sh) and make gpu-deps
# (scripts/gpu_deps.sh) that need no GPU, so they cannot rot where no GPU runs them: the one-line
# refusal without a GPU, STAGES and argument parsing, the checks before any stage (a driver too
# old for the CUDA runtime, a Python without CUDA torch or matplotlib: with a stand-in nvidia-smi
# and python), the staging check of build/gpu-deps (on directories made here; nothing is
# downloaded), the stage result files, summary.md, the sanitizer stage's verdict (a run cut by the
# time limit fails), and the figures computed from a run's log and metrics.jsonl (MFU, run-to-run
# and PyTorch comparisons). The dry run is test/checks/gpu_dry_run.sh.
# usage: gpu_acceptance.sh cpu|gpu   (both modes; on a machine with a GPU the refusal is not checked)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "ok: $*"; }
acceptance() { env -u STAGES -u ACCEPTANCE_OUT bash scripts/gpu_acceptance.sh "$@"; }
report() { python3 scripts/acceptance_report.py "$@"; }

# expect NAME STATUS PATTERN COMMAND...: COMMAND exits STATUS and prints exactly one line
# (stdout and stderr together), matching the extended regex PATTERN.
expect() {
  local name=$1 want=$2 pattern=$3 out rc; shift 3
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" -ne "$want" ]; then fail "$name: exit $rc, expected $want; output: $out"
  elif [ "$(printf '%s\n' "$out" | wc -l)" -ne 1 ]; then fail "$name: expected one line, got: $out"
  elif ! grep -qE -- "$pattern" <<< "$out"; then fail "$name: '$out' does not match '$pattern'"
  else ok "$name: $out"; fi
}

# ---- (a) without a GPU: one line, exit 1
if { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; } || [ -e /dev/nvidia0 ]; then
  echo "skipped: the refusal without a GPU (this machine has one)"
else
  expect "no GPU" 1 '^gpu_acceptance: no GPU here \(.*\): run make gpu-acceptance on a machine with an NVIDIA GPU$' acceptance
fi

# ---- (b) STAGES and arguments
all="device build test sanitizer parity determinism ceilings throughput"
# same NAME GOT WANT
same() { if [ "$2" = "$3" ]; then ok "$1: $2"; else fail "$1: got '$2', expected '$3'"; fi; }
same "default stages" "$(acceptance --list-stages 2>&1)" "$all"
same "STAGES in running order, commas and repeats" \
  "$(STAGES="throughput, device  test,test" bash scripts/gpu_acceptance.sh --list-stages 2>&1)" "device test throughput"
expect "unknown stage" 2 "^gpu_acceptance: unknown stage 'bogus' in STAGES \(stages: $all\)$" \
  env STAGES="device bogus" bash scripts/gpu_acceptance.sh
expect "unknown stage, --list-stages" 2 "unknown stage 'sanitiser'" env STAGES="sanitiser" bash scripts/gpu_acceptance.sh --list-stages
expect "empty STAGES" 2 '^gpu_acceptance: STAGES is empty' env STAGES=" , " bash scripts/gpu_acceptance.sh
expect "unknown argument" 2 "^gpu_acceptance: unknown argument '--fast'" acceptance --fast
expect "--summary without DIR" 2 'usage: gpu_acceptance.sh --summary DIR' acceptance --summary

# ---- (b2) before any stage: the driver and the Python modules, one line each (a stand-in
# nvidia-smi that reports a GPU and a driver; a stand-in python that lacks what each case says).
# The script runs from a copy of scripts/ with STAGES=device and no staged packages, so that if a
# check let it through it could only write the device stage's file into that copy.
mkdir -p "$tmp/bin" "$tmp/copy"
cp -r scripts "$tmp/copy/"
guarded() { env PATH="$tmp/bin:$PATH" STAGES=device GPU_DEPS="$tmp/none" "$@" bash "$tmp/copy/scripts/gpu_acceptance.sh"; }
# fake_gpu DRIVER: nvidia-smi in $tmp/bin reporting an H100 with that driver.
fake_gpu() {
  printf '#!/bin/sh\ncase "$*" in\n  -L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)" ;;\n  *driver_version*) echo "%s" ;;\n  *) echo "NVIDIA H100 80GB HBM3" ;;\nesac\n' "$1" > "$tmp/bin/nvidia-smi"
  chmod +x "$tmp/bin/nvidia-smi"
}
# fake_python LACKS: a python that is /usr/bin/python3 except that LACKS fails (cuda: torch sees no GPU).
fake_python() {
  printf '#!/bin/sh\ncase "$*" in\n  *is_available*) [ "%s" = cuda ] && exit 1; exit 0 ;;\n  *"import %s"*) exit 1 ;;\nesac\nexec /usr/bin/python3 "$@"\n' "$1" "$1" > "$tmp/python"
  chmod +x "$tmp/python"
}
if /usr/bin/python3 -c 'import torch, numpy, matplotlib' 2>/dev/null; then
  fake_gpu 570.86.15
  expect "preflight: old driver" 1 '^gpu_acceptance: preflight: driver 570.86.15 is older than CUDA [0-9.]+ needs \(580.65.06 or later\): update the driver' \
    guarded PYTHON=/usr/bin/python3
  fake_gpu 580.159.04
  for lacks in cuda matplotlib; do
    fake_python "$lacks"
    out=$(guarded PYTHON="$tmp/python" 2>&1); rc=$?
    want='^gpu_acceptance: preflight: torch .* sees no GPU \(torch.cuda.is_available\(\) is False\): set PYTHON to a CUDA PyTorch$'
    [ "$lacks" = matplotlib ] && want="^gpu_acceptance: preflight: $tmp/python cannot import matplotlib: install it there or set PYTHON\$"
    if [ "$rc" -eq 1 ] && grep -qE '^preflight: driver 580.159.04 \(CUDA [0-9.]+ needs 580.65.06 or later\): ok$' <<< "$out" &&
       tail -n 1 <<< "$out" | grep -qE -- "$want"; then
      ok "preflight: python without $lacks: $(tail -n 1 <<< "$out")"
    else
      fail "preflight: python without $lacks: exit $rc, output: $out"
    fi
  done
else
  echo "skipped: the preflight cases (/usr/bin/python3 lacks torch, numpy or matplotlib)"
fi

# ---- (c) the staging check of build/gpu-deps
staged=$tmp/gpu-deps
# stage NAME ARCH BYTES: one fake package file listed in the MANIFEST.
stage() {
  truncate -s "$3" "$staged/$1.deb"
  echo "$1 1.0 $2 $1.deb $3" >> "$staged/MANIFEST"
}
expect "staging: missing directory" 1 "^gpu-deps: $staged is missing: run 'make gpu-deps' on a networked Debian machine" \
  bash scripts/gpu_deps.sh --check "$staged"
mkdir -p "$staged"
expect "staging: no MANIFEST" 1 "^gpu-deps: $staged/MANIFEST is missing" bash scripts/gpu_deps.sh --check "$staged"
echo "# package version architecture file bytes" > "$staged/MANIFEST"
stage catch2 all 300000
stage libopenmpi3 "$(dpkg --print-architecture 2>/dev/null || echo all)" 2500000
expect "staging: a package of the list missing" 1 "^gpu-deps: $staged/MANIFEST lacks libopenmpi-dev, which scripts/gpu_deps.sh stages" \
  bash scripts/gpu_deps.sh --check "$staged"
for name in $(bash scripts/gpu_deps.sh --list); do
  grep -q "^$name " "$staged/MANIFEST" || stage "$name" all 1000
done
expect "staging: no vocabulary" 1 "^gpu-deps: $staged/gpt2_bpe/encoder.json \(the GPT-2 vocabulary\) is missing: rerun make gpu-deps$" \
  bash scripts/gpu_deps.sh --check "$staged"
mkdir -p "$staged/gpt2_bpe"
cp data/gpt2_bpe/encoder.json data/gpt2_bpe/vocab.bpe "$staged/gpt2_bpe/"
echo " " >> "$staged/gpt2_bpe/vocab.bpe"
expect "staging: altered vocabulary" 1 "^gpu-deps: $staged/gpt2_bpe/vocab.bpe is not the GPT-2 vocabulary \(sha256 differs" \
  bash scripts/gpu_deps.sh --check "$staged"
cp data/gpt2_bpe/vocab.bpe "$staged/gpt2_bpe/"
expect "staging: complete" 0 "^gpu-deps: $staged: $(bash scripts/gpu_deps.sh --list | wc -l) packages and the GPT-2 vocabulary, 4.1 MiB \(limit 48 MiB\)$" bash scripts/gpu_deps.sh --check "$staged"
stage big all $((49 * 1048576))
expect "staging: over the limit" 1 "^gpu-deps: $staged holds 53.1 MiB of packages, over the 48 MiB limit$" \
  bash scripts/gpu_deps.sh --check "$staged"
rm "$staged/big.deb"
expect "staging: listed file missing" 1 "^gpu-deps: $staged/big.deb \(listed in $staged/MANIFEST\) is missing" \
  bash scripts/gpu_deps.sh --check "$staged"
sed -i '/^big /d' "$staged/MANIFEST"
truncate -s 1000 "$staged/catch2.deb"
expect "staging: size differs" 1 "^gpu-deps: $staged/catch2.deb has 1000 bytes, $staged/MANIFEST says 300000" \
  bash scripts/gpu_deps.sh --check "$staged"
truncate -s 300000 "$staged/catch2.deb"
touch "$staged/stray.deb"
expect "staging: unlisted package" 1 "^gpu-deps: $staged/stray.deb is not listed in $staged/MANIFEST" \
  bash scripts/gpu_deps.sh --check "$staged"
rm "$staged/stray.deb"
stage foreign s390x 10
expect "staging: other architecture" 1 "^gpu-deps: $staged/foreign.deb is for s390x, this machine is " \
  bash scripts/gpu_deps.sh --check "$staged"

# ---- (d) stage files and summary.md
results=$tmp/results
line=$(ACCEPTANCE_DEVICE="NVIDIA H100 80GB HBM3" ACCEPTANCE_COMMIT=0123456789ab report record "$results" device 0 PASS 1.26 \
  "NVIDIA H100 80GB HBM3, 132 SMs" sms=132 "name=NVIDIA H100 80GB HBM3" 'torch={"sms": 132}' 2>&1)
same "record prints the stage line" "$line" "STAGE device: PASS (NVIDIA H100 80GB HBM3, 132 SMs)"
if python3 - "$results/device.json" <<'EOF'; then ok "record writes the stage file"; else fail "record: $results/device.json"; fi
import json, sys
r = json.load(open(sys.argv[1]))
want = {"stage": "device", "order": 0, "status": "PASS", "seconds": 1.3, "commit": "0123456789ab",
        "device": "NVIDIA H100 80GB HBM3",
        "figures": {"sms": 132, "name": "NVIDIA H100 80GB HBM3", "torch": {"sms": 132}}}
bad = {k: (r.get(k), v) for k, v in want.items() if r.get(k) != v}
if bad:
    print("FAIL: fields (got, want):", bad)
sys.exit(1 if bad else 0)
EOF
expect "record: bad status" 1 "status 'PASSED' of stage test is not one of PASS, FAIL, SKIP" \
  report record "$results" test 2 PASSED 1 ""
# Canned files of a later run: names sort differently from the running order.
cat > "$results/test.json" <<'EOF'
{"stage": "test", "order": 2, "status": "FAIL", "text": "make test-gpu: 341 passed, 1 failed | 2 skipped",
 "seconds": 120.5, "figures": {"passed": 341, "failed": 1, "failures": "test_gpt2 (log: x)"},
 "commit": "0123456789ab", "date": "2026-11-23T12:00:00Z", "device": "NVIDIA H100 80GB HBM3"}
EOF
cat > "$results/ceilings.json" <<'EOF'
{"stage": "ceilings", "order": 6, "status": "SKIP", "text": "no CUDA PyTorch", "seconds": 0.2,
 "figures": {"ceilings": {"copy_gb_per_s": 3000.5}}, "commit": "0123456789ab",
 "date": "2026-11-23T12:05:00Z", "device": "NVIDIA H100 80GB HBM3"}
EOF
expect "summary" 0 "^summary: $results/summary.md: 1 PASS, 1 FAIL, 1 SKIP$" acceptance --summary "$results"
summary=$results/summary.md
for want in '- device: NVIDIA H100 80GB HBM3' '- commit: 0123456789ab' '- stages: 1 PASS, 1 FAIL, 1 SKIP' \
            '| test | FAIL | make test-gpu: 341 passed, 1 failed \| 2 skipped | 120.5 | 2026-11-23T12:00:00Z | 0123456789ab |' \
            '## test: FAIL' '- failures: test_gpt2 (log: x)' '- ceilings: {"copy_gb_per_s": 3000.5}' '- sms: 132'; do
  if grep -qxF -- "$want" "$summary"; then ok "summary.md has: $want"; else fail "summary.md lacks: $want"; fi
done
same "summary.md rows in running order" \
  "$(grep -E '^\| (device|test|ceilings) \|' "$summary" | cut -d' ' -f2 | paste -sd ' ')" "device test ceilings"
echo '{"stage": "parity"' > "$results/parity.json"
expect "summary: broken stage file" 1 "^acceptance_report: $results/parity.json: not a stage result" acceptance --summary "$results"
echo '{"stage": "parity"}' > "$results/parity.json"
expect "summary: incomplete stage file" 1 "^acceptance_report: $results/parity.json: not a stage result \(no order, status" \
  acceptance --summary "$results"
mkdir -p "$tmp/empty"
expect "summary: no stage files" 1 "holds no stage results" acceptance --summary "$tmp/empty"

# ---- the sanitizer stage's verdict from its runs' result files
runs=$tmp/sanitizer
mkdir -p "$runs"
for tool in memcheck racecheck synccheck initcheck; do
  for target in test_gelu train; do echo "$tool $target clean 0 4.5" > "$runs/$tool.$target.result"; done
done
verdict=$(report sanitizer "$runs" 120 8 2>&1)
same "sanitizer: every run clean" "$(head -n 2 <<< "$verdict" | paste -sd '|')" \
  "PASS|memcheck: 2 clean; racecheck: 2 clean; synccheck: 2 clean; initcheck: 2 clean"
echo "racecheck test_gelu timeout 0 120.2" > "$runs/racecheck.test_gelu.result"
verdict=$(report sanitizer "$runs" 120 8 2>&1)
same "sanitizer: a run cut by the limit fails, named with its tool" "$(head -n 2 <<< "$verdict" | paste -sd '|')" \
  "FAIL|memcheck: 2 clean; racecheck: 1 clean, 1 cut by the 120 s limit (test_gelu); synccheck: 2 clean; initcheck: 2 clean"
if grep -qxF 'slowest="racecheck test_gelu 120.2 s"' <<< "$verdict"; then ok "sanitizer: the slowest run is a figure"
else fail "sanitizer: no slowest figure in: $verdict"; fi
rm "$runs/racecheck.test_gelu.result"
same "sanitizer: a missing run fails" "$(report sanitizer "$runs" 120 8 2>&1 | head -n 2 | paste -sd '|')" \
  "FAIL|only 7 of 8 runs reported; memcheck: 2 clean; racecheck: 1 clean; synccheck: 2 clean; initcheck: 2 clean"
echo "memcheck train finished" > "$runs/memcheck.train.result"
expect "sanitizer: a malformed result file" 1 "^acceptance_report: $runs/memcheck.train.result: expected 'tool target outcome errors seconds'" \
  report sanitizer "$runs" 120 8

# ---- figures from a run: ms/step after the warm-up, tokens/s, MFU; run-to-run; PyTorch parity
run=$tmp/run
mkdir -p "$run"
printf '%s\n' "model: L=12 NH=12 C=768 maxT=1024 V=50257 Vp=50304 from preset d12, 124,475,904 parameters" \
  "memory: parameters+gradients 474.8 MiB, optimizer 1424.6 MiB, activations 1979.5 MiB, total 3878.9 MiB" > "$run/log"
for step in 1 2 3 4 5 6 7 8 9 10; do
  ms=100; [ "$step" -le 5 ] && ms=900; [ "$step" -eq 8 ] && ms=130
  echo "{\"step\":$step,\"train_loss\":$((11 - step)).5,\"lr\":0.0006,\"grad_norm\":1.5,\"ms\":$ms,\"tokens_per_s\":1}"
done > "$run/metrics.jsonl"
if python3 - "$(report throughput "$run/log" "$run/metrics.jsonl" 8 1024 5 "NVIDIA H100 PCIe" 2>&1)" <<'EOF'; then
import json, sys
d = json.loads(sys.argv[1])
flops = (6 * 124475904 + 6 * 12 * 768 * 1024) * 8 * 1024 / 0.1  # median of steps 6..10: 100 ms
want = {"steps_timed": 5, "ms_per_step": 100.0, "tokens_per_s": 81920, "peak_tflops": 756.0,
        "mfu_percent": round(100 * flops / 756e12, 1), "parameters": 124475904, "planned_mib": 3878.9,
        "final_loss": 1.5}
bad = {k: (d.get(k), v) for k, v in want.items() if d.get(k) != v}
if bad:
    print("FAIL: throughput figures (got, want):", bad)
sys.exit(1 if bad else 0)
EOF
  ok "throughput: median ms after the warm-up, tokens/s, MFU against the H100 PCIe peak"
else
  fail "throughput figures"
fi
same "an unknown device is rated as an H100 SXM" \
  "$(report throughput "$run/log" "$run/metrics.jsonl" 8 1024 5 "Some Future GPU" |
     python3 -c 'import json, sys; d = json.load(sys.stdin); print(d["peak_tflops"], d["peak_of"])')" "989.0 H100 SXM (default)"
expect "throughput: log without the memory line" 1 "no 'model: ... parameters' or 'memory: ... total X MiB' line" \
  report throughput /dev/null "$run/metrics.jsonl" 8 1024 5 H100
cp "$run/metrics.jsonl" "$run/same.jsonl"
sed 's/"ms":100,/"ms":101,/' "$run/metrics.jsonl" > "$run/slower.jsonl"
sed 's/"train_loss":3.5,/"train_loss":3.5000001,/' "$run/metrics.jsonl" > "$run/other.jsonl"
expect "same run: timings aside" 0 '^10 records identical \(timings aside\)$' report same-run "$run/metrics.jsonl" "$run/slower.jsonl"
expect "same run: one loss differs" 1 '^first difference: .*"step": 8' report same-run "$run/metrics.jsonl" "$run/other.jsonl"
python3 -c 'import json; json.dump({"losses": [10.5 - k for k in range(10)], "grad_norms": [1.5] * 10}, open("'"$run"'/reference.json", "w"))'
expect "parity within the limit" 0 '^0 0$' report parity "$run/reference.json" "$run/same.jsonl" 1e-4
expect "parity beyond the limit" 1 '^2.86e-08 0$' report parity "$run/reference.json" "$run/other.jsonl" 1e-8

[ "$failures" -eq 0 ]
