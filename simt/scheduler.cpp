// scheduler.cpp — runs kernel launches: a persistent pool of OS threads takes blocks; each
// block's CUDA threads are fibers scheduled cooperatively on one OS thread.
#include "simt.h"
#include "state.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cxxabi.h>
#include <dlfcn.h>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <sys/mman.h>
#include <unistd.h>

#if defined(SIMT_UCONTEXT)
#include <ucontext.h>
#else
#include <boost/context/detail/fcontext.hpp>
#endif

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define SIMT_ASAN 1
#endif

namespace simt {
namespace {

enum class FiberState : uint8_t { runnable, at_barrier, in_collective, exited };

struct PendingCopy {
  void* dst;
  const void* src;
  size_t bytes;
  int group;  // -1 until committed
};

struct Fiber {
#if defined(SIMT_UCONTEXT)
  ucontext_t context;
#else
  boost::context::detail::fcontext_t context = nullptr;
#endif
  char* stack = nullptr;
  uint3 tid{};
  int lane = 0, warp = 0;
  FiberState state = FiberState::exited;
  const char* wait_site = nullptr;  // barrier site or collective name while waiting
  std::vector<PendingCopy> copies;
  int next_group = 0;
};

struct Schedule {
  enum Kind { forward, reverse, random } kind = forward;
  uint64_t seed = 0;
};

Schedule read_schedule() {
  Schedule s;
  const char* e = std::getenv("SIMT_SCHEDULE");
  if (!e || !*e || std::strcmp(e, "forward") == 0) return s;
  if (std::strcmp(e, "reverse") == 0) {
    s.kind = Schedule::reverse;
  } else if (std::strncmp(e, "random:", 7) == 0) {
    s.kind = Schedule::random;
    s.seed = std::strtoull(e + 7, nullptr, 10);
  } else {
    std::fprintf(stderr, "simt: SIMT_SCHEDULE=%s: expected forward, reverse or random:SEED\n", e);
    std::exit(2);
  }
  return s;
}

// Read at every launch (a getenv is cheap next to a launch), so a test can switch orders.
bool read_check_barrier_sites() {
  const char* e = std::getenv("SIMT_BARRIER_SITES");
  return !(e && std::strcmp(e, "0") == 0);
}

size_t fiber_stack_bytes() {
  static const size_t bytes = [] {
    const char* e = std::getenv("SIMT_STACK_KB");
    long kb = e ? std::atol(e) : 256;
    return static_cast<size_t>(std::max(kb, 16L)) * 1024;
  }();
  return bytes;
}

// Everything one OS thread needs to run blocks. Lives as long as the thread.
struct Worker {
  std::vector<Fiber> fibers;
  std::vector<WarpState> warps;
  Fiber* current = nullptr;
#if defined(SIMT_UCONTEXT)
  ucontext_t scheduler_context;
#else
  boost::context::detail::fcontext_t scheduler_context = nullptr;
#endif
#if defined(SIMT_ASAN)
  void* scheduler_fake_stack = nullptr;
  const void* scheduler_stack_bottom = nullptr;
  size_t scheduler_stack_size = 0;
#endif
  const LaunchSpec* spec = nullptr;
  Schedule schedule;
  bool check_barrier_sites = true;
  unsigned char* dynamic_smem = nullptr;
  int block_threads = 0, live_threads = 0, at_barrier = 0;
  const char* barrier_site = nullptr;
  std::mt19937_64 rng;
  std::vector<int> order;

