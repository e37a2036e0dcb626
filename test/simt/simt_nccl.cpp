// The CPU build's NCCL stand-in (simt/nccl.cpp) in a single process: a one-rank communicator
// needs no MPI, its collectives are the identity (bf16 averages round once, so they too return
// the input), and everything the stand-in does not implement fails with an error status and a
// message instead of computing something else. The real library implements these types and
// ops, so this test exists only in the CPU build; multi-rank semantics are test/mpi/mpi_nccl.cu.
// NCCL's own rules hold too: a non-blocking communicator's first error is sticky, it is finalized
// (and that polled) before it is destroyed, and buffers overlap only in the in-place layouts.
// ncclCommSplit of one rank: a child of one rank or none (NCCL_SPLIT_NOCOLOR), blocking as its
// config says or as its parent is, and a communicator of its own; splits over ranks are
// test/mpi/mpi_comm_split.cu.
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
  CHECK(ncclAllReduce(data.ptr, data.ptr, 8, ncclFloat32, ncclMin, one.comm, nullptr) == ncclInvalidArgument);
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

TEST_CASE("simt NCCL stand-in: ncclCommSplit of one rank", "[nccl]") {
  OneRank one;
  const std::vector<float> values = test::random_floats(11, 7);
  test::DeviceBuffer<float> data(values);
  ncclComm_t child = one.comm;  // the split overwrites it
  CHECK(ncclCommSplit(one.comm, 3, -5, &child, nullptr) == ncclSuccess);
  REQUIRE(child != nullptr);
  REQUIRE(child != one.comm);
  int count = 0, rank = -1;
  CHECK(ncclCommCount(child, &count) == ncclSuccess);
  CHECK(ncclCommUserRank(child, &rank) == ncclSuccess);
  CHECK(count == 1);
  CHECK(rank == 0);
  CHECK(ncclAllReduce(data.ptr, data.ptr, 11, ncclFloat32, ncclSum, child, nullptr) == ncclSuccess);
  CHECK(test::all_close("all-reduce on the child", data.download(), values, 0.0, 0.0));
  // A split of a split.
  ncclComm_t grandchild = nullptr;
  CHECK(ncclCommSplit(child, 0, 0, &grandchild, nullptr) == ncclSuccess);
  REQUIRE(grandchild != nullptr);
  CHECK(ncclAllGather(data.ptr, data.ptr, 11, ncclFloat32, grandchild, nullptr) == ncclSuccess);
  // config NULL: blocking as the parent is, so destroyed without a finalize.
  CHECK(ncclCommDestroy(grandchild) == ncclSuccess);
  CHECK(ncclCommDestroy(child) == ncclSuccess);

  // NCCL_SPLIT_NOCOLOR: no communicator.
  ncclComm_t none = one.comm;
  CHECK(ncclCommSplit(one.comm, NCCL_SPLIT_NOCOLOR, 0, &none, nullptr) == ncclSuccess);
  CHECK(none == nullptr);
  // The parent still works.
  CHECK(ncclAllReduce(data.ptr, data.ptr, 11, ncclFloat32, ncclAvg, one.comm, nullptr) == ncclSuccess);
  CHECK(test::all_close("all-reduce on the parent", data.download(), values, 0.0, 0.0));
}

TEST_CASE("simt NCCL stand-in: a split communicator's blocking mode is its config's, else its parent's",
          "[nccl]") {
  OneRank blocking_parent;
  ncclComm_t non_blocking_parent = non_blocking_one_rank();
  ncclConfig_t non_blocking = NCCL_CONFIG_INITIALIZER;
  non_blocking.blocking = 0;
  ncclConfig_t unset = NCCL_CONFIG_INITIALIZER;  // `blocking` unset: NCCL's default, blocking
  ncclComm_t child = nullptr;
  // A non-blocking child is destroyed only after a polled finalize; a blocking one at once.
  CHECK(ncclCommSplit(blocking_parent.comm, 0, 0, &child, &non_blocking) == ncclSuccess);
  REQUIRE(child != nullptr);
  CHECK(ncclCommDestroy(child) == ncclInvalidUsage);
  CHECK(finalize_and_destroy(child) == ncclSuccess);
  ncclResult_t status = ncclCommSplit(non_blocking_parent, 0, 0, &child, nullptr);
  while (status == ncclInProgress) REQUIRE(ncclCommGetAsyncError(non_blocking_parent, &status) == ncclSuccess);
  REQUIRE(status == ncclSuccess);
  REQUIRE(child != nullptr);
  CHECK(ncclCommDestroy(child) == ncclInvalidUsage);
  CHECK(finalize_and_destroy(child) == ncclSuccess);
  CHECK(ncclCommSplit(non_blocking_parent, 0, 0, &child, &unset) == ncclSuccess);
  REQUIRE(child != nullptr);
  CHECK(ncclCommDestroy(child) == ncclSuccess);
  CHECK(finalize_and_destroy(non_blocking_parent) == ncclSuccess);
}

