// comm_watchdog.h — the watchdog of one communicator (each of comm.h's communicators has its own):
// which collectives are in flight (what they carry, at which step, since when), the lock every
// NCCL call on the communicator takes, and a host thread that ends the process when communication
// stalls or fails.
//
// The communicator is non-blocking (comm.h): an NCCL call may return ncclInProgress (NCCL's own
// thread is still enqueueing it), and then ncclCommGetAsyncError is polled until it reports the
// call's end: at once and, yielding the core between polls, for up to kSpin, where NCCL usually
// finishes; only a call still in progress after that (a set-up, a late peer on the CPU build's
// stand-in) is polled with sleeps that grow to a millisecond. A collective thus costs the host
// its polls and no sleep: with hundreds of tensor-parallel collectives per micro-step, a sleep
// of 20 us to 1 ms each would cost tens of milliseconds of host time per step (settle_counts()
// counts the host time and the sleeps). Every collective is registered before it is issued, and
// an event is recorded after it on the communication stream. Every 100 ms the watchdog thread asks
// ncclCommGetAsyncError and the oldest unfinished collective's event. When NCCL reports an error,
// or a collective (or the communicator's set-up) has not finished --comm-timeout seconds after it
// was issued, the thread prints one line that names the communicator as start() was told, e.g.
//   rank 1: all-reduce of gradients at step 7 did not finish within 600 s (--comm-timeout); aborting
//   rank 3 (tensor-parallel rank 1 of 2): all-reduce of activations at step 7 failed: ...; aborting
// calls ncclCommAbort (which also ends the NCCL kernels a GPU is stuck in) and ends the process
// with exit status 1; the launcher then ends the other ranks (mpirun does; srun with
// --kill-on-bad-exit=1), or their own watchdogs do. A collective is timed from when the host
// issued it, so the GPU work queued before it on the streams counts too.
#pragma once
#include "kernels/common.cuh"
#include "src/dist/rendezvous.h"

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

// The host's waits for non-blocking NCCL calls to leave ncclInProgress (CommWatchdog::settle).
struct SettleCounts {
  long long in_progress = 0;  // calls that returned ncclInProgress
  long long sleeps = 0;       // sleeps while polling them
  double seconds = 0.0;       // host time from their return to their end
};

class CommWatchdog {
 public:
  static constexpr int kExitStatus = 1;
  // How long a call in progress is polled without sleeping: kSpin, and at least kSpinPolls polls
  // (on a loaded host a yield hands the core to the peers the call waits for, and may take longer
  // than kSpin; sleeping then would only add the sleep).
  static constexpr auto kSpin = std::chrono::microseconds(500);
  static constexpr int kSpinPolls = 256;

  explicit CommWatchdog(double timeout_seconds) : timeout_seconds_(timeout_seconds) {}
  CommWatchdog(const CommWatchdog&) = delete;
  CommWatchdog& operator=(const CommWatchdog&) = delete;
  ~CommWatchdog() {
    stop();
    for (const InFlight& work : in_flight_)
      if (work.done != nullptr) cudaEventDestroy(work.done);
    for (cudaEvent_t e : spare_events_) cudaEventDestroy(e);
  }

