// Collectives of src/dist/comm.h's Communicator (nccl* calls: the CPU build's MPI stand-in
// simt/nccl.cpp, or NCCL on GPUs) against host loops over what every rank contributed.
// Runs under mpirun (test/checks/distributed_nccl.sh: 2 and 4 ranks; 1 on a one-GPU machine);
// it is named mpi_* so the single-process test runner does not pick it up.
//
// Rank r's input element i is a value derived from (r, i), so every rank can compute every
// other rank's contribution and the reference. Sums are compared with a tolerance (NCCL's
// order of additions depends on its algorithm; the stand-in adds in rank order in fp32, which
// the reference also does, so on the CPU they agree exactly), and every rank must hold the
// same bits as rank 0 (checked through MPI).
#include "test/raw_nccl.h"
#include "test/test_util.h"
#include "src/dist/comm.h"

#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace {

Communicator& comm() {
  static Communicator instance{CommOptions{}};
  return instance;
}

// The communicator, its next collective ordered after the legacy stream: test buffers are filled
// there (cudaMemcpy, cudaMemset), which the non-blocking communication stream does not wait for.
Communicator& after_uploads() {
  comm().wait_for(cudaStreamLegacy);
  return comm();
}

float contribution(int rank, size_t i) {
  return static_cast<float>(((rank + 1) * 37 + static_cast<int>(i % 101) * 13) % 97) / 16.0f - 3.0f +
         0.001953125f * static_cast<float>(rank);
}

template <typename T> std::vector<T> inputs_of(int rank, size_t n) {
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) values[i] = contribution(rank, i);
  return test::from_floats<T>(values);
}

// op over ranks of element i, added in rank order in fp32 from the values as stored in T.
template <typename T> float reference(size_t i, ncclRedOp_t op) {
  float acc = 0.0f;
  for (int r = 0; r < comm().world_size(); ++r) acc += test::to_floats<T>(inputs_of<T>(r, i + 1))[i];
  return op == ncclAvg ? acc / static_cast<float>(comm().world_size()) : acc;
}

// Whether every rank holds the same bytes as rank 0.
template <typename T> bool same_on_all_ranks(const std::vector<T>& values) {
  std::vector<T> root = values;
  MPI_Bcast(root.data(), static_cast<int>(root.size() * sizeof(T)), MPI_BYTE, 0, MPI_COMM_WORLD);
  int same = std::memcmp(root.data(), values.data(), values.size() * sizeof(T)) == 0, all = 0;
  MPI_Allreduce(&same, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all == 1;
}


template <typename T> void check_reduced(const std::vector<T>& got, size_t first, ncclRedOp_t op) {
  std::vector<float> want(got.size());
  for (size_t k = 0; k < got.size(); ++k) want[k] = reference<T>(first + k, op);
  CHECK(test::all_close<T>("reduced", test::to_floats<T>(got), test::round_to<T>(want)));
}

}  // namespace

TEST_CASE("the communicator sees the mpirun launch", "[nccl]") {
  REQUIRE(comm().world_size() >= 1);
  CHECK(comm().rank() >= 0);
  CHECK(comm().rank() < comm().world_size());
  int mpi_rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank);
  CHECK(comm().rank() == mpi_rank);
}

TEMPLATE_TEST_CASE("all_reduce sums and averages in place over the ranks", "[nccl]", float, bf16) {
  for (size_t n : {size_t(1), size_t(7), size_t(1003)})
    for (ncclRedOp_t op : {ncclSum, ncclAvg}) {
      INFO("n " << n << " op " << op);
      test::DeviceBuffer<TestType> data(inputs_of<TestType>(comm().rank(), n));
      after_uploads().all_reduce(data.ptr, n, op);
      const std::vector<TestType> got = data.download();
      check_reduced(got, 0, op);
      CHECK(same_on_all_ranks(got));
    }
}

