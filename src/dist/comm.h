// comm.h — a communicator: which process this is (rank, world size, node-local rank) and NCCL
// collectives and point-to-point transfers (send, recv, exchange: e.g. activations between
// pipeline stages) on device buffers, issued on a dedicated communication stream. The first one spans
// every process of the launch (below); others are split from it (ncclCommSplit), e.g. the
// tensor-parallel and data-parallel groups of a DP × TP grid.
//
// Launch (detected from the environment):
//   mpirun (OpenMPI: OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK): MPI is initialized and, without
//     --rendezvous, rank 0's ncclUniqueId reaches the others by MPI_Bcast.
//   srun --mpi=pmix (SLURM_PROCID/NTASKS/LOCALID and PMIX_RANK): as mpirun, MPI_Init finds the
//     job through PMIx.
//   SLURM srun without MPI (SLURM_PROCID/NTASKS/LOCALID): the id goes through --rendezvous:
//     file:PATH  rank 0 writes PATH (atomically); rank r reads it and writes PATH.rank<r>; rank 0
//                waits for every PATH.rank<r>, then writes PATH.ready, which the others wait for.
//                PATH must be on a filesystem all ranks see and must not exist before the run
//                (rank 0 removes the files at the end of a run).
//     tcp:HOST:PORT  rank 0 listens on PORT; rank r connects to HOST:PORT, sends its rank and
//                world size, and receives the id once every rank has connected.
//   neither: one process, world size 1 (no MPI needed).
// --comm-timeout bounds every wait for the other ranks: each wait of the rendezvous gives up after
// it with an error that names the missing rank(s), so a peer that never starts makes every other
// rank exit instead of hanging; the NCCL communicator is non-blocking and each collective (and its
// set-up) is watched by comm_watchdog.h, which aborts the communicator and ends the process with
// one line naming the rank, the collective and the step when one does not finish within it or
// NCCL reports an error (a peer that died or hangs).
// Each process uses GPU (local rank mod device count).
//
// Arguments are validated before NCCL sees them (null buffers, the in-place layouts NCCL documents,
// the root, the reduction op, a transfer's peer): a bad call throws CommArgumentError naming the collective, and the
// communicator stays usable (a failed NCCL call would poison a non-blocking communicator for good).
// Teardown finalizes the communicator and polls that to its end under the watchdog before
// destroying it, as NCCL requires of a non-blocking communicator.
// Split communicators (Communicator(parent, color, key, name)): the ranks of the parent with the
// same color, ranked by key (ties by rank in the parent). The split is collective over the
// parent's ranks and is one of the parent's operations (issued under its lock and watched by its
// watchdog, as NCCL completes it on the parent). rank() and world_size() are then within the
// group; local_rank() and launcher() are the process's. Each has its own stream, event, counts()
// and watchdog, whose messages name it: "rank 3 (tensor-parallel rank 1 of 2): all-reduce of
// ...". Its destructor finalizes and destroys its own NCCL communicator only (MPI and the
// rendezvous files stay the launch's). Destroy split communicators before the one they were split
// from (a parent destroyed first ends the process with a message): the launch's communicator
// finalizes MPI.
// One order for all communicators of the process: NCCL gives the kernels of two communicators
// that run at once on one GPU no forward-progress guarantee (they may deadlock: NCCL user guide,
// "Using multiple NCCL communicators concurrently"), so a collective issued on one communicator's
// stream after another communicator's runs after the work queued so far on that one's stream
// (an event): the process's collectives run in the order the host issued them, the same on every
// rank, as with NCCL_LAUNCH_ORDER_IMPLICIT (e.g. the data-parallel sum of a gradient bucket and
// the tensor-parallel collectives of the next layer's backward; the world's sums and ZeRO-1's
// parameter gather). Computation still overlaps communication; two communicators' transfers do
// not overlap each other. The CPU build's stream checker fails any pair left unordered.
// A transfer counts as a collective here: watched, in the one order, named by its purpose and
// peer ("send of activations to pipeline rank 2 at step 7").
// Collectives run on stream() (a stream of their own); wait_for(s) orders the communication
// after the work already queued on s, and order_before(s) orders the work queued next on s after
// the communication issued so far. set_purpose(what, when) names what the collectives issued next
// carry, for the watchdog's messages. The CPU build answers the nccl* calls with MPI
// (simt/nccl.cpp); there streams are synchronous and MPI needs mpirun for more than one rank.
#pragma once
#include "kernels/common.cuh"

