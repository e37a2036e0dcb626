// raw_nccl.h — for the multi-rank tests that call NCCL directly (test/mpi/): waiting out a
// non-blocking communicator's call, and a non-blocking communicator of their own over the MPI world.
#pragma once
#include "test/test_util.h"

// The C API only: OpenMPI's deprecated C++ bindings do not compile warning-free.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <thread>

namespace test {

// Polls ncclCommGetAsyncError while `status` is ncclInProgress; the final status.
inline ncclResult_t settle(ncclComm_t c, ncclResult_t status) {
  while (status == ncclInProgress) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (ncclCommGetAsyncError(c, &status) != ncclSuccess) return ncclInternalError;
  }
  return status;
}

// A non-blocking NCCL communicator of its own over the MPI world's `ranks` ranks (this one `rank`), set up.
inline ncclComm_t non_blocking_comm(int rank, int ranks) {
  ncclUniqueId id;
  if (rank == 0) REQUIRE(ncclGetUniqueId(&id) == ncclSuccess);
  MPI_Bcast(id.internal, sizeof(id.internal), MPI_BYTE, 0, MPI_COMM_WORLD);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t c = nullptr;
  REQUIRE(settle(c, ncclCommInitRankConfig(&c, ranks, id, rank, &config)) == ncclSuccess);
  return c;
}

}  // namespace test
