// profile.cuh — --profile's record of the device work: every kernel launch (launch() in
// common.cuh) and cuBLASLt product (matmul.cuh) by site — the kernel's name, or the product's
// label and shape — with its calls, its time between CUDA events recorded around it on its stream
// (on the CPU build simt records host time: the kernel's CPU time), and the bytes and FLOPs its
// launcher declares from the shapes. Off unless a run starts it: then one branch per launch.
// Included by common.cuh, after the CUDA runtime and the error checks it uses.
#pragma once
#include <cxxabi.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

// One site's work, summed over its calls since the profiler was cleared.
struct ProfileSite {
  std::string name;
  long long calls = 0;
  double ms = 0, bytes = 0, flops = 0;  // bytes and FLOPs: 0 where the launcher declares none
};

class DeviceProfiler {
 public:
  // The process's one profiler (launches come from everywhere: one per process, like the device).
  static DeviceProfiler& get() {
    static DeviceProfiler profiler;
    return profiler;
  }
  DeviceProfiler(const DeviceProfiler&) = delete;
  DeviceProfiler& operator=(const DeviceProfiler&) = delete;
  ~DeviceProfiler() {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }

  bool on() const { return on_; }
  void start() { on_ = true; }
  // Collects what is recorded, then records nothing more.
  void stop() {
    collect();
    on_ = false;
  }
  void clear() {
    collect();
    sites_.clear();
    index_.clear();
  }

  // The bytes moved and FLOPs of the next launch or product: its launcher knows the shapes.
  void declare(double bytes, double flops) {
    next_bytes_ = bytes;
    next_flops_ = flops;
  }

  // Around one launch or product on `stream`.
  void begin(const std::string& site, cudaStream_t stream) { begin_site(site, stream); }
  // A kernel's site is its function's name (demangled, without return type and parameters:
  // "adamw_kernel<__nv_bfloat16>").
  void begin_kernel(const void* kernel, cudaStream_t stream) { begin_site(kernel_name(kernel), stream); }
  void end(cudaStream_t stream) {
    cuda_check(cudaEventRecord(events_[pending_.back().first_event + 1], stream), "profile: recording an event");
  }

  // Waits for the recorded work and adds its times to the sites; the events are reused.
  void collect() {
    for (const Pending& p : pending_) {
      cuda_check(cudaEventSynchronize(events_[p.first_event + 1]), "profile: waiting for an event");
      float ms = 0;
      cuda_check(cudaEventElapsedTime(&ms, events_[p.first_event], events_[p.first_event + 1]), "profile: timing");
      sites_[p.site].ms += ms;
    }
    pending_.clear();
    used_ = 0;
  }

  // The sites in the order of their first call.
  const std::vector<ProfileSite>& sites() const { return sites_; }

  // While set (ProfileLabel), products are recorded under `label` rather than their shape: the
  // experts' products, whose row counts change with every routing, are one site each.
  void set_label(std::string label) { label_ = std::move(label); }
  const std::string& label() const { return label_; }

 private:
  DeviceProfiler() = default;

  struct Pending {
    size_t site, first_event;  // events first_event (before) and first_event + 1 (after)
  };

  void begin_site(const std::string& site, cudaStream_t stream) {
    const auto found = index_.find(site);
    const size_t s = found != index_.end() ? found->second : add_site(site);
    ProfileSite& p = sites_[s];
    ++p.calls;
    p.bytes += next_bytes_;
    p.flops += next_flops_;
    next_bytes_ = next_flops_ = 0;
    while (events_.size() < used_ + 2) {
      cudaEvent_t e;
      cuda_check(cudaEventCreate(&e), "profile: creating an event");
      events_.push_back(e);
    }
    pending_.push_back(Pending{s, used_});
    cuda_check(cudaEventRecord(events_[used_], stream), "profile: recording an event");
    used_ += 2;
  }

  size_t add_site(const std::string& name) {
    index_.emplace(name, sites_.size());
    sites_.push_back(ProfileSite{name});
    return sites_.size() - 1;
  }

  const std::string& kernel_name(const void* kernel) {
    const auto found = names_.find(kernel);
    if (found != names_.end()) return found->second;
    const char* raw = nullptr;
    std::string name;
    if (cudaFuncGetName(&raw, kernel) == cudaSuccess && raw != nullptr) {
      int status = 0;
      char* demangled = abi::__cxa_demangle(raw, nullptr, nullptr, &status);
      name = status == 0 && demangled != nullptr ? demangled : raw;
      std::free(demangled);
    } else {
      cudaGetLastError();  // not a fatal error: the kernel keeps an address for a name
      name = "kernel@" + std::to_string(reinterpret_cast<uintptr_t>(kernel));
    }
    // "void adamw_kernel<__nv_bfloat16>(AdamWSegment const*, ...)" -> "adamw_kernel<__nv_bfloat16>"
    int depth = 0;
    size_t end = name.size(), begin = 0;
    for (size_t i = 0; i < name.size(); ++i) {
      if (name[i] == '<') ++depth;
      else if (name[i] == '>') --depth;
      else if (name[i] == '(' && depth == 0) {
        end = i;
        break;
      } else if (name[i] == ' ' && depth == 0) begin = i + 1;
    }
    return names_.emplace(kernel, name.substr(begin, end - begin)).first->second;
  }

  bool on_ = false;
  std::string label_;
  double next_bytes_ = 0, next_flops_ = 0;
  std::vector<ProfileSite> sites_;
  std::map<std::string, size_t> index_;
  std::map<const void*, std::string> names_;
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
  std::vector<Pending> pending_;
};

// Runs `work` (one launch or product on `stream`), recorded as `site` (profiled: a name;
// profiled_kernel: the kernel's function) when the profiler is on.
template <typename Work>
void profiled(const std::string& site, cudaStream_t stream, Work&& work) {
  DeviceProfiler& p = DeviceProfiler::get();
  if (!p.on()) return work();
  p.begin(site, stream);
  work();
  p.end(stream);
}
template <typename Work>
void profiled_kernel(const void* kernel, cudaStream_t stream, Work&& work) {
  DeviceProfiler& p = DeviceProfiler::get();
  if (!p.on()) return work();
  p.begin_kernel(kernel, stream);
  work();
  p.end(stream);
}

// The products queued while it lives are one --profile site, `label` (DeviceProfiler::set_label).
class ProfileLabel {
 public:
  explicit ProfileLabel(std::string label) { DeviceProfiler::get().set_label(std::move(label)); }
  ProfileLabel(const ProfileLabel&) = delete;
  ProfileLabel& operator=(const ProfileLabel&) = delete;
  ~ProfileLabel() { DeviceProfiler::get().set_label(""); }
};

// Declares the bytes and FLOPs of the next launch or product (nothing when the profiler is off).
inline void profile_declare(double bytes, double flops = 0) {
  if (DeviceProfiler::get().on()) DeviceProfiler::get().declare(bytes, flops);
}