  ~Worker() {
    for (Fiber& f : fibers) munmap(f.stack - page_size(), fiber_stack_bytes() + page_size());
  }
  static size_t page_size() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }
};

thread_local Worker* this_worker = nullptr;

Worker& worker() {
  thread_local std::unique_ptr<Worker> owned;
  if (!this_worker) {
    owned = std::make_unique<Worker>();
    this_worker = owned.get();
  }
  return *this_worker;
}

std::string kernel_name(const void* kernel) {
  Dl_info info{};
  if (dladdr(kernel, &info) && info.dli_sname) {
    int status = 0;
    char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    std::string name = status == 0 && demangled ? demangled : info.dli_sname;
    std::free(demangled);
    return name;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "kernel@%p", kernel);
  return buf;
}

[[noreturn]] void die_in_block(const std::string& what) {
  Worker& w = worker();
  std::fprintf(stderr, "simt: %s\n  in kernel %s, block (%u,%u,%u) of grid (%u,%u,%u), block size (%u,%u,%u)\n",
               what.c_str(), kernel_name(w.spec->kernel).c_str(), blockIdx.x, blockIdx.y, blockIdx.z, gridDim.x,
               gridDim.y, gridDim.z, blockDim.x, blockDim.y, blockDim.z);
  std::fflush(stderr);
  std::abort();
}

// ---- context switching
#if defined(SIMT_ASAN)
void asan_before_switch(void** fake_stack_save, const void* bottom, size_t size) {
  __sanitizer_start_switch_fiber(fake_stack_save, bottom, size);
}
void asan_after_switch(void* fake_stack_save, const void** old_bottom, size_t* old_size) {
  __sanitizer_finish_switch_fiber(fake_stack_save, old_bottom, old_size);
}
#endif

void switch_to_scheduler(bool exiting) {
  Worker& w = worker();
#if defined(SIMT_ASAN)
  void* fake = nullptr;
  asan_before_switch(exiting ? nullptr : &fake, w.scheduler_stack_bottom, w.scheduler_stack_size);
#else
  (void)exiting;
#endif
#if defined(SIMT_UCONTEXT)
  swapcontext(&w.current->context, &w.scheduler_context);
#else
  auto t = boost::context::detail::jump_fcontext(w.scheduler_context, nullptr);
  w.scheduler_context = t.fctx;
#endif
#if defined(SIMT_ASAN)
  asan_after_switch(fake, nullptr, nullptr);
#endif
}

void on_thread_exit();

void run_thread_body() {
  Worker& w = worker();
  w.spec->invoke(w.spec->bound);
  on_thread_exit();
}

#if defined(SIMT_UCONTEXT)
void fiber_entry() {
#if defined(SIMT_ASAN)
  asan_after_switch(nullptr, &worker().scheduler_stack_bottom, &worker().scheduler_stack_size);
#endif
  run_thread_body();
  switch_to_scheduler(true);
}
#else
void fiber_entry(boost::context::detail::transfer_t t) {
  worker().scheduler_context = t.fctx;
#if defined(SIMT_ASAN)
  asan_after_switch(nullptr, &worker().scheduler_stack_bottom, &worker().scheduler_stack_size);
#endif
  run_thread_body();
  switch_to_scheduler(true);
}
#endif

void resume(Fiber& f) {
  Worker& w = worker();
  w.current = &f;
  threadIdx = f.tid;
#if defined(SIMT_ASAN)
  void* fake = nullptr;
  asan_before_switch(&fake, f.stack, fiber_stack_bytes());
#endif
#if defined(SIMT_UCONTEXT)
  swapcontext(&w.scheduler_context, &f.context);
#else
  auto t = boost::context::detail::jump_fcontext(f.context, nullptr);
  f.context = t.fctx;
#endif
#if defined(SIMT_ASAN)
  asan_after_switch(fake, nullptr, nullptr);
#endif
  w.current = nullptr;
}

char* map_stack(size_t bytes) {
  size_t page = Worker::page_size();
  void* p = mmap(nullptr, bytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("simt: mmap of a fiber stack");
    std::abort();
  }
  mprotect(p, page, PROT_NONE);  // guard page: a stack overflow faults instead of corrupting
  return static_cast<char*>(p) + page;
}

// ---- barrier and warp collectives
void release_barrier(Worker& w) {
  for (int i = 0; i < w.block_threads; ++i) {
    Fiber& f = w.fibers[i];
    if (f.state == FiberState::at_barrier) {
      f.state = FiberState::runnable;
      f.wait_site = nullptr;
    }
  }
  w.at_barrier = 0;
  w.barrier_site = nullptr;
}

void complete_collective(Worker& w, WarpState& ws, int warp) {
  ws.fn(ws);
  for (int lane = 0; lane < kWarpSize; ++lane) {
    if (ws.arrived & (1u << lane)) {
      Fiber& f = w.fibers[warp * kWarpSize + lane];
      if (&f != w.current) {
        f.state = FiberState::runnable;
        f.wait_site = nullptr;
      }
    }
  }
  ws.arrived = 0;
  ws.fn = nullptr;
  ws.what = nullptr;
}

void on_thread_exit() {
  Worker& w = worker();
  Fiber& me = *w.current;
  me.state = FiberState::exited;
  me.copies.clear();
  --w.live_threads;
  WarpState& ws = w.warps[me.warp];
  ws.live &= ~(1u << me.lane);
  unsigned expected = ws.mask & ws.live;
  if (ws.arrived && (ws.arrived & expected) == expected) complete_collective(w, ws, me.warp);
  if (w.at_barrier > 0 && w.at_barrier == w.live_threads) release_barrier(w);
}

std::string describe_waiting_threads(const Worker& w, int nthreads) {
  // Group consecutive threads that wait at the same place: "threads 0-31 at kernels/x.cuh:12".
  std::string out;
  int i = 0;
  while (i < nthreads) {
    const Fiber& f = w.fibers[i];
    if (f.state == FiberState::exited) { ++i; continue; }
    int j = i;
    while (j + 1 < nthreads && w.fibers[j + 1].state == f.state && w.fibers[j + 1].wait_site == f.wait_site) ++j;
    char line[256];
    std::snprintf(line, sizeof line, "\n    threads %d-%d wait %s %s", i, j,
                  f.state == FiberState::at_barrier ? "at __syncthreads" : "in", f.wait_site ? f.wait_site : "?");
    out += line;
    i = j + 1;
  }
  return out;
}

void run_block(Worker& w) {
  const dim3 bd = w.spec->block;
  const int n = static_cast<int>(bd.x * bd.y * bd.z);
  const size_t stack_bytes = fiber_stack_bytes();
  if (static_cast<int>(w.fibers.size()) < n) {
    size_t old = w.fibers.size();
    w.fibers.resize(n);
    for (size_t i = old; i < static_cast<size_t>(n); ++i) w.fibers[i].stack = map_stack(stack_bytes);
  }
  w.warps.assign((n + kWarpSize - 1) / kWarpSize, WarpState{});
  w.block_threads = w.live_threads = n;
  w.at_barrier = 0;
  w.barrier_site = nullptr;
  for (int i = 0; i < n; ++i) {
    Fiber& f = w.fibers[i];
    f.tid = make_uint3(i % bd.x, (i / bd.x) % bd.y, i / (bd.x * bd.y));
    f.lane = i % kWarpSize;
    f.warp = i / kWarpSize;
    f.state = FiberState::runnable;
    f.wait_site = nullptr;
    f.copies.clear();
    f.next_group = 0;
    w.warps[f.warp].live |= 1u << f.lane;
    // Stagger stack tops so the fibers' hot frames do not all map to one cache set.
    size_t skew = static_cast<size_t>(i % 61) * 64;
#if defined(SIMT_UCONTEXT)
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack;
    f.context.uc_stack.ss_size = stack_bytes - skew;
    f.context.uc_link = nullptr;
    makecontext(&f.context, fiber_entry, 0);
#else
    f.context = boost::context::detail::make_fcontext(f.stack + stack_bytes - skew, stack_bytes - skew, fiber_entry);
#endif
  }
  w.order.resize(n);
  for (int i = 0; i < n; ++i) w.order[i] = w.schedule.kind == Schedule::reverse ? n - 1 - i : i;

  while (w.live_threads > 0) {
    if (w.schedule.kind == Schedule::random) std::shuffle(w.order.begin(), w.order.end(), w.rng);
    bool progressed = false;
    for (int i : w.order) {
      if (w.fibers[i].state == FiberState::runnable) {
        resume(w.fibers[i]);
        progressed = true;
      }
    }
    if (!progressed && w.live_threads > 0)
      die_in_block("deadlock: no CUDA thread of the block can run (a __syncthreads some threads never reach, or "
                   "a warp collective whose mask names threads that wait elsewhere)" +
                   describe_waiting_threads(w, n));
  }
}

// ---- the pool: the launching thread plus SIMT_THREADS-1 helpers take blocks in turn.
class Pool {
 public:
  static Pool& instance() {
    static Pool pool;
    return pool;
  }
  int size() const { return static_cast<int>(helpers_.size()) + 1; }

