// rendezvous.h — how a process learns where it sits in a launch (rank, world size, node-local
// rank from mpirun's or SLURM's environment) and, without MPI, how the ranks exchange the NCCL
// unique id: through a file on a shared filesystem or rank 0's TCP port (see comm.h for the
// launch modes and --rendezvous). Every wait gives up after --comm-timeout seconds naming the
// missing ranks.
#pragma once
#include "src/base/durable_file.h"

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
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

// Where the process sits in the launch, from the launcher's environment variables.
struct LaunchInfo {
  int rank = 0, world_size = 1, local_rank = 0;
  bool uses_mpi = false;  // MPI can start here (mpirun, or srun --mpi=pmix) and carries the NCCL id
  std::string source = "single process";
};

namespace rendezvous {

bool env_int(const char* name, int* value);

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start);

// "1, 3" for the ranks in [1, world) whose arrived[r] is false.
std::string missing_ranks(const std::vector<bool>& arrived);

std::string timeout_text(double seconds);

// ---- file rendezvous

inline bool file_exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

void write_rendezvous_file(const std::string& what, const std::string& path, const void* data, size_t bytes);

ncclUniqueId file_rendezvous(const std::string& path, const LaunchInfo& who, double timeout, ncclUniqueId id);

void remove_rendezvous_files(const std::string& path, int world_size);

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
bool wait_fd(int fd, short events, double remaining);

// Reads exactly `bytes` or fails (false) on timeout / closed connection.
bool read_exact(int fd, void* data, size_t bytes, Clock::time_point start, double timeout);

bool write_all(int fd, const void* data, size_t bytes);

ncclUniqueId tcp_rendezvous(const std::string& host, const std::string& port, const LaunchInfo& who,
                                   double timeout, ncclUniqueId id);

}  // namespace rendezvous

// The launch this process belongs to, from mpirun's or SLURM's environment variables. srun
// --mpi=pmix sets no OMPI_COMM_WORLD_* (OpenMPI reads its place from the PMIx server at MPI_Init)
// but PMIX_RANK: such a launch uses MPI like mpirun's, with SLURM's numbering.
LaunchInfo detect_launch();
