// comm.h — the data-parallel communicator: which process this is (rank, world size, node-local
// rank) and NCCL collectives on device buffers, issued on a dedicated communication stream.
//
// Launch (detected from the environment):
//   mpirun (OpenMPI: OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK): MPI is initialized and, without
//     --rendezvous, rank 0's ncclUniqueId reaches the others by MPI_Bcast.
//   SLURM srun without MPI (SLURM_PROCID/NTASKS/LOCALID): the id goes through --rendezvous:
//     file:PATH  rank 0 writes PATH (atomically); rank r reads it and writes PATH.rank<r>; rank 0
//                waits for every PATH.rank<r>, then writes PATH.ready, which the others wait for.
//                PATH must be on a filesystem all ranks see and must not exist before the run
//                (rank 0 removes the files at the end of a run).
//     tcp:HOST:PORT  rank 0 listens on PORT; rank r connects to HOST:PORT, sends its rank and
//                world size, and receives the id once every rank has connected.
//   neither: one process, world size 1 (no MPI needed).
// Every wait of the rendezvous gives up after --comm-timeout seconds with an error that names the
// missing rank(s), so a peer that never starts makes every other rank exit instead of hanging.
// Each process uses GPU (local rank mod device count).
//
// Collectives run on stream() (a stream of their own); wait_for(s) orders the communication
// after the work already queued on s, and order_before(s) orders the work queued next on s after
// the communication issued so far. The CPU build answers the nccl* calls with MPI
// (simt/nccl.cpp); there streams are synchronous and MPI needs mpirun for more than one rank.
#pragma once
#include "../kernels/common.cuh"

// The C API only: OpenMPI's deprecated C++ bindings do not compile warning-free.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

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
#include <vector>

struct CommOptions {
  std::string rendezvous;          // "", "file:PATH" or "tcp:HOST:PORT"
  double timeout_seconds = 300.0;  // for every wait of the bootstrap
};

// Where the process sits in the launch, from the launcher's environment variables.
struct LaunchInfo {
  int rank = 0, world_size = 1, local_rank = 0;
  bool mpirun = false;  // launched by OpenMPI's mpirun
  std::string source = "single process";
};

namespace comm_detail {

inline bool env_int(const char* name, int* value) {
  const char* text = std::getenv(name);
  if (text == nullptr) return false;
  char* end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < 0 || v > 1 << 24)
    throw std::runtime_error(std::string("environment variable ") + name + "='" + text +
                             "': expected a non-negative integer");
  *value = static_cast<int>(v);
  return true;
}

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// "1, 3" for the ranks in [1, world) whose arrived[r] is false.
inline std::string missing_ranks(const std::vector<bool>& arrived) {
  std::string out;
  for (size_t r = 1; r < arrived.size(); ++r)
    if (!arrived[r]) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

inline std::string timeout_text(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", seconds);
  return buf;
}

// ---- file rendezvous

inline bool file_exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

inline void write_file_atomically(const std::string& path, const void* data, size_t bytes) {
  const std::string temp = path + ".tmp" + std::to_string(getpid());
  {
    std::ofstream out(temp, std::ios::binary);
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    if (!out) throw std::runtime_error("--rendezvous file:" + path + ": cannot write " + temp);
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0)
    throw std::runtime_error("--rendezvous file:" + path + ": cannot rename " + temp + " into place: " +
                             std::strerror(errno));
}

inline ncclUniqueId file_rendezvous(const std::string& path, const LaunchInfo& who, double timeout, ncclUniqueId id) {
  const std::string what = "--rendezvous file:" + path;
  const auto start = Clock::now();
  const auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
  if (who.rank == 0) {
    if (file_exists(path) || file_exists(path + ".ready"))
      throw std::runtime_error(what + ": the file already exists (left by an earlier run?); delete it or use a "
                               "path unique to this job");
    write_file_atomically(path, id.internal, sizeof(id.internal));
    std::vector<bool> arrived(who.world_size, false);
    for (;;) {
      bool all = true;
      for (int r = 1; r < who.world_size; ++r) {
        if (!arrived[r]) arrived[r] = file_exists(path + ".rank" + std::to_string(r));
        all = all && arrived[r];
      }
      if (all) break;
      if (seconds_since(start) > timeout)
        throw std::runtime_error(what + ": rank(s) " + missing_ranks(arrived) + " of " +
                                 std::to_string(who.world_size) + " did not check in within --comm-timeout " +
                                 timeout_text(timeout));
      pause();
    }
    const char ready = 1;
    write_file_atomically(path + ".ready", &ready, 1);
    return id;
  }
  while (!file_exists(path)) {
    if (seconds_since(start) > timeout)
      throw std::runtime_error(what + ": rank 0 did not write the file within --comm-timeout " +
                               timeout_text(timeout));
    pause();
  }
  ncclUniqueId received;
  std::ifstream in(path, std::ios::binary);
  in.read(received.internal, sizeof(received.internal));
  if (!in) throw std::runtime_error(what + ": cannot read the unique id (truncated file?)");
  const char ready = 1;
  write_file_atomically(path + ".rank" + std::to_string(who.rank), &ready, 1);
  while (!file_exists(path + ".ready")) {
    if (seconds_since(start) > timeout)
      throw std::runtime_error(what + ": rank 0 did not see all " + std::to_string(who.world_size) +
                               " ranks check in within --comm-timeout " + timeout_text(timeout) +
                               " (a rank never started?)");
    pause();
  }
  return received;
}

inline void remove_rendezvous_files(const std::string& path, int world_size) {
  std::remove(path.c_str());
  std::remove((path + ".ready").c_str());
  for (int r = 1; r < world_size; ++r) std::remove((path + ".rank" + std::to_string(r)).c_str());
}

// ---- TCP rendezvous

class Socket {
 public:
  explicit Socket(int fd = -1) : fd_(fd) {}
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept {
    std::swap(fd_, o.fd_);
    return *this;
  }
  ~Socket() {
    if (fd_ >= 0) close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int fd_;
};

// Waits until fd is readable (or writable), up to `remaining` seconds; false on timeout.
inline bool wait_fd(int fd, short events, double remaining) {
  if (remaining <= 0) return false;
  pollfd p{fd, events, 0};
  const int ms = static_cast<int>(remaining * 1000.0) + 1;
  return poll(&p, 1, ms) > 0;
}

// Reads exactly `bytes` or fails (false) on timeout / closed connection.
inline bool read_exact(int fd, void* data, size_t bytes, Clock::time_point start, double timeout) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    if (!wait_fd(fd, POLLIN, timeout - seconds_since(start))) return false;
    const ssize_t got = recv(fd, p, bytes, 0);
    if (got <= 0) return false;
    p += got;
    bytes -= static_cast<size_t>(got);
  }
  return true;
}

