// The weight initialisation's normal numbers (src/base/rng.h): NormalSampler::fill, which spreads
// the Box–Muller arithmetic over threads, gives exactly the values of a sequential Box–Muller over
// mt19937_64 written here from the formula, whatever the chunk size, count parity or pending spare.
#include "src/base/rng.h"
#include "test/test_util.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <random>
#include <vector>

namespace {

// Box–Muller over mt19937_64's words in order: words 2j and 2j+1 give r·cos θ then r·sin θ.
std::vector<float> reference_normals(uint64_t seed, size_t skip, size_t n, float scale) {
  std::mt19937_64 rng(seed);
  std::vector<double> all;
  while (all.size() < skip + n) {
    const double u1 = (static_cast<double>(rng() >> 11) + 0.5) / 9007199254740992.0;
    const double u2 = (static_cast<double>(rng() >> 11) + 0.5) / 9007199254740992.0;
    const double r = std::sqrt(-2.0 * std::log(u1)), theta = 2.0 * M_PI * u2;
    all.push_back(r * std::cos(theta));
    all.push_back(r * std::sin(theta));
  }
  std::vector<float> out;
  for (size_t k = skip; k < skip + n; ++k) out.push_back(static_cast<float>(all[k]) * scale);
  return out;
}

}  // namespace

TEST_CASE("NormalSampler::fill equals the sequential Box-Muller stream", "[rng]") {
  for (size_t skip : {size_t{0}, size_t{1}, size_t{2}}) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{1001}, size_t{4096}}) {
      for (size_t chunk : {size_t{1}, size_t{7}, size_t{1} << 20}) {
        CAPTURE(skip, n, chunk);
        NormalSampler normal(42);
        for (size_t k = 0; k < skip; ++k) normal.next();
        std::vector<float> got(n + 1, std::nanf(""));
        normal.fill(got.data(), n, 0.02f, chunk);
        const std::vector<float> want = reference_normals(42, skip, n + 1, 0.02f);
        for (size_t k = 0; k < n; ++k) REQUIRE(got[k] == want[k]);
        CHECK(std::isnan(got[n]));  // nothing written past n
        // The stream continues where fill left it.
        CHECK(static_cast<float>(normal.next()) * 0.02f == want[n]);
      }
    }
  }
}
