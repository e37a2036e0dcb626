// Point-to-point transfers: src/dist/comm.h's send, recv and exchange, and the nccl calls under
// them (ncclSend / ncclRecv: the CPU build's MPI stand-in simt/nccl.cpp, or NCCL on GPUs). Runs
// under mpirun with 2 ranks or more (test/checks/distributed_p2p.sh: 2 and 3); with one rank the
// cases have no peer and pass empty. Named mpi_* so the single-process test runner does not pick
// it up. The hidden case "[.hazard]" is the stream checker's planted violation, run on its own by
// the check script (it ends the processes).
#include "test/raw_nccl.h"
#include "test/test_util.h"
#include "src/dist/comm.h"

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

namespace {

// A transfer that deadlocks ends the run through the watchdog within a minute.
Communicator& comm() {
  static Communicator instance{CommOptions{"", 60.0}};
  return instance;
}
int me() { return comm().rank(); }
int ranks() { return comm().world_size(); }

// Rank r's message number m, element i: every rank can compute what any other sent.
float value(int rank, int message, size_t i) {
  return static_cast<float>((rank + 1) * 1000 + message * 100) + static_cast<float>(i % 89) * 0.375f;
}
template <typename T> std::vector<T> message(int rank, int m, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = value(rank, m, i);
  return test::from_floats<T>(v);
}


}  // namespace

// Named (not in an anonymous namespace) so that the stream checker's report names the kernel.
namespace p2p_probe {
__global__ void fill_kernel(float* out, float x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) out[i] = x;
}
}  // namespace p2p_probe

TEMPLATE_TEST_CASE("send and recv move exact values between two ranks, both ways", "[p2p]", float, bf16) {
  if (ranks() < 2) return;
  const int last = ranks() - 1;
  for (size_t n : {size_t(1), size_t(7), size_t(1003)}) {
    INFO("n " << n);
    test::DeviceBuffer<TestType> data(n);
    if (me() == 0) {
      data.upload(message<TestType>(0, 1, n));
      comm().wait_for(cudaStreamLegacy);
      comm().send(data.ptr, n, last);
      comm().recv(data.ptr, n, last);  // the same buffer back, once the send has completed
      CHECK(test::same_bits(data.download(), message<TestType>(last, 2, n)));
    } else if (me() == last) {
      comm().wait_for(cudaStreamLegacy);
      comm().recv(data.ptr, n, 0);
      CHECK(test::same_bits(data.download(), message<TestType>(0, 1, n)));
      data.upload(message<TestType>(last, 2, n));
      comm().wait_for(cudaStreamLegacy);
      comm().send(data.ptr, n, 0);
    }
    CUDA_CHECK(cudaStreamSynchronize(comm().stream()));
  }
  comm().barrier();
}

// Every rank sends to the next and receives from the previous at once: with sends that complete
// only when their receive is posted (NCCL's), one call after the other would deadlock; one group
// completes.
TEST_CASE("a ring exchange in one group completes on every rank", "[p2p]") {
  if (ranks() < 2) return;
  const int next = (me() + 1) % ranks(), previous = (me() + ranks() - 1) % ranks();
  const size_t n = 517;
  test::DeviceBuffer<float> out(message<float>(me(), 3, n)), in(n);
  comm().wait_for(cudaStreamLegacy);
  comm().exchange<float>({{out.ptr, nullptr, n, next}, {nullptr, in.ptr, n, previous}});
  CHECK(test::same_bits(in.download(), message<float>(previous, 3, n)));
  comm().barrier();
}

// The stand-in's rendezvous: a send that no receive has matched stays in progress, so the ring
// above needs its group (a stand-in that let small sends complete alone would hide such deadlocks).
TEST_CASE("ncclSend completes only once the peer's receive is posted", "[p2p]") {
  if (ranks() < 2) return;
  ncclComm_t c = test::non_blocking_comm(me(), ranks());
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  test::DeviceBuffer<float> data(message<float>(me(), 4, 16));
  ncclResult_t status = ncclSuccess;
  if (me() == 0) {
    status = ncclSend(data.ptr, 16, ncclFloat32, 1, c, stream);
    for (int poll = 0; poll < 10 && status == ncclInProgress; ++poll) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      REQUIRE(ncclCommGetAsyncError(c, &status) == ncclSuccess);
    }
    CHECK(status == ncclInProgress);
  }
  MPI_Barrier(MPI_COMM_WORLD);  // rank 1 posts its receive only now
  if (me() == 1) status = ncclRecv(data.ptr, 16, ncclFloat32, 0, c, stream);
  CHECK(test::settle(c, status) == ncclSuccess);
  if (me() == 1) CHECK(test::same_bits(data.download(), message<float>(0, 4, 16)));
  CHECK(test::settle(c, ncclCommFinalize(c)) == ncclSuccess);
  CHECK(ncclCommDestroy(c) == ncclSuccess);
  CUDA_CHECK(cudaStreamDestroy(stream));
}

