// block_ops.h — the architecture's choices as the operations a transformer block runs: its norm
// (LayerNorm with bias | RMSNorm), the MLP's up-projection and activation (fc then GELU | fc and
// fc2 then SwiGLU) and their backward passes, each dispatching on the configuration
// (model_config.h) to the kernels in kernels/. The transformer (transformer.h) calls these and
// never asks which architecture it runs.
#pragma once
#include "kernels/gelu.cuh"
#include "kernels/layernorm.cuh"
#include "kernels/matmul.cuh"
#include "kernels/rmsnorm.cuh"
#include "kernels/swiglu.cuh"
#include "src/config/model_config.h"
#include "src/model/linear.h"

#include <functional>
#include <type_traits>

// out = norm(inp) over N rows of C; LayerNorm keeps mean and rstd, RMSNorm rstd only (mean unused).
// fp8 (none by default): out's FP8 copy too (linear_input_cast).
template <typename Elem>
void norm_forward(const ModelConfig& c, Elem* out, float* mean, float* rstd, const Elem* inp, const Elem* weight,
                  const Elem* bias, int N, cudaStream_t s, const Fp8Out& fp8 = {}) {
  if (c.norm == Norm::rmsnorm) return rmsnorm_forward(out, rstd, inp, weight, N, c.channels, c.norm_eps, s, fp8);
  layernorm_forward(out, mean, rstd, inp, weight, bias, N, c.channels, s, fp8);
}

// residual = inp1 + inp2 (rounded, in place allowed), out = norm(residual). fp8: as norm_forward's.
template <typename Elem>
void residual_norm_forward(const ModelConfig& c, Elem* residual, Elem* out, float* mean, float* rstd, const Elem* inp1,
                           const Elem* inp2, const Elem* weight, const Elem* bias, int N, cudaStream_t s,
                           const Fp8Out& fp8 = {}) {
  if (c.norm == Norm::rmsnorm)
    return residual_rmsnorm_forward(residual, out, rstd, inp1, inp2, weight, N, c.channels, c.norm_eps, s, fp8);
  residual_layernorm_forward(residual, out, mean, rstd, inp1, inp2, weight, bias, N, c.channels, s, fp8);
}

// dinp += d inp, dweight (and LayerNorm's dbias) += their gradients, from dout.
template <typename Elem>
void norm_backward(const ModelConfig& c, Elem* dinp, Elem* dweight, Elem* dbias, float* scratch, const Elem* dout,
                   const Elem* inp, const Elem* weight, const float* mean, const float* rstd, int N, cudaStream_t s) {
  if (c.norm == Norm::rmsnorm) return rmsnorm_backward(dinp, dweight, scratch, dout, inp, weight, rstd, N, c.channels, s);
  layernorm_backward(dinp, dweight, dbias, scratch, dout, inp, weight, mean, rstd, N, c.channels, s);
}

// The MLP's hidden activation `act` (N, H) from its kept products `fch`: GELU of fch (N, H), or
// SwiGLU's silu(a) ⊙ b of fch = [a = w1·x (N, H); b = w3·x (N, H)]. Recomputing it from fch gives
// the same bits. fp8 (none by default): act's FP8 copy too (linear_input_cast).
template <typename Elem>
void mlp_activation_forward(const ModelConfig& c, Elem* act, const Elem* fch, int N, int H, cudaStream_t s,
                            const Fp8Out& fp8 = {}) {
  const size_t NH = static_cast<size_t>(N) * H;
  if (c.mlp == Mlp::swiglu) return swiglu_forward(act, fch, fch + NH, N, H, H, s, fp8);
  gelu_forward(act, fch, NH, s, fp8);
}

