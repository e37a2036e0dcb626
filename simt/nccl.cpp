// nccl.cpp — the NCCL library on the CPU, at its API: the toolkit's own declarations (nccl.h),
// answered with MPI on host memory. Device pointers are host pointers (simt's cudaMalloc) and
// simt's streams are synchronous, so an operation's data is in place once its call has completed
// (blocking communicator) or once ncclCommGetAsyncError stopped reporting ncclInProgress
// (non-blocking communicator): the stand-in's "enqueue" is the whole collective.
//
// Communicators: ncclCommInitRank / ncclCommInitRankConfig(nranks, id, rank, config) with
// nranks == 1 needs no MPI at all (a single process without mpirun); nranks > 1 needs MPI
// initialized by the caller with MPI_Init_thread at MPI_THREAD_SERIALIZED or above (the stand-in
// calls MPI from whichever thread calls into it, e.g. a watchdog thread polling
// ncclCommGetAsyncError), an MPI world of exactly nranks processes and rank == the MPI world rank
// (launch with mpirun; the stand-in has no transport of its own), and every rank passing the same
// unique id. The config may set `blocking` (0 or 1; default 1) and nothing else.
// ncclCommSplit(comm, color, key, newcomm, config) (nccl.h): collective over the parent's ranks;
//   those passing the same color form a new communicator, ranked by key, ties by their rank in
//   the parent (MPI_Comm_split's order); NCCL_SPLIT_NOCOLOR leaves *newcomm NULL (any other
//   negative color is refused). The split is an operation queued on the parent like a collective
//   (in call order with the parent's other operations, as in NCCL: NVIDIA/nccl#1472): a blocking
//   parent returns once it completed; a non-blocking parent returns ncclInProgress and, as real
//   NCCL does, fills *newcomm (NULL until then; the pointer must stay valid) when
//   ncclCommGetAsyncError on the parent reports ncclSuccess. The child is blocking as its config
//   says (as for ncclCommInitRankConfig), or as the parent is when config is NULL ("inherit the
//   original communicator's configuration"). It is a communicator of its own: its own MPI
//   communicator, on which its collectives run with ranks within it, its own sticky error, abort,
//   finalize and destroy, independent of the parent's (either may be destroyed first). Over more
//   than one rank it needs MPI_THREAD_MULTIPLE (MPI_Comm_split runs on a helper thread, so that
//   the call does not block on the peers); inside ncclGroupStart/End it is refused.
//
// Blocking and non-blocking, as NCCL documents them: every operation (the set-up included) is a
// chain of non-blocking MPI calls, run one operation at a time in call order (the same order on
// every rank), advanced by each call into the communicator. A blocking communicator's calls
// return when their operation has completed (waiting with short sleeps, never spinning a core).
// A non-blocking communicator's calls return ncclInProgress while their operation is still
// running; ncclCommGetAsyncError then advances it and reports ncclInProgress until it completes
// (ncclSuccess) or fails (the error). Issuing another call on the communicator before that is
// refused with ncclInvalidUsage, as NCCL requires. A peer that stops participating therefore
// leaves the operation in progress instead of blocking the caller, and ncclCommAbort (from any
// thread) ends the communicator: later calls on it fail, and a blocking call waiting on it
// returns ncclInvalidUsage. An aborted communicator's memory (and the buffers MPI may still
// write into) is never freed, so a thread still holding the handle reads an invalid communicator
// rather than freed memory; its MPI communicator is left to the end of the process.
// MPI errors are returned (MPI_ERRORS_RETURN) as ncclSystemError with MPI's text.
//
// Collectives (ncclAllReduce, ncclReduceScatter, ncclReduce, ncclAllGather, ncclBroadcast):
//   data types ncclFloat32, ncclBfloat16, ncclFloat64; reduction ops ncclSum, ncclAvg and ncclMax;
//   in-place variants as nccl.h documents them.
//   Reductions are deterministic and identical on every rank: the contributions of all ranks are
//   added in rank order (0, 1, ..., R-1) in fp32 (fp64 for ncclFloat64), ncclAvg then divides
//   that sum by R, and the result is rounded once to the data type (bf16: to nearest even); ncclMax
//   takes the largest contribution (exact).
//   Real NCCL's order depends on its algorithm (ring/tree), so GPU results may differ from these
//   in the last bits; they do not differ between ranks on either.
// Buffers (NCCL user guide, "In-place Operations"): all-reduce, broadcast and reduce are in place
//   when sendbuff == recvbuff; reduce-scatter when recvbuff == sendbuff + rank·recvcount; all-gather
//   when sendbuff == recvbuff + rank·sendcount. Any other overlap of the two ranges is refused
//   (ncclInvalidArgument), as is a NULL buffer with a non-zero count.
// Point-to-point (ncclSend, ncclRecv): count elements of the data types above to / from rank peer
//   of the communicator; an operation of the communicator like a collective (in call order with
//   its others, blocking or not as the communicator is, sticky errors, abort). As nccl.h says, each
//   is blocking until its peer takes part: a send completes only once the peer's matching receive
//   has been posted (MPI_Issend, synchronous mode, so the stand-in is never more lenient than
//   NCCL's rendezvous), and transfers that must progress together go in one ncclGroupStart/End.
//   A group's sends and receives on a communicator are one operation, queued where the first of
//   them was called and started at the outermost ncclGroupEnd: all posted at once, complete when
//   all have (so two ranks that each send to and receive from the other in one group, or a ring,
//   do not deadlock). Messages between two ranks match in call order (one MPI tag). A receive of
//   another size than the send it matches fails its communicator with ncclInvalidUsage (MPI
//   would truncate or leave bytes unwritten; the sending side, whose transfer completed, sees no
//   error). Refused (ncclInvalidArgument): a peer that is not a rank of the communicator, the
//   caller's own rank (NCCL allows that inside a group; the stand-in does not implement it), a
//   NULL buffer with a non-zero count. For the stream checker a send reads its buffer and a
//   receive writes its buffer on the call's stream.
// Errors of a non-blocking communicator are sticky, as in NCCL's enqueue path (ncclEnqueueCheck
//   stores a failed call's status with ncclCommSetAsyncError): once any call on it has failed, for
//   whatever reason, ncclCommGetAsyncError and every later call on it report that error; only
//   ncclCommAbort remains.
// Teardown (nccl.h, ncclCommFinalize: "the state will change to ncclSuccess when the communicator
//   is globally quiescent ... then, calling ncclCommDestroy can locally free the rest"):
//   ncclCommFinalize queues a barrier of all ranks after the issued operations; a non-blocking
//   communicator returns ncclInProgress until ncclCommGetAsyncError reports its end.
//   ncclCommDestroy of a non-blocking communicator is refused (ncclInvalidUsage) unless finalize
//   was called and polled to ncclSuccess; a blocking one is finalized by the destroy itself.
//   No operation may be issued after ncclCommFinalize.
// Groups (ncclGroupStart/End, per thread) nest; the calls inside are queued (and started, except
// point-to-point ones, above) in call order and return ncclSuccess; the outermost ncclGroupEnd
// completes them (blocking) or returns ncclInProgress while any of them runs (non-blocking).
// Stream order: each collective, send and receive is an operation of its stream for the checker
//   (streams.h: its buffers, and its order against the other live communicators' operations, with
//   the number of the outermost group it was issued in); communicators are tracked from their
//   creation (ncclCommInitRank*, ncclCommSplit) to ncclCommDestroy or ncclCommAbort.
// Limits: one message per peer is at most INT_MAX bytes (MPI counts are int).
// Anything else — other types, ops, devices, config fields — returns ncclInvalidArgument or
// ncclInvalidUsage with a message for ncclGetLastError; nothing is ignored.
#include <nccl.h>
// The C API only: OpenMPI's deprecated C++ bindings do not compile warning-free.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include "streams.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

