// streams.cpp — the stream ordering checker: the happens-before order a GPU gives stream work,
// kept as vector clocks, and every device-memory access of stream work checked against it.
//
// simt runs every operation when it is issued, so a missing cross-stream dependency never shows
// in its results. This file keeps the order a GPU would enforce instead, from the CUDA Runtime
// API's "Stream synchronization behavior" and "API synchronization behavior" pages
// (docs.nvidia.com/cuda/cuda-runtime-api/stream-sync-behavior.html, api-sync-behavior.html):
// - each stream has a clock (one counter per stream); an operation ticks its stream's counter,
//   and its place in the order is (stream, counter);
// - a host thread has a clock of what it has waited for; whatever it issues next comes after that;
// - events capture their stream's clock at cudaEventRecord; cudaStreamWaitEvent joins it into the
//   waiting stream, cudaEventSynchronize (and a cudaEventQuery that answers success) into the host;
// - cudaStreamSynchronize joins the stream's clock into the host, cudaDeviceSynchronize every
//   stream's;
// - the legacy default stream: "the legacy stream first waits on all blocking streams, the action
//   is queued in the legacy stream, and then all blocking streams wait on the legacy stream";
//   streams created with cudaStreamNonBlocking take no part. The per-thread default stream
//   (cudaStreamPerThread) is one blocking stream per host thread.
// Each device allocation keeps, per byte range, the last write and the reads since it, each with
// its (stream, counter). A write must come after all of them, a read after the write; otherwise
// the process ends with one "simt: stream hazard:" line.
// NCCL operations are also checked against each other: NCCL gives no forward-progress guarantee
// to the kernels of two communicators that run at once on one GPU (NCCL user guide, "Using
// multiple NCCL communicators concurrently": they may deadlock), so an operation of one
// communicator must come after every earlier operation of every other live communicator of the
// process (each communicator keeps its latest operation per stream), unless both were issued in
// one ncclGroupStart/ncclGroupEnd (NCCL launches a group's operations together); otherwise one
// "simt: stream hazard:" line names the two operations and communicators. Kernel pointer arguments reach from the
// pointer to the end of its allocation (their extent is unknown); copies, memsets and library
// calls give exact ranges.
#include "state.h"  // first: simt.h must precede the CUDA headers
#include "streams.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace simt {
namespace {

// counter[s] = how many operations of stream s are known to come before.
struct Clock {
  std::vector<uint64_t> counter;
  uint64_t at(size_t s) const { return s < counter.size() ? counter[s] : 0; }
  void join(const Clock& o) {
    if (counter.size() < o.counter.size()) counter.resize(o.counter.size(), 0);
    for (size_t s = 0; s < o.counter.size(); ++s) counter[s] = std::max(counter[s], o.counter[s]);
  }
  uint64_t tick(size_t s) {
    if (counter.size() <= s) counter.resize(s + 1, 0);
    return ++counter[s];
  }
};

struct Stream {
  size_t id;
  bool blocking;
  std::string name;
  Clock clock;
};

// One issued operation, for reports.
struct Operation {
  std::string what;
  std::string stream;
};

// An access in the order: operation number `counter` of stream `stream`.
struct Mark {
  size_t stream;
  uint64_t counter;
  std::shared_ptr<const Operation> op;
};

// A byte range's history since its last write.
struct Segment {
  bool written = false;
  Mark write{};
  std::vector<Mark> reads;  // at most one per stream: the latest covers the earlier ones
};

struct Allocation {
  size_t bytes;
  std::vector<void*> allocated_by;  // return addresses, for reports
  std::map<size_t, Segment> segments;  // start offset → history up to the next start
};

// A communicator's latest NCCL operation on one stream, and the group it was issued in (0: none).
struct CommunicatorMark {
  Mark mark;
  unsigned long long group;
};
struct Communicator {
  std::string name;
  std::vector<CommunicatorMark> latest;  // at most one per stream: the latest covers the earlier ones
};

std::mutex mutex;  // everything below
Stream legacy{0, true, "the legacy default stream", {}};
std::vector<Stream*> blocking_streams;  // blocking streams besides the legacy one
size_t next_stream_id = 1;
Clock latest;  // each stream's last operation: what cudaDeviceSynchronize waits for
std::map<const void*, Clock> events;
std::map<const char*, Allocation> allocations;
std::map<const void*, Communicator> communicators;  // live ones, by handle
thread_local Stream* per_thread = nullptr;
// Each host thread's clock, never destroyed (like its per-thread stream): the destructor of a
// static object, e.g. a communicator a program keeps to its end, may synchronize a stream after the
// thread's thread_local objects are gone (they are destroyed before static ones).
thread_local Clock* host_clock = nullptr;
Clock& host() {
  if (host_clock == nullptr) host_clock = new Clock;
  return *host_clock;
}

// A code address as its function's name, or as FILE+0xOFFSET (for addr2line) where the symbol is
// not exported.
std::string symbol(const void* address) {
  Dl_info info;
  if (dladdr(address, &info) == 0) return "?";
  if (info.dli_sname == nullptr) {
    char offset[32];
    std::snprintf(offset, sizeof offset, "+0x%zx",
                  static_cast<size_t>(static_cast<const char*>(address) - static_cast<const char*>(info.dli_fbase)));
    return std::string(info.dli_fname) + offset;
  }
  int status = 0;
  char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
  std::string name = status == 0 ? demangled : info.dli_sname;
  std::free(demangled);
  return name;
}

Stream& stream_of(cudaStream_t handle) {
  if (handle == nullptr || handle == cudaStreamLegacy) return legacy;
  if (handle == cudaStreamPerThread) {
    if (per_thread == nullptr) {
      per_thread = new Stream{next_stream_id++, true, "the per-thread default stream of a host thread", {}};
      blocking_streams.push_back(per_thread);
    }
    return *per_thread;
  }
  return *reinterpret_cast<Stream*>(handle);
}

// What an operation issued now on s waits for: the host thread's knowledge and the legacy
// stream's implicit synchronization.
void order_issue(Stream& s) {
  s.clock.join(host());
  if (&s == &legacy) {
    for (const Stream* b : blocking_streams) s.clock.join(b->clock);
  } else if (s.blocking) {
    s.clock.join(legacy.clock);
  }
}

std::string describe_allocation(const char* start, const Allocation& a) {
  char address[32];
  std::snprintf(address, sizeof address, "%p", static_cast<const void*>(start));
  std::string text = std::string("device allocation ") + address + " (" + std::to_string(a.bytes) +
                     " bytes, allocated by ";
  for (size_t i = 0; i < a.allocated_by.size(); ++i) text += (i ? " <- " : "") + symbol(a.allocated_by[i]);
  return text + ")";
}

[[noreturn]] void report(const Mark& earlier, bool earlier_wrote, const Operation& now, bool now_writes, size_t lo,
                         size_t hi, const char* start, const Allocation& a) {
  std::fprintf(stderr,
               "simt: stream hazard: %s on %s %s bytes [%zu, %zu) of %s, which %s on %s %s earlier, with nothing "
               "ordering the two (an event, a stream or host synchronization, or the legacy stream's implicit one)\n",
               now.what.c_str(), now.stream.c_str(), now_writes ? "writes" : "reads", lo, hi,
               describe_allocation(start, a).c_str(), earlier.op->what.c_str(), earlier.op->stream.c_str(),
               earlier_wrote ? "wrote" : "read");
  std::fflush(stderr);
  std::_Exit(1);
}

// Splits the segment holding `offset` so that one starts there.
void split(Allocation& a, size_t offset) {
  if (offset >= a.bytes) return;
  auto it = a.segments.upper_bound(offset);
  --it;
  if (it->first != offset) a.segments.emplace_hint(std::next(it), offset, it->second);
}

void check(const char* start, Allocation& a, size_t lo, size_t hi, bool write, const Stream& s, const Mark& mark) {
  split(a, lo);
  split(a, hi);
  auto first = a.segments.find(lo), end = a.segments.lower_bound(hi);
  for (auto it = first; it != end; ++it) {
    const Segment& seg = it->second;
    if (seg.written && s.clock.at(seg.write.stream) < seg.write.counter)
      report(seg.write, true, *mark.op, write, lo, hi, start, a);
    if (write)
      for (const Mark& r : seg.reads)
        if (s.clock.at(r.stream) < r.counter) report(r, false, *mark.op, true, lo, hi, start, a);
  }
  if (write) {
    // One segment now: every earlier access in it is ordered before this write.
    a.segments.erase(std::next(first), end);
    first->second = Segment{true, mark, {}};
    return;
  }
  for (auto it = first; it != end; ++it) {
    std::vector<Mark>& reads = it->second.reads;
    auto same = std::find_if(reads.begin(), reads.end(), [&](const Mark& r) { return r.stream == mark.stream; });
    if (same != reads.end()) *same = mark;
    else reads.push_back(mark);
  }
}

// The NCCL operation `mark` of communicator `comm` on `s` against the other communicators' (see the
// file comment), then recorded as comm's latest on s.
void check_communicators(const void* comm, unsigned long long group, const Stream& s, const Mark& mark) {
  for (const auto& [other, c] : communicators) {
    if (other == comm) continue;
    for (const CommunicatorMark& m : c.latest) {
      if (s.clock.at(m.mark.stream) >= m.mark.counter || (group != 0 && m.group == group)) continue;
      std::fprintf(stderr,
                   "simt: stream hazard: %s of %s on %s and %s of %s on %s earlier, with nothing ordering the two (an "
                   "event, a stream or host synchronization, or one ncclGroupStart/ncclGroupEnd): NCCL operations of "
                   "two communicators that may run at once on one GPU can deadlock\n",
                   mark.op->what.c_str(), communicators.at(comm).name.c_str(), mark.op->stream.c_str(),
                   m.mark.op->what.c_str(), c.name.c_str(), m.mark.op->stream.c_str());
      std::fflush(stderr);
      std::_Exit(1);
    }
  }
  std::vector<CommunicatorMark>& mine = communicators.at(comm).latest;
  auto same = std::find_if(mine.begin(), mine.end(), [&](const CommunicatorMark& m) { return m.mark.stream == s.id; });
  if (same != mine.end()) *same = CommunicatorMark{mark, group};
  else mine.push_back(CommunicatorMark{mark, group});
}

void issue(cudaStream_t handle, std::string what, const MemoryAccess* accesses, size_t count,
           const void* comm = nullptr, unsigned long long group = 0) {
  std::lock_guard<std::mutex> lock(mutex);
  Stream& s = stream_of(handle);
  order_issue(s);
  const uint64_t counter = s.clock.tick(s.id);
  latest.tick(s.id);
  const Mark mark{s.id, counter, std::make_shared<const Operation>(Operation{std::move(what), s.name})};
  if (comm != nullptr) check_communicators(comm, group, s, mark);
  for (size_t i = 0; i < count; ++i) {
    const char* p = static_cast<const char*>(accesses[i].address);
    auto it = allocations.upper_bound(p);
    if (it == allocations.begin()) continue;
    --it;
    const size_t lo = static_cast<size_t>(p - it->first);
    if (lo >= it->second.bytes) continue;  // not device memory
    const size_t hi = accesses[i].bytes == kWholeRest ? it->second.bytes : std::min(it->second.bytes, lo + accesses[i].bytes);
    if (hi > lo) check(it->first, it->second, lo, hi, accesses[i].write, s, mark);
  }
}

}  // namespace