inline bool write_all(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t sent = send(fd, p, bytes, MSG_NOSIGNAL);
    if (sent <= 0) return false;
    p += sent;
    bytes -= static_cast<size_t>(sent);
  }
  return true;
}

inline ncclUniqueId tcp_rendezvous(const std::string& host, const std::string& port, const LaunchInfo& who,
                                   double timeout, ncclUniqueId id) {
  const std::string what = "--rendezvous tcp:" + host + ":" + port;
  const auto start = Clock::now();
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (who.rank == 0) hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const int gai = getaddrinfo(who.rank == 0 ? nullptr : host.c_str(), port.c_str(), &hints, &found);
  if (gai != 0) throw std::runtime_error(what + ": cannot resolve the address: " + gai_strerror(gai));
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> addresses(found, freeaddrinfo);

  if (who.rank == 0) {
    Socket listener(socket(found->ai_family, found->ai_socktype, found->ai_protocol));
    const int yes = 1;
    setsockopt(listener.fd(), SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (listener.fd() < 0 || bind(listener.fd(), found->ai_addr, found->ai_addrlen) != 0 ||
        listen(listener.fd(), 128) != 0)
      throw std::runtime_error(what + ": rank 0 cannot listen on port " + port + ": " + std::strerror(errno));
    std::vector<bool> arrived(who.world_size, false);
    std::vector<Socket> peers;
    for (int connected = 1; connected < who.world_size;) {
      if (!wait_fd(listener.fd(), POLLIN, timeout - seconds_since(start)))
        throw std::runtime_error(what + ": rank(s) " + missing_ranks(arrived) + " of " +
                                 std::to_string(who.world_size) + " did not connect within --comm-timeout " +
                                 timeout_text(timeout));
      Socket peer(accept(listener.fd(), nullptr, nullptr));
      if (peer.fd() < 0) continue;
      int32_t hello[2] = {-1, -1};  // rank, world size
      if (!read_exact(peer.fd(), hello, sizeof hello, start, timeout)) continue;
      if (hello[1] != who.world_size || hello[0] < 1 || hello[0] >= who.world_size || arrived[hello[0]])
        throw std::runtime_error(what + ": a peer announced rank " + std::to_string(hello[0]) + " of " +
                                 std::to_string(hello[1]) + ", expected a new rank in [1, " +
                                 std::to_string(who.world_size) + ") of " + std::to_string(who.world_size));
      arrived[hello[0]] = true;
      peers.push_back(std::move(peer));
      ++connected;
    }
    for (const Socket& peer : peers)
      if (!write_all(peer.fd(), id.internal, sizeof(id.internal)))
        throw std::runtime_error(what + ": sending the unique id failed: " + std::strerror(errno));
    return id;
  }

  for (;;) {
    Socket s(socket(found->ai_family, found->ai_socktype, found->ai_protocol));
    if (s.fd() >= 0 && connect(s.fd(), found->ai_addr, found->ai_addrlen) == 0) {
      const int32_t hello[2] = {who.rank, who.world_size};
      ncclUniqueId received;
      if (!write_all(s.fd(), hello, sizeof hello))
        throw std::runtime_error(what + ": sending this rank's number to rank 0 failed");
      if (!read_exact(s.fd(), received.internal, sizeof(received.internal), start, timeout))
        throw std::runtime_error(what + ": rank 0 did not send the unique id within --comm-timeout " +
                                 timeout_text(timeout) + " (not all " + std::to_string(who.world_size) +
                                 " ranks connected?)");
      return received;
    }
    if (seconds_since(start) > timeout)
      throw std::runtime_error(what + ": rank 0 was not reachable within --comm-timeout " + timeout_text(timeout));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

template <typename T> constexpr ncclDataType_t nccl_type();
template <> constexpr ncclDataType_t nccl_type<float>() { return ncclFloat32; }
template <> constexpr ncclDataType_t nccl_type<bf16>() { return ncclBfloat16; }
template <> constexpr ncclDataType_t nccl_type<double>() { return ncclFloat64; }

}  // namespace comm_detail

// The launch this process belongs to, from mpirun's or SLURM's environment variables.
inline LaunchInfo detect_launch() {
  LaunchInfo info;
  using comm_detail::env_int;
  if (env_int("OMPI_COMM_WORLD_SIZE", &info.world_size)) {
    info.mpirun = true;
    info.source = "mpirun";
    if (!env_int("OMPI_COMM_WORLD_RANK", &info.rank))
      throw std::runtime_error("mpirun launch: OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not");
    if (!env_int("OMPI_COMM_WORLD_LOCAL_RANK", &info.local_rank)) info.local_rank = info.rank;
  } else if (env_int("SLURM_NTASKS", &info.world_size)) {
    info.source = "SLURM";
    if (!env_int("SLURM_PROCID", &info.rank))
      throw std::runtime_error("SLURM launch: SLURM_NTASKS is set but SLURM_PROCID is not");
    if (!env_int("SLURM_LOCALID", &info.local_rank)) info.local_rank = info.rank;
  }
  if (info.world_size < 1 || info.rank >= info.world_size)
    throw std::runtime_error(info.source + " launch: rank " + std::to_string(info.rank) + " is not in [0, world size " +
                             std::to_string(info.world_size) + ")");
  return info;
}

class Communicator {
 public:
  explicit Communicator(const CommOptions& options) : options_(options) {
    launch_ = detect_launch();
    if (launch_.mpirun) {
      int initialized = 0;
      MPI_Initialized(&initialized);
      if (!initialized) {
        if (MPI_Init(nullptr, nullptr) != MPI_SUCCESS) throw std::runtime_error("mpirun launch: MPI_Init failed");
        owns_mpi_ = true;
      }
    }
    int devices = 0;
    if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0)
      check_cuda(cudaSetDevice(launch_.local_rank % devices), "selecting this rank's GPU");
    ncclUniqueId id;
    if (launch_.rank == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    if (launch_.world_size > 1) id = exchange_id(id);
    check(ncclCommInitRank(&comm_, launch_.world_size, id, launch_.rank), "ncclCommInitRank");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "creating the communication stream");
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "creating a communication event");
    check_cuda(cudaMalloc(reinterpret_cast<void**>(&scalar_), sizeof(double)), "allocating a communication scalar");
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  // While an exception unwinds, peers may still wait in a collective with this rank: the
  // communicator and MPI are then left for the error path to abort (MPI_Abort) instead of being
  // torn down collectively, which could block.
  ~Communicator() {
    if (std::uncaught_exceptions() > 0) return;
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (scalar_ != nullptr) cudaFree(scalar_);
    if (event_ != nullptr) cudaEventDestroy(event_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (comm_ != nullptr) ncclCommDestroy(comm_);
    if (launch_.rank == 0 && options_.rendezvous.rfind("file:", 0) == 0)
      comm_detail::remove_rendezvous_files(options_.rendezvous.substr(5), launch_.world_size);
    if (owns_mpi_) MPI_Finalize();
  }

  int rank() const { return launch_.rank; }
  int world_size() const { return launch_.world_size; }
  int local_rank() const { return launch_.local_rank; }
  const std::string& launcher() const { return launch_.source; }
  cudaStream_t stream() const { return stream_; }

  // Communication issued from now on runs after the work already queued on `producer`.
  void wait_for(cudaStream_t producer) {
    check_cuda(cudaEventRecord(event_, producer), "recording a communication event");
    check_cuda(cudaStreamWaitEvent(stream_, event_, 0), "ordering communication after computation");
  }
  // Work queued next on `consumer` runs after the communication issued so far.
  void order_before(cudaStream_t consumer) {
    check_cuda(cudaEventRecord(event_, stream_), "recording a communication event");
    check_cuda(cudaStreamWaitEvent(consumer, event_, 0), "ordering computation after communication");
  }

  // In place over n device elements: every rank gets the sum (average) over ranks.
  template <typename T> void all_reduce(T* data, size_t n, ncclRedOp_t op) {
    check(ncclAllReduce(data, data, n, comm_detail::nccl_type<T>(), op, comm_, stream_), "ncclAllReduce");
  }
  // recv (recvcount elements) on rank r = op over ranks of send[r·recvcount, (r+1)·recvcount).
  template <typename T> void reduce_scatter(const T* send, T* recv, size_t recvcount, ncclRedOp_t op) {
    check(ncclReduceScatter(send, recv, recvcount, comm_detail::nccl_type<T>(), op, comm_, stream_),
          "ncclReduceScatter");
  }
  // recv on `root` = op over ranks of send (n elements); other ranks' recv is untouched.
  template <typename T> void reduce(const T* send, T* recv, size_t n, int root, ncclRedOp_t op) {
    check(ncclReduce(send, recv, n, comm_detail::nccl_type<T>(), op, root, comm_, stream_), "ncclReduce");
  }
  // recv[r·sendcount, (r+1)·sendcount) = rank r's send; send may be recv + rank·sendcount.
  template <typename T> void all_gather(const T* send, T* recv, size_t sendcount) {
    check(ncclAllGather(send, recv, sendcount, comm_detail::nccl_type<T>(), comm_, stream_), "ncclAllGather");
  }
  // data (n elements) on every rank = data on `root`.
  template <typename T> void broadcast(T* data, size_t n, int root) {
    check(ncclBroadcast(data, data, n, comm_detail::nccl_type<T>(), root, comm_, stream_), "ncclBroadcast");
  }
  // Calls between group_start() and group_end() are launched together (nccl group semantics).
  void group_start() { check(ncclGroupStart(), "ncclGroupStart"); }
  void group_end() { check(ncclGroupEnd(), "ncclGroupEnd"); }

  // Sum over ranks of a host value (blocking; fp64, added in NCCL's order).
  double sum(double value) {
    check_cuda(cudaMemcpyAsync(scalar_, &value, sizeof value, cudaMemcpyHostToDevice, stream_), "communication");
    all_reduce(scalar_, 1, ncclSum);
    double total = 0.0;
    check_cuda(cudaMemcpyAsync(&total, scalar_, sizeof total, cudaMemcpyDeviceToHost, stream_), "communication");
    check_cuda(cudaStreamSynchronize(stream_), "communication");
    return total;
  }
  // Returns once every rank has called it.
  void barrier() { sum(0.0); }

 private:
  ncclUniqueId exchange_id(ncclUniqueId id) {
    const std::string& r = options_.rendezvous;
    const double timeout = options_.timeout_seconds;
    if (r.rfind("file:", 0) == 0 && r.size() > 5) return comm_detail::file_rendezvous(r.substr(5), launch_, timeout, id);
    if (r.rfind("tcp:", 0) == 0) {
      const size_t colon = r.rfind(':');
      if (colon > 4 && colon + 1 < r.size())
        return comm_detail::tcp_rendezvous(r.substr(4, colon - 4), r.substr(colon + 1), launch_, timeout, id);
    }
    if (!r.empty())
      throw std::runtime_error("--rendezvous '" + r + "': expected file:PATH or tcp:HOST:PORT");
    if (!launch_.mpirun)
      throw std::runtime_error(launch_.source + " launch of " + std::to_string(launch_.world_size) +
                               " ranks without mpirun: give --rendezvous file:PATH (shared filesystem) or "
                               "--rendezvous tcp:HOST:PORT (HOST = rank 0's node)");
    if (MPI_Bcast(id.internal, sizeof(id.internal), MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
      throw std::runtime_error("mpirun launch: MPI_Bcast of the NCCL unique id failed");
    return id;
  }

  void check(ncclResult_t status, const char* what) const {
    if (status != ncclSuccess)
      throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(status) + " (" +
                               ncclGetLastError(comm_) + ")");
  }
  static void check_cuda(cudaError_t err, const char* what) {
    if (err != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
  }

  CommOptions options_;
  LaunchInfo launch_;
  bool owns_mpi_ = false;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t event_ = nullptr;
  double* scalar_ = nullptr;
};