TEMPLATE_TEST_CASE("reduce_scatter leaves block r of the sum on rank r, in and out of place", "[nccl]", float,
                   bf16) {
  const int R = comm().world_size(), rank = comm().rank();
  for (size_t block : {size_t(1), size_t(5), size_t(333)}) {
    INFO("block " << block);
    test::DeviceBuffer<TestType> send(inputs_of<TestType>(rank, block * R));
    test::DeviceBuffer<TestType> recv(block);
    after_uploads().reduce_scatter(send.ptr, recv.ptr, block, ncclAvg);
    check_reduced(recv.download(), rank * block, ncclAvg);
    // In place: the result lands in the rank's own block of the input.
    after_uploads().reduce_scatter(send.ptr, send.ptr + rank * block, block, ncclSum);
    const std::vector<TestType> all = send.download();
    check_reduced(std::vector<TestType>(all.begin() + rank * block, all.begin() + (rank + 1) * block), rank * block,
                  ncclSum);
  }
}

TEMPLATE_TEST_CASE("all_gather concatenates the ranks' blocks, in and out of place", "[nccl]", float, bf16) {
  const int R = comm().world_size(), rank = comm().rank();
  for (size_t block : {size_t(1), size_t(9), size_t(250)}) {
    INFO("block " << block);
    std::vector<TestType> want;
    for (int r = 0; r < R; ++r) {
      const std::vector<TestType> part = inputs_of<TestType>(r, block);
      want.insert(want.end(), part.begin(), part.end());
    }
    test::DeviceBuffer<TestType> send(inputs_of<TestType>(rank, block)), recv(block * R);
    after_uploads().all_gather(send.ptr, recv.ptr, block);
    CHECK(test::all_close<TestType>("out of place", test::to_floats(recv.download()), test::to_floats(want)));
    recv.poison();
    CUDA_CHECK(cudaMemcpy(recv.ptr + rank * block, send.ptr, block * sizeof(TestType), cudaMemcpyDeviceToDevice));
    after_uploads().all_gather(recv.ptr + rank * block, recv.ptr, block);
    CHECK(test::all_close<TestType>("in place", test::to_floats(recv.download()), test::to_floats(want)));
  }
}

TEMPLATE_TEST_CASE("broadcast copies the root's buffer to every rank", "[nccl]", float, bf16) {
  const size_t n = 131;
  for (int root : {0, comm().world_size() - 1}) {
    INFO("root " << root);
    test::DeviceBuffer<TestType> data(inputs_of<TestType>(comm().rank(), n));
    after_uploads().broadcast(data.ptr, n, root);
    CHECK(test::all_close<TestType>("broadcast", test::to_floats(data.download()),
                                    test::to_floats(inputs_of<TestType>(root, n))));
  }
}

TEST_CASE("host sums and the barrier agree", "[nccl]") {
  const int R = comm().world_size();
  CHECK(comm().sum(static_cast<double>(comm().rank()) + 0.5) == R * (R - 1) / 2.0 + 0.5 * R);
  comm().barrier();
}

// A collective that NCCL finishes promptly (here: every rank issues it at once) costs the host its
// polls of ncclCommGetAsyncError and no sleep (comm_watchdog.h, settle): at hundreds of
// tensor-parallel collectives per micro-step, a sleep each adds tens of milliseconds per step. A
// loop that sleeps before it polls again sleeps at least once per call in progress, whatever the
// timing; the settle loop sleeps only for calls still running after its spin, which two ranks on
// two cores rarely leave. (With more ranks than cores, as the 4-rank runs here, a peer is often
// descheduled for milliseconds: then sleeping is right, so those runs are not held to this.)
TEST_CASE("collectives that every rank issues at once cost the host no sleep", "[nccl]") {
  if (comm().world_size() != 2) return;
  constexpr int kCollectives = 200;
  test::DeviceBuffer<float> data(inputs_of<float>(comm().rank(), 16));
  after_uploads();
  comm().barrier();
  comm().settle_counts() = {};
  for (int i = 0; i < kCollectives; ++i) comm().all_reduce(data.ptr, 16, ncclAvg);
  CUDA_CHECK(cudaStreamSynchronize(comm().stream()));
  const SettleCounts counts = comm().settle_counts();
  INFO(counts.in_progress << " of " << kCollectives << " collectives in progress when issued; " << counts.sleeps
                          << " sleeps; " << counts.seconds * 1e6 / kCollectives << " us of host time each");
  CHECK(counts.in_progress <= kCollectives);
  CHECK(counts.sleeps < counts.in_progress);
  comm().barrier();
}

