#!/usr/bin/env bash
# make gpu-pack: everything a GPU node needs to prove the build (scripts/gpu_quick.sh) and nothing
# else, made where the CUDA toolkit is and no GPU need be (a login node). One folder, gpu-pack/,
# laid out like the repository so that every relative path the binaries and scripts use holds:
#   train_gpt, tokenize                     stripped (train_gpt: sm_80, sm_90a, compute_90 PTX)
#   build/gpu/test/{kernels,model}/test_*   the GPU tests only a GPU can judge (PACK_TESTS)
#   build/bench_attention                   our attention kernels timed (make bench)
#   build/reference/tiny/                   the PyTorch reference the model tests compare with
#   build/reference/parity/                 the parity stage's model, tokens and CPU PyTorch losses
#   lib/                                    every shared library the binaries load that is neither
#                                           the C/C++ base nor the CUDA driver/toolkit/NCCL set
#                                           (OpenMPI's, PCRE2's, ...), found with ldd
#   data/gpt2_bpe/, data/default/           the GPT-2 vocabulary, the built-in corpus
#   data/llama3/                            the docs in Llama 3 tokens (where its vocabulary is installed)
#   scripts/, dev/                          gpu_quick.sh and what its stages run
#   MANIFEST                                commit, date, toolkit, the newest glibc symbol and the
#                                           driver the binaries need, sha256 of every file
# The pack is built beside (gpu-pack.tmp) and renamed into place only when complete and within
# PACK_LIMIT_MIB (48): a failed pack never replaces a good one.
# usage: gpu_pack.sh [--check-closure DIR]
#   --check-closure DIR: every library each ELF file in DIR loads (ldd, with DIR/lib first) is in
#   DIR/lib, the C/C++ base or the CUDA driver/toolkit/NCCL set; any other is named with its
#   package (dpkg -S). Exit 1 if one is not. make test runs it (test/checks/gpu_pack.sh).
# environment: PACK_DIR (gpu-pack), PACK_LIMIT_MIB (48), CUDA_HOME (/usr/local/cuda),
#              PYTHON (/usr/bin/python3: Debian's torch for the CPU references)
set -euo pipefail
cd "$(dirname "$0")/.."

pack=${PACK_DIR:-gpu-pack}
limit_mib=${PACK_LIMIT_MIB:-48}
python=${PYTHON:-/usr/bin/python3}
cuda=${CUDA_HOME:-/usr/local/cuda}
die() { echo "gpu_pack: $*" >&2; exit 1; }

# The GPU test binaries whose verdict needs a GPU: the kernels with tensor cores, shared-memory
# tiles and warp reductions, and the whole model against PyTorch.
pack_tests=(kernels/test_flash_attention kernels/test_matmul kernels/test_layernorm kernels/test_classifier
            kernels/test_vocab_parallel_classifier model/test_gpt2 model/test_recompute)
# The parity stage's configuration (dev/gpt2_reference.py's flags): larger than the test suite's
# references, seconds on a CPU. scripts/gpu_quick.sh reads it back from the pack's parity.args.
parity_args=(--layers 4 --heads 4 --channels 128 --vocab 2000 --max-seq-len 256 --batch 4 --seq-len 256
             --steps 10 --seed 4242 --lr 1e-3 --weight-decay 0.1 --grad-clip 1.0)

# Libraries never packed: the C/C++ base every Linux machine has, and the CUDA driver, toolkit
# and NCCL, which come from the node (driver, CUDA_HOME, /usr or Python's nvidia-nccl wheel).
is_base_library() {
  case $1 in
    linux-vdso.so.* | ld-linux*.so.* | libc.so.* | libm.so.* | libdl.so.* | librt.so.* | libpthread.so.* | \
    libstdc++.so.* | libgcc_s.so.* | libz.so.* | libutil.so.* | libresolv.so.*) return 0 ;;
  esac
  return 1
}
is_cuda_library() {
  case $1 in
    libcuda.so.* | libcudart.so.* | libcublas.so.* | libcublasLt.so.* | libnccl.so.* | libnvidia-*.so.*) return 0 ;;
  esac
  return 1
}
is_elf() { [ "$(head -c 4 "$1" 2>/dev/null | od -An -c | tr -d ' ')" = '177ELF' ]; }

