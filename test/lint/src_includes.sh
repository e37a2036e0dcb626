#!/usr/bin/env bash
# The shape of the host code: src/ is folders of layers (kLayers below, lowest first) and a file
# includes only its own folder, folders below it, and kernels/; data/ may use src/, never the
# reverse; train_gpt.cu sits on top. Each src/ header compiles on its own (it includes what it
# uses), none reaches itself through another (no include cycles), every src/ file opens with
# '// NAME — <what it owns>' and has at most 500 lines; train_gpt.cu at most 300.
# usage: src_includes.sh cpu|gpu   (the check is the same for both builds; it compiles for the CPU)
set -u
cd "$(dirname "$0")/../.." || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
flags=(-std=c++17 -DSIMT -I. -isystem "${CUDA_HOME:-/usr/local/cuda}/include")
read -ra mpi <<< "$(mpicxx --showme:compile 2>/dev/null)"
kLayers=(base tokenizer config data dist model gen ckpt run)
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

declare -A rank
for i in "${!kLayers[@]}"; do rank[${kLayers[$i]}]=$i; done
for d in src/*/; do
  d=$(basename "$d")
  [ -n "${rank[$d]:-}" ] || fail "src/$d/ is not a known layer (add it to kLayers in $0 and to src/README.md)"
done
for f in src/*; do [ -d "$f" ] || [ "$f" = src/README.md ] || fail "$f: src/ holds only layer folders"; done

# The quoted includes of FILE, root-relative.
includes_of() { grep -oE '^#include "[^"]+"' "$1" | sed -E 's/^#include "(.*)"/\1/'; }

declare -A deps
for f in src/*/*.h src/*/*.cpp; do
  [ -e "$f" ] || continue
  name=$(basename "$f"); layer=$(basename "$(dirname "$f")")
  head -n 1 "$f" | grep -qE "^// $name — " || fail "$f does not open with '// $name — <what it owns>'"
  lines=$(wc -l < "$f")
  [ "$lines" -le 500 ] || fail "$f has $lines lines (split it by concern: at most 500)"
  for inc in $(includes_of "$f"); do
    case $inc in
      kernels/*) ;;
      src/*/*)
        to=$(echo "$inc" | cut -d/ -f2)
        if [ -z "${rank[$to]:-}" ] || [ "${rank[$to]}" -gt "${rank[$layer]:-99}" ]; then
          fail "$f ($layer) includes $inc: layers include only their own folder or lower ones (${kLayers[*]})"
        fi ;;
      *) fail "$f includes \"$inc\": src/ includes only src/ and kernels/ (root-relative paths)" ;;
    esac
  done
  [[ $f == *.h ]] || continue
  echo "#include \"$f\"" > "$tmp/$name.cpp"
  g++ "${flags[@]}" "${mpi[@]}" -fsyntax-only -x c++ "$tmp/$name.cpp" 2> "$tmp/$name.err" ||
    fail "$f does not compile on its own: $(head -n 1 "$tmp/$name.err")"
  # Every src/ header it reaches, directly or not.
  deps[$f]=$(g++ "${flags[@]}" "${mpi[@]}" -MM -x c++ "$tmp/$name.cpp" 2>/dev/null |
             tr ' ' '\n' | grep -E '^src/.+\.h$' | grep -vx "$f" | sort -u | tr '\n' ' ')
done
for a in "${!deps[@]}"; do
  for b in ${deps[$a]}; do
    [[ " ${deps[$b]:-} " == *" $a "* ]] && [[ "$a" < "$b" ]] && fail "include cycle: $a and $b reach each other"
  done
done

# data/ and the top: data/ tools may use src/; src/ never reaches data/, test/, dev/ or scripts/.
grep -rlE '^#include "(data|test|dev|scripts)/' src | while read -r f; do echo "FAIL: $f includes outside src/ and kernels/"; done | grep . && failures=$((failures + 1))
lines=$(wc -l < train_gpt.cu)
[ "$lines" -le 300 ] || fail "train_gpt.cu has $lines lines (at most 300: it orchestrates; the work lives in src/)"
for inc in $(includes_of train_gpt.cu); do
  case $inc in src/*/*|kernels/*) ;; *) fail "train_gpt.cu includes \"$inc\" (only src/ and kernels/)";; esac
done
echo "${#deps[@]} headers checked"
[ "$failures" -eq 0 ]
