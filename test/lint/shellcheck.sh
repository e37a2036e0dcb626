#!/usr/bin/env bash
# Every shell script in the repository (*.sh, and the sbatch scripts, *.sbatch) passes shellcheck.
# usage: shellcheck.sh cpu|gpu   (gpu: skipped; the scripts are the same in both builds and make
# test checks them)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "${1:-cpu}" = cpu ] || exit 77
command -v shellcheck >/dev/null || { echo "shellcheck not installed (scripts/install_deps.sh installs it)"; exit 1; }
mapfile -t scripts < <(git ls-files '*.sh' '*.sbatch' .ci/run; find scripts test data -name '*.sh' -o -name '*.sbatch' 2>/dev/null)
mapfile -t scripts < <(printf '%s\n' "${scripts[@]}" | sort -u)
shellcheck -x "${scripts[@]}"
echo "ok: ${#scripts[@]} scripts clean"
