#!/usr/bin/env bash
# The rehearsal of make gpu-acceptance on a machine without a GPU (ACCEPTANCE_DRY_RUN=1
# scripts/gpu_acceptance.sh), on what travels to a bare GPU machine: a fresh copy of the files git
# tracks or does not ignore, plus build/gpu-deps (made by make gpu-deps first when it is missing or
# stale: that needs network). In the copy, the dry run prints its checks, unpacks the staged
# packages into a fresh prefix, puts the staged vocabulary into data/gpt2_bpe, and builds, with
# this machine made to look bare (scripts/hide_system_copies.sh: only the C/C++ base's headers
# and link names and none of the staged packages' files left), train_gpt
# and ./tokenize (PCRE2), one test binary (test_config: Catch2, nlohmann-json) and one multi-rank
# test binary (mpi_nccl: OpenMPI, NCCL) — not every test binary, whose nvcc time is more than the
# suite can spend; test/checks/gpu_deps_closure.sh covers every test source's headers — then stops
# before the stages that need a GPU. Also: the hiding hides (the staged headers are gone from
# /usr/include inside it), and with libpcre2-dev left out of scripts/gpu_deps.sh's list and its
# staging (the state issue 21 found) the build stage fails naming pcre2.h.
# usage: gpu_dry_run.sh cpu|gpu   (gpu: skipped; a GPU machine runs make gpu-acceptance itself)
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
[ "${1:-cpu}" = cpu ] || exit 77
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "ok: $*"; }

if ! bash scripts/gpu_deps.sh --check build/gpu-deps >/dev/null 2>&1; then
  bash scripts/gpu_deps.sh || { echo "FAIL: make gpu-deps failed (it needs apt's network)"; exit 1; }
fi
# A fresh copy of the tree: what the device tool carries (README "On a GPU machine"), and the
# staged packages.
fresh_copy() {
  mkdir -p "$1/build"
  git ls-files -z -co --exclude-standard | tar --null -T - -cf - 2>/dev/null | tar -xf - -C "$1" &&
    cp -r build/gpu-deps "$1/build/gpu-deps"
}
dry_run() {  # DIR TARGETS: the dry run in DIR building TARGETS; its output in DIR/dry-run.log
  (cd "$1" && env -u STAGES ACCEPTANCE_DRY_RUN=1 DRY_RUN_TARGETS="$2" bash scripts/gpu_acceptance.sh) > "$1/dry-run.log" 2>&1
}

tree=$tmp/tree
fresh_copy "$tree" || { echo "FAIL: cannot copy the tree to $tree"; exit 1; }
[ ! -e "$tree/data/gpt2_bpe" ] || fail "the copy has data/gpt2_bpe, which git ignores: it would not travel"
targets="train_gpt tokenize build/gpu/test/host/test_config build/gpu/test/mpi/mpi_nccl"
start=$(date +%s)
if dry_run "$tree" "$targets"; then ok "dry run passed in $(( $(date +%s) - start )) s"
else fail "dry run exited $?: $(tail -n 5 "$tree/dry-run.log")"; fi
sed 's/^/  | /' "$tree/dry-run.log"
for line in '^preflight: driver: not checked \(dry run\); CUDA [0-9.]+ needs [0-9.]+ or later$' \
            '^preflight: torch .*: ok$' '^preflight: numpy .*: ok$' '^preflight: matplotlib .*: ok$' \
            "^STAGE build: PASS \\($targets; deps: staged build/gpu-deps \\([0-9]+ packages\\); NCCL: .*\\)$" \
            '^gpu_acceptance: dry run: build passed against the staged prefix alone; not run: device test sanitizer parity determinism ceilings throughput \(they need a GPU\)$'; do
  if grep -qE -- "$line" "$tree/dry-run.log"; then ok "output has: $line"; else fail "output lacks: $line"; fi
done
log=$tree/build/acceptance-dry-run/logs/build/make.log
if grep -qE '^hide_system_copies: [1-9][0-9]* names hidden: headers and link names outside the C/C\+\+ base \([1-9][0-9]* packages\), files of [1-9][0-9]* staged packages$' "$log"; then
  ok "the build ran with the system's copies hidden: $(grep '^hide_system_copies:' "$log")"
else
  fail "no hide_system_copies line in $log"
fi
for target in $targets; do
  if [ -x "$tree/$target" ]; then ok "built $target"; else fail "$target was not built"; fi
done
for file in encoder.json vocab.bpe; do
  if cmp -s "data/gpt2_bpe/$file" "$tree/data/gpt2_bpe/$file"; then ok "staged vocabulary: data/gpt2_bpe/$file"
  else fail "data/gpt2_bpe/$file was not restored from build/gpu-deps"; fi
done
if bash scripts/hide_system_copies.sh "$tree/build/gpu-prefix" bash -c \
     'for f in /usr/include/catch2/catch.hpp /usr/include/nlohmann/json.hpp /usr/include/pcre2.h \
               /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h /usr/lib/x86_64-linux-gnu/libpcre2-8.so; do
        [ ! -e "$f" ] || { echo "visible: $f"; exit 1; }
      done' > "$tmp/hidden.log" 2>&1; then
  ok "inside hide_system_copies.sh the system's Catch2, nlohmann-json, PCRE2 and OpenMPI headers are gone"
else
  fail "hide_system_copies.sh left the system's copies visible: $(cat "$tmp/hidden.log")"
fi

# Planted: libpcre2-dev neither in the list nor staged. With the system's pcre2.h hidden, the
# tokenizer cannot build.
broken=$tmp/broken
fresh_copy "$broken" || { echo "FAIL: cannot copy the tree to $broken"; exit 1; }
sed -i '/^  libpcre2-dev  /d' "$broken/scripts/gpu_deps.sh"
rm "$broken"/build/gpu-deps/libpcre2-dev_*.deb
sed -i '/^libpcre2-dev /d' "$broken/build/gpu-deps/MANIFEST"
if dry_run "$broken" build/host/src/tokenizer/gpt2_bpe.o; then
  fail "a dry run without libpcre2-dev staged built the tokenizer: the system's pcre2.h was not hidden"
elif grep -q 'pcre2.h: No such file' "$broken/build/acceptance-dry-run/logs/build/make.log" &&
     grep -q '^STAGE build: FAIL' "$broken/dry-run.log"; then
  ok "without libpcre2-dev staged the build stage fails: $(grep -m 1 'pcre2.h' "$broken/build/acceptance-dry-run/logs/build/make.log")"
else
  fail "without libpcre2-dev staged: expected STAGE build: FAIL on pcre2.h, got: $(tail -n 3 "$broken/dry-run.log")"
fi
[ "$failures" -eq 0 ]
