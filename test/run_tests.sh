#!/usr/bin/env bash
# Runs test binaries and the project's other checks; prints one summary line
# "N passed, N failed[, N skipped]" (test cases and checks) and exits non-zero on any failure.
# A check script that exits 77 does not apply to this build (e.g. simt checks under test-gpu).
# usage: run_tests.sh [--only] cpu|gpu BINARY...   (--only: the binaries alone, no check scripts)
# CPU: every binary runs twice, SIMT_SCHEDULE=forward and reverse, so a missing barrier
# that one thread order hides is caught by the other.
set -u
only=0
if [ "${1:-}" = --only ]; then only=1; shift; fi
mode=$1; shift
log_dir=build/$mode/test/logs
mkdir -p "$log_dir"
passed=0; failed=0; skipped=0; failures=()

# Every entry's wall time, "SECONDS NAME" a line: the ten slowest are printed before the summary, so
# a suite that grows past its budget (45 minutes on 2 cores) shows where the time went.
timings=()

# Adds a Catch2 run's counts ("test cases: N | P passed | F failed" or "All tests passed
# (… in N test cases)"); a run without a summary (crash, abort) counts as one failure.
count_catch2() {
  local name=$1 log=$2 status=$3 line p f
  line=$(grep -E '^(All tests passed|test cases:)' "$log" | tail -n 1)
  if [[ $line =~ ^All\ tests\ passed.*\ ([0-9]+)\ test\ case ]]; then
    p=${BASH_REMATCH[1]}; f=0
  elif [[ $line =~ test\ cases:\ +[0-9]+\ \|\ +([0-9]+)\ passed\ \|\ +([0-9]+)\ failed ]]; then
    p=${BASH_REMATCH[1]}; f=${BASH_REMATCH[2]}
  elif [[ $line =~ test\ cases:\ +([0-9]+)\ \|\ +([0-9]+)\ failed ]]; then
    p=0; f=${BASH_REMATCH[2]}
  else
    p=0; f=1
  fi
  if [ "$status" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi
  passed=$((passed + p)); failed=$((failed + f))
  if [ "$f" -gt 0 ]; then failures+=("$name (log: $log)"); fi
  printf '%-44s %4d passed %4d failed  %5.1fs\n' "$name" "$p" "$f" "$4"
  timings+=("$4 $name")
}

run_binary() {
  local bin=$1 label=$2 log=$3; shift 3
  local start end status
  start=$(date +%s.%N)
  env "$@" "$bin" >"$log" 2>&1; status=$?
  end=$(date +%s.%N)
  count_catch2 "$label" "$log" "$status" "$(echo "$end - $start" | bc)"
}

# A named check that is a command: one pass or one failure.
run_check() {
  local name=$1; shift
  local log="$log_dir/${name//[^A-Za-z0-9_.-]/_}.log" start end status
  start=$(date +%s.%N)
  "$@" >"$log" 2>&1; status=$?
  end=$(date +%s.%N)
  if [ $status -eq 0 ]; then passed=$((passed + 1)); r="ok"
  elif [ $status -eq 77 ]; then skipped=$((skipped + 1)); r="skipped"
  else failed=$((failed + 1)); r="FAILED"; failures+=("$name (log: $log)"); fi
  printf '%-44s %s  %5.1fs\n' "$name" "$r" "$(echo "$end - $start" | bc)"
  timings+=("$(echo "$end - $start" | bc) $name")
}

# CPU: simt checks every launch against the GPU build's registers and shared memory (docs/SIMT.md,
# "Launches") from this tree's ptxas table, which a full run makes first so that it matches the
# sources; without nvcc, or when the GPU build fails (gpu_build.sh then says why), there is none
# and the rule is not applied. --only runs use $SIMT_KERNEL_RESOURCES as it is set.
if [ "$mode" = cpu ] && [ "$only" -eq 0 ]; then
  table=$PWD/build/ptx-report.txt.tsv nvcc=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
  rm -f "$table"
  unset SIMT_KERNEL_RESOURCES
  if ! command -v "$nvcc" >/dev/null; then
    echo "launches not checked against ptxas figures: no nvcc at $nvcc"
  elif make --no-print-directory -j2 ptx-report >"$log_dir/ptx-report.log" 2>&1 || [ -f "$table" ]; then
    export SIMT_KERNEL_RESOURCES=$table  # (make ptx-report fails on spills after writing it)
    echo "launches checked against $(wc -l <"$table") ptxas rows ($table)"
  else
    echo "launches not checked against ptxas figures: the GPU build failed (log: $log_dir/ptx-report.log)"
  fi
fi

for bin in "$@"; do
  name=$(basename "$bin")
  if [ "$mode" = cpu ]; then
    for order in forward reverse; do
      run_binary "$bin" "$name [$order]" "$log_dir/$name.$order.log" SIMT_SCHEDULE=$order
    done
  else
    run_binary "$bin" "$name" "$log_dir/$name.log"
  fi
done

for check in test/checks/*.sh test/lint/*.sh; do
  if [ "$only" -eq 1 ] || [ ! -e "$check" ]; then continue; fi
  run_check "$(basename "$check" .sh)" bash "$check" "$mode"
done

if [ ${#timings[@]} -gt 0 ]; then
  echo "slowest:"
  printf '%s\n' "${timings[@]}" | sort -rn | head -n 10 | awk '{ printf "  %7.1fs  %s\n", $1, substr($0, index($0, " ") + 1) }'
fi
if [ ${#failures[@]} -gt 0 ]; then
  echo "failed:"
  for f in "${failures[@]}"; do echo "  $f"; done
fi
if [ "$skipped" -gt 0 ]; then echo "$passed passed, $failed failed, $skipped skipped"; else echo "$passed passed, $failed failed"; fi
[ "$failed" -eq 0 ]