// One side's transfers in one group, the other's one call each (and both one call each): a group
// that posted its transfers in another order than called would pair message m with another one.
TEST_CASE("messages between two ranks arrive in the order they were sent", "[p2p]") {
  if (ranks() < 2) return;
  constexpr int kMessages = 4;
  const size_t n = 33;
  std::vector<test::DeviceBuffer<float>> buffers;
  for (int m = 0; m < kMessages; ++m) buffers.emplace_back(me() == 0 ? message<float>(0, m, n) : std::vector<float>(n));
  comm().wait_for(cudaStreamLegacy);
  for (const int grouped_rank : {-1, 0, 1}) {
    INFO("grouped on rank " << grouped_rank << " (-1: neither)");
    std::vector<Transfer<float>> transfers;
    for (int m = 0; m < kMessages; ++m) {
      if (me() == 0) transfers.push_back({buffers[m].ptr, nullptr, n, 1});
      if (me() == 1) transfers.push_back({nullptr, buffers[m].ptr, n, 0});
    }
    if (me() == grouped_rank) comm().exchange(transfers);
    else
      for (const Transfer<float>& t : transfers) comm().exchange<float>({t});
    if (me() == 1)
      for (int m = 0; m < kMessages; ++m) {
        INFO("message " << m);
        CHECK(test::same_bits(buffers[m].download(), message<float>(0, m, n)));
        buffers[m].poison();
        comm().wait_for(cudaStreamLegacy);
      }
  }
  comm().barrier();
}

// A receive of another size than its send fails (NCCL leaves it undefined; MPI would truncate).
TEST_CASE("a receive of another size than its send is an error, not a truncation", "[p2p]") {
  if (ranks() < 2) return;
  for (const size_t received : {size_t(4), size_t(6)}) {
    INFO("5 elements sent, " << received << " received");
    ncclComm_t c = test::non_blocking_comm(me(), ranks());
    test::DeviceBuffer<float> data(message<float>(me(), 5, 6));
    ncclResult_t status = ncclSuccess;
    if (me() == 0) status = test::settle(c, ncclSend(data.ptr, 5, ncclFloat32, 1, c, cudaStreamLegacy));
    if (me() == 1) {
      status = test::settle(c, ncclRecv(data.ptr, received, ncclFloat32, 0, c, cudaStreamLegacy));
      CHECK(status == ncclInvalidUsage);
      CHECK_THAT(ncclGetLastError(c), Catch::Contains("same count and type"));
    } else {
      CHECK(status == ncclSuccess);
    }
    CHECK(ncclCommAbort(c) == ncclSuccess);  // the failed communicator cannot finalize
    MPI_Barrier(MPI_COMM_WORLD);
  }
}

