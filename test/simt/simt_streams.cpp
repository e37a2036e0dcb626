// The stream ordering checker (simt/streams.cpp): for every rule, a planted violation ends its
// process with one "simt: stream hazard:" line naming both operations, and a correct counterpart
// runs clean. A hazard ends the process, so each case runs in a child: this binary re-run on the
// hidden test "stream ordering probe" with SIMT_STREAMS_PROBE=<case> (and the caller's
// SIMT_SCHEDULE). The checker exists only in the CPU build, so this test does too.
#include "test/test_util.h"
#include "kernels/matmul.cuh"

#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

// Named (not in an anonymous namespace) so that reports can name the kernels.
namespace stream_probe {

constexpr int kN = 64;

__global__ void fill_kernel(float* out, float value, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value;
}
__global__ void copy_kernel(float* out, const float* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i];
}
// Reads through a pointer that is not const: the checker must count it as a write.
__global__ void sum_mutable_kernel(float* out, float* in, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = in[i] + 1.0f;
}

void fill(cudaStream_t s, float* out, int n = kN) { launch(fill_kernel, 1, kN, 0, s, out, 1.0f, n); }
void copy(cudaStream_t s, float* out, const float* in) { launch(copy_kernel, 1, kN, 0, s, out, in, kN); }

// Device memory without the test buffers' poisoning memset (itself legacy-stream work that each
// probe would have to order first); contents are never checked here.
struct Buffer {
  float* ptr = nullptr;
  explicit Buffer(size_t n) { CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr), n * sizeof(float))); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { cudaFree(ptr); }
  operator float*() const { return ptr; }
};

