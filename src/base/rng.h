// rng.h — the project's random numbers: SplitMix64 (seeded streams that are the same on every
// platform and standard library) and the normal sampler of the weight initialisation.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>

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
// tensor and step draws fresh bits and a resumed run reproduces them.
inline unsigned adamw_rounding_seed(uint64_t seed, int step, int tensor) {
  const uint64_t x = seed * kGoldenGamma + ((static_cast<uint64_t>(step) << 5) | static_cast<uint64_t>(tensor));
  return static_cast<unsigned>(splitmix64_mix(x) >> 32);
}

// Standard normal numbers from mt19937_64 (fully specified by the C++ standard) with Box–Muller,
// rather than std::normal_distribution, whose algorithm differs between standard libraries.
class NormalSampler {
 public:
  explicit NormalSampler(uint64_t seed) : rng_(seed) {}
  double next() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    const double radius = std::sqrt(-2.0 * std::log(uniform_open()));
    const double angle = 6.283185307179586 * uniform_open();  // 2π
    spare_ = radius * std::sin(angle);
    has_spare_ = true;
    return radius * std::cos(angle);
  }

 private:
  double uniform_open() { return (static_cast<double>(rng_() >> 11) + 0.5) * 0x1.0p-53; }  // in (0, 1)
  std::mt19937_64 rng_;
  bool has_spare_ = false;
  double spare_ = 0.0;
};
