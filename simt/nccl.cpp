// nccl.cpp — the NCCL library on the CPU, at its API: the toolkit's own declarations (nccl.h),
// answered with MPI on host memory. Device pointers are host pointers (simt's cudaMalloc) and
// streams are synchronous, so every collective has completed when its call returns.
//
// Communicators: ncclCommInitRank(nranks, id, rank) with nranks == 1 needs no MPI at all (a
// single process without mpirun); nranks > 1 needs MPI initialized by the caller, an MPI world
// of exactly nranks processes and rank == the MPI world rank (launch with mpirun; the stand-in
// has no transport of its own), and every rank passing the same unique id.
//
// Collectives (ncclAllReduce, ncclReduceScatter, ncclReduce, ncclAllGather, ncclBroadcast):
//   data types ncclFloat32, ncclBfloat16, ncclFloat64; reduction ops ncclSum and ncclAvg;
//   in-place variants as nccl.h documents them.
//   Reductions are deterministic and identical on every rank: the contributions of all ranks are
//   added in rank order (0, 1, ..., R-1) in fp32 (fp64 for ncclFloat64), ncclAvg then divides
//   that sum by R, and the result is rounded once to the data type (bf16: to nearest even).
//   Real NCCL's order depends on its algorithm (ring/tree), so GPU results may differ from these
//   in the last bits; they do not differ between ranks on either.
// Groups (ncclGroupStart/End) nest; the calls inside run immediately in call order, which is
// what a group of collectives issued in the same order on every rank computes.
// Limits: one message per peer is at most INT_MAX bytes (MPI counts are int).
// Anything else — other types, ops, devices, configs — returns ncclInvalidArgument or
// ncclInvalidUsage with a message for ncclGetLastError; nothing is ignored.
#include <nccl.h>
// The C API only: OpenMPI's deprecated C++ bindings do not compile warning-free.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

struct ncclComm {
  uint64_t magic;
  MPI_Comm mpi;  // MPI_COMM_NULL for a one-rank communicator
  int rank, nranks;
};

namespace {

constexpr uint64_t kCommMagic = 0x73696d744e63636cull;  // "simtNccl"
constexpr char kIdTag[] = "simt-nccl-id";

thread_local std::string last_error;
int group_depth = 0;

ncclResult_t fail(ncclResult_t status, const std::string& message) {
  last_error = message;
  return status;
}

bool valid(const ncclComm* comm) { return comm != nullptr && comm->magic == kCommMagic; }

// Bytes per element, 0 for a type the stand-in does not implement.
size_t element_bytes(ncclDataType_t type) {
  switch (type) {
    case ncclFloat32: return 4;
    case ncclBfloat16: return 2;
    case ncclFloat64: return 8;
    default: return 0;
  }
}

ncclResult_t check_call(const char* what, const ncclComm* comm, ncclDataType_t type, size_t count,
                        const ncclRedOp_t* op) {
  if (!valid(comm)) return fail(ncclInvalidArgument, std::string(what) + ": invalid communicator");
  if (element_bytes(type) == 0)
    return fail(ncclInvalidArgument, std::string(what) + ": data type " + std::to_string(static_cast<int>(type)) +
                                         " is not implemented by the CPU stand-in (ncclFloat32, ncclBfloat16, ncclFloat64)");
  if (op != nullptr && *op != ncclSum && *op != ncclAvg)
    return fail(ncclInvalidArgument, std::string(what) + ": reduction op " + std::to_string(static_cast<int>(*op)) +
                                         " is not implemented by the CPU stand-in (ncclSum, ncclAvg)");
  if (count * element_bytes(type) * static_cast<size_t>(comm->nranks) > static_cast<size_t>(INT_MAX))
    return fail(ncclInvalidArgument, std::string(what) + ": " + std::to_string(count) +
                                         " elements exceed the CPU stand-in's MPI message limit (INT_MAX bytes)");
  return ncclSuccess;
}

ncclResult_t mpi_status(int err, const char* what) {
  if (err == MPI_SUCCESS) return ncclSuccess;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(err, text, &length);
  return fail(ncclSystemError, std::string(what) + ": MPI error: " + std::string(text, length));
}

float load_float(const void* base, size_t i, ncclDataType_t type) {
  if (type == ncclFloat32) return static_cast<const float*>(base)[i];
  return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
}

void store_float(void* base, size_t i, ncclDataType_t type, float x) {
  if (type == ncclFloat32) static_cast<float*>(base)[i] = x;
  else static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(x);
}

// out[i] = op over ranks p = 0..R-1 (in that order) of contributions[p * count + i].
void reduce_in_rank_order(void* out, const char* contributions, size_t count, int nranks, ncclDataType_t type,
                          ncclRedOp_t op) {
  const size_t stride = count * element_bytes(type);
  for (size_t i = 0; i < count; ++i) {
    if (type == ncclFloat64) {
      double acc = 0.0;
      for (int p = 0; p < nranks; ++p) acc += reinterpret_cast<const double*>(contributions + p * stride)[i];
      static_cast<double*>(out)[i] = op == ncclAvg ? acc / nranks : acc;
    } else {
      float acc = 0.0f;
      for (int p = 0; p < nranks; ++p) acc += load_float(contributions + p * stride, i, type);
      store_float(out, i, type, op == ncclAvg ? acc / static_cast<float>(nranks) : acc);
    }
  }
}

// Every rank q receives the contributions of all ranks to its range [offsets[q], offsets[q] +
// counts[q]) (elements of sendbuff), in rank order, into `gathered` (R * counts[rank] elements).
ncclResult_t exchange_ranges(const void* sendbuff, const std::vector<size_t>& offsets,
                             const std::vector<size_t>& counts, ncclDataType_t type, const ncclComm* comm,
                             std::vector<char>* gathered) {
  const size_t es = element_bytes(type);
  const int R = comm->nranks;
  const size_t mine = counts[comm->rank];
  gathered->resize(mine * es * R);
  if (R == 1) {
    if (mine > 0) std::memcpy(gathered->data(), static_cast<const char*>(sendbuff) + offsets[0] * es, mine * es);
    return ncclSuccess;
  }
  std::vector<int> send_counts(R), send_displs(R), recv_counts(R), recv_displs(R);
  for (int q = 0; q < R; ++q) {
    send_counts[q] = static_cast<int>(counts[q] * es);
    send_displs[q] = static_cast<int>(offsets[q] * es);
    recv_counts[q] = static_cast<int>(mine * es);
    recv_displs[q] = static_cast<int>(q * mine * es);
  }
  return mpi_status(MPI_Alltoallv(sendbuff, send_counts.data(), send_displs.data(), MPI_BYTE, gathered->data(),
                                  recv_counts.data(), recv_displs.data(), MPI_BYTE, comm->mpi),
                    "collective");
}

}  // namespace