// The activation recomputed for the backward (--recompute 1 and 2): mlp_activation_forward, or with
// `transposed` (linear_input_cast_transposed: --fp8) straight into the down product's transposed
// input cast, act itself not written (the FP8 backward reads only the cast).
template <typename Elem>
void mlp_activation_recompute(const ModelConfig& c, Elem* act, const Elem* fch, int N, int H, cudaStream_t s,
                              const Fp8Out& transposed) {
  if constexpr (std::is_same<Elem, bf16>::value) {
    if (transposed.out != nullptr) {
      const size_t NH = static_cast<size_t>(N) * H;
      if (c.mlp == Mlp::swiglu)
        return swiglu_forward_fp8(nullptr, transposed.out, transposed.amax, transposed.scale, fch, fch + NH, N, H, s);
      return gelu_forward_fp8(nullptr, transposed.out, transposed.amax, transposed.scale, fch, N, H, s);
    }
  }
  mlp_activation_forward(c, act, fch, N, H, s);
}

// The MLP's products from its input x (N, C) into fch (mlp_activation_forward's layout) and the
// activation into act. GELU runs as its own kernel on the rounded pre-activation (not cuBLASLt's
// GELU epilogue on the fp32 product), so that recomputing it from the kept fch reproduces the bits.
// fp8: layer l's products in FP8 (linear.h), else matmul.cuh's, and the activation writes the
// down product's input cast (which must be the next FP8 call).
template <typename Elem>
void mlp_up_forward(const ModelConfig& c, Elem* fch, Elem* act, const Elem* x, const Elem* fcw, const Elem* fcb,
                    const Elem* fc2w, int N, int H, cudaStream_t s, Fp8State* fp8 = nullptr, int l = 0) {
  linear_forward({fp8, l, Fp8Product::fc}, fch, x, fcw, fcb, N, c.channels, H, s);
  if (c.mlp == Mlp::swiglu)
    linear_forward({fp8, l, Fp8Product::fc2}, fch + static_cast<size_t>(N) * H, x, fc2w, nullptr, N, c.channels, H, s,
                   true);
  mlp_activation_forward(c, act, fch, N, H, s, linear_input_cast(LinearSite{fp8, l, Fp8Product::fcproj}, act, N));
}

// Backward of mlp_up_forward from dact (N, H; overwritten): dx (N, C) written, the weight and bias
// gradients accumulated. SwiGLU's product gradients overwrite fch in place (it is not read again),
// and its two products' input gradients are summed in dx. after_input_gradient: as matmul_backward's,
// once all of dx is queued. dfcw and dfc2w nullptr: the weight gradients are left for later (their
// g: dact with GELU, fch's two halves with SwiGLU). fp8, l: as mlp_up_forward's.
template <typename Elem>
void mlp_up_backward(const ModelConfig& c, Elem* dx, Elem* dfcw, Elem* dfcb, Elem* dfc2w, Elem* dact, Elem* fch,
                     const Elem* x, const Elem* fcw, const Elem* fc2w, int N, int H, cudaStream_t s,
                     const std::function<void()>& after_input_gradient, Fp8State* fp8 = nullptr, int l = 0) {
  const int C = c.channels;
  if (c.mlp == Mlp::gelu) {
    linear_backward({fp8, l, Fp8Product::fc}, dx, dfcw, dfcb, dact, dact, x, fcw, fch, N, C, H, s, after_input_gradient);
    return;
  }
  Elem* a = fch;
  Elem* b = fch + static_cast<size_t>(N) * H;
  if (dfcb == nullptr && fp8_swiglu_backward(fp8, l, dx, dfcw, dfc2w, dact, a, b, x, after_input_gradient)) return;
  swiglu_backward(a, b, dact, a, b, N, H, H, s);
  linear_backward({fp8, l, Fp8Product::fc}, dx, dfcw, dfcb, nullptr, a, x, fcw, nullptr, N, C, H, s);
  linear_backward({fp8, l, Fp8Product::fc2}, dx, dfc2w, nullptr, nullptr, b, x, fc2w, nullptr, N, C, H, s,
                  after_input_gradient, true);
}
