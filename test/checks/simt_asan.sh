#!/usr/bin/env bash
# Out-of-bounds dynamic shared memory is caught under AddressSanitizer: simt gives each
# launch a buffer of exactly the requested size. Builds a probe with -fsanitize=address
# (ucontext fibers too, the fallback backend) and expects an in-bounds kernel to run clean
# and an out-of-bounds one to be reported.
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "${1:-cpu}" = cpu ] || exit 77  # simt exists only in the CPU build
out=build/asan
mkdir -p "$out"
flags=(-std=c++17 -O1 -g -DSIMT -fno-strict-aliasing -fsanitize=address -fno-omit-frame-pointer -pthread -I.
       -isystem "${CUDA_HOME:-/usr/local/cuda}/include")
for backend in fcontext ucontext; do
  extra=(); [ $backend = ucontext ] && extra=(-DSIMT_UCONTEXT)
  g++ "${flags[@]}" "${extra[@]}" -x c++ test/simt/simt_asan_probe.cu simt/scheduler.cpp simt/runtime.cpp simt/kernel_resources.cpp \
      simt/streams.cpp simt/warp_ops.cpp \
      -o "$out/probe_$backend" -rdynamic -lboost_context -ldl
  if ! "$out/probe_$backend" inside > "$out/inside_$backend.log" 2>&1; then
    echo "FAIL ($backend): an in-bounds kernel was reported:"; cat "$out/inside_$backend.log"; exit 1
  fi
  if "$out/probe_$backend" past-end > "$out/past_$backend.log" 2>&1; then
    echo "FAIL ($backend): writing past dynamic shared memory was not reported"; exit 1
  fi
  grep -q "heap-buffer-overflow" "$out/past_$backend.log" || { echo "FAIL ($backend): unexpected report:"; cat "$out/past_$backend.log"; exit 1; }
  echo "ok ($backend): in-bounds clean, past-the-end write reported as heap-buffer-overflow"
done
