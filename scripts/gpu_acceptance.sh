#!/usr/bin/env bash
# make gpu-acceptance: proves the GPU build on a GPU machine in one command. Needs only a CUDA
# toolkit, a driver and a python3 with PyTorch: no network, no root changes to /. OpenMPI, Catch2,
# nlohmann-json, PCRE2 and the GPT-2 vocabulary come from build/gpu-deps (make gpu-deps, on a
# networked Debian machine), unpacked into a local prefix, or from the system when it has them.
# Before any stage, one line each: the driver is new enough for the CUDA runtime, and python has
# torch with CUDA, numpy and matplotlib. Stages, in running order:
#   device       name, SMs, memory, driver, clocks
#   build        train_gpt, ./tokenize and every GPU test binary
#   test         make test-gpu and make ptx-report
#   sanitizer    compute-sanitizer memcheck, racecheck, synccheck and initcheck on each
#                build/gpu/test/test_* and on 1 small training step; a run cut by its time
#                limit fails the stage, named with its tool
#   parity       dev/gpt2_reference.py on the GPU (CUDA PyTorch) against train_gpt, fp32 and bf16
#   determinism  one 20-step run three times (the third with CUDA_LAUNCH_BLOCKING=1): metrics
#                and model.bin identical
#   ceilings     device-to-device copy GB/s and bf16 GEMM TFLOP/s (dev/ceilings.py); make bench
#   throughput   d12, T=1024, B=8/32/64: ms/step, tokens/s, MFU, peak memory next to the
#                trainer's plan; d48 one step at the largest B of 8/4/2/1 that fits
# Each prints `STAGE name: PASS|FAIL|SKIP (figures)` and writes build/acceptance/NAME.json (logs in
# build/acceptance/logs/NAME/); summary.md sums up every stage file there.
#
# usage: gpu_acceptance.sh                  run STAGES on GPU 0; exit 1 if a stage fails
#        ACCEPTANCE_DRY_RUN=1 gpu_acceptance.sh   rehearsal without a GPU: the checks above that
#                          need none, the staged packages unpacked into a fresh prefix, the build
#                          stage against that prefix alone (scripts/hide_system_copies.sh leaves
#                          only the C/C++ base's headers and link names; sm_90a only), then
#                          stop before the first stage that needs a GPU (results in
#                          build/acceptance-dry-run/; test/checks/gpu_dry_run.sh runs it)
#        gpu_acceptance.sh --list-stages    print the stages STAGES selects
#        gpu_acceptance.sh --summary DIR    write DIR/summary.md from the stage files in DIR
#        (these two need no GPU: test/checks/gpu_acceptance.sh runs them; so does
#        scripts/gpu_deps.sh --check DIR, the staging check used here)
# environment: STAGES      stages to run, separated by spaces or commas (default: all)
#              ACCEPTANCE_OUT  also copy summary.md, this run's stage files and logs.tar.gz there
#              GPU_DEPS    staged packages (build/gpu-deps); GPU_PREFIX where they are unpacked
#                          (build/gpu-prefix); CUDA_HOME (/usr/local/cuda); PYTHON (a python3
#                          with PyTorch; default: python3 or /usr/bin/python3, whichever has it)
#              SANITIZER_TIMEOUT  seconds per sanitizer run (120); SANITIZER_JOBS  runs at once (8)
#              DRY_RUN_TARGETS  in a dry run, the make targets of the build stage (default: all)
#              ACCEPTANCE_COMMIT  the commit to record where the tree has no .git (default: git's)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

all_stages=(device build test sanitizer parity determinism ceilings throughput)
# The stages that need no GPU: the only ones a dry run runs.
host_stages=(build)
dry_run=${ACCEPTANCE_DRY_RUN:-0}
results=build/acceptance
[ "$dry_run" = 1 ] && results=build/acceptance-dry-run
logs=$results/logs
work=$results/work
deps_dir=${GPU_DEPS:-build/gpu-deps}
prefix=${GPU_PREFIX:-build/gpu-prefix}

