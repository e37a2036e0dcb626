#!/usr/bin/env bash
# Every shell script in the repository passes shellcheck.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v shellcheck >/dev/null || { echo "shellcheck not installed (scripts/install_deps.sh installs it)"; exit 1; }
mapfile -t scripts < <(git ls-files '*.sh' .ci/run; find scripts test data -name '*.sh' 2>/dev/null)
mapfile -t scripts < <(printf '%s\n' "${scripts[@]}" | sort -u)
shellcheck -x "${scripts[@]}"
echo "ok: ${#scripts[@]} scripts clean"