# Prints "NAME PATH" for each library FILE loads (PATH "not found" when the loader has none).
libraries_of() {
  ldd "$1" 2>/dev/null | awk '/=>/ { if ($3 == "not") print $1, "not-found"; else print $1, $3 }'
}

check_closure() {
  local dir=$1 file name path failures=0 owner checked=0
  [ -d "$dir" ] || die "--check-closure: $dir is not a directory"
  local abs
  abs=$(cd "$dir" && pwd)
  while IFS= read -r -d '' file; do
    is_elf "$file" || continue
    checked=$((checked + 1))
    while read -r name path; do
      if [ -e "$abs/lib/$name" ] || is_base_library "$name" || is_cuda_library "$name"; then continue; fi
      if [ "$path" = not-found ]; then
        echo "closure: ${file#"$abs"/} loads $name, which is not in the pack, the C/C++ base or the CUDA set, and not found here"
      else
        owner=$(dpkg -S "$(readlink -f "$path")" 2>/dev/null | head -n 1 | cut -d: -f1)
        echo "closure: ${file#"$abs"/} loads $name ($path, package ${owner:-unknown}), which is not in the pack, the C/C++ base or the CUDA set"
      fi
      failures=$((failures + 1))
    done < <(LD_LIBRARY_PATH=$abs/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} libraries_of "$file")
  done < <(find "$abs" -type f -print0)
  [ "$checked" -gt 0 ] || die "--check-closure: no ELF file in $dir"
  if [ "$failures" -gt 0 ]; then echo "closure: $failures libraries missing from $dir"; return 1; fi
  echo "closure: the $checked binaries of $dir load only the pack's libraries, the C/C++ base and the CUDA set"
}