  // Starts the thread that watches `comm` (once its handle exists, possibly still being set up);
  // `who` opens its messages ("rank 3", "rank 3 (tensor-parallel rank 1 of 2)").
  // The thread works on the calling thread's device: a thread of its own would otherwise open a
  // context on device 0, on every rank of a node.
  void start(ncclComm_t comm, std::string who) {
    comm_ = comm;
    who_ = std::move(who);
    int device = 0;
    cuda_check(cudaGetDevice(&device), "the watchdog's device");
    thread_ = std::thread([this, device] {
      cudaSetDevice(device);
      watch();
    });
  }
  // Ends the thread (before the communicator is destroyed).
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  // Registers the collective about to be issued ("all-reduce of gradients at step 7").
  void begin(std::string what) {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.push_back(InFlight{std::move(what), Clock::now(), nullptr, false});
  }
  // The registered collective was issued on `stream`: it has finished once what is queued there
  // now has.
  void issued(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(mutex_);
    cudaEvent_t done = nullptr;
    if (spare_events_.empty()) {
      cuda_check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "creating a watchdog event");
    } else {
      done = spare_events_.back();
      spare_events_.pop_back();
    }
    cuda_check(cudaEventRecord(done, stream), "recording a watchdog event");
    in_flight_.back().done = done;
  }
  // The registered work has finished on the host (the communicator's set-up), or its call failed
  // (the caller reports that error).
  void finished() {
    std::lock_guard<std::mutex> lock(mutex_);
    in_flight_.back().host_done = true;
  }

  // Runs one NCCL call on the watched communicator under the lock the watchdog's own calls take,
  // then settles it.
  template <typename Call>
  ncclResult_t run(Call&& call) {
    ncclResult_t status;
    {
      std::lock_guard<std::timed_mutex> lock(nccl_mutex_);
      status = call();
    }
    return settle(status);
  }
  // While a call's status is ncclInProgress, polls ncclCommGetAsyncError: at once, then yielding
  // the core between polls for kSpin and kSpinPolls polls, then with sleeps that grow to a
  // millisecond; returns the
  // final status. Once the watchdog has fired it never returns: the process is ending.
  ncclResult_t settle(ncclResult_t status) {
    if (status != ncclInProgress) return status;
    const Clock::time_point since = Clock::now();
    ++settle_counts_.in_progress;
    auto pause = std::chrono::microseconds(20);
    for (int polls = 1;; ++polls) {
      wait_if_fired();
      {
        std::lock_guard<std::timed_mutex> lock(nccl_mutex_);
        const ncclResult_t polled = ncclCommGetAsyncError(comm_, &status);
        if (polled != ncclSuccess) status = polled;
      }
      if (status != ncclInProgress) break;
      if (polls < kSpinPolls || Clock::now() - since < kSpin) {
        std::this_thread::yield();
        continue;
      }
      ++settle_counts_.sleeps;
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
    settle_counts_.seconds += rendezvous::seconds_since(since);
    return status;
  }
  // Since construction or the last reset (= {}); the calling thread's (the one issuing NCCL calls).
  SettleCounts& settle_counts() { return settle_counts_; }

  // After the watchdog fired, an NCCL call may fail because the communicator was aborted under
  // it: the caller waits here for the exit instead of reporting that as an error of its own.
  void wait_if_fired() const {
    while (fired_.load()) std::this_thread::sleep_for(std::chrono::seconds(1));
  }

 private:
  using Clock = std::chrono::steady_clock;
  static constexpr auto kPoll = std::chrono::milliseconds(100);

  struct InFlight {
    std::string what;
    Clock::time_point since;
    cudaEvent_t done;  // recorded after the collective; nullptr while it is being issued
    bool host_done;
  };

  // With mutex_ held: drops the finished collectives, keeping their events for reuse.
  void forget_finished() {
    for (auto it = in_flight_.begin(); it != in_flight_.end();) {
      const bool finished = it->host_done || (it->done != nullptr && cudaEventQuery(it->done) != cudaErrorNotReady);
      if (!finished) {
        ++it;
        continue;
      }
      if (it->done != nullptr) spare_events_.push_back(it->done);
      it = in_flight_.erase(it);
    }
  }

  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      wake_.wait_for(lock, kPoll);
      if (stopping_) break;
      forget_finished();
      std::string oldest = in_flight_.empty() ? "communication" : in_flight_.front().what;
      const double age = in_flight_.empty() ? 0.0 : rendezvous::seconds_since(in_flight_.front().since);
      lock.unlock();
      ncclResult_t async_error = ncclSuccess;
      {
        std::lock_guard<std::timed_mutex> nccl_lock(nccl_mutex_);
        if (ncclCommGetAsyncError(comm_, &async_error) != ncclSuccess) async_error = ncclInternalError;
      }
      if (async_error != ncclSuccess && async_error != ncclInProgress)
        fire(oldest + " failed: " + ncclGetErrorString(async_error) + " (" + ncclGetLastError(comm_) + ")");
      if (age > timeout_seconds_)
        fire(oldest + " did not finish within " + rendezvous::timeout_text(timeout_seconds_) + " (--comm-timeout)");
      lock.lock();
    }
  }

  // One line, the communicator aborted, the process ended. Nothing stuck inside NCCL may keep
  // the process alive: the abort waits at most a second for the lock, and the exit comes after
  // ten seconds even if the abort itself does not return.
  [[noreturn]] void fire(const std::string& what) {
    fired_.store(true);
    std::fprintf(stderr, "%s: %s; aborting\n", who_.c_str(), what.c_str());
    std::fflush(stderr);
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      std::_Exit(kExitStatus);
    }).detach();
    std::unique_lock<std::timed_mutex> nccl_lock(nccl_mutex_, std::chrono::seconds(1));
    ncclCommAbort(comm_);
    std::_Exit(kExitStatus);
  }

  const double timeout_seconds_;
  ncclComm_t comm_ = nullptr;
  std::string who_;
  std::timed_mutex nccl_mutex_;  // every NCCL call on comm_
  std::mutex mutex_;             // what follows
  std::condition_variable wake_;
  bool stopping_ = false;
  std::deque<InFlight> in_flight_;
  std::vector<cudaEvent_t> spare_events_;
  std::atomic<bool> fired_{false};
  SettleCounts settle_counts_;
  std::thread thread_;
};