void stream_operation(cudaStream_t stream, const char* what, const MemoryAccess* accesses, size_t count) {
  issue(stream, what, accesses, count);
}

void nccl_operation(cudaStream_t stream, const char* what, const void* comm, unsigned long long group,
                    std::initializer_list<MemoryAccess> accesses) {
  issue(stream, what, accesses.begin(), accesses.size(), comm, group);
}

void track_communicator(const void* comm, std::string name) {
  std::lock_guard<std::mutex> lock(mutex);
  communicators[comm] = Communicator{std::move(name), {}};
}

void untrack_communicator(const void* comm) {
  std::lock_guard<std::mutex> lock(mutex);
  communicators.erase(comm);
}

void kernel_operation(cudaStream_t stream, const void* kernel, const MemoryAccess* accesses, size_t count) {
  issue(stream, "kernel " + describe_kernel(kernel), accesses, count);
}

void track_allocation(const void* start, size_t bytes) {
  void* frames[5];
  const int n = backtrace(frames, 5);
  std::lock_guard<std::mutex> lock(mutex);
  Allocation& a = allocations[static_cast<const char*>(start)];
  a = Allocation{bytes, {}, {}};
  a.segments.emplace(0, Segment{});
  // Frames 0 and 1 are this function and cudaMalloc.
  for (int i = 2; i < n; ++i) a.allocated_by.push_back(frames[i]);
}