if [ "${1:-}" = --check-closure ]; then
  [ $# -eq 2 ] || die "usage: gpu_pack.sh --check-closure DIR"
  check_closure "$2"
  exit
fi
[ $# -eq 0 ] || die "unknown argument '$1' (usage: gpu_pack.sh [--check-closure DIR])"
[ -x "$cuda/bin/nvcc" ] || die "no nvcc at $cuda/bin/nvcc: set CUDA_HOME to the CUDA toolkit"
for file in data/gpt2_bpe/encoder.json data/gpt2_bpe/vocab.bpe; do
  [ -f "$file" ] || die "$file is missing: run scripts/install_deps.sh (it fetches the GPT-2 vocabulary)"
done

test_binaries=("${pack_tests[@]/#/build/gpu/test/}")
echo "gpu_pack: building train_gpt, tokenize, bench_attention and ${#test_binaries[@]} GPU test binaries"
make --no-print-directory -j"$(nproc)" train_gpt tokenize build/bench_attention "${test_binaries[@]}" \
  build/reference/tiny/reference.bin >/dev/null || die "make failed (rerun 'make gpu-pack' to see why)"

staging=$pack.tmp
work=$(mktemp -d)
rm -rf "$staging"
mkdir -p "$staging"/{lib,scripts,dev,data,build/reference} "$staging"/build/gpu/test/{kernels,model}
trap 'rm -rf "$staging" "$work"' EXIT

for file in train_gpt tokenize build/bench_attention "${test_binaries[@]}"; do
  strip -o "$staging/$file" "$file" || die "strip $file failed"
done
mkdir -p "$staging/build/reference/tiny" "$staging/build/reference/parity"
cp build/reference/tiny/{reference.bin,reference.json,model.bin,train.bin} "$staging/build/reference/tiny/"
echo "gpu_pack: the parity reference on the CPU (dev/gpt2_reference.py ${parity_args[*]})"
"$python" dev/gpt2_reference.py --device cpu --out "$work/parity" "${parity_args[@]}" > "$work/parity.log" 2>&1 ||
  die "dev/gpt2_reference.py failed for the parity reference: $(tail -n 1 "$work/parity.log")"
# The stage needs the model, the tokens and the per-step losses, not the gradients of reference.bin.
cp "$work"/parity/{model.bin,train.bin,reference.json} "$staging/build/reference/parity/"
echo "${parity_args[*]}" > "$staging/build/reference/parity/parity.args"
cp -r data/gpt2_bpe data/default "$staging/data/"
# Llama 3 token shards of the docs for gpu_quick.sh's Llama throughput run (Meta's vocabulary is
# fetched by scripts/install_deps.sh, never committed; without it the pack has none and says so).
if [ -s data/llama3_bpe/tokenizer.model ]; then
  ./tokenize --encoding llama3 --out-dir "$staging/data/llama3" --name docs --val-tokens 4096 docs/*.md README.md \
    > "$work/llama3_tokens.log" 2>&1 || die "tokenize --encoding llama3 failed: $(tail -n 1 "$work/llama3_tokens.log")"
else
  echo "gpu_pack: no Llama 3 vocabulary (data/llama3_bpe; scripts/install_deps.sh): the pack has no Llama 3 shards"
fi
cp scripts/gpu_quick.sh scripts/acceptance_report.py "$staging/scripts/"
cp dev/gpt2_reference.py dev/reference_common.py dev/bench_attention_sdpa.py dev/ceilings.py dev/hf_llama_check.py dev/hf_gpt2.py \
  "$staging/dev/"

# The libraries to bring: what ldd resolves for each binary outside the base and CUDA sets, copied
# under the name the binaries ask for (the loader looks for that name, not the file's).
while read -r name path; do
  is_base_library "$name" || is_cuda_library "$name" || [ -e "$staging/lib/$name" ] || {
    [ "$path" != not-found ] || die "$name, which a packed binary loads, is not found on this machine"
    cp -L "$path" "$staging/lib/$name"
  }
done < <(for file in train_gpt tokenize build/bench_attention "${test_binaries[@]}"; do libraries_of "$file"; done | sort -u)
strip --strip-unneeded "$staging"/lib/* 2>/dev/null || true

check_closure "$staging" >/dev/null || { check_closure "$staging"; die "the pack is not closed"; }

# The newest glibc symbol version any binary needs, and the driver the CUDA runtime needs.
glibc=$(for f in "$staging"/train_gpt "$staging"/tokenize "$staging"/build/bench_attention "$staging"/build/gpu/test/*/* "$staging"/lib/*; do
          objdump -T "$f" 2>/dev/null | grep -o 'GLIBC_[0-9.]*'; done | sort -uV | tail -n 1)
release=$("$cuda/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')
case ${release%%.*} in 12) driver=525.60.13 ;; 13) driver=580.65.06 ;; *) driver=unknown ;; esac
commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit+="+uncommitted"
{
  echo "# gpu-pack: scripts/gpu_quick.sh runs from it on a GPU node (docs/GPU.md)"
  echo "commit $commit"
  echo "date $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cuda $release (nvcc $cuda/bin/nvcc); architectures: sm_80 sm_90a compute_90"
  # Built here so that a node's newer host compiler (and -Werror) never meets the sources.
  echo "compiler: $(${CXX:-g++} --version | head -n 1); nvcc $release"
  echo "needs glibc ${glibc#GLIBC_} or later; NVIDIA driver $driver or later (CUDA $release)"
  echo "from the node: the CUDA driver, libcublasLt (CUDA_HOME or the system) and libnccl (CUDA_HOME, /usr, or Python's nvidia-nccl wheel)"
  echo "# sha256  size  file"
  (cd "$staging" && find . -type f ! -name MANIFEST -printf '%P\n' | sort | while read -r f; do
     printf '%s  %s  %s\n' "$(sha256sum "$f" | cut -d' ' -f1)" "$(stat -c %s "$f")" "$f"; done)
} > "$staging/MANIFEST"

size_kib=$(du -sk "$staging" | cut -f1)
[ "$size_kib" -le $((limit_mib * 1024)) ] ||
  die "the pack is $((size_kib / 1024)) MiB, over its $limit_mib MiB limit; the largest files: $(cd "$staging" && find . -type f -printf '%s %P\n' | sort -n | tail -n 5 | awk '{printf "%s %d KiB; ", $2, $1 / 1024}')"
rm -rf "$pack.old"
[ ! -e "$pack" ] || mv "$pack" "$pack.old"
mv "$staging" "$pack"
rm -rf "$pack.old"
trap 'rm -rf "$work"' EXIT
echo "gpu_pack: $pack/: $(grep -c '^[0-9a-f]\{64\} ' "$pack/MANIFEST") files, $((size_kib / 1024)) MiB of $limit_mib; commit $commit; needs glibc ${glibc#GLIBC_}, driver $driver"