  void run(const LaunchSpec& spec) {
    if (getpid() != owner_pid_) {  // a forked child has no helper threads: run every block here
      next_block_.store(0);
      blocks_ = static_cast<size_t>(spec.grid.x) * spec.grid.y * spec.grid.z;
      schedule_ = read_schedule();
      check_barrier_sites_ = read_check_barrier_sites();
      run_blocks(spec);
      return;
    }
    const size_t blocks = static_cast<size_t>(spec.grid.x) * spec.grid.y * spec.grid.z;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      schedule_ = read_schedule();
      check_barrier_sites_ = read_check_barrier_sites();
      spec_ = &spec;
      next_block_.store(0);
      blocks_ = blocks;
      busy_ = static_cast<int>(helpers_.size());
      ++generation_;
    }
    wake_.notify_all();
    run_blocks(spec);
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return busy_ == 0; });
    spec_ = nullptr;
  }

 private:
  Pool() : owner_pid_(getpid()) {
    const char* e = std::getenv("SIMT_THREADS");
    int n = e ? std::atoi(e) : static_cast<int>(std::thread::hardware_concurrency());
    n = std::max(1, std::min(n, 64));
    for (int i = 1; i < n; ++i) helpers_.emplace_back([this] { helper_loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    for (auto& t : helpers_) t.join();
  }

  void helper_loop() {
    uint64_t seen = 0;
    for (;;) {
      const LaunchSpec* spec;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || generation_ != seen; });
        if (stopping_) return;
        seen = generation_;
        spec = spec_;
      }
      run_blocks(*spec);
      std::lock_guard<std::mutex> lock(mutex_);
      if (--busy_ == 0) done_.notify_all();
    }
  }

  void run_blocks(const LaunchSpec& spec) {
    Worker& w = worker();
    w.spec = &spec;
    w.schedule = schedule_;
    w.check_barrier_sites = check_barrier_sites_;
    gridDim = spec.grid;
    blockDim = spec.block;
    // Exactly the requested size, so AddressSanitizer sees an access past the end.
    w.dynamic_smem = spec.dynamic_smem
                         ? static_cast<unsigned char*>(::operator new(spec.dynamic_smem, std::align_val_t(128)))
                         : nullptr;
    for (;;) {
      size_t b = next_block_.fetch_add(1);
      if (b >= blocks_) break;
      blockIdx = make_uint3(b % spec.grid.x, (b / spec.grid.x) % spec.grid.y,
                            b / (static_cast<size_t>(spec.grid.x) * spec.grid.y));
      if (spec.dynamic_smem) std::memset(w.dynamic_smem, 0xFF, spec.dynamic_smem);  // NaN as float and bf16
      w.rng.seed(w.schedule.seed * 0x9E3779B97F4A7C15ull + b);
      run_block(w);
    }
    if (w.dynamic_smem) ::operator delete(w.dynamic_smem, std::align_val_t(128));
    w.dynamic_smem = nullptr;
    w.spec = nullptr;
  }

  const pid_t owner_pid_;
  std::vector<std::thread> helpers_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const LaunchSpec* spec_ = nullptr;
  Schedule schedule_;
  bool check_barrier_sites_ = true;
  std::atomic<size_t> next_block_{0};
  size_t blocks_ = 0;
  int busy_ = 0;
  uint64_t generation_ = 0;
  bool stopping_ = false;
};

}  // namespace

