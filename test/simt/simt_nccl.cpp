// The CPU build's NCCL stand-in (simt/nccl.cpp) in a single process: a one-rank communicator
// needs no MPI, its collectives are the identity (bf16 averages round once, so they too return
// the input), and everything the stand-in does not implement fails with an error status and a
// message instead of computing something else. The real library implements these types and
// ops, so this test exists only in the CPU build; multi-rank semantics are test/mpi/mpi_nccl.cu.
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