die() { echo "gpu_acceptance: $*" >&2; exit 1; }
usage_error() { echo "gpu_acceptance: $*" >&2; exit 2; }
# The report helper needs only the standard library, so any python3 runs it.
report() { python3 scripts/acceptance_report.py "$@"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
# A JSON string of its argument, for figures that are free text.
json_string() { python3 -c 'import json, sys; print(json.dumps(sys.argv[1]))' "$1"; }

# Sets stages: the stages STAGES names, in running order, each once.
parse_stages() {
  local words name known s
  local -A wanted=()
  read -r -a words <<< "${STAGES-${all_stages[*]}}"
  words=("${words[@]//,/ }")
  read -r -a words <<< "${words[*]}"
  for name in "${words[@]}"; do
    known=0
    for s in "${all_stages[@]}"; do [ "$s" = "$name" ] && known=1; done
    [ "$known" -eq 1 ] || usage_error "unknown stage '$name' in STAGES (stages: ${all_stages[*]})"
    wanted[$name]=1
  done
  stages=()
  for s in "${all_stages[@]}"; do [ -n "${wanted[$s]:-}" ] && stages+=("$s"); done
  [ ${#stages[@]} -gt 0 ] || usage_error "STAGES is empty (stages: ${all_stages[*]})"
}

gpu_present() {
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then return 0; fi
  [ -e /dev/nvidia0 ]
}

# ---- environment: CUDA, python, OpenMPI/Catch2/nlohmann-json, NCCL

pick_python() {
  local candidate
  if [ -n "${PYTHON:-}" ]; then
    "$PYTHON" -c 'import torch' >/dev/null 2>&1 || die "PYTHON=$PYTHON cannot import torch"
    return
  fi
  for candidate in python3 /usr/bin/python3; do
    if "$candidate" -c 'import torch' >/dev/null 2>&1; then
      PYTHON=$(command -v "$candidate"); export PYTHON; return
    fi
  done
  die "no python3 with PyTorch (tried python3 and /usr/bin/python3): set PYTHON"
}

system_has_deps() {
  local flags
  if ! command -v mpicxx >/dev/null 2>&1 || ! command -v mpirun >/dev/null 2>&1; then return 1; fi
  read -r -a flags <<< "$(mpicxx --showme:compile 2>/dev/null)"
  printf '#include <mpi.h>\n#include <catch2/catch.hpp>\n#include <nlohmann/json.hpp>\n#define PCRE2_CODE_UNIT_WIDTH 8\n#include <pcre2.h>\n' |
    g++ -std=c++17 -E -x c++ - "${flags[@]}" -o /dev/null >/dev/null 2>&1
}

# Unpacks the staged packages into $prefix (again only when the MANIFEST changed; always afresh in
# a dry run) and points the compilers, the linker, the loader and OpenMPI at it; puts the staged
# GPT-2 vocabulary where the trainer and the checks look for it.
use_staged_deps() {
  local name file triplet abs
  bash scripts/gpu_deps.sh --check "$deps_dir" || exit 1
  [ "$dry_run" = 1 ] && rm -rf "$prefix"
  if ! cmp -s "$prefix/MANIFEST" "$deps_dir/MANIFEST" 2>/dev/null; then
    command -v dpkg-deb >/dev/null 2>&1 ||
      die "dpkg-deb not found: $deps_dir holds Debian packages; install OpenMPI, Catch2 and nlohmann-json with this system's packages instead"
    rm -rf "$prefix"
    mkdir -p "$prefix/bin" || die "cannot create $prefix"
    while read -r name _ _ file _; do
      case $name in '#'* | '') continue ;; esac
      dpkg-deb -x "$deps_dir/$file" "$prefix" || die "dpkg-deb -x $deps_dir/$file failed"
    done < "$deps_dir/MANIFEST"
    # Installing the packages would make these names with update-alternatives; dpkg -x does not.
    ln -s ../usr/bin/mpirun.openmpi "$prefix/bin/mpirun"
    ln -s ../usr/bin/mpicxx.openmpi "$prefix/bin/mpicxx"
    cp "$deps_dir/MANIFEST" "$prefix/MANIFEST"  # last: marks a complete unpack
  fi
  abs=$(cd "$prefix" && pwd)
  triplet=$(cd "$abs/usr/lib" && compgen -G '*-linux-gnu' | head -n 1)
  [ -n "$triplet" ] || die "$prefix/usr/lib has no *-linux-gnu directory: remove $prefix and rerun"
  # OpenMPI finds its components, help texts and mpicxx's wrapper data relative to OPAL_PREFIX;
  # the Makefile asks mpicxx for the compile and link flags.
  export OPAL_PREFIX=$abs/usr
  export PATH=$abs/bin:$PATH
  export CPATH=$abs/usr/include${CPATH:+:$CPATH}
  export LIBRARY_PATH=$abs/usr/lib/$triplet${LIBRARY_PATH:+:$LIBRARY_PATH}
  export LD_LIBRARY_PATH=$abs/usr/lib/$triplet:$LD_LIBRARY_PATH
  mkdir -p data/gpt2_bpe || die "cannot create data/gpt2_bpe"
  for file in "$deps_dir"/gpt2_bpe/*; do
    cmp -s "$file" "data/gpt2_bpe/${file##*/}" || cp "$file" data/gpt2_bpe/ || die "cannot copy $file to data/gpt2_bpe"
  done
  deps_source="staged $deps_dir ($(grep -vc '^#' "$deps_dir/MANIFEST") packages)"
}

# NCCL from the CUDA toolkit or the system, else from the nvidia-nccl wheel PyTorch brings.
setup_nccl() {
  local dir abs
  if [ -f "$CUDA_HOME/include/nccl.h" ] && compgen -G "$CUDA_HOME/lib*/libnccl.so" >/dev/null; then
    nccl_source=$CUDA_HOME; return
  fi
  if [ -f /usr/include/nccl.h ] && compgen -G "/usr/lib/*/libnccl.so" >/dev/null; then
    nccl_source=/usr; return
  fi
  dir=$("$PYTHON" -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null)
  if [ -z "$dir" ] || [ ! -f "$dir/include/nccl.h" ] || [ ! -f "$dir/lib/libnccl.so.2" ]; then
    die "no NCCL: not in $CUDA_HOME or /usr, and $PYTHON has no nvidia.nccl (pip package nvidia-nccl-cu13)"
  fi
  # The wheel ships only libnccl.so.2; -lnccl looks for libnccl.so.
  mkdir -p "$prefix/nccl/lib" || die "cannot create $prefix/nccl/lib"
  ln -sfn "$dir/lib/libnccl.so.2" "$prefix/nccl/lib/libnccl.so" || die "cannot link $prefix/nccl/lib/libnccl.so"
  abs=$(cd "$prefix/nccl/lib" && pwd)
  export CPATH=$dir/include${CPATH:+:$CPATH}
  export LIBRARY_PATH=$abs${LIBRARY_PATH:+:$LIBRARY_PATH}
  export LD_LIBRARY_PATH=$dir/lib:$LD_LIBRARY_PATH
  nccl_source="python wheel $dir"
}

# The oldest Linux driver of each CUDA major release (CUDA Toolkit release notes, "CUDA Toolkit
# and Corresponding Driver Versions": 12.x needs 525.60.13, 13.x needs 580.65.06).
driver_needed() {
  case $1 in
    12) echo 525.60.13 ;;
    13) echo 580.65.06 ;;
    *) return 1 ;;
  esac
}

