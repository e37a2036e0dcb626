// counters.h — what simt counts for tests of how host code would behave on a GPU.
#pragma once

namespace simt {
// Calls that block the host until device work is done (stream, event and device synchronize;
// cudaMemcpy; cudaMemcpyAsync into pageable host memory, which returns only once copied, or from
// it, which may wait for the stream's earlier work before staging the data), and
// cuBLASLt heuristic queries. Tests reset them (= Counters{}) and read them around the code they
// measure.
// Device memory: bytes held by cudaMalloc now, and the most held at once since the last reset
// (pinned host memory is not device memory and not counted).
struct Counters {
  long long host_syncs = 0;
  long long heuristic_queries = 0;
  long long device_bytes = 0;
  long long peak_device_bytes = 0;
};
Counters& counters();
}  // namespace simt