int worker_count() { return Pool::instance().size(); }

std::string describe_kernel(const void* kernel) { return kernel_name(kernel); }

void execute_launch(const LaunchSpec& spec) {
  if (worker().spec) {
    std::fprintf(stderr, "simt: kernel %s launched from inside kernel %s (dynamic parallelism is not supported)\n",
                 kernel_name(spec.kernel).c_str(), kernel_name(worker().spec->kernel).c_str());
    std::abort();
  }
  Pool::instance().run(spec);
}

// ---- device-side services
void syncthreads(const char* site) {
  Worker& w = worker();
  Fiber& me = *w.current;
  if (w.at_barrier == 0) {
    w.barrier_site = site;
  } else if (w.check_barrier_sites && std::strcmp(w.barrier_site, site) != 0) {
    die_in_block(std::string("threads of one block wait at different __syncthreads: ") + w.barrier_site + " and " +
                 site + " (set SIMT_BARRIER_SITES=0 if this is intended)");
  }
  if (++w.at_barrier == w.live_threads) {  // the last thread releases the others without a switch
    release_barrier(w);
    return;
  }
  me.state = FiberState::at_barrier;
  me.wait_site = site;
  switch_to_scheduler(false);
}

void warp_collective(unsigned mask, const char* what, CollectiveFn fn, int param, const void* in, size_t in_bytes,
                     void* out, size_t out_bytes, int src_lane) {
  Worker& w = worker();
  if (!w.current) {
    std::fprintf(stderr, "simt: %s called outside a kernel\n", what);
    std::abort();
  }
  Fiber& me = *w.current;
  WarpState& ws = w.warps[me.warp];
  if (!(mask & (1u << me.lane)))
    die_in_block(std::string(what) + ": the calling lane is not in the mask");
  if (ws.arrived == 0) {
    ws.mask = mask;
    ws.fn = fn;
    ws.param = param;
    ws.what = what;
  } else if (ws.mask != mask || ws.fn != fn || ws.param != param) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "divergent warp collective in warp %d: %s (mask %08x) and %s (mask %08x)", me.warp,
                  ws.what, ws.mask, what, mask);
    die_in_block(buf);
  }
  if (in_bytes) std::memcpy(ws.in[me.lane], in, in_bytes);
  ws.src_lane[me.lane] = src_lane;
  ws.arrived |= 1u << me.lane;
  unsigned expected = mask & ws.live;
  if ((ws.arrived & expected) == expected) {
    complete_collective(w, ws, me.warp);
  } else {
    me.state = FiberState::in_collective;
    me.wait_site = what;
    switch_to_scheduler(false);
  }
  if (out_bytes) std::memcpy(out, ws.out[me.lane], out_bytes);
}

