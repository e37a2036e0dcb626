// counters.h — what simt counts for tests of how host code would behave on a GPU.
#pragma once

namespace simt {
// Calls that block the host until device work is done (stream, event and device synchronize;
// cudaMemcpy; cudaMemcpyAsync into pageable host memory, which returns only once copied), and
// cuBLASLt heuristic queries. Tests reset them (= Counters{}) and read them around the code they
// measure.
struct Counters {
  long long host_syncs = 0;
  long long heuristic_queries = 0;
};
Counters& counters();
}  // namespace simt
