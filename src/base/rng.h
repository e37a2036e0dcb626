// rng.h — the project's random numbers: SplitMix64 (seeded streams that are the same on every
// platform and standard library) and the normal sampler of the weight initialisation.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

// SplitMix64's output function: a bijective 64-bit mix.
inline uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr uint64_t kGoldenGamma = 0x9E3779B97F4A7C15ull;  // SplitMix64's increment (2^64 / φ)

// A counter-based generator whose every output is a fixed function of the seed, identical on
// every platform (unlike std::shuffle / std::uniform_int_distribution).
struct SplitMix64 {
  uint64_t state;
  uint64_t next() { return splitmix64_mix(state += kGoldenGamma); }
  // Uniform in [0, n), unbiased: rejects the lowest 2^64 mod n values.
  uint64_t below(uint64_t n) {
    const uint64_t threshold = (0 - n) % n;
    uint64_t r = next();
    while (r < threshold) r = next();
    return r % n;
  }
};

// Seed of the stochastic rounding for one AdamW call: a hash of (run seed, step, tensor), so every
// tensor and step draws fresh bits and a resumed run reproduces them. `tensor` is the tensor's
// rounding number: GPT-2's 16 tensors in llm.c order 0..15, then Llama's fc2w 16 and lm_head 17
// (optimizer.h's rounding_stream).
inline unsigned adamw_rounding_seed(uint64_t seed, int step, int tensor) {
  const uint64_t x = seed * kGoldenGamma + ((static_cast<uint64_t>(step) << 5) | static_cast<uint64_t>(tensor));
  return static_cast<unsigned>(splitmix64_mix(x) >> 32);
}

// Standard normal numbers from mt19937_64 (fully specified by the C++ standard) with Box–Muller,
// rather than std::normal_distribution, whose algorithm differs between standard libraries.
// Each pair of uniforms (u1, u2) gives two normals, r·cos θ then r·sin θ (r = √(−2 ln u1), θ = 2π u2).
class NormalSampler {
 public:
  explicit NormalSampler(uint64_t seed) : rng_(seed) {}
  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const uint64_t a = rng_(), b = rng_();
    spare_ = second_of_pair(a, b);
    has_spare_ = true;
    return first_of_pair(a, b);
  }

  // out[k] = float(next())·scale for k < n: the same values as n calls of next(), but only the
  // generator's words are drawn in order (mt19937_64 is sequential); the Box–Muller arithmetic,
  // most of the time, runs on the machine's cores, pairs_per_chunk pairs at a time. A GPT-2 1.5B
  // initialisation is 1.56 billion values: a minute on one core.
  void fill(float* out, size_t n, float scale, size_t pairs_per_chunk = size_t{1} << 20) {
    size_t k = 0;
    if (n > 0 && has_spare_) out[k++] = static_cast<float>(next()) * scale;
    std::vector<uint64_t> words;
    const unsigned threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
    while (n - k >= 2) {
      const size_t pairs = std::min(pairs_per_chunk, (n - k) / 2);
      words.resize(2 * pairs);
      for (uint64_t& w : words) w = rng_();
      float* chunk = out + k;
      auto transform = [&](size_t begin, size_t end) {
        for (size_t p = begin; p < end; ++p) {
          chunk[2 * p] = static_cast<float>(first_of_pair(words[2 * p], words[2 * p + 1])) * scale;
          chunk[2 * p + 1] = static_cast<float>(second_of_pair(words[2 * p], words[2 * p + 1])) * scale;
        }
      };
      const size_t per_thread = (pairs + threads - 1) / threads;
      std::vector<std::thread> workers;
      for (size_t begin = per_thread; begin < pairs; begin += per_thread)
        workers.emplace_back(transform, begin, std::min(pairs, begin + per_thread));
      transform(0, std::min(pairs, per_thread));
      for (std::thread& w : workers) w.join();
      k += 2 * pairs;
    }
    if (k < n) out[k] = static_cast<float>(next()) * scale;  // an odd count leaves the pair's sine spare
  }

 private:
  static double uniform_open(uint64_t word) { return (static_cast<double>(word >> 11) + 0.5) * 0x1.0p-53; }  // (0, 1)
  static double radius(uint64_t a) { return std::sqrt(-2.0 * std::log(uniform_open(a))); }
  static double angle(uint64_t b) { return 6.283185307179586 * uniform_open(b); }  // 2π·u
  static double first_of_pair(uint64_t a, uint64_t b) { return radius(a) * std::cos(angle(b)); }
  static double second_of_pair(uint64_t a, uint64_t b) { return radius(a) * std::sin(angle(b)); }
  std::mt19937_64 rng_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};
