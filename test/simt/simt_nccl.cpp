// The CPU build's NCCL stand-in (simt/nccl.cpp) in a single process: a one-rank communicator
// needs no MPI, its collectives are the identity (bf16 averages round once, so they too return
// the input), and everything the stand-in does not implement fails with an error status and a
// message instead of computing something else. The real library implements these types and
// ops, so this test exists only in the CPU build; multi-rank semantics are test/mpi/mpi_nccl.cu.
// NCCL's own rules hold too: a non-blocking communicator's first error is sticky, it is finalized
// (and that polled) before it is destroyed, and buffers overlap only in the in-place layouts.
#include "test/test_util.h"

#include <nccl.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

struct OneRank {
  ncclComm_t comm = nullptr;
  OneRank() {
    ncclUniqueId id;
    REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
    REQUIRE(ncclCommInitRank(&comm, 1, id, 0) == ncclSuccess);
  }
  ~OneRank() { ncclCommDestroy(comm); }
};

}  // namespace

TEST_CASE("simt NCCL stand-in: one rank without MPI", "[nccl]") {
  OneRank one;
  int count = 0, rank = -1;
  CHECK(ncclCommCount(one.comm, &count) == ncclSuccess);
  CHECK(ncclCommUserRank(one.comm, &rank) == ncclSuccess);
  CHECK(count == 1);
  CHECK(rank == 0);

  const std::vector<float> values = test::round_to<bf16>(test::random_floats(37, 3));
  test::DeviceBuffer<bf16> data(test::from_floats<bf16>(values)), out(37);
  CHECK(ncclAllReduce(data.ptr, out.ptr, 37, ncclBfloat16, ncclAvg, one.comm, nullptr) == ncclSuccess);
  CHECK(test::all_close("all-reduce of one rank", test::to_floats(out.download()), values, 0.0, 0.0));
  out.poison();
  CHECK(ncclReduceScatter(data.ptr, out.ptr, 37, ncclBfloat16, ncclSum, one.comm, nullptr) == ncclSuccess);
  CHECK(test::all_close("reduce-scatter of one rank", test::to_floats(out.download()), values, 0.0, 0.0));
  out.poison();
  CHECK(ncclAllGather(data.ptr, out.ptr, 37, ncclBfloat16, one.comm, nullptr) == ncclSuccess);
  CHECK(test::all_close("all-gather of one rank", test::to_floats(out.download()), values, 0.0, 0.0));
}

