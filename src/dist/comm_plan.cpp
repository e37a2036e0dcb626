// comm_plan.cpp — a step's gradient and parameter collectives by ZeRO stage (comm_plan.h).
#include "src/dist/comm_plan.h"

#include <vector>

namespace {

// One call on a buffer of `elements` chunked over `ranks`, `passes` ring halves (1: reduce-scatter
// or all-gather, 2: all-reduce).
void add_call(CollectiveTraffic& t, size_t elements, int ranks, size_t elem_bytes, int passes) {
  ++t.calls;
  t.bytes_sent += passes * static_cast<double>(elements * elem_bytes) * (ranks - 1) / ranks;
}

}  // namespace

StepTraffic step_traffic(const GradientBuckets& buckets, int world_size, int stage, int micro_steps, int prefetch,
                         size_t elem_bytes) {
  StepTraffic t;
  const int R = world_size;
  const std::vector<GradientBucket>& all = buckets.buckets();
  if (R < 2) return t;
  for (const GradientBucket& b : all) {
    const size_t chunked = b.chunk * static_cast<size_t>(buckets.ranks());
    if (stage == 0) add_call(t.all_reduce, b.elements, R, elem_bytes, 2);
    for (int m = 0; m < (stage >= 2 ? micro_steps : stage == 1 ? 1 : 0); ++m)
      add_call(t.reduce_scatter, chunked, R, elem_bytes, 1);
    if (stage == 1 || stage == 2) add_call(t.all_gather, chunked, R, elem_bytes, 1);
  }
  if (stage != 3) return t;
  // Layer buckets are 0..K-2 (top layers first); the forward walks them from K-2 down, the
  // backward from 0 up; wte/wpe/lnf (bucket K-1) is gathered once.
  const size_t layer_buckets = all.size() - 1;
  add_call(t.all_gather, all.back().chunk * static_cast<size_t>(R), R, elem_bytes, 1);
  for (int pass = 0; pass < 2 * micro_steps; ++pass) {
    const bool forward = pass % 2 == 0;
    const size_t resident = pass == 0 ? 0 : static_cast<size_t>(prefetch) + 1;
    for (size_t k = resident; k < layer_buckets; ++k) {
      const GradientBucket& b = all[forward ? layer_buckets - 1 - k : k];
      add_call(t.all_gather, b.chunk * static_cast<size_t>(R), R, elem_bytes, 1);
    }
  }
  return t;
}