// The C API only: OpenMPI's deprecated C++ bindings do not compile warning-free.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>

#include "src/base/device.h"
#include "src/dist/comm_watchdog.h"
#include "src/dist/rendezvous.h"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

struct CommOptions {
  std::string rendezvous;          // "", "file:PATH" or "tcp:HOST:PORT"
  double timeout_seconds = 600.0;  // for every wait for the other ranks: the start-up's and each collective's
};

namespace comm_detail {

template <typename T> constexpr ncclDataType_t nccl_type();
template <> constexpr ncclDataType_t nccl_type<float>() { return ncclFloat32; }
template <> constexpr ncclDataType_t nccl_type<bf16>() { return ncclBfloat16; }
template <> constexpr ncclDataType_t nccl_type<double>() { return ncclFloat64; }

}  // namespace comm_detail

// A collective called with arguments NCCL would refuse; thrown before NCCL is called.
struct CommArgumentError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// This rank stops because another rank failed and reports it: that rank's own error ends the job
// (main waits for it), so its message is not lost to this rank's abort.
struct FailedOnAnotherRank : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Collectives issued through a Communicator, by kind (tests check how gradients travel; the trainer
// reports them per step), and the bytes of the whole buffers they covered: an all-reduce's or a
// broadcast's n elements, a reduce-scatter's send and an all-gather's recv (every rank's part).
// Point-to-point transfers count one per send or receive (an exchange's each), with their bytes.
struct CollectiveCounts {
  long long all_reduce = 0, reduce_scatter = 0, all_gather = 0, broadcast = 0;
  long long all_reduce_bytes = 0, reduce_scatter_bytes = 0, all_gather_bytes = 0, broadcast_bytes = 0;
  long long send = 0, recv = 0, send_bytes = 0, recv_bytes = 0;
};

// One transfer of Communicator::exchange: n elements of `send` to rank `peer`, or into `recv` from
// it; exactly one of the two is set (neither only when n is 0: nothing moves).
template <typename T> struct Transfer {
  const T* send = nullptr;
  T* recv = nullptr;
  size_t n = 0;
  int peer = -1;
};

class Communicator {
 public:
  explicit Communicator(const CommOptions& options)
      : options_(options), launch_(detect_launch()), watchdog_(options.timeout_seconds) {
    if (launch_.uses_mpi) {
      int initialized = 0;
      MPI_Initialized(&initialized);
      if (!initialized) {
        // Threads: the CPU build's NCCL stand-in calls MPI from the watchdog's thread too.
        int provided = 0;
        if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
          throw std::runtime_error(launch_.source + " launch: MPI_Init_thread failed");
        owns_mpi_ = true;
      }
    }
    int devices = 0;
    if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0)
      cuda_check(cudaSetDevice(launch_.local_rank % devices), "selecting this rank's GPU");
    ncclUniqueId id;
    if (launch_.rank == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    if (launch_.world_size > 1) id = exchange_id(id);
    rank_ = launch_.rank;
    world_size_ = launch_.world_size;
    ncclConfig_t config = non_blocking_config();
    watchdog_.begin("set-up of the communicator during start-up");
    const ncclResult_t status = ncclCommInitRankConfig(&comm_, world_size_, id, rank_, &config);
    if (status != ncclInProgress) check(status, "ncclCommInitRankConfig");
    finish_set_up(status, "ncclCommInitRankConfig");
  }
  // The ranks of `parent` with the same `color` (0 or above), ranked by `key` (ncclCommSplit);
  // `name` (e.g. "tensor-parallel", "data-parallel") names it in the watchdog's messages and
  // errors. Every rank of `parent` constructs one, in the same order relative to the parent's
  // collectives.
  Communicator(Communicator& parent, int color, int key, std::string name)
      : options_(parent.options_), launch_(parent.launch_), watchdog_(options_.timeout_seconds),
        name_(std::move(name)), parent_(&parent), order_(parent.order_) {
    if (color < 0)
      throw CommArgumentError("split of the " + name_ + " communicator: color " + std::to_string(color) +
                              " is negative (colors are 0 or above)");
    ncclConfig_t config = non_blocking_config();
    const std::string what = "set-up of the " + name_ + " communicator " + parent.purpose_when_;
    // NCCL completes the split on the parent (comm_ is filled then): its watchdog watches it.
    parent.watchdog_.begin(what);
    const ncclResult_t status =
        parent.watchdog_.run([&] { return ncclCommSplit(parent.comm_, color, key, &comm_, &config); });
    parent.watchdog_.finished();
    parent.check(status, ("ncclCommSplit into the " + name_ + " communicator").c_str());
    if (comm_ == nullptr)
      throw std::runtime_error("ncclCommSplit of the " + name_ + " communicator completed without a communicator");
    check(ncclCommUserRank(comm_, &rank_), "ncclCommUserRank");
    check(ncclCommCount(comm_, &world_size_), "ncclCommCount");
    watchdog_.begin(what);
    finish_set_up(ncclInProgress, "ncclCommSplit");
    ++parent.children_;
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  // While an exception unwinds, peers may still wait in a collective with this rank: the
  // communicator and MPI are then left for the error path to abort (MPI_Abort) instead of being
  // torn down collectively, which could block.
  ~Communicator() {
    if (parent_ != nullptr) --parent_->children_;
    if (order_->latest == this) order_->latest = nullptr;
    if (std::uncaught_exceptions() > 0) return;
    if (children_ > 0) {
      std::fprintf(stderr, "%s: the %s communicator was destroyed before the %d communicator(s) split from it\n",
                   describe().c_str(), name_.empty() ? "launch's" : name_.c_str(), children_);
      std::abort();
    }
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);  // still watched
    if (sums_ != nullptr) cudaFree(sums_);
    if (event_ != nullptr) cudaEventDestroy(event_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    watchdog_.begin("finalize of the communicator at teardown");
    const ncclResult_t finalized = watchdog_.run([&] { return ncclCommFinalize(comm_); });
    watchdog_.finished();
    watchdog_.stop();
    // A finalize that failed leaves only the abort.
    if (finalized == ncclSuccess) ncclCommDestroy(comm_);
    else ncclCommAbort(comm_);
    if (parent_ != nullptr) return;  // MPI and the rendezvous files are the launch communicator's
    if (launch_.rank == 0 && options_.rendezvous.rfind("file:", 0) == 0)
      rendezvous::remove_rendezvous_files(options_.rendezvous.substr(5), launch_.world_size);
    if (owns_mpi_) MPI_Finalize();
  }

  // Within this communicator (a split one: within its group).
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // The process's, whichever communicator.
  int local_rank() const { return launch_.local_rank; }
  const std::string& launcher() const { return launch_.source; }
  // This rank in messages (the watchdog's): "rank 3" (the launch's rank), or for a split
  // communicator "rank 3 (tensor-parallel rank 1 of 2)".
  std::string describe() const {
    std::string who = "rank " + std::to_string(launch_.rank);
    if (!name_.empty())
      who += " (" + name_ + " rank " + std::to_string(rank_) + " of " + std::to_string(world_size_) + ")";
    return who;
  }
  cudaStream_t stream() const { return stream_; }
  // Since construction or the last reset (counts = {}).
  CollectiveCounts& counts() { return counts_; }
  // The host's waits for this communicator's non-blocking calls (comm_watchdog.h); reset the same way.
  SettleCounts& settle_counts() { return watchdog_.settle_counts(); }

  // Communication issued from now on runs after the work already queued on `producer`.
  void wait_for(cudaStream_t producer) {
    cuda_check(cudaEventRecord(event_, producer), "recording a communication event");
    cuda_check(cudaStreamWaitEvent(stream_, event_, 0), "ordering communication after computation");
  }
  // Work queued next on `consumer` runs after the communication issued so far.
  void order_before(cudaStream_t consumer) {
    cuda_check(cudaEventRecord(event_, stream_), "recording a communication event");
    cuda_check(cudaStreamWaitEvent(consumer, event_, 0), "ordering computation after communication");
  }
  // The communication `issue` queues, between the two: after the work already queued on `s`, and
  // before the work queued on `s` next.
  template <typename Issue> void ordered_with(cudaStream_t s, Issue&& issue) {
    wait_for(s);
    issue();
    order_before(s);
  }

  // What the collectives issued from now on carry and when, for the watchdog's messages:
  // ("gradients", "at step 7") names an all-reduce "all-reduce of gradients at step 7".
  void set_purpose(std::string what, std::string when) {
    purpose_what_ = std::move(what);
    purpose_when_ = std::move(when);
  }
  const std::string& purpose_when() const { return purpose_when_; }

  // In place over n device elements: every rank gets the sum (average) over ranks.
  template <typename T> void all_reduce(T* data, size_t n, ncclRedOp_t op) {
    require_buffer("all-reduce", data, n);
    require_op("all-reduce", op);
    ++counts_.all_reduce;
    counts_.all_reduce_bytes += static_cast<long long>(n * sizeof(T));
    collective("all-reduce", "ncclAllReduce",
               [&] { return ncclAllReduce(data, data, n, comm_detail::nccl_type<T>(), op, comm_, stream_); });
  }
  // recv (recvcount elements) on rank r = op over ranks of send[r·recvcount, (r+1)·recvcount).
  template <typename T> void reduce_scatter(const T* send, T* recv, size_t recvcount, ncclRedOp_t op) {
    require_layout("reduce-scatter", send, recvcount * world_size(), recv, recvcount, send + rank() * recvcount == recv,
                   "recv == send + rank·recvcount");
    require_op("reduce-scatter", op);
    ++counts_.reduce_scatter;
    counts_.reduce_scatter_bytes += static_cast<long long>(recvcount * world_size() * sizeof(T));
    collective("reduce-scatter", "ncclReduceScatter", [&] {
      return ncclReduceScatter(send, recv, recvcount, comm_detail::nccl_type<T>(), op, comm_, stream_);
    });
  }
  // recv[r·sendcount, (r+1)·sendcount) = rank r's send; send may be recv + rank·sendcount.
  template <typename T> void all_gather(const T* send, T* recv, size_t sendcount) {
    require_layout("all-gather", send, sendcount, recv, sendcount * world_size(), send == recv + rank() * sendcount,
                   "send == recv + rank·sendcount");
    ++counts_.all_gather;
    counts_.all_gather_bytes += static_cast<long long>(sendcount * world_size() * sizeof(T));
    collective("all-gather", "ncclAllGather",
               [&] { return ncclAllGather(send, recv, sendcount, comm_detail::nccl_type<T>(), comm_, stream_); });
  }
  // data (n elements) on every rank = data on `root`.
  template <typename T> void broadcast(T* data, size_t n, int root) {
    require_buffer("broadcast", data, n);
    if (root < 0 || root >= world_size())
      throw CommArgumentError(call("broadcast") + ": root " + std::to_string(root) + " is not a rank of " +
                              std::to_string(world_size()));
    ++counts_.broadcast;
    counts_.broadcast_bytes += static_cast<long long>(n * sizeof(T));
    collective("broadcast", "ncclBroadcast",
               [&] { return ncclBroadcast(data, data, n, comm_detail::nccl_type<T>(), root, comm_, stream_); });
  }

  // Point-to-point on this communicator's stream: n elements to / from rank `peer` of this
  // communicator. As NCCL's, a send completes only with its peer's matching receive (the same n
  // and type), and the transfers between two ranks match in call order; a rank that sends to and
  // receives from others at the same moment uses exchange.
  template <typename T> void send(const T* data, size_t n, int peer) { exchange<T>({{data, nullptr, n, peer}}); }
  template <typename T> void recv(T* data, size_t n, int peer) { exchange<T>({{nullptr, data, n, peer}}); }
  // One group (ncclGroupStart/End): the sends and receives of `transfers` progress together, so
  // e.g. each rank of a ring sending to the next and receiving from the previous cannot deadlock.
  template <typename T> void exchange(const std::vector<Transfer<T>>& transfers) {
    const char* kind = transfers.size() == 1 ? (transfers[0].send != nullptr ? "send" : "receive") : "exchange";
    for (const Transfer<T>& t : transfers) {
      require_peer(kind, t.peer);
      if (t.send != nullptr && t.recv != nullptr)
        throw CommArgumentError(call(kind) + ": a transfer with both a send and a receive buffer");
      require_buffer(kind, t.send != nullptr ? static_cast<const void*>(t.send) : t.recv, t.n);
    }
    std::string peers;
    for (const Transfer<T>& t : transfers) {
      const bool sends = t.send != nullptr;
      if (!sends && t.recv == nullptr) continue;  // n is 0: nothing moves
      (sends ? counts_.send : counts_.recv) += 1;
      (sends ? counts_.send_bytes : counts_.recv_bytes) += static_cast<long long>(t.n * sizeof(T));
      peers += std::string(peers.empty() ? "" : " and") + (sends ? " to " : " from ") + rank_name(t.peer);
    }
    collective(kind, "ncclSend/ncclRecv", [&] {
      ncclResult_t status = ncclGroupStart();
      for (const Transfer<T>& t : transfers) {
        if (status != ncclSuccess || (t.send == nullptr && t.recv == nullptr)) continue;
        status = t.send != nullptr ? ncclSend(t.send, t.n, comm_detail::nccl_type<T>(), t.peer, comm_, stream_)
                                   : ncclRecv(t.recv, t.n, comm_detail::nccl_type<T>(), t.peer, comm_, stream_);
      }
      const ncclResult_t ended = ncclGroupEnd();
      return status != ncclSuccess ? status : ended;
    }, peers);
  }

  // Sum over ranks of a host value (blocking; fp64, added in NCCL's order).
  double sum(double value) {
    std::vector<double> values{value};
    sum(values);
    return values[0];
  }
  // Sum over ranks of host values, in place (blocking; fp64, added in NCCL's order): the copies and
  // the all-reduce share the communicator's stream, so nothing else orders them. The device room is
  // kept between calls (some run every micro-batch) and grown when a call needs more.
  void sum(std::vector<double>& values) {
    if (values.empty()) return;
    if (values.size() > sums_capacity_) {
      cuda_check(cudaFree(sums_), "growing the room for host values summed over ranks");
      sums_ = nullptr;
      cuda_check(cudaMalloc(reinterpret_cast<void**>(&sums_), values.size() * sizeof(double)),
                 "allocating the room for host values summed over ranks");
      sums_capacity_ = values.size();
    }
    const size_t bytes = values.size() * sizeof(double);
    cuda_check(cudaMemcpyAsync(sums_, values.data(), bytes, cudaMemcpyHostToDevice, stream_), "communication");
    all_reduce(sums_, values.size(), ncclSum);
    cuda_check(cudaMemcpyAsync(values.data(), sums_, bytes, cudaMemcpyDeviceToHost, stream_), "communication");
    cuda_check(cudaStreamSynchronize(stream_), "communication");
  }
  // Returns once every rank has called it.
  void barrier() { sum(0.0); }

 private:
  static ncclConfig_t non_blocking_config() {
    // Non-blocking: no NCCL call waits on a peer, so the watchdog can end a stalled run.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    return config;
  }

  // What both constructors share once comm_ exists (possibly still being set up: `status` is what
  // the creating call returned) and rank_/world_size_ are known: the watchdog, the set-up polled
  // to its end under it, the stream and the event.
  void finish_set_up(ncclResult_t status, const char* call) {
    watchdog_.start(comm_, describe());
    check(watchdog_.settle(status), call);
    watchdog_.finished();
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating the communication stream");
    cuda_check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "creating a communication event");
  }

  // A collective in error messages: "all-gather of activations" (+ " on the tensor-parallel
  // communicator").
  std::string call(const char* kind) const {
    return std::string(kind) + " of " + purpose_what_ + (name_.empty() ? "" : " on the " + name_ + " communicator");
  }

  // ---- argument checks (what NCCL would refuse with ncclInvalidArgument)
  void require_buffer(const char* kind, const void* data, size_t n) const {
    if (n > 0 && data == nullptr)
      throw CommArgumentError(call(kind) + ": a null buffer of " + std::to_string(n) + " elements");
  }
  void require_peer(const char* kind, int peer) const {
    if (peer < 0 || peer >= world_size() || peer == rank())
      throw CommArgumentError(call(kind) + ": peer " + std::to_string(peer) +
                              (peer == rank() ? " is this rank" : " is not a rank of " + std::to_string(world_size())));
  }
  // Rank r of this communicator in messages: "rank 2", or "pipeline rank 2" for a split one.
  std::string rank_name(int r) const { return (name_.empty() ? "" : name_ + " ") + "rank " + std::to_string(r); }
  void require_op(const char* kind, ncclRedOp_t op) const {
    if (op != ncclSum && op != ncclProd && op != ncclMax && op != ncclMin && op != ncclAvg)
      throw CommArgumentError(call(kind) + ": reduction op " + std::to_string(static_cast<int>(op)) +
                              " is not one of NCCL's");
  }
  // NCCL's "In-place Operations": the two ranges may overlap only in the in-place layout.
  template <typename T>
  void require_layout(const char* kind, const T* send, size_t send_count, const T* recv, size_t recv_count,
                      bool in_place, const char* layout) const {
    require_buffer(kind, send, send_count);
    require_buffer(kind, recv, recv_count);
    if (in_place || send_count == 0 || recv_count == 0) return;
    if (send < recv + recv_count && recv < send + send_count)
      throw CommArgumentError(call(kind) + ": send and receive buffers overlap without being in place (" + layout +
                              ")");
  }

  ncclUniqueId exchange_id(ncclUniqueId id) {
    const std::string& r = options_.rendezvous;
    const double timeout = options_.timeout_seconds;
    if (r.rfind("file:", 0) == 0 && r.size() > 5) return rendezvous::file_rendezvous(r.substr(5), launch_, timeout, id);
    if (r.rfind("tcp:", 0) == 0) {
      const size_t colon = r.rfind(':');
      if (colon > 4 && colon + 1 < r.size())
        return rendezvous::tcp_rendezvous(r.substr(4, colon - 4), r.substr(colon + 1), launch_, timeout, id);
    }
    if (!r.empty())
      throw std::runtime_error("--rendezvous '" + r + "': expected file:PATH or tcp:HOST:PORT");
    if (!launch_.uses_mpi)
      throw std::runtime_error(launch_.source + " launch of " + std::to_string(launch_.world_size) +
                               " ranks without mpirun: give --rendezvous file:PATH (shared filesystem) or "
                               "--rendezvous tcp:HOST:PORT (HOST = rank 0's node), or start them with srun --mpi=pmix");
    if (MPI_Bcast(id.internal, sizeof(id.internal), MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
      throw std::runtime_error(launch_.source + " launch: MPI_Bcast of the NCCL unique id failed");
    return id;
  }

  // Issues one collective, watched by the watchdog from now until its event completes; after the
  // process's previous collective where another communicator issued it (the file comment).
  // `detail` follows the purpose in the watchdog's message (" to pipeline rank 2").
  template <typename Call>
  void collective(const std::string& kind, const char* nccl_name, Call&& call, const std::string& detail = "") {
    Communicator* previous = order_->latest;
    if (previous != nullptr && previous != this) {
      cuda_check(cudaEventRecord(previous->event_, previous->stream_), "recording a communication event");
      cuda_check(cudaStreamWaitEvent(stream_, previous->event_, 0), "ordering communicators");
    }
    order_->latest = this;
    watchdog_.begin(kind + " of " + purpose_what_ + detail + " " + purpose_when_);
    const ncclResult_t status = watchdog_.run(call);
    if (status != ncclSuccess) {
      watchdog_.finished();  // not watched: its error is reported here
      check(status, nccl_name);
    }
    watchdog_.issued(stream_);
  }

  // Throws the call's error, unless the watchdog fired (the process is ending with its message).
  void check(ncclResult_t status, const char* what) const {
    if (status == ncclSuccess) return;
    watchdog_.wait_if_fired();
    throw std::runtime_error(std::string(what) + (name_.empty() ? "" : " (" + name_ + " communicator)") + ": " +
                             ncclGetErrorString(status) + " (" + ncclGetLastError(comm_) + ")");
  }

  // The communicator whose stream got the process's latest collective (nullptr: none yet, or it
  // was destroyed); one for the launch's communicator and those split from it.
  struct IssueOrder {
    Communicator* latest = nullptr;
  };

  CommOptions options_;
  LaunchInfo launch_;
  CommWatchdog watchdog_;
  std::string name_;                // a split communicator's ("tensor-parallel"); "" for the launch's
  Communicator* parent_ = nullptr;  // what a split communicator was split from
  int children_ = 0;                // communicators split from this one and not yet destroyed
  IssueOrder own_order_;            // the launch's communicator's
  IssueOrder* order_ = &own_order_;  // shared by a split communicator with its parent
  int rank_ = 0, world_size_ = 1;   // within this communicator
  bool owns_mpi_ = false;
  ncclComm_t comm_ = nullptr;
  std::string purpose_what_ = "values", purpose_when_ = "during start-up";
  cudaStream_t stream_ = nullptr;
  cudaEvent_t event_ = nullptr;
  double* sums_ = nullptr;  // sum()'s device room: sums_capacity_ doubles
  size_t sums_capacity_ = 0;
  CollectiveCounts counts_;
};