# One line per requirement that a stage would otherwise fail on after spending device time:
# the driver against the CUDA runtime that nvcc links, and the Python modules of the stages
# (torch with CUDA: parity, ceilings, the model tests' reference; numpy: the reference and the
# checks; matplotlib: the plot check).
preflight() {
  local release need driver module version
  release=$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
  need=$(driver_needed "${release%%.*}") ||
    die "preflight: CUDA $release: the driver it needs is not in this script's table (driver_needed)"
  if [ "$dry_run" = 1 ]; then
    echo "preflight: driver: not checked (dry run); CUDA $release needs $need or later"
  else
    driver=$(nvidia-smi -i 0 --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' ')
    [ -n "$driver" ] || die "preflight: driver: nvidia-smi --query-gpu=driver_version answered nothing"
    [ "$(printf '%s\n' "$need" "$driver" | sort -V | head -n 1)" = "$need" ] ||
      die "preflight: driver $driver is older than CUDA $release needs ($need or later): update the driver, or set CUDA_HOME to a toolkit this driver supports"
    echo "preflight: driver $driver (CUDA $release needs $need or later): ok"
  fi
  for module in torch numpy matplotlib; do
    version=$("$PYTHON" -c "import $module; print($module.__version__)" 2>/dev/null) ||
      die "preflight: $PYTHON cannot import $module: install it there or set PYTHON"
    if [ "$module" = torch ] && [ "$dry_run" != 1 ] &&
       ! "$PYTHON" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
      die "preflight: torch $version in $PYTHON sees no GPU (torch.cuda.is_available() is False): set PYTHON to a CUDA PyTorch"
    fi
    echo "preflight: $module $version ($PYTHON): ok"
  done
}