TEST_CASE("simt NCCL stand-in refuses what it does not implement", "[nccl]") {
  OneRank one;
  test::DeviceBuffer<float> data(8);
  CHECK(ncclAllReduce(data.ptr, data.ptr, 8, ncclInt8, ncclSum, one.comm, nullptr) == ncclInvalidArgument);
  CHECK(std::string(ncclGetLastError(one.comm)).find("data type") != std::string::npos);
  CHECK(ncclAllReduce(data.ptr, data.ptr, 8, ncclFloat16, ncclSum, one.comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclAllReduce(data.ptr, data.ptr, 8, ncclFloat32, ncclProd, one.comm, nullptr) == ncclInvalidArgument);
  CHECK(std::string(ncclGetLastError(one.comm)).find("reduction op") != std::string::npos);
  CHECK(ncclAllReduce(data.ptr, data.ptr, 8, ncclFloat32, ncclMax, one.comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclReduce(data.ptr, data.ptr, 8, ncclFloat32, ncclSum, 1, one.comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclBroadcast(data.ptr, data.ptr, 8, ncclFloat32, -1, one.comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclAllReduce(data.ptr, data.ptr, 8, ncclFloat32, ncclSum, nullptr, nullptr) == ncclInvalidArgument);
  CHECK(ncclGroupEnd() == ncclInvalidUsage);

  ncclComm_t comm = nullptr;
  ncclUniqueId bogus;
  std::memset(bogus.internal, 0, sizeof(bogus.internal));
  CHECK(ncclCommInitRank(&comm, 1, bogus, 0) == ncclInvalidArgument);
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  CHECK(ncclCommInitRank(&comm, 1, id, 1) == ncclInvalidArgument);
  // Two ranks need an MPI world of two (mpirun); this process has not initialized MPI.
  CHECK(ncclCommInitRank(&comm, 2, id, 0) == ncclInvalidUsage);
  CHECK(std::string(ncclGetLastError(nullptr)).find("mpirun") != std::string::npos);
}

TEST_CASE("simt NCCL stand-in: config, non-blocking calls and abort", "[nccl]") {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclComm_t comm = nullptr;
  // Only `blocking` is implemented; a config not made by NCCL_CONFIG_INITIALIZER is refused.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 2;
  CHECK(ncclCommInitRankConfig(&comm, 1, id, 0, &config) == ncclInvalidArgument);
  CHECK(std::string(ncclGetLastError(nullptr)).find("blocking") != std::string::npos);
  config = NCCL_CONFIG_INITIALIZER;
  config.maxCTAs = 4;
  CHECK(ncclCommInitRankConfig(&comm, 1, id, 0, &config) == ncclInvalidArgument);
  CHECK(std::string(ncclGetLastError(nullptr)).find("only the config's `blocking`") != std::string::npos);
  ncclConfig_t uninitialized;
  std::memset(&uninitialized, 0, sizeof uninitialized);
  CHECK(ncclCommInitRankConfig(&comm, 1, id, 0, &uninitialized) == ncclInvalidArgument);

  // One rank: a non-blocking communicator's collectives complete within their calls.
  config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  REQUIRE(ncclCommInitRankConfig(&comm, 1, id, 0, &config) == ncclSuccess);
  const std::vector<float> values = test::random_floats(19, 5);
  test::DeviceBuffer<float> data(values);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  CHECK(ncclAllReduce(data.ptr, data.ptr, 19, ncclFloat32, ncclSum, comm, nullptr) == ncclSuccess);
  CHECK(ncclBroadcast(data.ptr, data.ptr, 19, ncclFloat32, 0, comm, nullptr) == ncclSuccess);
  CHECK(ncclGroupEnd() == ncclSuccess);
  ncclResult_t async_error = ncclInternalError;
  CHECK(ncclCommGetAsyncError(comm, &async_error) == ncclSuccess);
  CHECK(async_error == ncclSuccess);
  CHECK(test::all_close("grouped collectives of one rank", data.download(), values, 0.0, 0.0));

  // After ncclCommAbort the handle is refused, not used.
  CHECK(ncclCommAbort(comm) == ncclSuccess);
  CHECK(ncclAllReduce(data.ptr, data.ptr, 19, ncclFloat32, ncclSum, comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclCommGetAsyncError(comm, &async_error) == ncclInvalidArgument);
  CHECK(ncclCommDestroy(comm) == ncclInvalidArgument);
}

namespace {

// A one-rank non-blocking communicator.
ncclComm_t non_blocking_one_rank() {
  ncclUniqueId id;
  REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  REQUIRE(ncclCommInitRankConfig(&comm, 1, id, 0, &config) == ncclSuccess);
  return comm;
}

// ncclCommFinalize, polled to its end, then ncclCommDestroy: what NCCL requires of a
// non-blocking communicator.
ncclResult_t finalize_and_destroy(ncclComm_t comm) {
  ncclResult_t status = ncclCommFinalize(comm);
  while (status == ncclInProgress)
    if (ncclCommGetAsyncError(comm, &status) != ncclSuccess) return ncclInternalError;
  return status == ncclSuccess ? ncclCommDestroy(comm) : status;
}

}  // namespace

TEST_CASE("simt NCCL stand-in: a failed call poisons a non-blocking communicator, not a blocking one", "[nccl]") {
  test::DeviceBuffer<float> data(8);
  // Planted: an invalid broadcast root on a non-blocking communicator.
  ncclComm_t comm = non_blocking_one_rank();
  CHECK(ncclBroadcast(data.ptr, data.ptr, 8, ncclFloat32, 1, comm, nullptr) == ncclInvalidArgument);
  ncclResult_t async_error = ncclSuccess;
  CHECK(ncclCommGetAsyncError(comm, &async_error) == ncclSuccess);
  CHECK(async_error == ncclInvalidArgument);
  CHECK(ncclAllReduce(data.ptr, data.ptr, 8, ncclFloat32, ncclSum, comm, nullptr) == ncclInvalidArgument);
  CHECK(std::string(ncclGetLastError(comm)).find("root 1") != std::string::npos);
  CHECK(ncclCommFinalize(comm) == ncclInvalidArgument);
  CHECK(ncclCommDestroy(comm) == ncclInvalidUsage);  // after an error only the abort remains
  CHECK(ncclCommAbort(comm) == ncclSuccess);
  // Correct counterpart: valid calls leave it healthy.
  comm = non_blocking_one_rank();
  CHECK(ncclAllReduce(data.ptr, data.ptr, 8, ncclFloat32, ncclSum, comm, nullptr) == ncclSuccess);
  CHECK(ncclCommGetAsyncError(comm, &async_error) == ncclSuccess);
  CHECK(async_error == ncclSuccess);
  CHECK(finalize_and_destroy(comm) == ncclSuccess);
  // A blocking communicator returns the error and carries on.
  OneRank one;
  CHECK(ncclBroadcast(data.ptr, data.ptr, 8, ncclFloat32, 1, one.comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclAllReduce(data.ptr, data.ptr, 8, ncclFloat32, ncclSum, one.comm, nullptr) == ncclSuccess);
}

TEST_CASE("simt NCCL stand-in: a non-blocking communicator is destroyed only after a polled finalize", "[nccl]") {
  test::DeviceBuffer<float> data(8);
  ncclComm_t comm = non_blocking_one_rank();
  CHECK(ncclAllReduce(data.ptr, data.ptr, 8, ncclFloat32, ncclSum, comm, nullptr) == ncclSuccess);
  // Planted: destroy without finalize.
  CHECK(ncclCommDestroy(comm) == ncclInvalidUsage);
  CHECK(std::string(ncclGetLastError(nullptr)).find("ncclCommFinalize") != std::string::npos);
  ncclResult_t status = ncclCommFinalize(comm);
  while (status == ncclInProgress) REQUIRE(ncclCommGetAsyncError(comm, &status) == ncclSuccess);
  CHECK(status == ncclSuccess);
  // Nothing may be issued after the finalize.
  CHECK(ncclAllReduce(data.ptr, data.ptr, 8, ncclFloat32, ncclSum, comm, nullptr) == ncclInvalidUsage);
  CHECK(ncclCommAbort(comm) == ncclSuccess);
  // Correct counterpart.
  CHECK(finalize_and_destroy(non_blocking_one_rank()) == ncclSuccess);
}

TEST_CASE("simt NCCL stand-in: buffers overlap only in NCCL's in-place layouts", "[nccl]") {
  OneRank one;
  test::DeviceBuffer<float> data(16);
  const size_t n = 8;
  // Correct: in place and disjoint.
  CHECK(ncclAllReduce(data.ptr, data.ptr, n, ncclFloat32, ncclSum, one.comm, nullptr) == ncclSuccess);
  CHECK(ncclAllReduce(data.ptr, data.ptr + n, n, ncclFloat32, ncclSum, one.comm, nullptr) == ncclSuccess);
  CHECK(ncclAllGather(data.ptr, data.ptr, n, ncclFloat32, one.comm, nullptr) == ncclSuccess);  // recv + 0·n
  CHECK(ncclReduceScatter(data.ptr, data.ptr, n, ncclFloat32, ncclSum, one.comm, nullptr) == ncclSuccess);
  CHECK(ncclBroadcast(data.ptr + n, data.ptr, n, ncclFloat32, 0, one.comm, nullptr) == ncclSuccess);
  // Planted: partial overlaps.
  CHECK(ncclAllReduce(data.ptr, data.ptr + 1, n, ncclFloat32, ncclSum, one.comm, nullptr) == ncclInvalidArgument);
  CHECK(std::string(ncclGetLastError(one.comm)).find("overlap") != std::string::npos);
  CHECK(ncclAllGather(data.ptr + 1, data.ptr, n, ncclFloat32, one.comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclReduceScatter(data.ptr, data.ptr + 2, n, ncclFloat32, ncclSum, one.comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclBroadcast(data.ptr + 4, data.ptr, n, ncclFloat32, 0, one.comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclReduce(data.ptr, data.ptr + 3, n, ncclFloat32, ncclSum, 0, one.comm, nullptr) == ncclInvalidArgument);
  CHECK(ncclAllReduce(nullptr, data.ptr, n, ncclFloat32, ncclSum, one.comm, nullptr) == ncclInvalidArgument);
}
