// Gradient buckets and ownership (src/dist/grad_buckets.h): every parameter is owned by exactly one rank,
// each rank's state is dense, buckets hold whole layers in backward order, and every tensor slice
// has one place in its bucket.
#include "test/test_util.h"
#include "src/dist/grad_buckets.h"

#include <vector>

namespace {

// Layers that do not fill buckets evenly, C not a multiple of 8.
const ModelConfig kOdd{9, 13, 16, 5, 3, 12};  // maxT, V, Vp, L, NH, C

size_t layer_elements(const ParameterLayout& layout) {
  size_t n = 0;
  for (int i = kFirstLayerTensor; i <= kLastLayerTensor; ++i) n += layout.slice_count(i);
  return n;
}

}  // namespace

TEST_CASE("Buckets hold whole layers from the top, then wte/wpe/lnf", "[grad_buckets]") {
  const ParameterLayout layout(kOdd);
  const GradientBuckets buckets(layout, 2, 3);
  const std::vector<GradientBucket>& b = buckets.buckets();
  REQUIRE(b.size() == 4);  // layers {4,3}, {2,1}, {0}, then the model tensors
  CHECK((b[0].top_layer == 4 && b[0].bottom_layer == 3));
  CHECK((b[1].top_layer == 2 && b[1].bottom_layer == 1));
  CHECK((b[2].top_layer == 0 && b[2].bottom_layer == 0));
  CHECK(!b[3].holds_layers());
  const size_t per_layer = layer_elements(layout);
  CHECK(b[0].elements == 2 * per_layer);
  CHECK(b[2].elements == per_layer);
  CHECK(b[3].elements == layout[kWte].count + layout[kWpe].count + 2 * layout[kLnfw].count);
  size_t offset = 0, shard = 0;
  for (const GradientBucket& bucket : b) {
    CHECK(bucket.chunk % 8 == 0);
    CHECK(bucket.chunk * 3 >= bucket.elements);
    CHECK(bucket.chunk * 3 < bucket.elements + 3 * 8);  // ceil(n / 3) rounded up to 8
    CHECK(bucket.offset == offset);
    CHECK(bucket.shard_offset == shard);
    offset += 3 * bucket.chunk;
    shard += bucket.chunk;
  }
  CHECK(buckets.full_elements() == offset);
  CHECK(buckets.shard_elements() == shard);
  CHECK(buckets.largest_layer_bucket() == 3 * b[0].chunk);
  for (int l = 0; l < 5; ++l) CHECK(buckets.bucket_of_layer(l) == static_cast<size_t>((4 - l) / 2));
}

TEST_CASE("Every tensor slice has its own place in its bucket", "[grad_buckets]") {
  const ParameterLayout layout(kOdd);
  for (int bucket_layers : {1, 2, 5, 9}) {
    const GradientBuckets buckets(layout, bucket_layers, 2);
    std::vector<std::vector<int>> used;
    for (const GradientBucket& b : buckets.buckets()) used.emplace_back(b.elements, 0);
    for (int i = 0; i < kNumParameterTensors; ++i)
      for (int l = 0; l < (is_layer_tensor(i) ? 5 : 1); ++l) {
        const size_t b = is_layer_tensor(i) ? buckets.bucket_of_layer(l) : buckets.buckets().size() - 1;
        const size_t at = buckets.piece_at(i, l);
        REQUIRE(at + layout.slice_count(i) <= used[b].size());
        for (size_t k = 0; k < layout.slice_count(i); ++k) used[b][at + k] += 1;
      }
    for (const std::vector<int>& u : used)
      for (int count : u) REQUIRE(count == 1);
  }
}

TEST_CASE("Each parameter has exactly one owner; each rank's state is dense", "[grad_buckets]") {
  const ParameterLayout layout(kOdd);
  for (int ranks : {1, 2, 3, 4, 7}) {
    for (int bucket_layers : {1, 2, 5}) {
      const GradientBuckets buckets(layout, bucket_layers, ranks);
      std::vector<int> owners(layout.total, 0);
      size_t states = 0;
      for (int r = 0; r < ranks; ++r) {
        size_t state = 0;
        for (const OptimizerSegment& s : buckets.segments(r)) {
          CHECK(s.state == state);  // state order: no gaps
          state += s.count;
          const ParameterInfo& t = layout[s.tensor];
          REQUIRE(s.param >= t.offset);
          REQUIRE(s.param + s.count <= t.offset + t.count);
          // Within one slice of its tensor, and inside rank r's chunk of its bucket.
          if (is_layer_tensor(s.tensor))
            CHECK((s.param - t.offset) / layout.slice_count(s.tensor) ==
                  (s.param + s.count - 1 - t.offset) / layout.slice_count(s.tensor));
          const GradientBucket& b = buckets.buckets()[s.bucket];
          CHECK(s.at >= r * b.chunk);
          CHECK(s.at + s.count <= (r + 1) * b.chunk);
          for (size_t k = 0; k < s.count; ++k) owners[s.param + k] += 1;
        }
        CHECK(state == buckets.state_count(r));
        states += state;
      }
      CHECK(states == layout.total);
      for (int n : owners) REQUIRE(n == 1);
    }
  }
}

TEST_CASE("Layers per bucket follow the size asked for", "[grad_buckets]") {
  const ParameterLayout layout(kOdd);
  const size_t bytes = layer_elements(layout) * 4;  // one fp32 layer
  const double mib = static_cast<double>(bytes) / 1048576.0;
  CHECK(layers_per_bucket(layout, mib * 0.5, 4) == 1);  // never less than a layer
  CHECK(layers_per_bucket(layout, mib * 2.6, 4) == 2);
  CHECK(layers_per_bucket(layout, mib * 2.6, 2) == 5);  // bf16: five layers fit
  CHECK(layers_per_bucket(layout, 1e6, 4) == 5);        // never more than the model has
}