// One step of an operation: the local work that follows the previous step's MPI call (whose data
// has arrived), then at most one non-blocking MPI call, whose request it stores.
using Step = std::function<ncclResult_t(MPI_Request*)>;

// The point-to-point transfers of one operation: one ncclSend or ncclRecv outside a group, or all
// of a group's on one communicator. They are posted together when the operation starts and it
// completes once all have, so that a group's sends and receives progress together.
struct Transfers {
  struct Transfer {
    bool send;
    void* buffer;
    size_t bytes;
    int peer;
  };
  std::vector<Transfer> list;
  std::vector<MPI_Request> requests;  // posted, not yet all completed
  std::vector<MPI_Status> statuses;
  bool open = false;  // its group has not ended: more may join, and it does not start yet
};

struct Operation {
  std::string name;  // "ncclAllReduce", for error messages
  std::vector<Step> steps;
  size_t next = 0;  // the step to run once `request` (and the transfers' requests) have completed
  MPI_Request request = MPI_REQUEST_NULL;
  std::shared_ptr<Transfers> transfers;  // a point-to-point operation's
};

}  // namespace

struct ncclComm {
  uint64_t magic;
  MPI_Comm mpi = MPI_COMM_NULL;  // MPI_COMM_NULL for a one-rank communicator
  int rank = 0, nranks = 1;
  bool blocking = true;
  std::mutex mutex;                  // the operations below, shared by every thread that calls in
  std::deque<Operation> operations;  // in call order; the front one runs
  ncclResult_t error = ncclSuccess;  // the first failure of an operation (sticky)
  std::string error_text;
  bool awaiting = false;  // a call returned ncclInProgress and ncclCommGetAsyncError has not reported its end
  bool finalize_called = false, finalized = false;  // ncclCommFinalize issued / completed
};

