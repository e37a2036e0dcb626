#!/usr/bin/env bash
# GPU build health of the flash attention kernels without a GPU: every kernel compiles for
# sm_80 and sm_90a without spills or stack frame (ptxas), and the PTX of the tensor-core
# kernels (the model's causal ones: FlashKeys::causal, (FlashKeys)0 demangled) holds mma.sync,
# ldmatrix (plain and .trans) and cp.async, the delta kernel 128-bit loads.
# usage: flash_attention_gpu.sh cpu|gpu
set -euo pipefail
cd "$(dirname "$0")/../.."
nvcc=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
command -v "$nvcc" >/dev/null || { echo "nvcc not found at $nvcc: install the CUDA toolkit or set CUDA_HOME"; exit 1; }

src=test/kernels/test_flash_attention.cu
obj=build/gpu/test/kernels/test_flash_attention.o
make --no-print-directory -j2 "$obj"

failures=0
report=build/gpu/flash-attention-ptxas.txt
bash scripts/ptx_report.sh "$report" "$obj.ptxas" || failures=$((failures + 1))
# Columns of the .tsv: kernel, arch, registers, spill stores, spill loads, smem, stack.
rows=$(grep -c '^void flash_attention_' "$report.tsv" || true)
if [ "$rows" -ne 32 ]; then  # 4 kernels x 4 head dims x 2 architectures
  echo "FAIL: expected 32 flash attention kernel builds in $report, found $rows"
  failures=$((failures + 1))
fi
while IFS=$'\t' read -r kernel arch regs spill_st spill_ld _ stack; do
  if [ "$spill_st" != 0 ] || [ "$spill_ld" != 0 ] || [ "$stack" != 0 ]; then
    echo "FAIL: $kernel ($arch): $spill_st/$spill_ld bytes spilled, $stack bytes stack"
    failures=$((failures + 1))
  else
    echo "ok: $kernel ($arch): $regs registers, no spills, no stack"
  fi
done < <(grep '^void flash_attention_' "$report.tsv")

# Occupancy the tiling relies on (docs/ATTENTION.md): at most 168 registers (3 blocks of 128
# threads per SM) for the query kernel, and for the key/value kernel at head dims up to 64 on
# sm_90a, where it has no __launch_bounds__ minimum (the bound makes CUDA 13.0 spill; ptxas's
# own allocation fits). If this fails, the remedy is a 32-row streamed tile for that kernel.
while IFS=$'\t' read -r kernel arch regs _; do
  case "$kernel" in
    "void flash_attention_backward_query_kernel<"*) limit=168 ;;
    "void flash_attention_backward_key_value_kernel<128,"*) continue ;;
    "void flash_attention_backward_key_value_kernel<"*) [ "$arch" = sm_90a ] || continue; limit=168 ;;
    *) continue ;;
  esac
  if [ "$regs" -gt "$limit" ]; then
    echo "FAIL: $kernel ($arch): $regs registers, more than $limit (3 blocks per SM)"
    failures=$((failures + 1))
  fi
done < <(grep '^void flash_attention_' "$report.tsv")

# Lines matching pattern $3 in the body of the PTX ($1) entries whose demangled name starts with $2.
count_in() {
  awk -v pat="$3" '
    /\.entry / { name = $0; sub(/.*\.entry /, "", name); sub(/\(.*/, "", name) }
    name != "" && $0 ~ pat { n[name]++ }
    END { for (k in n) print k "\t" n[k] }' "$1" | c++filt | awk -F'\t' -v k="$2" 'index($1, k) == 1 { s += $2 } END { print s + 0 }'
}

mpi_flags=()
read -r -a mpi_flags <<< "$(mpicxx --showme:compile 2>/dev/null)"
for arch in sm_80 sm_90a; do
  ptx=build/gpu/ptx/test_flash_attention.$arch.ptx
  mkdir -p "$(dirname "$ptx")"
  if [ ! -f "$ptx" ] || [ "$src" -nt "$ptx" ] || [ kernels/flash_attention.cuh -nt "$ptx" ] || [ kernels/common.cuh -nt "$ptx" ]; then
    "$nvcc" -std=c++17 -O3 -arch="$arch" -I. "${mpi_flags[@]}" -ptx "$src" -o "$ptx"
  fi
  for hd in 16 32 64 128; do
    for kernel in flash_attention_forward_kernel flash_attention_backward_key_value_kernel \
                  flash_attention_backward_query_kernel; do
      for pattern in 'mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.bf16\.bf16\.f32' \
                     'ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16' 'ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16' \
                     'cp\.async\.cg\.shared\.global' 'st\.global\.v4'; do
        # At head dim 16 (small test models only) nvcc splits the 16-byte row stores.
        [ "$hd" = 16 ] && [ "$pattern" = 'st\.global\.v4' ] && continue
        if [ "$(count_in "$ptx" "void $kernel<$hd, (FlashKeys)0>" "$pattern")" -eq 0 ]; then
          echo "FAIL: $kernel<$hd> ($arch) has no ${pattern//\\/}"
          failures=$((failures + 1))
        fi
      done
      echo "ok: $kernel<$hd> ($arch): $(count_in "$ptx" "void $kernel<$hd, (FlashKeys)0>" 'mma\.sync') mma.sync," \
           "$(count_in "$ptx" "void $kernel<$hd, (FlashKeys)0>" 'ldmatrix') ldmatrix in the PTX"
    done
    if [ "$(count_in "$ptx" "void flash_attention_backward_delta_kernel<$hd>" 'ld\.global(\.[a-z]+)*\.v4')" -eq 0 ]; then
      echo "FAIL: flash_attention_backward_delta_kernel<$hd> ($arch) has no 128-bit global load"
      failures=$((failures + 1))
    fi
  done
done
[ "$failures" -eq 0 ]
