// profile_report.h — --profile's report: the device work of the profiled training steps per kernel
// and cuBLASLt call site (kernels/profile.cuh's record), as a table on stdout and DIR/profile.json,
// next to the code's own plan of launch counts (what test/checks/profile.sh holds the record to).
// (kernels/profile.cuh comes with common.cuh, which it needs.)
#pragma once
#include "kernels/common.cuh"
#include "src/base/durable_file.h"
#include "src/dist/comm.h"
#include "src/run/throughput.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

// What the code plans to launch per step, for checks against the record.
struct ProfilePlan {
  int grad_accum_steps = 1;       // micro-steps per optimizer step
  int lm_head_chunks = 1;         // lm-head chunks per micro-step: its products and classifier launches each
  int lm_head_chunk_rows = 0;     // rows per chunk (the memory plan's choice)
  int adamw_launches_per_step = 1;  // one per parameter dtype: the model has one
  int encoder_backward_launches = 0;  // per micro-step: its segments, their combination, wpe
};

// The record of `steps` profiled optimizer steps (step_ms: their mean wall time) as JSON: one
// entry per site, heaviest first, with launches per optimizer step and per micro-step, time per
// step, share of the profiled device time, bytes and FLOPs per call, and achieved rates, against
// `peak` where the device is known. `device`: cudaDeviceProp::name; the times are CUDA events',
// which simt records on the host: on the CPU build they are CPU time, and the report says so.
inline nlohmann::json profile_json(const std::vector<ProfileSite>& sites, long long steps, double step_ms,
                                   const ProfilePlan& plan, const std::string& device,
                                   const std::optional<Peak>& peak) {
  const bool cpu = device.rfind("simt", 0) == 0;
  double total_ms = 0;
  for (const ProfileSite& s : sites) total_ms += s.ms;
  std::vector<ProfileSite> order(sites);
  std::stable_sort(order.begin(), order.end(), [](const ProfileSite& a, const ProfileSite& b) { return a.ms > b.ms; });
  nlohmann::json out;
  out["device"] = device;
  out["time"] = cpu ? "CPU time (CPU build: simt runs each kernel on the host; its CUDA events time that)"
                    : "GPU time from CUDA events around each launch";
  out["profiled_steps"] = steps;
  out["step_ms"] = step_ms;
  out["device_ms_per_step"] = total_ms / static_cast<double>(steps);
  if (peak) out["peak"] = {{"gpu", peak->gpu}, {"tflops", peak->tflops}, {"memory_gbs", peak->memory_gbs}};
  out["plan"] = {{"grad_accum_steps", plan.grad_accum_steps},
                 {"lm_head_chunks_per_micro_step", plan.lm_head_chunks},
                 {"lm_head_chunk_rows", plan.lm_head_chunk_rows},
                 {"adamw_launches_per_step", plan.adamw_launches_per_step},
                 {"encoder_backward_launches_per_micro_step", plan.encoder_backward_launches}};
  nlohmann::json list = nlohmann::json::array();
  for (const ProfileSite& s : order) {
    const double per_step = static_cast<double>(s.calls) / static_cast<double>(steps);
    nlohmann::json e = {{"site", s.name},
                        {"launches_per_step", per_step},
                        {"launches_per_micro_step", per_step / plan.grad_accum_steps},
                        {"ms_per_step", s.ms / static_cast<double>(steps)},
                        {"percent", total_ms > 0 ? 100.0 * s.ms / total_ms : 0.0},
                        {"bytes_per_call", s.bytes / static_cast<double>(s.calls)},
                        {"flops_per_call", s.flops / static_cast<double>(s.calls)}};
    if (s.ms > 0 && s.bytes > 0) e["gb_per_s"] = s.bytes / (s.ms * 1e6);
    if (s.ms > 0 && s.flops > 0) e["tflop_per_s"] = s.flops / (s.ms * 1e9);
    if (!cpu && peak && peak->memory_gbs > 0 && e.contains("gb_per_s"))
      e["percent_of_memory_peak"] = 100.0 * e["gb_per_s"].get<double>() / peak->memory_gbs;
    if (!cpu && peak && e.contains("tflop_per_s"))
      e["percent_of_tflops_peak"] = 100.0 * e["tflop_per_s"].get<double>() / peak->tflops;
    list.push_back(e);
  }
  out["sites"] = list;
  return out;
}

// --profile under pipeline parallelism: each stage's measured idle share of the profiled steps'
// wall time (1 - its device time / the step's: its bubble, and whatever else kept it idle), from
// the stage's first rank (`reports`: TP rank 0 of data-parallel replica 0), beside the schedule's
// unit-cost bubble (pipeline_check.h). A collective over `world`: every rank calls it.
inline nlohmann::json pipeline_profile_json(Communicator& world, int stages, int stage, bool reports,
                                            const std::vector<ProfileSite>& sites, long long steps, double step_ms,
                                            double planned_bubble) {
  std::vector<double> idle(stages, 0.0);
  double device_ms = 0;
  for (const ProfileSite& s : sites) device_ms += s.ms;
  if (reports && steps > 0 && step_ms > 0)
    idle[stage] = std::max(0.0, 1.0 - device_ms / static_cast<double>(steps) / step_ms);
  world.sum(idle);
  double mean = 0;
  for (double x : idle) mean += x / stages;
  return {{"stages", stages}, {"measured_idle_per_stage", idle}, {"measured_bubble", mean},
          {"planned_bubble", planned_bubble}};
}

// The report as a table (stdout).
inline void print_profile(const nlohmann::json& p) {
  std::printf("profile: %lld step(s), %.3f ms per step, %.3f ms of device work per step; %s\n",
              p["profiled_steps"].get<long long>(), p["step_ms"].get<double>(), p["device_ms_per_step"].get<double>(),
              p["time"].get<std::string>().c_str());
  std::printf("  %8s %8s %10s %6s %12s %12s %9s %9s  %s\n", "/step", "/micro", "ms/step", "%", "bytes/call",
              "FLOPs/call", "GB/s", "TFLOP/s", "site");
  for (const nlohmann::json& e : p["sites"]) {
    std::printf("  %8.2f %8.2f %10.3f %6.2f %12.4g %12.4g %9.1f %9.2f  %s\n", e["launches_per_step"].get<double>(),
                e["launches_per_micro_step"].get<double>(), e["ms_per_step"].get<double>(), e["percent"].get<double>(),
                e["bytes_per_call"].get<double>(), e["flops_per_call"].get<double>(), e.value("gb_per_s", 0.0),
                e.value("tflop_per_s", 0.0), e["site"].get<std::string>().c_str());
  }
  if (p.contains("pipeline")) {
    const nlohmann::json& q = p["pipeline"];
    std::printf("  pipeline: measured idle per stage");
    for (const nlohmann::json& x : q["measured_idle_per_stage"]) std::printf(" %.1f%%", 100.0 * x.get<double>());
    std::printf(" (mean %.1f%%); the schedule's bubble at unit costs %.1f%%\n", 100.0 * q["measured_bubble"].get<double>(),
                100.0 * q["planned_bubble"].get<double>());
  }
  std::fflush(stdout);
}

// DIR/profile.json, written atomically.
inline void write_profile(const std::string& path, const nlohmann::json& p) {
  const std::string text = p.dump(2) + "\n";
  AtomicFileWriter file(path);
  file.write(text.data(), text.size());
  file.commit();
}
