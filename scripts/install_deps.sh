#!/usr/bin/env bash
# Installs every Debian package train_gpt needs to build, test and run its CPU build.
# Idempotent and non-interactive. On a machine where it cannot install (not root, or
# not Debian/apt) it prints the packages it would need and exits non-zero.
# The CUDA toolkit is not a Debian package here: it is found through CUDA_HOME.
set -euo pipefail

packages=(
  build-essential make git ca-certificates
  libopenmpi-dev openmpi-bin
  catch2 nlohmann-json3-dev
  libboost-context-dev
  libopenblas-dev libopenblas0-pthread
  libpcre2-dev
  python3 python3-torch python3-numpy
  shellcheck
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} Debian packages present"
else
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install_deps: cannot install here (needs root on Debian/apt). Missing packages:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "install_deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "install_deps: done"
fi

cuda_home="${CUDA_HOME:-/usr/local/cuda}"
if [ -x "$cuda_home/bin/nvcc" ]; then
  echo "install_deps: CUDA toolkit at $cuda_home ($("$cuda_home/bin/nvcc" --version | tail -n 2 | head -n 1))"
else
  echo "install_deps: no nvcc under CUDA_HOME=$cuda_home: the GPU build is skipped; install the CUDA toolkit and set CUDA_HOME to build it" >&2
fi