TEST_CASE("transfers to no rank or to oneself are refused", "[p2p]") {
  test::DeviceBuffer<float> data(8);
  comm().set_purpose("activations", "at step 3");
  CHECK_THROWS_AS(comm().send(data.ptr, 8, ranks()), CommArgumentError);
  CHECK_THROWS_WITH(comm().recv(data.ptr, 8, -1),
                    Catch::Contains("receive of activations: peer -1 is not a rank of " + std::to_string(ranks())));
  CHECK_THROWS_WITH(comm().send(data.ptr, 8, me()), Catch::Contains("send of activations: peer " +
                                                                     std::to_string(me()) + " is this rank"));
  if (ranks() >= 2) {
    const int other = 1 - std::min(me(), 1);
    CHECK_THROWS_WITH(comm().send(static_cast<float*>(nullptr), 8, other), Catch::Contains("null buffer"));
    CHECK_THROWS_WITH(comm().exchange<float>({{data.ptr, data.ptr, 8, other}}),
                      Catch::Contains("both a send and a receive buffer"));
    // The stand-in refuses what NCCL would (own rank: NCCL allows it in a group; the stand-in
    // does not), poisoning the non-blocking communicator as NCCL's enqueue does.
    ncclComm_t c = test::non_blocking_comm(me(), ranks());
    CHECK(ncclSend(data.ptr, 8, ncclFloat32, me(), c, cudaStreamLegacy) == ncclInvalidArgument);
    CHECK_THAT(ncclGetLastError(c), Catch::Contains("is this rank"));
    CHECK(ncclCommAbort(c) == ncclSuccess);
    c = test::non_blocking_comm(me(), ranks());
    CHECK(ncclRecv(data.ptr, 8, ncclFloat32, ranks(), c, cudaStreamLegacy) == ncclInvalidArgument);
    CHECK_THAT(ncclGetLastError(c), Catch::Contains("peer " + std::to_string(ranks()) + " is not a rank"));
    CHECK(ncclCommAbort(c) == ncclSuccess);
  }
  comm().set_purpose("values", "during start-up");
  comm().barrier();  // still usable, the ranks still in step
}

TEST_CASE("sends and receives are counted with their bytes", "[p2p]") {
  if (ranks() < 2) return;
  const int next = (me() + 1) % ranks(), previous = (me() + ranks() - 1) % ranks();
  test::DeviceBuffer<bf16> out(message<bf16>(me(), 6, 10)), in(10);
  comm().wait_for(cudaStreamLegacy);
  comm().counts() = {};
  comm().exchange<bf16>({{out.ptr, nullptr, 10, next}, {nullptr, in.ptr, 10, previous}});
  if (me() == 0) comm().send(out.ptr, 3, 1);
  if (me() == 1) comm().recv(in.ptr, 3, 0);
  const CollectiveCounts counts = comm().counts();
  CHECK(counts.send == 1 + (me() == 0));
  CHECK(counts.recv == 1 + (me() == 1));
  CHECK(counts.send_bytes == 20 + (me() == 0 ? 6 : 0));
  CHECK(counts.recv_bytes == 20 + (me() == 1 ? 6 : 0));
  CHECK(counts.all_reduce == 0);
  CUDA_CHECK(cudaStreamSynchronize(comm().stream()));
  comm().barrier();
}

// A kernel on another stream fills the send buffer, ordered before the transfer by wait_for: the
// hazard case below without its violation (it runs clean) and the values arrive.
TEST_CASE("a kernel writing a send buffer ordered before the send", "[p2p]") {
  if (ranks() < 2) return;
  cudaStream_t other = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  test::DeviceBuffer<float> out(64), in(64);
  CUDA_CHECK(cudaDeviceSynchronize());
  launch(p2p_probe::fill_kernel, 1, 64, 0, other, out.ptr, static_cast<float>(me() + 1), 64);
  comm().wait_for(other);
  const int previous = (me() + ranks() - 1) % ranks();
  comm().exchange<float>({{out.ptr, nullptr, 64, (me() + 1) % ranks()}, {nullptr, in.ptr, 64, previous}});
  CHECK(test::same_bits(in.download(), std::vector<float>(64, static_cast<float>(previous + 1))));
  CUDA_CHECK(cudaStreamDestroy(other));
  comm().barrier();
}

// The stream checker's planted violation (CPU build; run alone by test/checks/distributed_p2p.sh,
// which expects a "simt: stream hazard:" line naming the kernel and ncclSend): a kernel on another
// stream writes the send buffer with nothing ordering it before the send.
TEST_CASE("a kernel writing a send buffer unordered with the send", "[.hazard]") {
  cudaStream_t other = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  test::DeviceBuffer<float> out(64), in(64);
  CUDA_CHECK(cudaDeviceSynchronize());  // their poisoning is ordered before everything next
  launch(p2p_probe::fill_kernel, 1, 64, 0, other, out.ptr, 1.0f, 64);
  comm().exchange<float>({{out.ptr, nullptr, 64, (me() + 1) % ranks()},
                          {nullptr, in.ptr, 64, (me() + ranks() - 1) % ranks()}});
  CUDA_CHECK(cudaDeviceSynchronize());
}