namespace {

constexpr uint64_t kCommMagic = 0x73696d744e63636cull;     // "simtNccl"
constexpr uint64_t kAbortedMagic = 0x61626f7274656421ull;  // "aborted!"
constexpr char kIdTag[] = "simt-nccl-id";

thread_local std::string last_error;
thread_local int group_depth = 0;
thread_local unsigned long long current_group = 0;  // the outermost open group's number
std::atomic<unsigned long long> groups_started{0};
thread_local std::vector<ncclComm*> group_comms;  // communicators the current group issued on
// The current group's point-to-point operation on each communicator it sent or received on.
thread_local std::vector<std::pair<ncclComm*, std::shared_ptr<Transfers>>> group_transfers;

ncclResult_t fail(ncclResult_t status, const std::string& message) {
  last_error = message;
  return status;
}

bool valid(const ncclComm* comm) { return comm != nullptr && comm->magic == kCommMagic; }

// The stream-ordering checker (simt/streams.h) watches `comm` from now on; `origin` says how it
// was made.
void track(const ncclComm* comm, const std::string& origin) {
  char address[32];
  std::snprintf(address, sizeof address, "%p", static_cast<const void*>(comm));
  simt::track_communicator(comm, std::string("communicator ") + address + " (rank " + std::to_string(comm->rank) +
                                     " of " + std::to_string(comm->nranks) + ", " + origin + ")");
}

// An operation on `stream`, as the stream-ordering checker sees it: its device-memory accesses,
// and its order against the other communicators' operations.
void on_stream(const ncclComm* comm, cudaStream_t stream, const char* what,
               std::initializer_list<simt::MemoryAccess> accesses) {
  simt::nccl_operation(stream, what, comm, group_depth > 0 ? current_group : 0, accesses);
}

// With comm->mutex held: the communicator's sticky error is this thread's last failure.
ncclResult_t record_failure(ncclComm* comm, ncclResult_t status) {
  comm->error = status;
  comm->error_text = last_error;
  comm->operations.clear();  // their MPI calls completed or never started
  return status;
}

// A failed call on a communicator: on a non-blocking one the failure also becomes its sticky
// asynchronous error (the first one is kept).
ncclResult_t refuse(ncclComm* comm, ncclResult_t status, const std::string& message) {
  fail(status, message);
  if (valid(comm) && !comm->blocking) {
    std::lock_guard<std::mutex> lock(comm->mutex);
    if (comm->error == ncclSuccess) record_failure(comm, status);
  }
  return status;
}

// Bytes per element, 0 for a type the stand-in does not implement.
size_t element_bytes(ncclDataType_t type) {
  switch (type) {
    case ncclFloat32: return 4;
    case ncclBfloat16: return 2;
    case ncclFloat64: return 8;
    default: return 0;
  }
}

// `messages`: how many count-element messages one MPI call carries at most (a collective's: one
// per rank).
ncclResult_t check_call(const char* what, ncclComm* comm, ncclDataType_t type, size_t count, const ncclRedOp_t* op,
                        size_t messages = 0) {
  if (!valid(comm)) return fail(ncclInvalidArgument, std::string(what) + ": invalid communicator");
  if (element_bytes(type) == 0)
    return refuse(comm, ncclInvalidArgument, std::string(what) + ": data type " + std::to_string(static_cast<int>(type)) +
                                                 " is not implemented by the CPU stand-in (ncclFloat32, ncclBfloat16, ncclFloat64)");
  if (op != nullptr && *op != ncclSum && *op != ncclAvg && *op != ncclMax)
    return refuse(comm, ncclInvalidArgument, std::string(what) + ": reduction op " + std::to_string(static_cast<int>(*op)) +
                                                 " is not implemented by the CPU stand-in (ncclSum, ncclAvg, ncclMax)");
  if (messages == 0) messages = static_cast<size_t>(comm->nranks);
  if (count * element_bytes(type) * messages > static_cast<size_t>(INT_MAX))
    return refuse(comm, ncclInvalidArgument, std::string(what) + ": " + std::to_string(count) +
                                                 " elements exceed the CPU stand-in's MPI message limit (INT_MAX bytes)");
  return ncclSuccess;
}

// The in-place rule of "In-place Operations" (see the file comment): `in_place` is the one overlap
// allowed; any other overlap of [send, send + send_bytes) and [recv, recv + recv_bytes) is refused.
ncclResult_t check_buffers(const char* what, ncclComm* comm, const void* send, size_t send_bytes, const void* recv,
                           size_t recv_bytes, bool in_place, const char* in_place_layout) {
  if ((send_bytes > 0 && send == nullptr) || (recv_bytes > 0 && recv == nullptr))
    return refuse(comm, ncclInvalidArgument, std::string(what) + ": a NULL buffer");
  if (in_place || send_bytes == 0 || recv_bytes == 0) return ncclSuccess;
  const uintptr_t s = reinterpret_cast<uintptr_t>(send), r = reinterpret_cast<uintptr_t>(recv);
  if (s < r + recv_bytes && r < s + send_bytes)
    return refuse(comm, ncclInvalidArgument, std::string(what) + ": the send and receive buffers overlap without being "
                                                 "in place (in place is " + in_place_layout + ")");
  return ncclSuccess;
}

ncclResult_t mpi_status(int err, const std::string& what) {
  if (err == MPI_SUCCESS) return ncclSuccess;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(err, text, &length);
  return fail(ncclSystemError, what + ": MPI error: " + std::string(text, length));
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
      const auto value = [&](int p) { return reinterpret_cast<const double*>(contributions + p * stride)[i]; };
      double acc = op == ncclMax ? value(0) : 0.0;
      for (int p = 0; p < nranks; ++p) acc = op == ncclMax ? std::max(acc, value(p)) : acc + value(p);
      static_cast<double*>(out)[i] = op == ncclAvg ? acc / nranks : acc;
    } else {
      const auto value = [&](int p) { return load_float(contributions + p * stride, i, type); };
      float acc = op == ncclMax ? value(0) : 0.0f;
      for (int p = 0; p < nranks; ++p) acc = op == ncclMax ? std::max(acc, value(p)) : acc + value(p);
      store_float(out, i, type, op == ncclAvg ? acc / static_cast<float>(nranks) : acc);
    }
  }
}

// Rank q's range of a reduction: elements [offsets[q], offsets[q] + counts[q]) of sendbuff. The
// exchange gives each rank every rank's contribution to its own range, in rank order, in
// `gathered` (R * counts[rank] elements); the MPI call's arrays live here until it completes.
struct Exchange {
  std::vector<size_t> offsets, counts;
  std::vector<int> send_counts, send_displs, recv_counts, recv_displs;
  std::vector<char> gathered, reduced;
};

// Starts the exchange of `x`'s ranges (one rank: a copy).
ncclResult_t start_exchange(const void* sendbuff, ncclDataType_t type, const ncclComm* comm, Exchange* x,
                            MPI_Request* request) {
  const size_t es = element_bytes(type);
  const int R = comm->nranks;
  const size_t mine = x->counts[comm->rank];
  x->gathered.resize(mine * es * R);
  if (R == 1) {
    if (mine > 0) std::memcpy(x->gathered.data(), static_cast<const char*>(sendbuff) + x->offsets[0] * es, mine * es);
    return ncclSuccess;
  }
  x->send_counts.resize(R);
  x->send_displs.resize(R);
  x->recv_counts.resize(R);
  x->recv_displs.resize(R);
  for (int q = 0; q < R; ++q) {
    x->send_counts[q] = static_cast<int>(x->counts[q] * es);
    x->send_displs[q] = static_cast<int>(x->offsets[q] * es);
    x->recv_counts[q] = static_cast<int>(mine * es);
    x->recv_displs[q] = static_cast<int>(q * mine * es);
  }
  return mpi_status(MPI_Ialltoallv(sendbuff, x->send_counts.data(), x->send_displs.data(), MPI_BYTE,
                                   x->gathered.data(), x->recv_counts.data(), x->recv_displs.data(), MPI_BYTE,
                                   comm->mpi, request),
                    "collective");
}

// ---- running operations (with comm->mutex held)