struct Streams {
  cudaStream_t a = nullptr, b = nullptr, blocking = nullptr;
  cudaEvent_t event = nullptr;
  Streams() {
    CUDA_CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreate(&blocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
};

// One probe per case: a planted violation ("... unordered") or its correct counterpart.
std::map<std::string, std::function<void()>> probes() {
  std::map<std::string, std::function<void()>> p;
  // ---- per-stream order and events
  p["kernel write, read on another stream unordered"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    fill(s.a, x);
    copy(s.b, y, x);
  };
  p["kernel write, event, read on another stream"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    fill(s.a, x);
    CUDA_CHECK(cudaEventRecord(s.event, s.a));
    CUDA_CHECK(cudaStreamWaitEvent(s.b, s.event, 0));
    copy(s.b, y, x);
  };
  p["kernel read, write on another stream unordered"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    copy(s.a, y, x);
    fill(s.b, x);
  };
  p["kernel read, stream synchronize, write on another stream"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    copy(s.a, y, x);
    CUDA_CHECK(cudaStreamSynchronize(s.a));
    fill(s.b, x);
  };
  p["event recorded before the write, waited on, unordered"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    CUDA_CHECK(cudaEventRecord(s.event, s.a));
    fill(s.a, x);
    CUDA_CHECK(cudaStreamWaitEvent(s.b, s.event, 0));
    copy(s.b, y, x);
  };
  p["event synchronize before the write, unordered"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    CUDA_CHECK(cudaEventRecord(s.event, s.a));
    fill(s.a, x);
    CUDA_CHECK(cudaEventSynchronize(s.event));
    copy(s.b, y, x);
  };
  p["event synchronize after the write"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    fill(s.a, x);
    CUDA_CHECK(cudaEventRecord(s.event, s.a));
    CUDA_CHECK(cudaEventSynchronize(s.event));
    copy(s.b, y, x);
  };
  p["event query before the write, unordered"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    CUDA_CHECK(cudaEventRecord(s.event, s.a));
    fill(s.a, x);
    CUDA_CHECK(cudaEventQuery(s.event));
    copy(s.b, y, x);
  };
  p["event query after the write"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    fill(s.a, x);
    CUDA_CHECK(cudaEventRecord(s.event, s.a));
    CUDA_CHECK(cudaEventQuery(s.event));
    copy(s.b, y, x);
  };
  p["device synchronize before the write, unordered"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    CUDA_CHECK(cudaDeviceSynchronize());
    fill(s.a, x);
    copy(s.b, y, x);
  };
  p["device synchronize after the write"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    fill(s.a, x);
    CUDA_CHECK(cudaDeviceSynchronize());
    copy(s.b, y, x);
  };
  // ---- the legacy default stream and blocking streams
  p["non-blocking write, legacy read unordered"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    fill(s.a, x);
    copy(nullptr, y, x);
  };
  p["legacy write, non-blocking read unordered"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    fill(nullptr, x);
    copy(s.a, y, x);
  };
  p["blocking write, legacy read, blocking write"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    fill(s.blocking, x);
    copy(cudaStreamLegacy, y, x);
    fill(s.blocking, y);
  };
  // ---- per-thread default streams: blocking, one per host thread
  p["per-thread write, legacy read"] = [] {
    Buffer x(kN), y(kN);
    fill(cudaStreamPerThread, x);
    copy(nullptr, y, x);
  };
  p["per-thread streams of two threads unordered"] = [] {
    Buffer x(kN), y(kN);
    std::thread([&] { fill(cudaStreamPerThread, x); }).join();
    copy(cudaStreamPerThread, y, x);
  };
  // ---- copies and memsets, by their documented host behaviour
  p["cudaMemcpy from pageable memory, non-blocking read unordered"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    std::vector<float> host(kN, 2.0f);
    CUDA_CHECK(cudaMemcpy(x.ptr, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice));
    copy(s.a, y, x);
  };
  p["cudaMemcpy from pinned memory, non-blocking read"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    float* pinned = nullptr;
    CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&pinned), kN * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(x.ptr, pinned, kN * sizeof(float), cudaMemcpyHostToDevice));
    copy(s.a, y, x);
    CUDA_CHECK(cudaFreeHost(pinned));
  };
  p["cudaMemcpy from pageable memory, event, non-blocking read"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    std::vector<float> host(kN, 2.0f);
    CUDA_CHECK(cudaMemcpy(x.ptr, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaEventRecord(s.event, cudaStreamLegacy));
    CUDA_CHECK(cudaStreamWaitEvent(s.a, s.event, 0));
    copy(s.a, y, x);
  };
  p["non-blocking write, cudaMemcpy to the host unordered"] = [] {
    Streams s;
    Buffer x(kN);
    std::vector<float> host(kN);
    fill(s.a, x);
    CUDA_CHECK(cudaMemcpy(host.data(), x.ptr, kN * sizeof(float), cudaMemcpyDeviceToHost));
  };
  p["cudaMemcpy to the host waits: then a non-blocking write"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    std::vector<float> host(kN);
    CUDA_CHECK(cudaMemset(x.ptr, 0, kN * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(host.data(), y.ptr, kN * sizeof(float), cudaMemcpyDeviceToHost));
    fill(s.a, x);
  };
  p["cudaMemcpy device to device does not wait: then a non-blocking write unordered"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    CUDA_CHECK(cudaMemcpy(y.ptr, x.ptr, kN * sizeof(float), cudaMemcpyDeviceToDevice));
    fill(s.a, x);
  };
  p["cudaMemcpyAsync to pageable memory, write on another stream unordered"] = [] {
    Streams s;
    Buffer x(kN);
    std::vector<float> host(kN);
    CUDA_CHECK(cudaMemcpyAsync(host.data(), x.ptr, kN * sizeof(float), cudaMemcpyDeviceToHost, s.a));
    fill(s.b, x);
  };
  p["cudaMemcpyAsync, stream synchronize, write on another stream"] = [] {
    Streams s;
    Buffer x(kN);
    std::vector<float> host(kN);
    CUDA_CHECK(cudaMemcpyAsync(host.data(), x.ptr, kN * sizeof(float), cudaMemcpyDeviceToHost, s.a));
    CUDA_CHECK(cudaStreamSynchronize(s.a));
    fill(s.b, x);
  };
  p["cudaMemset, non-blocking read unordered"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    CUDA_CHECK(cudaMemset(x.ptr, 0, kN * sizeof(float)));
    copy(s.a, y, x);
  };
  p["cudaMemset, device synchronize, non-blocking read"] = [] {
    Streams s;
    Buffer x(kN), y(kN);
    CUDA_CHECK(cudaMemset(x.ptr, 0, kN * sizeof(float)));
    CUDA_CHECK(cudaDeviceSynchronize());
    copy(s.a, y, x);
  };
  // ---- byte ranges: exact for copies and memsets, pointer to allocation end for kernels
  p["cudaMemsetAsync of two halves on two streams"] = [] {
    Streams s;
    Buffer x(kN);
    CUDA_CHECK(cudaMemsetAsync(x.ptr, 0, kN / 2 * sizeof(float), s.a));
    CUDA_CHECK(cudaMemsetAsync(x.ptr + kN / 2, 0, kN / 2 * sizeof(float), s.b));
    CUDA_CHECK(cudaMemsetAsync(x.ptr + 8, 1, 8 * sizeof(float), s.a));  // after a's own write: ordered
  };
  p["cudaMemsetAsync of overlapping ranges on two streams unordered"] = [] {
    Streams s;
    Buffer x(kN);
    CUDA_CHECK(cudaMemsetAsync(x.ptr, 0, kN / 2 * sizeof(float), s.a));
    CUDA_CHECK(cudaMemsetAsync(x.ptr + kN / 2 - 1, 0, kN / 2 * sizeof(float), s.b));
  };
  p["kernel pointer reaches to the end of its allocation, unordered"] = [] {
    Streams s;
    Buffer x(kN);
    CUDA_CHECK(cudaMemsetAsync(x.ptr + kN - 1, 0, sizeof(float), s.a));
    fill(s.b, x.ptr + kN / 2, 1);
  };
  p["kernel pointer does not reach before itself"] = [] {
    Streams s;
    Buffer x(kN);
    CUDA_CHECK(cudaMemsetAsync(x.ptr, 0, kN / 2 * sizeof(float), s.a));
    fill(s.b, x.ptr + kN / 2, kN / 2);
  };
  // ---- kernel parameters: pointer to const = read, any other pointer = write
  p["two const-pointer readers on two streams"] = [] {
    Streams s;
    Buffer x(kN), y(kN), z(kN);
    copy(s.a, y, x);
    copy(s.b, z, x);
  };
  p["a non-const-pointer reader on another stream unordered"] = [] {
    Streams s;
    Buffer x(kN), y(kN), z(kN);
    copy(s.a, y, x);
    launch(sum_mutable_kernel, 1, kN, 0, s.b, z.ptr, x.ptr, kN);
  };
  // ---- cuBLASLt: A, B read, D and the workspace written
  p["matmul writes D, read on another stream unordered"] = [] {
    Streams s;
    matmul_init();
    Buffer inp(8 * 16), weight(8 * 16), out(8 * 8), y(kN);
    matmul_forward(out.ptr, inp.ptr, weight.ptr, nullptr, 8, 16, 8, s.a);
    copy(s.b, y, out);
  };
  p["matmuls sharing the workspace on two streams unordered"] = [] {
    Streams s;
    matmul_init();
    Buffer inp(8 * 16), weight(8 * 16), out1(8 * 8), out2(8 * 8);
    matmul_forward(out1.ptr, inp.ptr, weight.ptr, nullptr, 8, 16, 8, s.a);
    matmul_forward(out2.ptr, inp.ptr, weight.ptr, nullptr, 8, 16, 8, s.b);
  };
  p["matmuls on two streams ordered by an event"] = [] {
    Streams s;
    matmul_init();
    Buffer inp(8 * 16), weight(8 * 16), out1(8 * 8), out2(8 * 8), y(kN);
    matmul_forward(out1.ptr, inp.ptr, weight.ptr, nullptr, 8, 16, 8, s.a);
    CUDA_CHECK(cudaEventRecord(s.event, s.a));
    CUDA_CHECK(cudaStreamWaitEvent(s.b, s.event, 0));
    matmul_forward(out2.ptr, inp.ptr, weight.ptr, nullptr, 8, 16, 8, s.b);
    copy(s.b, y, out1);
  };
  // ---- NCCL: send read, receive written, on the call's stream
  auto one_rank = [] {
    ncclUniqueId id;
    ncclComm_t comm = nullptr;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    REQUIRE(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
    return comm;
  };
  p["kernel write, all-reduce on another stream unordered"] = [one_rank] {
    Streams s;
    ncclComm_t comm = one_rank();
    Buffer x(kN), y(kN);
    fill(s.a, x);
    REQUIRE(ncclAllReduce(x.ptr, y.ptr, kN, ncclFloat32, ncclSum, comm, s.b) == ncclSuccess);
  };
  p["all-reduce, read of its result on another stream unordered"] = [one_rank] {
    Streams s;
    ncclComm_t comm = one_rank();
    Buffer x(kN), y(kN);
    REQUIRE(ncclAllReduce(x.ptr, x.ptr, kN, ncclFloat32, ncclSum, comm, s.b) == ncclSuccess);
    copy(s.a, y, x);
  };
  p["kernel write, event, all-reduce, event, read"] = [one_rank] {
    Streams s;
    ncclComm_t comm = one_rank();
    Buffer x(kN), y(kN);
    fill(s.a, x);
    CUDA_CHECK(cudaEventRecord(s.event, s.a));
    CUDA_CHECK(cudaStreamWaitEvent(s.b, s.event, 0));
    REQUIRE(ncclAllReduce(x.ptr, x.ptr, kN, ncclFloat32, ncclSum, comm, s.b) == ncclSuccess);
    CUDA_CHECK(cudaEventRecord(s.event, s.b));
    CUDA_CHECK(cudaStreamWaitEvent(s.a, s.event, 0));
    copy(s.a, y, x);
    ncclCommDestroy(comm);
  };
  // ---- NCCL: operations of two communicators (each on its own buffers: only their order is checked)
  p["all-reduces of two communicators on two streams unordered"] = [one_rank] {
    Streams s;
    ncclComm_t first = one_rank(), second = one_rank();
    Buffer x(kN), y(kN);
    REQUIRE(ncclAllReduce(x.ptr, x.ptr, kN, ncclFloat32, ncclSum, first, s.a) == ncclSuccess);
    REQUIRE(ncclAllReduce(y.ptr, y.ptr, kN, ncclFloat32, ncclSum, second, s.b) == ncclSuccess);
  };
  p["all-reduces of two communicators on two streams ordered by an event"] = [one_rank] {
    Streams s;
    ncclComm_t first = one_rank(), second = one_rank();
    Buffer x(kN), y(kN);
    REQUIRE(ncclAllReduce(x.ptr, x.ptr, kN, ncclFloat32, ncclSum, first, s.a) == ncclSuccess);
    CUDA_CHECK(cudaEventRecord(s.event, s.a));
    CUDA_CHECK(cudaStreamWaitEvent(s.b, s.event, 0));
    REQUIRE(ncclAllReduce(y.ptr, y.ptr, kN, ncclFloat32, ncclSum, second, s.b) == ncclSuccess);
    REQUIRE(ncclAllReduce(x.ptr, x.ptr, kN, ncclFloat32, ncclSum, first, s.b) == ncclSuccess);
  };
  p["an event recorded before the first all-reduce, then another communicator unordered"] = [one_rank] {
    Streams s;
    ncclComm_t first = one_rank(), second = one_rank();
    Buffer x(kN), y(kN);
    CUDA_CHECK(cudaEventRecord(s.event, s.a));
    REQUIRE(ncclAllReduce(x.ptr, x.ptr, kN, ncclFloat32, ncclSum, first, s.a) == ncclSuccess);
    CUDA_CHECK(cudaStreamWaitEvent(s.b, s.event, 0));
    REQUIRE(ncclAllGather(y.ptr, y.ptr, kN, ncclFloat32, second, s.b) == ncclSuccess);
  };
  p["all-reduces of two communicators, stream synchronize between"] = [one_rank] {
    Streams s;
    ncclComm_t first = one_rank(), second = one_rank();
    Buffer x(kN), y(kN);
    REQUIRE(ncclAllReduce(x.ptr, x.ptr, kN, ncclFloat32, ncclSum, first, s.a) == ncclSuccess);
    CUDA_CHECK(cudaStreamSynchronize(s.a));
    REQUIRE(ncclAllReduce(y.ptr, y.ptr, kN, ncclFloat32, ncclSum, second, s.b) == ncclSuccess);
  };
  p["all-reduces of two communicators in one group"] = [one_rank] {
    Streams s;
    ncclComm_t first = one_rank(), second = one_rank();
    Buffer x(kN), y(kN);
    REQUIRE(ncclGroupStart() == ncclSuccess);
    REQUIRE(ncclAllReduce(x.ptr, x.ptr, kN, ncclFloat32, ncclSum, first, s.a) == ncclSuccess);
    REQUIRE(ncclAllReduce(y.ptr, y.ptr, kN, ncclFloat32, ncclSum, second, s.b) == ncclSuccess);
    REQUIRE(ncclGroupEnd() == ncclSuccess);
  };
  p["all-reduces of two communicators in two groups unordered"] = [one_rank] {
    Streams s;
    ncclComm_t first = one_rank(), second = one_rank();
    Buffer x(kN), y(kN);
    REQUIRE(ncclGroupStart() == ncclSuccess);
    REQUIRE(ncclAllReduce(x.ptr, x.ptr, kN, ncclFloat32, ncclSum, first, s.a) == ncclSuccess);
    REQUIRE(ncclGroupEnd() == ncclSuccess);
    REQUIRE(ncclGroupStart() == ncclSuccess);
    REQUIRE(ncclAllReduce(y.ptr, y.ptr, kN, ncclFloat32, ncclSum, second, s.b) == ncclSuccess);
    REQUIRE(ncclGroupEnd() == ncclSuccess);
  };
  p["all-reduce of a destroyed communicator, then of another unordered"] = [one_rank] {
    Streams s;
    ncclComm_t first = one_rank(), second = one_rank();
    Buffer x(kN), y(kN);
    REQUIRE(ncclAllReduce(x.ptr, x.ptr, kN, ncclFloat32, ncclSum, first, s.a) == ncclSuccess);
    REQUIRE(ncclCommDestroy(first) == ncclSuccess);  // waits for its operations
    REQUIRE(ncclAllReduce(y.ptr, y.ptr, kN, ncclFloat32, ncclSum, second, s.b) == ncclSuccess);
  };
  return p;
}

// What a case's child printed and how it ended.
struct Outcome {
  bool exited_zero;
  std::string hazard;  // the "simt: stream hazard:" line, or empty
};

Outcome run_probe(const std::string& name) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  REQUIRE(n > 0);
  self[n] = '\0';
  const std::string command = "SIMT_STREAMS_PROBE='" + name + "' '" + self + "' 'stream ordering probe' 2>&1";
  FILE* child = popen(command.c_str(), "r");
  REQUIRE(child != nullptr);
  Outcome outcome{false, ""};
  char line[8192];
  while (std::fgets(line, sizeof line, child) != nullptr)
    if (std::string(line).rfind("simt: stream hazard:", 0) == 0) outcome.hazard = line;
  const int status = pclose(child);
  outcome.exited_zero = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  return outcome;
}

// The violation ends its child with one hazard line naming `names` (operations, streams); the
// counterpart runs clean.
void expect_hazard(const std::string& name, std::vector<std::string> names) {
  INFO("case: " << name);
  const Outcome o = run_probe(name);
  CHECK_FALSE(o.exited_zero);
  INFO("hazard line: " << o.hazard);
  REQUIRE_FALSE(o.hazard.empty());
  for (const std::string& n : names) CHECK(o.hazard.find(n) != std::string::npos);
  CHECK(o.hazard.find("device allocation") != std::string::npos);
}
// The violation of the communicators' order ends its child with one hazard line naming `names`.
void expect_communicator_hazard(const std::string& name, std::vector<std::string> names) {
  INFO("case: " << name);
  const Outcome o = run_probe(name);
  CHECK_FALSE(o.exited_zero);
  INFO("hazard line: " << o.hazard);
  REQUIRE_FALSE(o.hazard.empty());
  for (const std::string& n : names) CHECK(o.hazard.find(n) != std::string::npos);
  CHECK(o.hazard.find("two communicators") != std::string::npos);
}
void expect_clean(const std::string& name) {
  INFO("case: " << name);
  const Outcome o = run_probe(name);
  CHECK(o.hazard == "");
  CHECK(o.exited_zero);
}

}  // namespace stream_probe

using stream_probe::expect_clean;
using stream_probe::expect_communicator_hazard;
using stream_probe::expect_hazard;

TEST_CASE("stream ordering probe", "[.]") {
  const char* name = std::getenv("SIMT_STREAMS_PROBE");
  REQUIRE(name != nullptr);
  const auto probes = stream_probe::probes();
  const auto it = probes.find(name);
  REQUIRE(it != probes.end());
  it->second();
  CUDA_CHECK(cudaDeviceSynchronize());
}

TEST_CASE("stream checker: per-stream order and events", "[simt][streams]") {
  expect_hazard("kernel write, read on another stream unordered",
                {"kernel stream_probe::copy_kernel", "reads", "kernel stream_probe::fill_kernel", "wrote",
                 "cudaStreamNonBlocking"});
  expect_clean("kernel write, event, read on another stream");
  expect_hazard("kernel read, write on another stream unordered", {"fill_kernel", "writes", "copy_kernel", "read"});
  expect_clean("kernel read, stream synchronize, write on another stream");
  expect_hazard("event recorded before the write, waited on, unordered", {"copy_kernel", "fill_kernel"});
}

TEST_CASE("stream checker: host waits (event, device)", "[simt][streams]") {
  expect_hazard("event synchronize before the write, unordered", {"copy_kernel", "fill_kernel"});
  expect_clean("event synchronize after the write");
  expect_hazard("event query before the write, unordered", {"copy_kernel", "fill_kernel"});
  expect_clean("event query after the write");
  expect_hazard("device synchronize before the write, unordered", {"copy_kernel", "fill_kernel"});
  expect_clean("device synchronize after the write");
}

TEST_CASE("stream checker: the legacy default stream syncs with blocking streams only", "[simt][streams]") {
  expect_hazard("non-blocking write, legacy read unordered", {"the legacy default stream", "cudaStreamNonBlocking"});
  expect_hazard("legacy write, non-blocking read unordered", {"the legacy default stream", "cudaStreamNonBlocking"});
  expect_clean("blocking write, legacy read, blocking write");
}

TEST_CASE("stream checker: per-thread default streams", "[simt][streams]") {
  expect_clean("per-thread write, legacy read");
  expect_hazard("per-thread streams of two threads unordered", {"per-thread default stream"});
}

TEST_CASE("stream checker: cudaMemcpy and cudaMemset host behaviour", "[simt][streams]") {
  expect_hazard("cudaMemcpy from pageable memory, non-blocking read unordered",
                {"copy_kernel", "cudaMemcpy (host to device) on the legacy default stream"});
  expect_clean("cudaMemcpy from pinned memory, non-blocking read");
  expect_clean("cudaMemcpy from pageable memory, event, non-blocking read");
  expect_hazard("non-blocking write, cudaMemcpy to the host unordered", {"cudaMemcpy (device to host)", "fill_kernel"});
  expect_clean("cudaMemcpy to the host waits: then a non-blocking write");
  expect_hazard("cudaMemcpy device to device does not wait: then a non-blocking write unordered",
                {"fill_kernel", "cudaMemcpy (device to device)"});
  expect_hazard("cudaMemcpyAsync to pageable memory, write on another stream unordered",
                {"fill_kernel", "cudaMemcpyAsync"});
  expect_clean("cudaMemcpyAsync, stream synchronize, write on another stream");
  expect_hazard("cudaMemset, non-blocking read unordered", {"copy_kernel", "cudaMemset on the legacy default stream"});
  expect_clean("cudaMemset, device synchronize, non-blocking read");
}

TEST_CASE("stream checker: byte ranges and kernel parameter types", "[simt][streams]") {
  expect_clean("cudaMemsetAsync of two halves on two streams");
  expect_hazard("cudaMemsetAsync of overlapping ranges on two streams unordered",
                {"cudaMemsetAsync", "bytes [124, 252)"});
  expect_hazard("kernel pointer reaches to the end of its allocation, unordered", {"fill_kernel", "cudaMemsetAsync"});
  expect_clean("kernel pointer does not reach before itself");
  expect_clean("two const-pointer readers on two streams");
  expect_hazard("a non-const-pointer reader on another stream unordered", {"sum_mutable_kernel", "copy_kernel"});
}

TEST_CASE("stream checker: cuBLASLt and NCCL calls", "[simt][streams]") {
  expect_hazard("matmul writes D, read on another stream unordered", {"copy_kernel", "cublasLtMatmul"});
  expect_hazard("matmuls sharing the workspace on two streams unordered", {"cublasLtMatmul", "writes"});
  expect_clean("matmuls on two streams ordered by an event");
  expect_hazard("kernel write, all-reduce on another stream unordered", {"ncclAllReduce", "reads", "fill_kernel"});
  expect_hazard("all-reduce, read of its result on another stream unordered", {"copy_kernel", "ncclAllReduce", "wrote"});
  expect_clean("kernel write, event, all-reduce, event, read");
}

TEST_CASE("stream checker: NCCL operations of two communicators", "[simt][streams]") {
  expect_communicator_hazard("all-reduces of two communicators on two streams unordered",
                             {"ncclAllReduce of communicator", "rank 0 of 1", "cudaStreamNonBlocking"});
  expect_clean("all-reduces of two communicators on two streams ordered by an event");
  expect_communicator_hazard("an event recorded before the first all-reduce, then another communicator unordered",
                             {"ncclAllGather", "ncclAllReduce"});
  expect_clean("all-reduces of two communicators, stream synchronize between");
  expect_clean("all-reduces of two communicators in one group");
  expect_communicator_hazard("all-reduces of two communicators in two groups unordered", {"ncclAllReduce"});
  expect_clean("all-reduce of a destroyed communicator, then of another unordered");
}
