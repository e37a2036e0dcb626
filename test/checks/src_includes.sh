#!/usr/bin/env bash
# src/ headers: each compiles on its own (it includes what it uses), none includes itself through
# another (no include cycles: the compiler's dependency output of every header is checked against
# every other's), each opens with a line saying what it owns, none is over 500 lines.
# usage: src_includes.sh cpu|gpu   (the check is the same for both builds; it compiles for the CPU)
set -u
cd "$(dirname "$0")/../.." || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags=(-std=c++17 -DSIMT -I. -isystem "${CUDA_HOME:-/usr/local/cuda}/include")
read -ra mpi <<< "$(mpicxx --showme:compile 2>/dev/null)"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

declare -A deps
for h in src/*.h; do
  name=$(basename "$h")
  echo "#include \"$h\"" > "$tmp/$name.cpp"
  g++ "${flags[@]}" "${mpi[@]}" -fsyntax-only -x c++ "$tmp/$name.cpp" 2> "$tmp/$name.err" ||
    fail "$h does not compile on its own: $(head -n 1 "$tmp/$name.err")"
  # Every src/ header it reaches, directly or not.
  deps[$name]=$(g++ "${flags[@]}" "${mpi[@]}" -MM -x c++ "$tmp/$name.cpp" 2>/dev/null |
                tr ' ' '\n' | grep -E '^src/[^/]+\.h$' | sed 's|^src/||' | grep -vx "$name" | sort -u | tr '\n' ' ')
  head -n 1 "$h" | grep -qE "^// $name — " || fail "$h does not open with '// $name — <what it owns>'"
  lines=$(wc -l < "$h")
  [ "$lines" -le 500 ] || fail "$h has $lines lines (split it by concern: at most 500)"
done
for a in "${!deps[@]}"; do
  for b in ${deps[$a]}; do
    [[ " ${deps[$b]:-} " == *" $a "* ]] && [[ "$a" < "$b" ]] && fail "include cycle: $a and $b reach each other"
  done
done
echo "${#deps[@]} headers checked"
[ "$failures" -eq 0 ]