// Posts the transfers: synchronous-mode sends (MPI_Issend completes only once the peer's receive
// has matched it, NCCL's rendezvous) and receives, on the communicator's MPI communicator, tag 0,
// so that the messages between two ranks match in call order.
ncclResult_t post_transfers(const ncclComm* comm, Transfers* t, const std::string& name) {
  t->requests.assign(t->list.size(), MPI_REQUEST_NULL);
  t->statuses.resize(t->list.size());
  for (size_t i = 0; i < t->list.size(); ++i) {
    const Transfers::Transfer& x = t->list[i];
    const int bytes = static_cast<int>(x.bytes);
    const int err = x.send ? MPI_Issend(x.buffer, bytes, MPI_BYTE, x.peer, 0, comm->mpi, &t->requests[i])
                           : MPI_Irecv(x.buffer, bytes, MPI_BYTE, x.peer, 0, comm->mpi, &t->requests[i]);
    if (err != MPI_SUCCESS) return mpi_status(err, name);
  }
  return ncclSuccess;
}

// Whether the posted transfers have all completed (*done); a receive whose message had another
// size than it expected fails the operation (MPI would truncate a longer one).
ncclResult_t test_transfers(Transfers* t, const std::string& name, bool* done) {
  int all = 0;
  const int err = MPI_Testall(static_cast<int>(t->requests.size()), t->requests.data(), &all, t->statuses.data());
  *done = all != 0;
  // The statuses are set once all completed, or when one failed (MPI_ERR_IN_STATUS).
  for (size_t i = 0; (*done || err == MPI_ERR_IN_STATUS) && i < t->list.size(); ++i) {
    const Transfers::Transfer& x = t->list[i];
    const int error = err == MPI_ERR_IN_STATUS ? t->statuses[i].MPI_ERROR : MPI_SUCCESS;
    int error_class = MPI_SUCCESS, got = 0;
    MPI_Error_class(error, &error_class);
    if (!x.send && error == MPI_SUCCESS) MPI_Get_count(&t->statuses[i], MPI_BYTE, &got);
    if (!x.send && (error_class == MPI_ERR_TRUNCATE || (error == MPI_SUCCESS && static_cast<size_t>(got) != x.bytes)))
      return fail(ncclInvalidUsage, name + ": ncclRecv of " + std::to_string(x.bytes) + " bytes from rank " +
                                        std::to_string(x.peer) + " matched an ncclSend of " +
                                        (error == MPI_SUCCESS ? std::to_string(got) : std::string("more")) +
                                        " bytes (a send and its receive must have the same count and type)");
    if (error != MPI_SUCCESS && error_class != MPI_ERR_PENDING) return mpi_status(error, name);
  }
  if (err != MPI_SUCCESS && err != MPI_ERR_IN_STATUS) return mpi_status(err, name);
  if (*done) t->requests.clear();
  return ncclSuccess;
}

// Runs the operations as far as their MPI calls have completed: ncclSuccess when all are done,
// ncclInProgress while one runs, or the communicator's error.
ncclResult_t advance(ncclComm* comm) {
  while (comm->error == ncclSuccess && !comm->operations.empty()) {
    Operation& op = comm->operations.front();
    if (op.transfers != nullptr && op.transfers->open) return ncclInProgress;  // its group has not ended
    if (op.request != MPI_REQUEST_NULL) {
      int done = 0;
      const ncclResult_t status = mpi_status(MPI_Test(&op.request, &done, MPI_STATUS_IGNORE), op.name);
      if (status != ncclSuccess) return record_failure(comm, status);
      if (!done) return ncclInProgress;
    }
    if (op.transfers != nullptr && !op.transfers->requests.empty()) {
      bool done = false;
      const ncclResult_t status = test_transfers(op.transfers.get(), op.name, &done);
      if (status != ncclSuccess) return record_failure(comm, status);
      if (!done) return ncclInProgress;
    }
    if (op.next == op.steps.size()) {
      comm->operations.pop_front();
      continue;
    }
    const ncclResult_t status = op.steps[op.next++](&op.request);
    if (status != ncclSuccess) return record_failure(comm, status);
  }
  return comm->error;
}

// Until the operations have completed or failed (or the communicator was aborted), with sleeps
// that grow to a millisecond: a waiting rank costs no core.
ncclResult_t wait_for_operations(ncclComm* comm, const char* what) {
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(comm->mutex);
      if (comm->magic != kCommMagic) return fail(ncclInvalidUsage, std::string(what) + ": the communicator was aborted");
      const ncclResult_t status = advance(comm);
      if (status != ncclInProgress) return status;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

// Queues an operation; outside a group it then completes (blocking) or has started (non-blocking:
// ncclInProgress while it runs).
ncclResult_t issue(ncclComm* comm, Operation op) {
  {
    std::lock_guard<std::mutex> lock(comm->mutex);
    if (comm->error != ncclSuccess)
      return fail(comm->error, op.name + ": the communicator failed earlier: " + comm->error_text);
    std::string misuse;
    if (comm->awaiting)
      misuse = op.name + ": issued while the communicator's previous operation is in progress "
                         "(poll ncclCommGetAsyncError until it is not ncclInProgress first)";
    else if (comm->finalize_called)
      misuse = op.name + ": issued after ncclCommFinalize";
    if (!misuse.empty()) {
      fail(ncclInvalidUsage, misuse);
      return comm->blocking ? ncclInvalidUsage : record_failure(comm, ncclInvalidUsage);
    }
    comm->operations.push_back(std::move(op));
    if (group_depth > 0) {
      if (std::find(group_comms.begin(), group_comms.end(), comm) == group_comms.end()) group_comms.push_back(comm);
      const ncclResult_t status = advance(comm);
      return status == ncclInProgress ? ncclSuccess : status;
    }
    if (!comm->blocking) {
      const ncclResult_t status = advance(comm);
      comm->awaiting = status == ncclInProgress;
      return status;
    }
  }
  return wait_for_operations(comm, "collective");
}

// `what` ("ncclCommInitRankConfig") names the call in the messages; a NULL config leaves *blocking.
ncclResult_t check_config(const char* what_call, const ncclConfig_t* config, bool* blocking) {
  if (config == nullptr) return ncclSuccess;
  *blocking = true;
  const std::string what = std::string(what_call) + ": ";
  if (config->magic != 0xcafebeef || config->size != sizeof(ncclConfig_t))
    return fail(ncclInvalidArgument, what + "the config was not initialized with NCCL_CONFIG_INITIALIZER");
  if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1)
    return fail(ncclInvalidArgument, what + "blocking = " + std::to_string(config->blocking) + ": expected 0 or 1");
  if (config->blocking == 0) *blocking = false;
  const int ints[] = {config->cgaClusterSize, config->minCTAs,      config->maxCTAs,   config->splitShare,
                      config->trafficClass,   config->collnetEnable, config->CTAPolicy, config->shrinkShare,
                      config->nvlsCTAs,       config->nChannelsPerNetPeer, config->nvlinkCentricSched};
  const bool others_set = config->netName != NCCL_CONFIG_UNDEF_PTR || config->commName != NCCL_CONFIG_UNDEF_PTR ||
                          std::any_of(std::begin(ints), std::end(ints), [](int v) { return v != NCCL_CONFIG_UNDEF_INT; });
  if (others_set)
    return fail(ncclInvalidArgument, what + "the CPU stand-in implements only the config's `blocking` field");
  return ncclSuccess;
}