setup() {
  CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
  [ -x "$CUDA_HOME/bin/nvcc" ] || die "no nvcc at $CUDA_HOME/bin/nvcc: set CUDA_HOME to the CUDA toolkit"
  export CUDA_HOME PATH=$CUDA_HOME/bin:$PATH
  export LD_LIBRARY_PATH=$CUDA_HOME/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  pick_python
  preflight
  if [ -d "$deps_dir" ]; then
    use_staged_deps
  elif [ "$dry_run" = 1 ]; then
    die "a dry run builds against staged packages: no $deps_dir (run make gpu-deps)"
  elif system_has_deps; then
    deps_source="system"
  else
    die "no $deps_dir and no OpenMPI/Catch2/nlohmann-json/PCRE2 here: run 'make gpu-deps' on a networked Debian machine and bring $deps_dir along"
  fi
  setup_nccl
  # mpirun needs ssh only to start ranks on other machines; without it, start them locally.
  [ -x "$(type -P ssh)" ] || export OMPI_MCA_plm=isolated
  # Flags of an outer make (make gpu-acceptance) would hold the inner builds to its job count.
  unset MAKEFLAGS MFLAGS
  jobs=$(nproc)
  mapfile -t test_binaries < <(for f in test/{kernels,host,model}/test_*.cu; do echo "build/gpu/${f%.cu}"; done)
  mapfile -t mpi_binaries < <(for f in test/mpi/mpi_*.cu; do [ -e "$f" ] && echo "build/gpu/${f%.cu}"; done)
}

# make targets, output to the log $1. A dry run builds where only the C/C++ base's headers and
# link names are left (scripts/hide_system_copies.sh), so that the prefix and the toolkit must
# serve everything else, and for sm_90a alone: it proves what the build reads, not the code
# generation of every architecture (make test's gpu_build does that).
build() {
  local log=$1; shift
  if [ "$dry_run" = 1 ]; then
    bash scripts/hide_system_copies.sh "$prefix" \
      make -j"$jobs" GPU_ARCH="-gencode arch=compute_90a,code=sm_90a" "$@" > "$log" 2>&1
  else
    make -j"$jobs" "$@" > "$log" 2>&1
  fi
}

# ---- stages: each sets status (PASS|FAIL|SKIP), text (one line of figures) and figures
# (KEY=VALUE, VALUE as JSON where it is not plain text)

