# Shared start of the end-to-end checks that run the trainer. A check begins with
#   source "$(dirname "$0")/lib/trainer.sh" "$@"
# and gets: the repository root as working directory, mode (cpu|gpu, the first argument), bin
# (./train_gpt_cpu or ./train_gpt), python (the interpreter with torch: $PYTHON when set, as make
# gpu-acceptance sets it on a GPU machine, else /usr/bin/python3), ref (the tiny PyTorch
# reference that make test generates), tmp (a directory removed at exit), failures and fail(),
# and require_files to stop early when something make test builds is missing.
# shellcheck shell=bash disable=SC2034
cd "$(dirname "${BASH_SOURCE[0]}")/../../.." || exit 1
mode=${1:-cpu}
bin=./train_gpt_cpu
[ "$mode" = gpu ] && bin=./train_gpt
python=${PYTHON:-/usr/bin/python3}
ref=build/reference/tiny
require_files() {
  local f
  for f in "$@"; do
    [ -e "$f" ] || { echo "FAIL: $f is missing (make test builds it)"; exit 1; }
  done
}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