// The steps of a multi-rank set-up: every rank must hold rank 0's id (so a broken id exchange
// fails instead of silently pairing wrong processes), then the communicator's own MPI
// communicator is duplicated from the world.
struct SetUp {
  ncclUniqueId root_id;
  int same = 0, all_same = 0;
};

Operation set_up_operation(ncclComm* comm, const ncclUniqueId& id) {
  auto s = std::make_shared<SetUp>();
  s->root_id = id;
  Operation op;
  op.name = "ncclCommInitRank";
  op.steps.push_back([s](MPI_Request* request) {
    return mpi_status(MPI_Ibcast(s->root_id.internal, NCCL_UNIQUE_ID_BYTES, MPI_BYTE, 0, MPI_COMM_WORLD, request),
                      "ncclCommInitRank");
  });
  op.steps.push_back([s, id](MPI_Request* request) {
    s->same = std::memcmp(s->root_id.internal, id.internal, NCCL_UNIQUE_ID_BYTES) == 0;
    return mpi_status(MPI_Iallreduce(&s->same, &s->all_same, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, request),
                      "ncclCommInitRank");
  });
  op.steps.push_back([s, comm](MPI_Request* request) {
    if (!s->all_same) return fail(ncclInvalidUsage, "ncclCommInitRank: the ranks were given different unique ids");
    return mpi_status(MPI_Comm_idup(MPI_COMM_WORLD, &comm->mpi, request), "ncclCommInitRank");
  });
  op.steps.push_back([comm](MPI_Request*) {
    return mpi_status(MPI_Comm_set_errhandler(comm->mpi, MPI_ERRORS_RETURN), "ncclCommInitRank");
  });
  return op;
}

// ncclCommSplit over more than one rank: MPI_Comm_split is MPI's split with NCCL's semantics
// (ranks by key, ties by parent rank; MPI_UNDEFINED for NCCL_SPLIT_NOCOLOR), but it blocks until
// every rank of the parent has called it. It therefore runs on a helper thread of its own, which
// then completes an MPI generalized request: the parent's operation waits on that request like
// on any other MPI call, so the caller never blocks on a peer (and an abort leaves the thread,
// like the communicator's memory, to the end of the process).
struct Split {
  int color = 0, key = 0;
  std::mutex mutex;  // what the helper thread hands over
  MPI_Comm mpi = MPI_COMM_NULL;
  int error = MPI_SUCCESS;
};

int split_request_query(void*, MPI_Status* status) {
  MPI_Status_set_elements(status, MPI_BYTE, 0);
  MPI_Status_set_cancelled(status, 0);
  status->MPI_SOURCE = MPI_UNDEFINED;
  status->MPI_TAG = MPI_UNDEFINED;
  return MPI_SUCCESS;
}
int split_request_free(void*) { return MPI_SUCCESS; }
int split_request_cancel(void*, int) { return MPI_SUCCESS; }

