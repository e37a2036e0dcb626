// simt's warp-shuffle rule, CPU build only: a shuffle whose source lane does not take part (not in
// the mask, exited, or beyond a partial warp) returns an undefined value on a GPU, so simt stops
// the program naming the kernel and the lanes; the shuffles CUDA defines (sources in the mask, a
// xor partner in a later segment or an up/down source past the segment: the caller's own value)
// run in both thread orders. Aborting cases run in a forked child (child_process.h).
#include "test/child_process.h"
#include "test/test_util.h"

#include <string>

// Lanes 0-15 name only themselves in the mask but read lane `src`.
__global__ void half_mask_shuffle_kernel(int* out, int src) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0x0000ffffu, static_cast<int>(threadIdx.x), src);
}

// A block of 40 threads: warp 1 has lanes 0-7; lane l reads lane l ^ offset.
__global__ void partial_warp_xor_kernel(int* out, int offset) {
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), offset);
}

// Lanes 16-31 have returned; lanes 0-15 read lane l + delta within segments of `width`.
__global__ void exited_lanes_shuffle_kernel(int* out, unsigned delta, int width) {
  if (threadIdx.x >= 16) return;
  out[threadIdx.x] = __shfl_down_sync(0xffffffffu, static_cast<int>(threadIdx.x), delta, width);
}

// Segments of 16: a xor partner in the later segment and a down source past the segment are
// the caller's own value; a xor partner in the earlier segment is read.
__global__ void segment_shuffle_kernel(int* out) {
  const int lane = static_cast<int>(threadIdx.x);
  out[2 * lane] = __shfl_xor_sync(0xffffffffu, lane, 16, 16);
  out[2 * lane + 1] = __shfl_down_sync(0xffffffffu, lane, 8, 16);
}

namespace {

// Runs `launch_it` in a child and returns its stderr, which must be the shuffle rule's message.
template <typename Launch>
std::string refused(const char* order, Launch launch_it) {
  test::ChildResult r = test::run_in_child([&] {
    test::ScheduleScope scope(order);
    test::DeviceBuffer<int> out(64);
    launch_it(out.ptr);
    return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
  });
  INFO(order << " stderr: " << r.stderr_text);
  CHECK(r.aborted);
  CHECK(r.stderr_text.find("does not take part") != std::string::npos);
  return r.stderr_text;
}

}  // namespace

TEST_CASE("a shuffle from a lane that does not take part is reported", "[warp]") {
  for (const char* order : {"forward", "reverse"}) {
    // Planted: a source outside the mask, a lane beyond a partial warp, an exited lane.
    CHECK(refused(order, [](int* out) { launch(half_mask_shuffle_kernel, dim3(1), dim3(32), 0, nullptr, out, 20); })
              .find("half_mask_shuffle_kernel") != std::string::npos);
    CHECK(refused(order, [](int* out) { launch(partial_warp_xor_kernel, dim3(1), dim3(40), 0, nullptr, out, 8); })
              .find("reads lane 8") != std::string::npos);
    CHECK(refused(order, [](int* out) { launch(exited_lanes_shuffle_kernel, dim3(1), dim3(32), 0, nullptr, out, 4u, 32); })
              .find("__shfl_down_sync") != std::string::npos);
  }
}

TEST_CASE("the shuffles CUDA defines run in both thread orders", "[warp]") {
  for (const char* order : {"forward", "reverse"}) {
    INFO(order);
    test::ScheduleScope scope(order);
    test::DeviceBuffer<int> out(64);
    // Correct counterparts of the planted cases: a source inside the mask, a partner inside the
    // partial warp, down-shuffles that stay among the live lanes (segments of 8).
    launch(half_mask_shuffle_kernel, dim3(1), dim3(32), 0, nullptr, out.ptr, 3);
    test::require_no_cuda_error();
    std::vector<int> got = out.download();
    for (int l = 0; l < 16; ++l) CHECK(got[l] == 3);
    launch(partial_warp_xor_kernel, dim3(1), dim3(40), 0, nullptr, out.ptr, 4);
    test::require_no_cuda_error();
    got = out.download();
    for (int t = 0; t < 40; ++t) CHECK(got[t] == ((t % 32) ^ 4) + (t / 32) * 32);
    launch(exited_lanes_shuffle_kernel, dim3(1), dim3(32), 0, nullptr, out.ptr, 4u, 8);
    test::require_no_cuda_error();
    got = out.download();
    for (int l = 0; l < 16; ++l) CHECK(got[l] == ((l & 7) + 4 < 8 ? l + 4 : l));
    launch(segment_shuffle_kernel, dim3(1), dim3(32), 0, nullptr, out.ptr);
    test::require_no_cuda_error();
    got = out.download();
    for (int l = 0; l < 32; ++l) {
      CHECK(got[2 * l] == (l < 16 ? l : l - 16));
      CHECK(got[2 * l + 1] == ((l & 15) + 8 < 16 ? l + 8 : l));
    }
  }
}
