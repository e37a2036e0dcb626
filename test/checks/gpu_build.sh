#!/usr/bin/env bash
# GPU build health without a GPU: the nvcc build (train_gpt and every kernel test) compiles
# for sm_80 and sm_90a with zero warnings, no kernel spills registers (ptx-report), and the
# PTX holds the instructions we intend: 128-bit global loads/stores in the element-wise and
# row kernels, mma.sync/ldmatrix/cp.async behind the tensor-core wrappers.
# usage: gpu_build.sh cpu|gpu   (in gpu mode make test-gpu has built everything already)
set -euo pipefail
cd "$(dirname "$0")/../.."
[ "${1:-cpu}" = cpu ] || exit 77  # make test-gpu has just built and run all of it
nvcc=${NVCC:-${CUDA_HOME:-/usr/local/cuda}/bin/nvcc}
command -v "$nvcc" >/dev/null || { echo "nvcc not found at $nvcc: install the CUDA toolkit or set CUDA_HOME"; exit 1; }

make --no-print-directory -j2 ptx-report

ptx_dir=build/gpu/ptx
mkdir -p "$ptx_dir"
# PTX of one test translation unit (it instantiates every kernel of its op for float and bf16).
ptx_of() {
  local src=$1 out mpi_flags
  out=$ptx_dir/$(basename "$1" .cu).ptx
  read -r -a mpi_flags <<< "$(mpicxx --showme:compile 2>/dev/null)"
  if [ ! -f "$out" ] || [ "$src" -nt "$out" ] || [ -n "$(find kernels -newer "$out" -name '*.cuh')" ]; then
    "$nvcc" -std=c++17 -O3 -arch=sm_90a -I. "${mpi_flags[@]}" -ptx "$src" -o "$out"
  fi
  echo "$out"
}

# Prints the demangled names of the PTX entry functions whose bodies contain PATTERN.
entries_with() {
  local ptx=$1 pattern=$2
  awk -v pat="$pattern" '
    /^\.visible \.entry|^\.entry/ { name = $0; sub(/.*\.entry /, "", name); sub(/\(.*/, "", name); found[name] = 0 }
    name != "" && $0 ~ pat { found[name] = 1 }
    END { for (n in found) if (found[n]) print n }' "$ptx" | c++filt
}

failures=0
require_vector_access() {  # test source, kernel name
  local ptx loads stores
  ptx=$(ptx_of "$1")
  loads=$(entries_with "$ptx" 'ld\.global(\.[a-z]+)*\.v4\.' | grep -cE "(^| )$2[<(]" || true)
  stores=$(entries_with "$ptx" 'st\.global(\.[a-z]+)*\.v4\.' | grep -cE "(^| )$2[<(]" || true)
  if [ "$loads" -eq 0 ] || [ "$stores" -eq 0 ]; then
    echo "FAIL: $2 has no 128-bit global $([ "$loads" -eq 0 ] && echo load)$([ "$stores" -eq 0 ] && echo ' store') in $ptx"
    failures=$((failures + 1))
  else
    echo "ok: $2 uses 128-bit global loads and stores"
  fi
}
require_vector_access test/kernels/test_gelu.cu gelu_forward_kernel
require_vector_access test/kernels/test_gelu.cu gelu_backward_kernel
require_vector_access test/kernels/test_encoder.cu encoder_forward_kernel
require_vector_access test/kernels/test_encoder.cu encoder_backward_wte_kernel
require_vector_access test/kernels/test_vocab_parallel_classifier.cu vocab_parallel_classifier_finish_kernel
require_vector_access test/kernels/test_encoder.cu encoder_backward_wte_combine_kernel
require_vector_access test/kernels/test_layernorm.cu layernorm_forward_kernel
require_vector_access test/kernels/test_layernorm.cu residual_layernorm_forward_kernel
require_vector_access test/kernels/test_layernorm.cu layernorm_backward_kernel
require_vector_access test/kernels/test_layernorm.cu layernorm_backward_params_kernel
require_vector_access test/kernels/test_adamw.cu adamw_kernel
require_vector_access test/kernels/test_attention.cu attention_forward_kernel
require_vector_access test/kernels/test_swiglu.cu swiglu_forward_kernel
require_vector_access test/kernels/test_swiglu.cu swiglu_backward_kernel
require_vector_access test/kernels/test_rmsnorm.cu rmsnorm_forward_kernel
require_vector_access test/kernels/test_rmsnorm.cu residual_rmsnorm_forward_kernel
require_vector_access test/kernels/test_rmsnorm.cu rmsnorm_backward_input_kernel
require_vector_access test/kernels/test_rope.cu rope_kernel
require_vector_access test/kernels/test_moe_router.cu moe_router_dx_kernel
require_vector_access test/kernels/test_moe_router.cu moe_router_dw_partial_kernel
require_vector_access test/kernels/test_moe_router.cu moe_router_dw_reduce_kernel
require_vector_access test/kernels/test_moe_dispatch.cu moe_permute_kernel
require_vector_access test/kernels/test_moe_dispatch.cu moe_gather_sum_kernel
require_vector_access test/kernels/test_moe_dispatch.cu moe_combine_backward_kernel

warp_ptx=$(ptx_of test/kernels/test_warp_ops.cu)
for instruction in 'mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32' 'ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16' \
                   'cp.async.cg.shared.global' 'shfl.sync.bfly.b32'; do
  if grep -qF "$instruction" "$warp_ptx"; then echo "ok: PTX has $instruction"; else echo "FAIL: no $instruction in $warp_ptx"; failures=$((failures + 1)); fi
done
[ "$failures" -eq 0 ]