// The split's steps on `parent`: (more than one rank) the helper thread's MPI_Comm_split, then
// the child, if this rank has a color, in *newcomm.
Operation split_operation(ncclComm* parent, int color, int key, ncclComm_t* newcomm, bool blocking) {
  auto s = std::make_shared<Split>();
  s->color = color;
  s->key = key;
  Operation op;
  op.name = "ncclCommSplit";
  if (parent->nranks > 1)
    op.steps.push_back([s, parent](MPI_Request* request) {
      const ncclResult_t status = mpi_status(
          MPI_Grequest_start(split_request_query, split_request_free, split_request_cancel, nullptr, request),
          "ncclCommSplit");
      if (status != ncclSuccess) return status;
      std::thread([s, mpi = parent->mpi, done = *request]() mutable {
        MPI_Comm child = MPI_COMM_NULL;
        const int error = MPI_Comm_split(mpi, s->color == NCCL_SPLIT_NOCOLOR ? MPI_UNDEFINED : s->color, s->key, &child);
        {
          std::lock_guard<std::mutex> lock(s->mutex);
          s->mpi = child;
          s->error = error;
        }
        MPI_Grequest_complete(done);
      }).detach();
      return ncclSuccess;
    });
  op.steps.push_back([s, parent, newcomm, blocking](MPI_Request*) {
    MPI_Comm mpi = MPI_COMM_NULL;
    if (parent->nranks > 1) {
      std::lock_guard<std::mutex> lock(s->mutex);
      const ncclResult_t status = mpi_status(s->error, "ncclCommSplit");
      if (status != ncclSuccess) return status;
      mpi = s->mpi;
    }
    if (s->color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
    if (mpi != MPI_COMM_NULL) {
      const ncclResult_t status = mpi_status(MPI_Comm_set_errhandler(mpi, MPI_ERRORS_RETURN), "ncclCommSplit");
      if (status != ncclSuccess) return status;
    }
    ncclComm* child = new ncclComm;
    child->magic = kCommMagic;
    child->blocking = blocking;
    if (mpi != MPI_COMM_NULL) {
      child->mpi = mpi;
      MPI_Comm_rank(mpi, &child->rank);
      MPI_Comm_size(mpi, &child->nranks);
    }
    track(child, "split with color " + std::to_string(s->color));
    *newcomm = child;
    return ncclSuccess;
  });
  return op;
}

// ncclSend / ncclRecv (see the file comment): the transfer joins the current group's
// point-to-point operation on `comm` (the group's first one queues it), or outside a group is an
// operation of its own.
ncclResult_t point_to_point(const char* what, bool send, void* buffer, size_t count, ncclDataType_t type, int peer,
                            ncclComm* comm, cudaStream_t stream) {
  ncclResult_t status = check_call(what, comm, type, count, nullptr, 1);
  if (status != ncclSuccess) return status;
  const std::string call = std::string(what) + ": peer " + std::to_string(peer);
  if (peer < 0 || peer >= comm->nranks)
    return refuse(comm, ncclInvalidArgument, call + " is not a rank of " + std::to_string(comm->nranks));
  if (peer == comm->rank)
    return refuse(comm, ncclInvalidArgument, call + " is this rank: the CPU stand-in does not implement "
                                                    "transfers to or from the calling rank itself");
  const size_t bytes = count * element_bytes(type);
  if (bytes > 0 && buffer == nullptr) return refuse(comm, ncclInvalidArgument, std::string(what) + ": a NULL buffer");
  on_stream(comm, stream, what, {{buffer, bytes, !send}});
  const Transfers::Transfer transfer{send, buffer, bytes, peer};
  if (group_depth > 0)
    for (auto& [c, t] : group_transfers)
      if (c == comm) {
        std::lock_guard<std::mutex> lock(comm->mutex);
        if (comm->error != ncclSuccess)
          return fail(comm->error, std::string(what) + ": the communicator failed earlier: " + comm->error_text);
        t->list.push_back(transfer);
        return ncclSuccess;
      }
  auto t = std::make_shared<Transfers>();
  t->list.push_back(transfer);
  t->open = group_depth > 0;
  Operation op;
  op.name = group_depth > 0 ? "ncclSend/ncclRecv group" : what;
  op.transfers = t;
  op.steps.push_back([comm, t, name = op.name](MPI_Request*) { return post_transfers(comm, t.get(), name); });
  status = issue(comm, std::move(op));
  if (group_depth > 0 && status == ncclSuccess) group_transfers.emplace_back(comm, t);
  return status;
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

// A communicator's failed operation, else this thread's last failed call.
const char* ncclGetLastError(ncclComm_t comm) {
  if (valid(comm) && comm->error != ncclSuccess) return comm->error_text.c_str();
  return last_error.c_str();
}

ncclResult_t ncclGetVersion(int* version) {
  if (version == nullptr) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

// The id carries a tag and this process's random bytes; the set-up checks that every rank got
// the same id.
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

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank, ncclConfig_t* config) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
  if (nranks < 1 || rank < 0 || rank >= nranks)
    return fail(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " is not in [0, " +
                                         std::to_string(nranks) + ")");
  if (std::memcmp(commId.internal, kIdTag, sizeof(kIdTag)) != 0)
    return fail(ncclInvalidArgument, "ncclCommInitRank: the unique id did not come from ncclGetUniqueId");
  bool blocking = true;
  ncclResult_t status = check_config("ncclCommInitRankConfig", config, &blocking);
  if (status != ncclSuccess) return status;
  if (nranks > 1) {
    int initialized = 0, world_size = 0, world_rank = 0, thread_level = 0;
    MPI_Initialized(&initialized);
    if (!initialized)
      return fail(ncclInvalidUsage, "ncclCommInitRank: the CPU NCCL stand-in runs over MPI and needs MPI initialized "
                                    "for " + std::to_string(nranks) + " ranks (launch multi-rank CPU runs with mpirun)");
    MPI_Query_thread(&thread_level);
    if (thread_level < MPI_THREAD_SERIALIZED)
      return fail(ncclInvalidUsage, "ncclCommInitRank: the CPU NCCL stand-in calls MPI from whichever thread calls "
                                    "into it: initialize MPI with MPI_Init_thread at MPI_THREAD_SERIALIZED or above");
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    if (world_size != nranks || world_rank != rank)
      return fail(ncclInvalidUsage, "ncclCommInitRank: the CPU NCCL stand-in needs the MPI world to be the "
                                    "communicator: MPI world rank " + std::to_string(world_rank) + " of " +
                                    std::to_string(world_size) + ", asked for rank " + std::to_string(rank) + " of " +
                                    std::to_string(nranks) + " (launch with mpirun -np " + std::to_string(nranks) + ")");
  }
  ncclComm* c = new ncclComm;
  c->magic = kCommMagic;
  c->rank = rank;
  c->nranks = nranks;
  c->blocking = blocking;
  track(c, "made by ncclCommInitRank");
  *comm = c;
  if (nranks == 1) return ncclSuccess;
  // Issued outside any group of the caller's: the set-up is not one of its collectives.
  const int depth = group_depth;
  group_depth = 0;
  status = issue(c, set_up_operation(c, commId));
  group_depth = depth;
  return status;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return ncclCommInitRankConfig(comm, nranks, commId, rank, nullptr);
}

// Queued on the parent like a collective (see the file comment): *newcomm is NULL until the
// operation completes, then the child (NULL for NCCL_SPLIT_NOCOLOR).
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config) {
  if (!valid(comm)) return fail(ncclInvalidArgument, "ncclCommSplit: invalid communicator");
  if (newcomm == nullptr) return refuse(comm, ncclInvalidArgument, "ncclCommSplit: newcomm is NULL");
  *newcomm = nullptr;
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR)
    return refuse(comm, ncclInvalidArgument, "ncclCommSplit: color " + std::to_string(color) +
                                                 " is neither a color (0 or above) nor NCCL_SPLIT_NOCOLOR");
  if (group_depth > 0)
    return refuse(comm, ncclInvalidUsage, "ncclCommSplit: the CPU stand-in does not implement a split inside "
                                          "ncclGroupStart/ncclGroupEnd");
  bool blocking = comm->blocking;  // a NULL config: the parent's
  ncclResult_t status = check_config("ncclCommSplit", config, &blocking);
  if (status != ncclSuccess) return refuse(comm, status, last_error);
  if (comm->nranks > 1) {
    int thread_level = 0;
    MPI_Query_thread(&thread_level);
    if (thread_level < MPI_THREAD_MULTIPLE)
      return refuse(comm, ncclInvalidUsage, "ncclCommSplit: the CPU NCCL stand-in splits on a thread of its own: "
                                            "initialize MPI with MPI_Init_thread at MPI_THREAD_MULTIPLE");
  }
  return issue(comm, split_operation(comm, color, key, newcomm, blocking));
}