// The Communicator refuses arguments NCCL would refuse before calling NCCL: a refused NCCL call
// would poison the non-blocking communicator (and real NCCL's watchdog would end the run).
TEST_CASE("invalid collective calls are refused before NCCL sees them", "[nccl]") {
  const int R = comm().world_size(), rank = comm().rank();
  test::DeviceBuffer<float> data(4 * R + 1);
  CHECK_THROWS_AS(comm().broadcast(data.ptr, 4, R), CommArgumentError);
  CHECK_THROWS_WITH(comm().broadcast(data.ptr, 4, -1), Catch::Contains("root -1 is not a rank"));
  CHECK_THROWS_WITH(comm().all_reduce(static_cast<float*>(nullptr), 4, ncclSum), Catch::Contains("null buffer"));
  CHECK_THROWS_WITH(comm().all_reduce(data.ptr, 4, static_cast<ncclRedOp_t>(-1)), Catch::Contains("reduction op"));
  // Overlaps that are not NCCL's in-place layouts (the in-place ones are exercised above).
  CHECK_THROWS_WITH(comm().all_gather(data.ptr + rank * 4 + 1, data.ptr, 4), Catch::Contains("overlap"));
  CHECK_THROWS_WITH(comm().reduce_scatter(data.ptr, data.ptr + rank * 4 + 1, 4, ncclSum), Catch::Contains("overlap"));
  comm().barrier();  // the communicator still works and the ranks are still in step
}

TEST_CASE("a non-blocking communicator completes a collective that a late peer joins", "[nccl]") {
  const size_t n = 300;
  ncclComm_t c = test::non_blocking_comm(comm().rank(), comm().world_size());
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  test::DeviceBuffer<float> data(inputs_of<float>(comm().rank(), n));
  if (comm().rank() != 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const ncclResult_t status = ncclAllReduce(data.ptr, data.ptr, n, ncclFloat32, ncclSum, c, stream);
  REQUIRE(test::settle(c, status) == ncclSuccess);
  CUDA_CHECK(cudaStreamSynchronize(stream));
  check_reduced(data.download(), 0, ncclSum);
  // NCCL destroys a non-blocking communicator only after a finalize polled to its end.
  CHECK(test::settle(c, ncclCommFinalize(c)) == ncclSuccess);
  CHECK(ncclCommDestroy(c) == ncclSuccess);
  CUDA_CHECK(cudaStreamDestroy(stream));
}

// What the watchdog (src/dist/comm_watchdog.h) relies on: a collective a peer never joins is seen as
// unfinished (the call still in progress, or an event after it not reached), and ncclCommAbort
// ends it without a hang.
TEST_CASE("a collective a peer never joins stays unfinished until ncclCommAbort ends it", "[nccl]") {
  if (comm().world_size() == 1) return;  // no peer to stay away
  const size_t n = 64;
  ncclComm_t c = test::non_blocking_comm(comm().rank(), comm().world_size());
  cudaStream_t stream = nullptr;
  cudaEvent_t after = nullptr;
  CUDA_CHECK(cudaStreamCreate(&stream));
  CUDA_CHECK(cudaEventCreateWithFlags(&after, cudaEventDisableTiming));
  test::DeviceBuffer<float> data(inputs_of<float>(comm().rank(), n));
  if (comm().rank() == 0) {
    ncclResult_t status = ncclAllReduce(data.ptr, data.ptr, n, ncclFloat32, ncclSum, c, stream);
    bool recorded = false;
    for (int poll = 0; poll < 20; ++poll) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      if (status == ncclInProgress) REQUIRE(ncclCommGetAsyncError(c, &status) == ncclSuccess);
      REQUIRE((status == ncclSuccess || status == ncclInProgress));
      if (status == ncclSuccess && !recorded) {
        CUDA_CHECK(cudaEventRecord(after, stream));
        recorded = true;
      }
      INFO("poll " << poll);
      CHECK((status == ncclInProgress || cudaEventQuery(after) == cudaErrorNotReady));
    }
  }
  CHECK(ncclCommAbort(c) == ncclSuccess);
  cudaStreamSynchronize(stream);  // returns: the abort ended the collective (its status is NCCL's business)
  CUDA_CHECK(cudaEventDestroy(after));
  CUDA_CHECK(cudaStreamDestroy(stream));
  MPI_Barrier(MPI_COMM_WORLD);
}
