// linear.h — a transformer block's Linear products and their backward passes: matmul.cuh's in the
// model's dtype, or with --fp8 (an Fp8State) the FP8 products of fp8_state.h. Only bf16 models have
// FP8 products (--fp8 with --dtype fp32 is refused), so a float model always takes matmul.cuh's.
#pragma once
#include "kernels/matmul.cuh"
#include "src/model/fp8_state.h"

#include <functional>
#include <type_traits>

// Which product a call is: layer l's product p, through fp8 when it is not nullptr.
struct LinearSite {
  Fp8State* fp8 = nullptr;
  int layer = 0;
  Fp8Product product = Fp8Product::qkv;
};

// matmul_forward's contract. same_input: with FP8, inp is the previous call's input, already cast.
template <typename Elem>
void linear_forward(const LinearSite& at, Elem* out, const Elem* inp, const Elem* weight, const NonDeduced<Elem>* bias,
                    int rows, int in_features, int out_features, cudaStream_t s, bool same_input = false) {
  if constexpr (std::is_same<Elem, bf16>::value)
    if (at.fp8 != nullptr) return at.fp8->forward(out, inp, at.layer, at.product, bias, same_input);
  matmul_forward(out, inp, weight, bias, rows, in_features, out_features, s);
}

// The FP8 copy of `inp` that the kernel writing it (`rows` rows) can make on the way, as product
// at's input cast (Fp8State::producer_output, kernels/fp8_cast.cuh's Fp8Out); none without FP8 or
// where that cast is not fused. The product must be the next FP8 call.
template <typename Elem>
Fp8Out linear_input_cast(const LinearSite& at, const Elem* inp, int rows) {
  if constexpr (std::is_same<Elem, bf16>::value)
    if (at.fp8 != nullptr) return at.fp8->producer_output(at.layer, at.product, inp, rows);
  return {};
}

// As linear_input_cast, the transposed cast the next linear_backward of `at` reads for its weight
// gradient, made by a kernel that recomputes `inp` for the backward
// (Fp8State::producer_transposed_output).
template <typename Elem>
Fp8Out linear_input_cast_transposed(const LinearSite& at, const Elem* inp, int rows) {
  if constexpr (std::is_same<Elem, bf16>::value)
    if (at.fp8 != nullptr) return at.fp8->producer_transposed_output(at.layer, at.product, inp, rows);
  return {};
}

// matmul_backward's contract (Elem weight gradients).
template <typename Elem>
void linear_backward(const LinearSite& at, Elem* dinp, NonDeduced<Elem>* dweight, NonDeduced<Elem>* dbias,
                     NonDeduced<Elem>* dpre_gelu, const Elem* dout, const Elem* inp, const Elem* weight,
                     const NonDeduced<Elem>* pre_gelu, int rows, int in_features, int out_features, cudaStream_t s,
                     const std::function<void()>& after_input_gradient = nullptr,
                     bool accumulate_input_gradient = false) {
  if constexpr (std::is_same<Elem, bf16>::value)
    if (at.fp8 != nullptr)
      return at.fp8->backward(dinp, dweight, dbias, dpre_gelu, dout, inp, pre_gelu, at.layer, at.product,
                              after_input_gradient, accumulate_input_gradient);
  matmul_backward(dinp, dweight, dbias, dpre_gelu, dout, inp, weight, pre_gelu, rows, in_features, out_features, s,
                  after_input_gradient, accumulate_input_gradient);
}

// SwiGLU's up products' backward (block_ops.h's mlp_up_backward) with their gradients' FP8 casts
// fused into the activation's backward (Fp8State::swiglu_backward): true when done, false (nothing
// done) without FP8 or where that fusion does not apply.
template <typename Elem>
bool fp8_swiglu_backward(Fp8State* fp8, int l, Elem* dx, NonDeduced<Elem>* dfcw, NonDeduced<Elem>* dfc2w,
                         const Elem* dact, const Elem* a, const Elem* b, const Elem* x,
                         const std::function<void()>& after_input_gradient) {
  if constexpr (std::is_same<Elem, bf16>::value)
    if (fp8 != nullptr) return fp8->swiglu_backward(dx, dfcw, dfc2w, dact, a, b, x, l, after_input_gradient);
  return false;
}