// Queues the barrier after the issued operations (see the file comment); on a non-blocking
// communicator, ncclInProgress until ncclCommGetAsyncError reports its end.
ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (!valid(comm)) return fail(ncclInvalidArgument, "ncclCommFinalize: invalid communicator");
  Operation op;
  op.name = "ncclCommFinalize";
  if (comm->nranks > 1)
    op.steps.push_back([comm](MPI_Request* request) {
      return mpi_status(MPI_Ibarrier(comm->mpi, request), "ncclCommFinalize");
    });
  op.steps.push_back([comm](MPI_Request*) {
    comm->finalized = true;
    return ncclSuccess;
  });
  const int depth = group_depth;  // not part of a caller's group
  group_depth = 0;
  const ncclResult_t status = issue(comm, std::move(op));
  group_depth = depth;
  if (status == ncclSuccess || status == ncclInProgress) {
    std::lock_guard<std::mutex> lock(comm->mutex);
    comm->finalize_called = true;
  }
  return status;
}

// A blocking communicator: waits for the operations still queued. A non-blocking one must have
// been finalized, and that polled to its end, first.
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!valid(comm)) return fail(ncclInvalidArgument, "ncclCommDestroy: invalid communicator");
  if (!comm->blocking) {
    std::lock_guard<std::mutex> lock(comm->mutex);
    if (!comm->finalized || comm->awaiting)
      return fail(ncclInvalidUsage, "ncclCommDestroy: a non-blocking communicator is destroyed only after "
                                    "ncclCommFinalize, polled with ncclCommGetAsyncError until ncclSuccess "
                                    "(after an error: ncclCommAbort)");
  }
  wait_for_operations(comm, "ncclCommDestroy");
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm->mpi != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm->mpi);
  simt::untrack_communicator(comm);
  comm->magic = 0;
  delete comm;
  return ncclSuccess;
}

// Ends the communicator at once, from any thread, whatever it is doing (see the file comment for
// what is kept).
ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!valid(comm)) return fail(ncclInvalidArgument, "ncclCommAbort: invalid communicator");
  std::lock_guard<std::mutex> lock(comm->mutex);
  simt::untrack_communicator(comm);
  comm->magic = kAbortedMagic;
  return ncclSuccess;
}

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

// Advances the communicator's operations: ncclInProgress while one runs, ncclSuccess once all
// completed, or the error of the one that failed.
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!valid(comm) || asyncError == nullptr) return fail(ncclInvalidArgument, "ncclCommGetAsyncError: invalid argument");
  std::lock_guard<std::mutex> lock(comm->mutex);
  *asyncError = advance(comm);
  if (*asyncError != ncclInProgress) comm->awaiting = false;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  if (group_depth++ == 0) current_group = ++groups_started;
  return ncclSuccess;
}