void untrack_allocation(const void* start) {
  std::lock_guard<std::mutex> lock(mutex);
  allocations.erase(static_cast<const char*>(start));
}

bool is_device_memory(const void* address) {
  const char* p = static_cast<const char*>(address);
  std::lock_guard<std::mutex> lock(mutex);
  auto it = allocations.upper_bound(p);
  if (it == allocations.begin()) return false;
  --it;
  return p < it->first + it->second.bytes;
}

cudaStream_t create_stream(unsigned flags, const void* creator) {
  std::lock_guard<std::mutex> lock(mutex);
  const bool blocking = (flags & cudaStreamNonBlocking) == 0;
  Stream* s = new Stream{next_stream_id, blocking,
                         "stream #" + std::to_string(next_stream_id) + (blocking ? " (blocking" : " (cudaStreamNonBlocking") +
                             ", created in " + symbol(creator) + ")",
                         {}};
  ++next_stream_id;
  if (blocking) blocking_streams.push_back(s);
  return reinterpret_cast<cudaStream_t>(s);
}

void destroy_stream(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex);
  Stream* s = &stream_of(stream);
  if (s == &legacy || s == per_thread) return;
  blocking_streams.erase(std::remove(blocking_streams.begin(), blocking_streams.end(), s), blocking_streams.end());
  delete s;  // its work still counts: `latest` and the marks keep its id
}

void record_event(const void* event, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex);
  Stream& s = stream_of(stream);
  order_issue(s);
  events[event] = s.clock;
}

void forget_event(const void* event) {
  std::lock_guard<std::mutex> lock(mutex);
  events.erase(event);
}

// An event never recorded has no work to wait for (cudaStreamWaitEvent and cudaEventSynchronize
// then return at once).
void stream_waits_for_event(cudaStream_t stream, const void* event) {
  std::lock_guard<std::mutex> lock(mutex);
  Stream& s = stream_of(stream);
  order_issue(s);
  auto it = events.find(event);
  if (it != events.end()) s.clock.join(it->second);
}

void host_waits_for_event(const void* event) {
  std::lock_guard<std::mutex> lock(mutex);
  auto it = events.find(event);
  if (it != events.end()) host().join(it->second);
}

void host_waits_for(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mutex);
  host().join(stream_of(stream).clock);
}

void host_waits_for_device() {
  std::lock_guard<std::mutex> lock(mutex);
  host().join(latest);
}

}  // namespace simt
