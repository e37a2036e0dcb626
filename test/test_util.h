// test_util.h — helpers shared by the Catch2 tests: device buffers, poisoning, seeded
// random data, bf16 rounding for references, and tolerance-aware comparison.
#pragma once
#include "kernels/common.cuh"
#include "src/base/device.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace test {

// One optimizer step as the trainer takes it: the step's figures (its one host synchronisation),
// then AdamW at `lr`. Returns the gradient norm before clipping.
template <typename Model, typename Settings>
float optimizer_step(Model& model, const Settings& opt, float lr, int step) {
  const auto figures = model.step_figures();
  model.apply_update(opt, lr, step, figures.grad_norm);
  return figures.grad_norm;
}

// A device allocation (src/base/device.h's DeviceArray, at least one element so that an empty buffer
// still has an address) whose fresh contents are poisoned with 0xFF bytes (NaN as float and as
// bf16), so an element a kernel forgets to write shows up.
template <typename T>
struct DeviceBuffer {
  DeviceArray<T> storage;
  T* ptr = nullptr;
  size_t count = 0;
  explicit DeviceBuffer(size_t n) : storage(std::max<size_t>(n, 1), "test buffer"), ptr(storage.get()), count(n) {
    poison();
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  size_t bytes() const { return storage.bytes(); }
  void poison() { CUDA_CHECK(cudaMemset(ptr, 0xFF, bytes())); }
  void upload(const std::vector<T>& host) {
    REQUIRE(host.size() == count);
    CUDA_CHECK(cudaMemcpy(ptr, host.data(), count * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(count);
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(host.data(), ptr, count * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  operator T*() const { return ptr; }
};

inline std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}
inline std::vector<int> random_tokens(size_t n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> dist(0, vocab - 1);
  std::vector<int> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Storage conversions, so one test body serves T = float and T = bf16.
template <typename T> std::vector<T> from_floats(const std::vector<float>& v) {
  std::vector<T> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = T(v[i]);
  return r;
}
template <typename T> std::vector<float> to_floats(const std::vector<T>& v) {
  std::vector<float> r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = static_cast<float>(v[i]);
  return r;
}
// The value a T would hold after storing x (identity for float, round-to-nearest-even for bf16):
// references feed kernels exactly the inputs the kernel sees.
template <typename T> std::vector<float> round_to(const std::vector<float>& v) {
  return to_floats(from_floats<T>(v));
}

// Default tolerances by storage type: fp32 results are compared to ~1e-5 relative,
// bf16 results to a few bf16 ulps (2^-8 relative).
template <typename T> struct Tolerance;
template <> struct Tolerance<float> { static constexpr double rel = 1e-5, abs = 1e-6; };
template <> struct Tolerance<bf16> { static constexpr double rel = 1.6e-2, abs = 1e-3; };

struct Comparison {
  size_t mismatches = 0, first_bad = 0;
  double max_abs_err = 0, got_at_first = 0, want_at_first = 0;
};

// Element-wise |got - want| <= abs + rel·|want|; NaN in got (an unwritten, poisoned
// element) is always a mismatch. Prints the first mismatch with its index.
template <typename G, typename W>
bool all_close(const std::string& what, const std::vector<G>& got, const std::vector<W>& want, double rel, double abs) {
  if (got.size() != want.size()) {
    UNSCOPED_INFO(what << ": size " << got.size() << " != expected " << want.size());
    return false;
  }
  Comparison c;
  for (size_t i = 0; i < got.size(); ++i) {
    double g = static_cast<double>(static_cast<float>(got[i])), w = static_cast<double>(want[i]);
    double err = std::fabs(g - w);
    bool ok = std::isfinite(g) == std::isfinite(w) && (!std::isfinite(w) || err <= abs + rel * std::fabs(w));
    if (std::isfinite(err)) c.max_abs_err = std::max(c.max_abs_err, err);
    if (!ok && c.mismatches++ == 0) { c.first_bad = i; c.got_at_first = g; c.want_at_first = w; }
  }
  if (c.mismatches) {
    UNSCOPED_INFO(what << ": " << c.mismatches << "/" << got.size() << " elements off; first at [" << c.first_bad
                       << "] got " << c.got_at_first << " want " << c.want_at_first << " (rel " << rel << ", abs "
                       << abs << "); max abs err " << c.max_abs_err);
  }
  return c.mismatches == 0;
}
template <typename T, typename G, typename W>
bool all_close(const std::string& what, const std::vector<G>& got, const std::vector<W>& want) {
  return all_close(what, got, want, Tolerance<T>::rel, Tolerance<T>::abs);
}

// Bitwise equality (determinism checks: same inputs must give the same bits, NaN included).
template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}
// The raw bytes of a vector, for comparisons that should report where the bits differ.
template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Launch errors (bad configuration, misaligned 128-bit access) must not pass silently.
inline void require_no_cuda_error() {
  cudaError_t err = cudaDeviceSynchronize();
  if (err == cudaSuccess) err = cudaGetLastError();
  INFO("CUDA error: " << cudaGetErrorString(err));
  REQUIRE(err == cudaSuccess);
}

}  // namespace test