// Every thread of a launch over the bound returns at once, so the kernel has no effect; block
// (0,0,0), which every launch runs, reports it.
bool within_launch_bounds(int max_threads_per_block) {
  const Worker& w = worker();
  const dim3 b = w.spec->block;
  if (static_cast<long long>(b.x) * b.y * b.z <= max_threads_per_block) return true;
  if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && w.current == &w.fibers[0])
    launch_refused(*w.spec, cudaErrorLaunchOutOfResources, "more threads per block than the kernel's __launch_bounds__");
  return false;
}

int lane_id() { return worker().current->lane; }
unsigned live_lanes() {
  Worker& w = worker();
  return w.warps[w.current->warp].live;
}
void* dynamic_shared_memory() { return worker().dynamic_smem; }

// A source lane that is not in the mask, has exited or lies beyond the block returns an undefined
// value on a GPU (CUDA C++ Programming Guide, "Warp Shuffle Functions": "If the target thread is
// inactive, the retrieved value is undefined"): stopped here. The documented own-value cases
// (a xor partner in a later segment, up/down past the segment) never get here: simt.h already
// made the source the caller itself.
void gather_fn(WarpState& ws) {
  for (int lane = 0; lane < kWarpSize; ++lane) {
    if (!(ws.arrived & (1u << lane))) continue;
    const int src = ws.src_lane[lane];
    if (src < 0 || src >= kWarpSize || !(ws.arrived & (1u << src))) {
      char buf[224];
      std::snprintf(buf, sizeof buf,
                    "%s: lane %d of warp %d reads lane %d, which does not take part (mask %08x, taking part %08x): "
                    "its value is undefined on a GPU",
                    ws.what, lane, worker().current->warp, src, ws.mask, ws.arrived);
      die_in_block(buf);
    }
    std::memcpy(ws.out[lane], ws.in[src], kLanePayload);
  }
}

void ballot_fn(WarpState& ws) {
  unsigned bits = 0;
  for (int lane = 0; lane < kWarpSize; ++lane)
    if ((ws.arrived & (1u << lane)) && ws.in[lane][0]) bits |= 1u << lane;
  for (int lane = 0; lane < kWarpSize; ++lane) std::memcpy(ws.out[lane], &bits, sizeof bits);
}

void nop_fn(WarpState&) {}

// ---- cp.async: copies wait in the issuing thread until a wait covers their group.
void cp_async_enqueue(void* dst, const void* src, size_t bytes) {
  worker().current->copies.push_back({dst, src, bytes, -1});
}
void cp_async_commit_group() {
  Fiber& me = *worker().current;
  for (PendingCopy& c : me.copies)
    if (c.group < 0) c.group = me.next_group;
  ++me.next_group;
}
void cp_async_wait_groups(int keep_in_flight) {
  Fiber& me = *worker().current;
  int complete_below = me.next_group - keep_in_flight;
  auto done = [&](const PendingCopy& c) { return c.group >= 0 && c.group < complete_below; };
  for (const PendingCopy& c : me.copies)
    if (done(c)) std::memcpy(c.dst, c.src, c.bytes);
  me.copies.erase(std::remove_if(me.copies.begin(), me.copies.end(), done), me.copies.end());
}

void kernel_fault(cudaError_t err, const char* what, const void* address) {
  Worker& w = worker();
  report_kernel_fault(err, what, address, w.spec ? w.spec->kernel : nullptr);
}

}  // namespace simt