extern "C" {

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) { return last_error.c_str(); }

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

// The id carries a tag and this process's random bytes; ncclCommInitRank checks that every rank
// got the same id (so a broken id exchange fails instead of silently pairing wrong processes).
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (uniqueId == nullptr) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  std::memset(uniqueId->internal, 0, NCCL_UNIQUE_ID_BYTES);
  std::memcpy(uniqueId->internal, kIdTag, sizeof(kIdTag));
  uint64_t state = reinterpret_cast<uintptr_t>(uniqueId) ^ static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  for (size_t i = sizeof(kIdTag); i < NCCL_UNIQUE_ID_BYTES; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    uniqueId->internal[i] = static_cast<char>(state >> 56);
  }
  return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " is not in [0, " +
                                         std::to_string(nranks) + ")");
  if (std::memcmp(commId.internal, kIdTag, sizeof(kIdTag)) != 0)
    return fail(ncclInvalidArgument, "ncclCommInitRank: the unique id did not come from ncclGetUniqueId");
  MPI_Comm mpi = MPI_COMM_NULL;
  if (nranks > 1) {
    int initialized = 0, world_size = 0, world_rank = 0;
    MPI_Initialized(&initialized);
    if (!initialized)
      return fail(ncclInvalidUsage, "ncclCommInitRank: the CPU NCCL stand-in runs over MPI and needs MPI initialized "
                                    "for " + std::to_string(nranks) + " ranks (launch multi-rank CPU runs with mpirun)");
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    if (world_size != nranks || world_rank != rank)
      return fail(ncclInvalidUsage, "ncclCommInitRank: the CPU NCCL stand-in needs the MPI world to be the "
                                    "communicator: MPI world rank " + std::to_string(world_rank) + " of " +
                                    std::to_string(world_size) + ", asked for rank " + std::to_string(rank) + " of " +
                                    std::to_string(nranks) + " (launch with mpirun -np " + std::to_string(nranks) + ")");
    ncclUniqueId root_id = commId;
    ncclResult_t status = mpi_status(MPI_Bcast(root_id.internal, NCCL_UNIQUE_ID_BYTES, MPI_BYTE, 0, MPI_COMM_WORLD),
                                     "ncclCommInitRank");
    if (status != ncclSuccess) return status;
    const int same = std::memcmp(root_id.internal, commId.internal, NCCL_UNIQUE_ID_BYTES) == 0;
    int all_same = 0;
    status = mpi_status(MPI_Allreduce(&same, &all_same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "ncclCommInitRank");
    if (status != ncclSuccess) return status;
    if (!all_same)
      return fail(ncclInvalidUsage, "ncclCommInitRank: the ranks were given different unique ids");
    status = mpi_status(MPI_Comm_dup(MPI_COMM_WORLD, &mpi), "ncclCommInitRank");
    if (status != ncclSuccess) return status;
  }
  *comm = new ncclComm{kCommMagic, mpi, rank, nranks};
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!valid(comm)) return fail(ncclInvalidArgument, "ncclCommDestroy: invalid communicator");
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm->mpi != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm->mpi);
  comm->magic = 0;
  delete comm;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) { return ncclCommDestroy(comm); }

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  if (!valid(comm) || count == nullptr) return fail(ncclInvalidArgument, "ncclCommCount: invalid argument");
  *count = comm->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (!valid(comm) || rank == nullptr) return fail(ncclInvalidArgument, "ncclCommUserRank: invalid argument");
  *rank = comm->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!valid(comm) || asyncError == nullptr) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: invalid argument");
  *asyncError = ncclSuccess;  // collectives complete (or fail) synchronously
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd: no matching ncclGroupStart");
  --group_depth;
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
  ncclResult_t status = check_call("ncclAllReduce", comm, datatype, count, &op);
  if (status != ncclSuccess) return status;
  const int R = comm->nranks;
  const size_t es = element_bytes(datatype), chunk = (count + R - 1) / R;
  std::vector<size_t> offsets(R), counts(R);
  for (int q = 0; q < R; ++q) {
    offsets[q] = std::min(count, q * chunk);
    counts[q] = std::min(count, offsets[q] + chunk) - offsets[q];
  }
  std::vector<char> gathered;
  status = exchange_ranges(sendbuff, offsets, counts, datatype, comm, &gathered);
  if (status != ncclSuccess) return status;
  std::vector<char> reduced(counts[comm->rank] * es);
  reduce_in_rank_order(reduced.data(), gathered.data(), counts[comm->rank], R, datatype, op);
  if (R == 1) {
    if (count > 0) std::memcpy(recvbuff, reduced.data(), reduced.size());
    return ncclSuccess;
  }
  std::vector<int> recv_counts(R), recv_displs(R);
  for (int q = 0; q < R; ++q) {
    recv_counts[q] = static_cast<int>(counts[q] * es);
    recv_displs[q] = static_cast<int>(offsets[q] * es);
  }
  return mpi_status(MPI_Allgatherv(reduced.data(), static_cast<int>(reduced.size()), MPI_BYTE, recvbuff,
                                   recv_counts.data(), recv_displs.data(), MPI_BYTE, comm->mpi),
                    "ncclAllReduce");
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t) {
  ncclResult_t status = check_call("ncclReduceScatter", comm, datatype, recvcount, &op);
  if (status != ncclSuccess) return status;
  const int R = comm->nranks;
  std::vector<size_t> offsets(R), counts(R, recvcount);
  for (int q = 0; q < R; ++q) offsets[q] = q * recvcount;
  std::vector<char> gathered;
  status = exchange_ranges(sendbuff, offsets, counts, datatype, comm, &gathered);
  if (status != ncclSuccess) return status;
  reduce_in_rank_order(recvbuff, gathered.data(), recvcount, R, datatype, op);
  return ncclSuccess;
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t) {
  ncclResult_t status = check_call("ncclReduce", comm, datatype, count, &op);
  if (status != ncclSuccess) return status;
  if (root < 0 || root >= comm->nranks)
    return fail(ncclInvalidArgument, "ncclReduce: root " + std::to_string(root) + " is not a rank");
  const int R = comm->nranks;
  std::vector<size_t> offsets(R, 0), counts(R, 0);
  counts[root] = count;
  std::vector<char> gathered;
  status = exchange_ranges(sendbuff, offsets, counts, datatype, comm, &gathered);
  if (status != ncclSuccess) return status;
  if (comm->rank == root) reduce_in_rank_order(recvbuff, gathered.data(), count, R, datatype, op);
  return ncclSuccess;
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t) {
  ncclResult_t status = check_call("ncclAllGather", comm, datatype, sendcount, nullptr);
  if (status != ncclSuccess) return status;
  const size_t bytes = sendcount * element_bytes(datatype);
  char* own = static_cast<char*>(recvbuff) + comm->rank * bytes;
  if (comm->nranks == 1) {
    if (own != sendbuff && bytes > 0) std::memmove(own, sendbuff, bytes);
    return ncclSuccess;
  }
  const bool in_place = own == sendbuff;
  return mpi_status(MPI_Allgather(in_place ? MPI_IN_PLACE : sendbuff, static_cast<int>(bytes), MPI_BYTE, recvbuff,
                                  static_cast<int>(bytes), MPI_BYTE, comm->mpi),
                    "ncclAllGather");
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t) {
  ncclResult_t status = check_call("ncclBroadcast", comm, datatype, count, nullptr);
  if (status != ncclSuccess) return status;
  if (root < 0 || root >= comm->nranks)
    return fail(ncclInvalidArgument, "ncclBroadcast: root " + std::to_string(root) + " is not a rank");
  const size_t bytes = count * element_bytes(datatype);
  if (comm->rank == root && sendbuff != recvbuff && bytes > 0) std::memmove(recvbuff, sendbuff, bytes);
  if (comm->nranks == 1) return ncclSuccess;
  return mpi_status(MPI_Bcast(recvbuff, static_cast<int>(bytes), MPI_BYTE, root, comm->mpi), "ncclBroadcast");
}

}  // extern "C"