// The outermost end completes the group's operations on blocking communicators and reports
// ncclInProgress while any runs on a non-blocking one (poll each with ncclCommGetAsyncError).
ncclResult_t ncclGroupEnd() {
  if (group_depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd: no matching ncclGroupStart");
  if (--group_depth > 0) return ncclSuccess;
  for (auto& [comm, transfers] : group_transfers) {  // their point-to-point operations may start now
    std::lock_guard<std::mutex> lock(comm->mutex);
    transfers->open = false;
  }
  group_transfers.clear();
  std::vector<ncclComm*> comms;
  comms.swap(group_comms);
  ncclResult_t result = ncclSuccess;
  for (ncclComm* comm : comms) {
    ncclResult_t status;
    if (comm->blocking) {
      status = wait_for_operations(comm, "ncclGroupEnd");
    } else {
      std::lock_guard<std::mutex> lock(comm->mutex);
      if (comm->magic != kCommMagic) return fail(ncclInvalidUsage, "ncclGroupEnd: the communicator was aborted");
      status = advance(comm);
      comm->awaiting = status == ncclInProgress;
    }
    if (status != ncclSuccess && status != ncclInProgress) return status;
    if (status == ncclInProgress) result = ncclInProgress;
  }
  return result;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  ncclResult_t status = check_call("ncclAllReduce", comm, datatype, count, &op);
  if (status != ncclSuccess) return status;
  const int R = comm->nranks, rank = comm->rank;
  const size_t es = element_bytes(datatype), chunk = (count + R - 1) / R;
  status = check_buffers("ncclAllReduce", comm, sendbuff, count * es, recvbuff, count * es, sendbuff == recvbuff,
                         "sendbuff == recvbuff");
  if (status != ncclSuccess) return status;
  auto x = std::make_shared<Exchange>();
  x->offsets.resize(R);
  x->counts.resize(R);
  for (int q = 0; q < R; ++q) {
    x->offsets[q] = std::min(count, q * chunk);
    x->counts[q] = std::min(count, x->offsets[q] + chunk) - x->offsets[q];
  }
  Operation o;
  o.name = "ncclAllReduce";
  on_stream(comm, stream, "ncclAllReduce", {{sendbuff, count * es, false}, {recvbuff, count * es, true}});
  o.steps.push_back([=](MPI_Request* request) { return start_exchange(sendbuff, datatype, comm, x.get(), request); });
  o.steps.push_back([=](MPI_Request* request) {
    x->reduced.resize(x->counts[rank] * es);
    reduce_in_rank_order(x->reduced.data(), x->gathered.data(), x->counts[rank], R, datatype, op);
    if (R == 1) {
      if (count > 0) std::memcpy(recvbuff, x->reduced.data(), x->reduced.size());
      return ncclSuccess;
    }
    for (int q = 0; q < R; ++q) {
      x->recv_counts[q] = static_cast<int>(x->counts[q] * es);
      x->recv_displs[q] = static_cast<int>(x->offsets[q] * es);
    }
    return mpi_status(MPI_Iallgatherv(x->reduced.data(), static_cast<int>(x->reduced.size()), MPI_BYTE, recvbuff,
                                      x->recv_counts.data(), x->recv_displs.data(), MPI_BYTE, comm->mpi, request),
                      "ncclAllReduce");
  });
  return issue(comm, std::move(o));
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  ncclResult_t status = check_call("ncclReduceScatter", comm, datatype, recvcount, &op);
  if (status != ncclSuccess) return status;
  const int R = comm->nranks;
  const size_t bytes = recvcount * element_bytes(datatype);
  status = check_buffers("ncclReduceScatter", comm, sendbuff, bytes * R, recvbuff, bytes,
                         recvbuff == static_cast<const char*>(sendbuff) + comm->rank * bytes,
                         "recvbuff == sendbuff + rank * recvcount");
  if (status != ncclSuccess) return status;
  auto x = std::make_shared<Exchange>();
  x->counts.assign(R, recvcount);
  x->offsets.resize(R);
  for (int q = 0; q < R; ++q) x->offsets[q] = q * recvcount;
  Operation o;
  o.name = "ncclReduceScatter";
  on_stream(comm, stream, "ncclReduceScatter", {{sendbuff, bytes * R, false}, {recvbuff, bytes, true}});
  o.steps.push_back([=](MPI_Request* request) { return start_exchange(sendbuff, datatype, comm, x.get(), request); });
  o.steps.push_back([=](MPI_Request*) {
    reduce_in_rank_order(recvbuff, x->gathered.data(), recvcount, R, datatype, op);
    return ncclSuccess;
  });
  return issue(comm, std::move(o));
}

ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  ncclResult_t status = check_call("ncclReduce", comm, datatype, count, &op);
  if (status != ncclSuccess) return status;
  if (root < 0 || root >= comm->nranks)
    return refuse(comm, ncclInvalidArgument, "ncclReduce: root " + std::to_string(root) + " is not a rank");
  // recvbuff is used on the root only.
  const size_t bytes = count * element_bytes(datatype);
  status = check_buffers("ncclReduce", comm, sendbuff, bytes, recvbuff, comm->rank == root ? bytes : 0,
                         sendbuff == recvbuff, "sendbuff == recvbuff");
  if (status != ncclSuccess) return status;
  const int R = comm->nranks;
  auto x = std::make_shared<Exchange>();
  x->offsets.assign(R, 0);
  x->counts.assign(R, 0);
  x->counts[root] = count;
  Operation o;
  o.name = "ncclReduce";
  on_stream(comm, stream, "ncclReduce",
                         {{sendbuff, bytes, false}, {recvbuff, comm->rank == root ? bytes : 0, true}});
  o.steps.push_back([=](MPI_Request* request) { return start_exchange(sendbuff, datatype, comm, x.get(), request); });
  o.steps.push_back([=](MPI_Request*) {
    if (comm->rank == root) reduce_in_rank_order(recvbuff, x->gathered.data(), count, R, datatype, op);
    return ncclSuccess;
  });
  return issue(comm, std::move(o));
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  ncclResult_t status = check_call("ncclAllGather", comm, datatype, sendcount, nullptr);
  if (status != ncclSuccess) return status;
  const size_t bytes = sendcount * element_bytes(datatype);
  char* own = static_cast<char*>(recvbuff) + comm->rank * bytes;
  status = check_buffers("ncclAllGather", comm, sendbuff, bytes, recvbuff, bytes * comm->nranks, sendbuff == own,
                         "sendbuff == recvbuff + rank * sendcount");
  if (status != ncclSuccess) return status;
  Operation o;
  o.name = "ncclAllGather";
  on_stream(comm, stream, "ncclAllGather", {{sendbuff, bytes, false}, {recvbuff, bytes * comm->nranks, true}});
  o.steps.push_back([=](MPI_Request* request) {
    if (comm->nranks == 1) {
      if (own != sendbuff && bytes > 0) std::memmove(own, sendbuff, bytes);
      return ncclSuccess;
    }
    const bool in_place = own == sendbuff;
    return mpi_status(MPI_Iallgather(in_place ? MPI_IN_PLACE : sendbuff, static_cast<int>(bytes), MPI_BYTE, recvbuff,
                                     static_cast<int>(bytes), MPI_BYTE, comm->mpi, request),
                      "ncclAllGather");
  });
  return issue(comm, std::move(o));
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
  ncclResult_t status = check_call("ncclBroadcast", comm, datatype, count, nullptr);
  if (status != ncclSuccess) return status;
  if (root < 0 || root >= comm->nranks)
    return refuse(comm, ncclInvalidArgument, "ncclBroadcast: root " + std::to_string(root) + " is not a rank");
  // sendbuff is used on the root only.
  const size_t bytes = count * element_bytes(datatype);
  status = check_buffers("ncclBroadcast", comm, sendbuff, comm->rank == root ? bytes : 0, recvbuff, bytes,
                         sendbuff == recvbuff, "sendbuff == recvbuff");
  if (status != ncclSuccess) return status;
  Operation o;
  o.name = "ncclBroadcast";
  on_stream(comm, stream, "ncclBroadcast",
                         {{sendbuff, comm->rank == root ? bytes : 0, false}, {recvbuff, bytes, true}});
  o.steps.push_back([=](MPI_Request* request) {
    if (comm->rank == root && sendbuff != recvbuff && bytes > 0) std::memmove(recvbuff, sendbuff, bytes);
    if (comm->nranks == 1) return ncclSuccess;
    return mpi_status(MPI_Ibcast(recvbuff, static_cast<int>(bytes), MPI_BYTE, root, comm->mpi, request),
                      "ncclBroadcast");
  });
  return issue(comm, std::move(o));
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return point_to_point("ncclSend", true, const_cast<void*>(sendbuff), count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return point_to_point("ncclRecv", false, recvbuff, count, datatype, peer, comm, stream);
}

}  // extern "C"