TEST_CASE("simt NCCL stand-in: a split communicator's errors and abort are its own", "[nccl]") {
  test::DeviceBuffer<float> data(8);
  ncclComm_t parent = non_blocking_one_rank();
  ncclComm_t child = nullptr, sibling = nullptr;
  REQUIRE(ncclCommSplit(parent, 0, 0, &child, nullptr) == ncclSuccess);
  REQUIRE(ncclCommSplit(parent, 0, 0, &sibling, nullptr) == ncclSuccess);
  // Planted: an invalid root poisons the (non-blocking) child, not its parent or sibling.
  CHECK(ncclBroadcast(data.ptr, data.ptr, 8, ncclFloat32, 1, child, nullptr) == ncclInvalidArgument);
  ncclResult_t async_error = ncclSuccess;
  CHECK(ncclCommGetAsyncError(child, &async_error) == ncclSuccess);
  CHECK(async_error == ncclInvalidArgument);
  CHECK(ncclCommGetAsyncError(parent, &async_error) == ncclSuccess);
  CHECK(async_error == ncclSuccess);
  CHECK(ncclAllReduce(data.ptr, data.ptr, 8, ncclFloat32, ncclSum, parent, nullptr) == ncclSuccess);
  CHECK(ncclAllReduce(data.ptr, data.ptr, 8, ncclFloat32, ncclSum, sibling, nullptr) == ncclSuccess);
  // Its abort ends it alone.
  CHECK(ncclCommAbort(child) == ncclSuccess);
  CHECK(ncclAllReduce(data.ptr, data.ptr, 8, ncclFloat32, ncclSum, child, nullptr) == ncclInvalidArgument);
  CHECK(ncclAllReduce(data.ptr, data.ptr, 8, ncclFloat32, ncclSum, parent, nullptr) == ncclSuccess);
  // The parent destroyed first, the sibling still works (the stand-in has no order; comm.h keeps
  // children first).
  CHECK(finalize_and_destroy(parent) == ncclSuccess);
  CHECK(ncclAllReduce(data.ptr, data.ptr, 8, ncclFloat32, ncclSum, sibling, nullptr) == ncclSuccess);
  CHECK(finalize_and_destroy(sibling) == ncclSuccess);
}

TEST_CASE("simt NCCL stand-in: ncclCommSplit refuses what NCCL or the stand-in does not take", "[nccl]") {
  OneRank one;
  ncclComm_t child = nullptr;
  CHECK(ncclCommSplit(nullptr, 0, 0, &child, nullptr) == ncclInvalidArgument);
  CHECK(ncclCommSplit(one.comm, 0, 0, nullptr, nullptr) == ncclInvalidArgument);
  CHECK(std::string(ncclGetLastError(nullptr)).find("newcomm") != std::string::npos);
  CHECK(ncclCommSplit(one.comm, -2, 0, &child, nullptr) == ncclInvalidArgument);
  CHECK(std::string(ncclGetLastError(nullptr)).find("color -2") != std::string::npos);
  CHECK(child == nullptr);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.splitShare = 1;
  CHECK(ncclCommSplit(one.comm, 0, 0, &child, &config) == ncclInvalidArgument);
  CHECK(std::string(ncclGetLastError(nullptr)).find("ncclCommSplit: the CPU stand-in implements only the config's "
                                                    "`blocking`") != std::string::npos);
  config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 3;
  CHECK(ncclCommSplit(one.comm, 0, 0, &child, &config) == ncclInvalidArgument);
  REQUIRE(ncclGroupStart() == ncclSuccess);
  CHECK(ncclCommSplit(one.comm, 0, 0, &child, nullptr) == ncclInvalidUsage);
  CHECK(std::string(ncclGetLastError(nullptr)).find("ncclGroupStart") != std::string::npos);
  REQUIRE(ncclGroupEnd() == ncclSuccess);
  CHECK(child == nullptr);
  // A blocking parent carries on after a refused split.
  test::DeviceBuffer<float> data(4);
  CHECK(ncclAllReduce(data.ptr, data.ptr, 4, ncclFloat32, ncclSum, one.comm, nullptr) == ncclSuccess);
  // Nothing is split from a finalized communicator.
  ncclComm_t finalized = non_blocking_one_rank();
  ncclResult_t status = ncclCommFinalize(finalized);
  while (status == ncclInProgress) REQUIRE(ncclCommGetAsyncError(finalized, &status) == ncclSuccess);
  CHECK(ncclCommSplit(finalized, 0, 0, &child, nullptr) == ncclInvalidUsage);
  CHECK(child == nullptr);
  CHECK(ncclCommAbort(finalized) == ncclSuccess);
}
