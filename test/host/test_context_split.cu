// ContextSplit (src/data/context_split.h): a CP rank's tokens, positions and row order against a
// brute-force statement of the zigzag layout (rank r holds chunks r and 2N-1-r of 2N equal chunks,
// chunk-major), the way back to [B][T] order, equal causal work per rank, and the refusals.
#include "test/test_util.h"
#include "src/data/context_split.h"

#include <set>
#include <vector>

namespace {

// The chunk of position t (chunks of T/(2N)) and whether rank r holds it: r or 2N-1-r (N = 1: all).
bool holds(int N, int r, int T, int t) {
  if (N == 1) return true;
  const int chunk = t / (T / (2 * N));
  return chunk == r || chunk == 2 * N - 1 - r;
}

}  // namespace

TEST_CASE("ContextSplit: each rank's rows are its zigzag chunks, chunk-major, and place() undoes it", "[cp]") {
  const int B = 3;
  for (const int N : {1, 2, 3, 4})
    for (const int chunk : {1, 5}) {
      const int T = N == 1 ? 7 : 2 * N * chunk;
      INFO("N " << N << ", T " << T);
      std::vector<int> whole(static_cast<size_t>(B) * T);
      for (size_t i = 0; i < whole.size(); ++i) whole[i] = static_cast<int>(i);  // a token names its (b, t)
      std::vector<int> gathered;
      std::set<int> seen;
      for (int r = 0; r < N; ++r) {
        const ContextSplit split(N, r, T);
        REQUIRE(split.local_len() * N == T);
        if (N > 1) {  // chunk r first, then chunk 2N-1-r
          CHECK(split.pieces(B).at(0).first == r * chunk);
          CHECK(split.pieces(B).at(1).first == (2 * N - 1 - r) * chunk);
        }
        std::vector<int> local(static_cast<size_t>(B) * split.local_len(), -1);
        split.select(local.data(), whole.data(), B);
        // Row order: the first chunk's (B, c) block, then the second's; within each, b then t.
        size_t at = 0;
        for (const ContextSplit::Piece& p : split.pieces(B)) {
          CHECK(p.row == static_cast<int>(at));
          for (int b = 0; b < B; ++b)
            for (int t = 0; t < p.len; ++t) {
              const int token = local[at++];
              CHECK(token / T == b);
              CHECK(token % T == p.first + t);
              CHECK(holds(N, r, T, token % T));
              CHECK(seen.insert(token).second);  // no token on two ranks
            }
        }
        CHECK(at == local.size());
        gathered.insert(gathered.end(), local.begin(), local.end());
      }
      CHECK(seen.size() == whole.size());  // every token on one rank
      std::vector<int> back(whole.size(), -1);
      ContextSplit(N, 0, T).place(back.data(), gathered.data(), B);
      CHECK(back == whole);
    }
}

TEST_CASE("ContextSplit: the zigzag gives every rank the same causal work", "[cp]") {
  for (const int N : {2, 3, 4, 8}) {
    const int T = 2 * N * 4;
    long long first = -1;
    for (int r = 0; r < N; ++r) {
      long long pairs = 0;  // (query, key) pairs the causal mask keeps, over the rank's queries
      for (const ContextSplit::Piece& p : ContextSplit(N, r, T).pieces(1))
        for (int t = 0; t < p.len; ++t) pairs += p.first + t + 1;
      if (first < 0) first = pairs;
      CHECK(pairs == first);
    }
  }
}

TEST_CASE("ContextSplit: refuses a sequence 2N does not divide, and a rank outside the group", "[cp]") {
  CHECK_THROWS_WITH(ContextSplit(2, 0, 6), Catch::Contains("2 x the ranks must divide it"));
  CHECK_THROWS(ContextSplit(2, 2, 8));
  CHECK_NOTHROW(ContextSplit(1, 0, 7));
}
