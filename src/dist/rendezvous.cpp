// rendezvous.cpp — the launch (mpirun, srun, single process) and the NCCL id exchange without MPI (shared file, TCP)
#include "src/dist/rendezvous.h"

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

namespace rendezvous {

bool env_int(const char* name, int* value) {
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

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string missing_ranks(const std::vector<bool>& arrived) {
  std::string out;
  for (size_t r = 1; r < arrived.size(); ++r)
    if (!arrived[r]) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

std::string timeout_text(double seconds) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", seconds);
  return buf;
}

void write_rendezvous_file(const std::string& what, const std::string& path, const void* data, size_t bytes) {
  try {
    AtomicFileWriter out(path);
    out.write(data, bytes);
    out.commit();
  } catch (const std::exception& e) {
    throw std::runtime_error(what + ": " + e.what());
  }
}

ncclUniqueId file_rendezvous(const std::string& path, const LaunchInfo& who, double timeout, ncclUniqueId id) {
  const std::string what = "--rendezvous file:" + path;
  const auto start = Clock::now();
  const auto pause = [] { std::this_thread::sleep_for(std::chrono::milliseconds(20)); };
  if (who.rank == 0) {
    if (file_exists(path) || file_exists(path + ".ready"))
      throw std::runtime_error(what + ": the file already exists (left by an earlier run?); delete it or use a "
                               "path unique to this job");
    write_rendezvous_file(what, path, id.internal, sizeof(id.internal));
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
    write_rendezvous_file(what, path + ".ready", &ready, 1);
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
  write_rendezvous_file(what, path + ".rank" + std::to_string(who.rank), &ready, 1);
  while (!file_exists(path + ".ready")) {
    if (seconds_since(start) > timeout)
      throw std::runtime_error(what + ": rank 0 did not see all " + std::to_string(who.world_size) +
                               " ranks check in within --comm-timeout " + timeout_text(timeout) +
                               " (a rank never started?)");
    pause();
  }
  return received;
}

void remove_rendezvous_files(const std::string& path, int world_size) {
  std::remove(path.c_str());
  std::remove((path + ".ready").c_str());
  for (int r = 1; r < world_size; ++r) std::remove((path + ".rank" + std::to_string(r)).c_str());
}

bool wait_fd(int fd, short events, double remaining) {
  if (remaining <= 0) return false;
  pollfd p{fd, events, 0};
  const int ms = static_cast<int>(remaining * 1000.0) + 1;
  return poll(&p, 1, ms) > 0;
}

bool read_exact(int fd, void* data, size_t bytes, Clock::time_point start, double timeout) {
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

bool write_all(int fd, const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t sent = send(fd, p, bytes, MSG_NOSIGNAL);
    if (sent <= 0) return false;
    p += sent;
    bytes -= static_cast<size_t>(sent);
  }
  return true;
}

ncclUniqueId tcp_rendezvous(const std::string& host, const std::string& port, const LaunchInfo& who,
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

}  // namespace rendezvous

LaunchInfo detect_launch() {
  LaunchInfo info;
  using rendezvous::env_int;
  if (env_int("OMPI_COMM_WORLD_SIZE", &info.world_size)) {
    info.uses_mpi = true;
    info.source = "mpirun";
    if (!env_int("OMPI_COMM_WORLD_RANK", &info.rank))
      throw std::runtime_error("mpirun launch: OMPI_COMM_WORLD_SIZE is set but OMPI_COMM_WORLD_RANK is not");
    if (!env_int("OMPI_COMM_WORLD_LOCAL_RANK", &info.local_rank)) info.local_rank = info.rank;
  } else if (env_int("SLURM_NTASKS", &info.world_size)) {
    info.uses_mpi = std::getenv("PMIX_RANK") != nullptr;
    info.source = info.uses_mpi ? "SLURM (PMIx)" : "SLURM";
    if (!env_int("SLURM_PROCID", &info.rank))
      throw std::runtime_error("SLURM launch: SLURM_NTASKS is set but SLURM_PROCID is not");
    if (!env_int("SLURM_LOCALID", &info.local_rank)) info.local_rank = info.rank;
  }
  if (info.world_size < 1 || info.rank >= info.world_size)
    throw std::runtime_error(info.source + " launch: rank " + std::to_string(info.rank) + " is not in [0, world size " +
                             std::to_string(info.world_size) + ")");
  return info;
}