stage_device() {
  local query name memory driver sm_max mem_max sm_now cc power props
  query=$(nvidia-smi -i 0 --format=csv,noheader,nounits \
    --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.memory,clocks.sm,compute_cap,power.limit \
    2> "$logs/device/nvidia-smi.err")
  nvidia-smi > "$logs/device/nvidia-smi.txt" 2>&1
  IFS=, read -r name memory driver sm_max mem_max sm_now cc power <<< "$query"
  if [ -z "$name" ]; then
    status=FAIL; text="nvidia-smi --query-gpu failed: $(head -n 1 "$logs/device/nvidia-smi.err")"; return
  fi
  props=$("$PYTHON" -c 'import json, torch; p = torch.cuda.get_device_properties(0)
print(json.dumps({"sms": p.multi_processor_count, "l2_bytes": getattr(p, "L2_cache_size", None),
                  "torch": torch.__version__, "torch_cuda": torch.version.cuda}))' 2> "$logs/device/torch.err")
  [ -n "$props" ] || props='{"sms": null}'
  local sms
  sms=$("$PYTHON" -c 'import json, sys; print(json.loads(sys.argv[1])["sms"] or "unknown")' "$props")
  status=PASS
  text="${name# }, $sms SMs, ${memory# } MiB, driver ${driver# }, SM clock ${sm_now# }/${sm_max# } MHz, memory clock ${mem_max# } MHz"
  figures=("name=${name# }" "memory_mib=${memory# }" "driver=${driver# }" "sm_clock_max_mhz=${sm_max# }"
           "memory_clock_max_mhz=${mem_max# }" "sm_clock_now_mhz=${sm_now# }" "compute_capability=${cc# }"
           "power_limit_w=${power# }" "torch_properties=$props"
           "nvcc=$("$CUDA_HOME/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')")
}

stage_build() {
  local log=$logs/build/make.log targets=(train_gpt tokenize "${test_binaries[@]}" "${mpi_binaries[@]}")
  [ "$dry_run" = 1 ] && [ -n "${DRY_RUN_TARGETS:-}" ] && read -r -a targets <<< "$DRY_RUN_TARGETS"
  if build "$log" "${targets[@]}"; then
    status=PASS; text="${targets[*]}"
    [ "${#targets[@]}" -gt 4 ] && text="train_gpt, tokenize and $((${#targets[@]} - 2)) test binaries"
  else
    status=FAIL; text="make failed: $(grep -m 1 -E 'error|Error|\*\*\*' "$log" || tail -n 1 "$log")"
  fi
  text+="; deps: $deps_source; NCCL: $nccl_source"
  figures=("deps=$deps_source" "nccl=$nccl_source" "jobs=$jobs" "log=$log")
}

stage_test() {
  local log=$logs/test/make-test-gpu.log ptx_log=$logs/test/make-ptx-report.log rc ptx_rc line counts ptx
  make -j"$jobs" test-gpu > "$log" 2>&1; rc=$?
  make -j"$jobs" ptx-report > "$ptx_log" 2>&1; ptx_rc=$?
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
  ptx=$(grep -E '^ptx-report:' "$ptx_log" | tail -n 1)
  read -r -a counts <<< "$(echo "$line" | tr -dc '0-9 ')"
  status=FAIL
  [ "$rc" -eq 0 ] && [ "$ptx_rc" -eq 0 ] && status=PASS
  text="make test-gpu: ${line:-no summary line (exit $rc)}; ${ptx:-make ptx-report failed (exit $ptx_rc)}"
  figures=("passed=${counts[0]:-null}" "failed=${counts[1]:-null}" "skipped=${counts[2]:-0}"
           "failures=$(json_string "$(sed -n '/^failed:$/,/passed, /{/^  /p}' "$log" | sed 's/^ *//' | paste -sd ';')")"
           "ptx_report=$(json_string "$ptx")" "log=$log")
}

# One compute-sanitizer run; writes "tool target outcome errors seconds" to its .result file,
# outcome one of clean, errors, failed and timeout (cut by the limit).
sanitize_one() {
  local tool=$1 target=$2 name log start rc errors outcome
  name=$(basename "$target")
  log=$logs/sanitizer/$tool.$name.log
  local command=("$target")
  # One step of the smallest model at a small shape: instrumented kernels run 10 to 100 times slower.
  [ "$target" = train ] && command=(./train_gpt --model nano --batch-size 1 --seq-len 32 --max-steps 1
                                    --val-every 0 --out-dir "$work/sanitizer/$tool")
  start=$(now)
  timeout -k 10 "$sanitizer_timeout" "$sanitizer" --tool "$tool" --error-exitcode 99 --print-limit 20 \
    "${command[@]}" > "$log" 2>&1
  rc=$?
  errors=$(sed -n 's/^========= ERROR SUMMARY: \([0-9]*\) error.*/\1/p; s/^========= RACECHECK SUMMARY: .*(\([0-9]*\) error.*/\1/p' "$log" | sort -n | tail -n 1)
  if [ "$rc" -eq 99 ] || [ "${errors:-0}" -gt 0 ]; then outcome=errors
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then outcome=timeout
  elif [ "$rc" -eq 0 ]; then outcome=clean
  else outcome=failed
  fi
  echo "$tool $name $outcome ${errors:-0} $(since "$start")" > "$logs/sanitizer/$tool.$name.result"
}

stage_sanitizer() {
  local tool target running=0 verdict
  sanitizer=$CUDA_HOME/bin/compute-sanitizer
  sanitizer_timeout=${SANITIZER_TIMEOUT:-120}
  # Some CUDA installations leave the sanitizer out; that says nothing about train_gpt.
  [ -x "$sanitizer" ] || { status=SKIP; text="no compute-sanitizer at $sanitizer"; return; }
  if ! build "$logs/sanitizer/make.log" train_gpt "${test_binaries[@]}" build/reference/tiny/reference.bin \
      build/reference/llama-untied31/reference.bin build/reference/llama-tied32/reference.bin; then
    status=FAIL; text="build failed (logs/sanitizer/make.log)"; return
  fi
  rm -rf "$work/sanitizer" && mkdir -p "$work/sanitizer"
  for tool in memcheck racecheck synccheck initcheck; do
    for target in "${test_binaries[@]}" train; do
      sanitize_one "$tool" "$target" &
      running=$((running + 1))
      if [ "$running" -ge "${SANITIZER_JOBS:-8}" ]; then wait -n; running=$((running - 1)); fi
    done
  done
  wait
  rm -rf "$work/sanitizer"
  # Status, text and figures: a run with errors, one that failed and one cut by the time limit
  # (it checked only part of its run) each fail the stage, named with the tool.
  mapfile -t verdict < <(report sanitizer "$logs/sanitizer" "$sanitizer_timeout" $(( 4 * (${#test_binaries[@]} + 1) )))
  status=${verdict[0]:-FAIL}
  text=${verdict[1]:-"acceptance_report.py sanitizer gave no verdict"}
  figures=("${verdict[@]:2}")
}

stage_parity() {
  local dir=$work/parity config device rc agree spec dtype tol errors loss_err norm_err
  rm -rf "$dir" && mkdir -p "$dir"
  build "$logs/parity/make.log" train_gpt || { status=FAIL; text="build failed (logs/parity/make.log)"; return; }
  # Larger than the test suite's references (GPU-sized), small enough for seconds on the CPU.
  config=(--layers 4 --heads 4 --channels 128 --vocab 2000 --max-seq-len 256 --batch 4 --seq-len 256
          --steps 10 --seed 4242 --lr 1e-3 --weight-decay 0.1 --grad-clip 1.0)
  for device in cuda cpu; do
    if ! "$PYTHON" dev/gpt2_reference.py --device "$device" --out "$dir/$device" "${config[@]}" \
        > "$logs/parity/reference-$device.log" 2>&1; then
      status=FAIL; text="dev/gpt2_reference.py --device $device failed (logs/parity/reference-$device.log)"; return
    fi
  done
  status=PASS
  agree=$(report ref-agree "$dir/cpu/reference.json" "$dir/cuda/reference.json" 1e-4) || status=FAIL
  text="PyTorch CUDA vs CPU: max rel err $agree"
  figures=("reference=$(json_string "${config[*]}")" "torch_cuda_vs_cpu_max_rel_err=$agree"
           "model_tests=$(json_string "test_gpt2 in the test stage compares with the CPU PyTorch reference of make test")")
  for spec in "fp32 1e-4" "bf16 2e-2"; do
    read -r dtype tol <<< "$spec"
    ./train_gpt --init-from "$dir/cuda/model.bin" --train-data "$dir/cuda/train.bin" --val-data "$dir/cuda/train.bin" \
      --dtype "$dtype" --shuffle 0 --batch-size 4 --seq-len 256 --max-steps 10 --lr 1e-3 --lr-schedule constant \
      --warmup-steps 0 --weight-decay 0.1 --grad-clip 1.0 --beta1 0.9 --beta2 0.95 --adam-eps 1e-8 --val-every 0 \
      --out-dir "$dir/run_$dtype" > "$logs/parity/train_gpt-$dtype.log" 2>&1; rc=$?
    if [ "$rc" -ne 0 ]; then
      status=FAIL; text+="; $dtype: train_gpt exited $rc (logs/parity/train_gpt-$dtype.log)"; continue
    fi
    errors=$(report parity "$dir/cuda/reference.json" "$dir/run_$dtype/metrics.jsonl" "$tol") || status=FAIL
    read -r loss_err norm_err <<< "$errors"
    text+="; train_gpt $dtype vs CUDA PyTorch: loss $loss_err, grad norm $norm_err (limit $tol)"
    figures+=("${dtype}_loss_max_rel_err=$loss_err" "${dtype}_grad_norm_max_rel_err=$norm_err" "${dtype}_limit=$tol")
  done
}

stage_determinism() {
  local dir=$work/determinism run a_b a_c blocking
  rm -rf "$dir" && mkdir -p "$dir"
  build "$logs/determinism/make.log" train_gpt || { status=FAIL; text="build failed (logs/determinism/make.log)"; return; }
  local args=(--model nano --batch-size 8 --seq-len 128 --max-steps 20 --val-every 10 --val-steps 4 --seed 1337)
  for run in a b blocking; do
    blocking=()
    [ "$run" = blocking ] && blocking=(CUDA_LAUNCH_BLOCKING=1)
    if ! env "${blocking[@]}" ./train_gpt "${args[@]}" --out-dir "$dir/$run" > "$logs/determinism/$run.log" 2>&1; then
      status=FAIL; text="run $run failed (logs/determinism/$run.log)"; return
    fi
  done
  status=PASS
  a_b=$(report same-run "$dir/a/metrics.jsonl" "$dir/b/metrics.jsonl") || status=FAIL
  a_c=$(report same-run "$dir/a/metrics.jsonl" "$dir/blocking/metrics.jsonl") || status=FAIL
  local model_b=identical model_c=identical
  cmp -s "$dir/a/model.bin" "$dir/b/model.bin" || { model_b=different; status=FAIL; }
  cmp -s "$dir/a/model.bin" "$dir/blocking/model.bin" || { model_c=different; status=FAIL; }
  text="run 2: $a_b, model.bin $model_b; CUDA_LAUNCH_BLOCKING=1: $a_c, model.bin $model_c"
  figures=("args=$(json_string "${args[*]}")" "metrics_run2=$(json_string "$a_b")" "model_run2=$model_b"
           "metrics_blocking=$(json_string "$a_c")" "model_blocking=$model_c")
  rm -rf "$dir"
}

stage_ceilings() {
  local ceilings copy gemm
  if ! ceilings=$("$PYTHON" dev/ceilings.py 2> "$logs/ceilings/ceilings.err"); then
    status=FAIL; text="dev/ceilings.py failed: $(tail -n 1 "$logs/ceilings/ceilings.err")"; return
  fi
  read -r copy gemm <<< "$("$PYTHON" -c 'import json, sys; d = json.loads(sys.argv[1]); print(d["copy_gb_per_s"], d["gemm_bf16_tflops"])' "$ceilings")"
  status=PASS
  text="copy $copy GB/s (read + write), bf16 GEMM $gemm TFLOP/s"
  figures=("ceilings=$ceilings")
  if make -n bench >/dev/null 2>&1; then
    if make -j"$jobs" bench > "$logs/ceilings/bench.log" 2>&1 &&
       timeout 300 build/bench_attention --python "$PYTHON" >> "$logs/ceilings/bench.log" 2>&1; then
      text+="; attention bench: ran (logs/ceilings/bench.log)"
    else
      status=FAIL; text+="; attention bench failed (logs/ceilings/bench.log)"
    fi
    figures+=("bench=$(json_string "$(tail -n 40 "$logs/ceilings/bench.log")")")
  else
    text+="; bench: SKIP (no 'make bench' target: dev/bench_attention is not in this tree)"
    figures+=("bench=SKIP: no make bench target in this tree")
  fi
}

# One training run of train_gpt with GPU memory sampled by nvidia-smi; sets run_rc, run_log,
# run_metrics and run_peak_mib (the most memory used above what was used before the run).
measured_run() {
  local name=$1 baseline peak sampler; shift
  run_log=$logs/throughput/$name.log
  run_metrics=$work/throughput/$name.metrics.jsonl
  baseline=$(nvidia-smi -i 0 --query-gpu=memory.used --format=csv,noheader,nounits | tr -dc '0-9')
  nvidia-smi -i 0 --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 \
    > "$work/throughput/$name.memory" 2>/dev/null &
  sampler=$!
  timeout 600 ./train_gpt "$@" --val-every 0 --out-dir "$work/throughput/$name" > "$run_log" 2>&1
  run_rc=$?
  kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
  peak=$(sort -n "$work/throughput/$name.memory" | tail -n 1 | tr -dc '0-9')
  run_peak_mib=$(( ${peak:-0} - ${baseline:-0} ))
  # The run's checkpoint (d48: ~25 GB) is not needed; the metrics are.
  cp "$work/throughput/$name/metrics.jsonl" "$run_metrics" 2>/dev/null
  rm -rf "${work:?}/throughput/$name"
}

stage_throughput() {
  local batch figures_json ms tps mfu planned attempts=""
  rm -rf "$work/throughput" && mkdir -p "$work/throughput"
  build "$logs/throughput/make.log" train_gpt || { status=FAIL; text="build failed (logs/throughput/make.log)"; return; }
  status=PASS; text=""; figures=()
  for batch in 8 32 64; do
    measured_run "d12-b$batch" --model d12 --seq-len 1024 --batch-size "$batch" --max-steps 35
    if [ "$run_rc" -ne 0 ] || ! figures_json=$(report throughput "$run_log" "$run_metrics" "$batch" 1024 5 "$ACCEPTANCE_DEVICE"); then
      status=FAIL; text+="${text:+; }d12 B=$batch failed (logs/throughput/d12-b$batch.log)"; continue
    fi
    read -r ms tps mfu planned <<< "$("$PYTHON" -c 'import json, sys; d = json.loads(sys.argv[1])
print(d["ms_per_step"], d["tokens_per_s"], d["mfu_percent"], d["planned_mib"])' "$figures_json")"
    text+="${text:+; }d12 B=$batch: $ms ms, $tps tok/s, MFU $mfu%, $run_peak_mib MiB used (plan $planned MiB)"
    figures+=("d12_b$batch=$("$PYTHON" -c 'import json, sys; d = json.loads(sys.argv[1]); d["peak_used_mib"] = int(sys.argv[2])
print(json.dumps(d))' "$figures_json" "$run_peak_mib")")
  done
  for batch in 8 4 2 1; do
    measured_run "d48-b$batch" --model d48 --seq-len 1024 --batch-size "$batch" --max-steps 1
    if [ "$run_rc" -eq 0 ] && figures_json=$(report throughput "$run_log" "$run_metrics" "$batch" 1024 0 "$ACCEPTANCE_DEVICE"); then
      read -r ms planned <<< "$("$PYTHON" -c 'import json, sys; d = json.loads(sys.argv[1]); print(d["ms_per_step"], d["planned_mib"])' "$figures_json")"
      text+="; d48 fits at B=$batch: 1 cold step $ms ms, $run_peak_mib MiB used (plan $planned MiB)"
      figures+=("d48=$("$PYTHON" -c 'import json, sys; d = json.loads(sys.argv[1]); d.update(batch=int(sys.argv[2]), peak_used_mib=int(sys.argv[3]))
print(json.dumps(d))' "$figures_json" "$batch" "$run_peak_mib")")
      [ -n "$attempts" ] && figures+=("d48_refused=$(json_string "$attempts")")
      rm -rf "$work/throughput"
      return
    fi
    attempts+="${attempts:+; }B=$batch: $(tail -n 1 "$run_log")"
  done
  status=FAIL; text+="; d48 did not run at B=8, 4, 2 or 1 (logs/throughput/d48-b*.log)"
  figures+=("d48_refused=$(json_string "$attempts")")
  rm -rf "$work/throughput"
}

run_stage() {
  local name=$1 start order=0 s
  for s in "${all_stages[@]}"; do [ "$s" = "$name" ] && break; order=$((order + 1)); done
  status=FAIL text="" figures=()
  rm -rf "${logs:?}/$name" && mkdir -p "$logs/$name"
  start=$(now)
  "stage_$name"
  report record "$results" "$name" "$order" "$status" "$(since "$start")" "$text" "${figures[@]}"
  [ "$status" = FAIL ] && failed_stages+=("$name")
}

publish() {
  local s files=()
  [ -n "${ACCEPTANCE_OUT:-}" ] || return 0
  mkdir -p "$ACCEPTANCE_OUT" || die "cannot create ACCEPTANCE_OUT=$ACCEPTANCE_OUT"
  for s in "${stages[@]}"; do files+=("$results/$s.json"); done
  cp "$results/summary.md" "${files[@]}" "$ACCEPTANCE_OUT/" || die "cannot copy the results to ACCEPTANCE_OUT=$ACCEPTANCE_OUT"
  tar czf "$ACCEPTANCE_OUT/logs.tar.gz" -C "$logs" "${stages[@]}" || die "cannot write $ACCEPTANCE_OUT/logs.tar.gz"
}

main() {
  case ${1:-} in
    --list-stages) [ $# -eq 1 ] || usage_error "--list-stages takes no argument"; parse_stages; echo "${stages[*]}"; exit 0 ;;
    --summary) [ $# -eq 2 ] || usage_error "usage: gpu_acceptance.sh --summary DIR"; report summary "$2"; exit ;;
    --help | -h) sed -n '2,/^set -uo/{/^#/s/^# \{0,1\}//p}' "$0"; exit 0 ;;
    '') ;;
    *) usage_error "unknown argument '$1' (usage: gpu_acceptance.sh [--list-stages | --summary DIR | --help])" ;;
  esac
  parse_stages
  local stage kept=() gpu_stages=()
  if [ "$dry_run" = 1 ]; then
    for stage in "${stages[@]}"; do
      if [[ " ${host_stages[*]} " == *" $stage "* ]]; then kept+=("$stage"); else gpu_stages+=("$stage"); fi
    done
    stages=("${kept[@]}")
    [ ${#stages[@]} -gt 0 ] || usage_error "a dry run runs only the stages that need no GPU (${host_stages[*]}); STAGES names none"
    export ACCEPTANCE_DEVICE="none (dry run)"
  else
    gpu_present || die "no GPU here (nvidia-smi lists none and there is no /dev/nvidia0): run make gpu-acceptance on a machine with an NVIDIA GPU"
    ACCEPTANCE_DEVICE=$(nvidia-smi -i 0 --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
    export ACCEPTANCE_DEVICE=${ACCEPTANCE_DEVICE:-unknown}
  fi
  setup
  mkdir -p "$results" "$work"
  echo "gpu_acceptance: $ACCEPTANCE_DEVICE; stages: ${stages[*]}; deps: $deps_source; NCCL: $nccl_source; python: $PYTHON"
  failed_stages=()
  for stage in "${stages[@]}"; do rm -f "$results/$stage.json"; done
  for stage in "${stages[@]}"; do run_stage "$stage"; done
  report summary "$results" || exit 1
  publish
  if [ ${#failed_stages[@]} -gt 0 ]; then
    echo "gpu_acceptance: FAILED: ${failed_stages[*]} (details: $results/summary.md, logs in $logs/)"; exit 1
  fi
  if [ "$dry_run" = 1 ]; then
    echo "gpu_acceptance: dry run: ${stages[*]} passed against the staged prefix alone; not run: ${gpu_stages[*]:-none} (they need a GPU)"
  else
    echo "gpu_acceptance: no stage failed (${stages[*]}; $results/summary.md)"
  fi
}

main "$@"
