// config.h — every training option: one table (kFlags) drives command-line parsing, JSON
// config files and --help, so the three cannot drift apart.
//
// Command line: GNU-style long flags, `--flag value` or `--flag=value`, each flag at most once.
// `--config FILE` reads a JSON object whose keys are the flag names without the dashes
// ({"lr": 3e-4, "lr-schedule": "wsd"}), each key at most once; flags on the command line
// override the file. The file must be a regular file of at most 1 MiB (kMaxConfigBytes). A repeated flag or key is an error: one of the two values would be
// dropped without a word.
// Every bad input is a std::invalid_argument with one line naming the flag, key or file
// and what was expected.
#pragma once
#include "src/config/model_config.h"
#include "src/config/lr_schedule.h"

#include <nlohmann/json_fwd.hpp>

#include <cmath>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

// The largest --config file: a JSON object of flag values is a few KiB; a larger "file" is a mistake
// (a log, a data shard, a device that never ends).
constexpr long long kMaxConfigBytes = 1 << 20;

// The largest --gpu-memory (GiB): 1 PiB, far above any device, and its bytes fit a size_t.
constexpr double kMaxGpuMemoryGiB = 1048576.0;

struct TrainConfig {
  // data
  std::string train_data = "data/default/*_train_*.bin";
  std::string val_data = "data/default/*_val_*.bin";
  bool shuffle = true;
  long long seed = 1337;
  // model
  std::string init_from;  // an llm.c model file or a Hugging Face Llama directory
  std::string model = "d12";
  std::string dtype = "bf16";
  // batch
  int batch_size = 8;
  int seq_len = 1024;
  int max_seq_len = 0;  // with --model: the preset's maximum sequence length replaced (0: the preset's)
  long long total_batch_tokens = 0;  // 0: batch_size·seq_len·ranks (no accumulation)
  int recompute = 1;                 // activation recomputation 0..3 (activations.h: kRecomputeDefault)
  std::string attention = "auto";    // attention kernel (attention.h: choose_attention)
  // FP8 products (src/model/fp8_state.h)
  bool fp8 = false;
  std::string fp8_scaling = "delayed";
  int fp8_amax_history = 16;
  int fp8_margin = 0;
  // Mixture of experts (src/model/expert_mlp.h, docs/MOE.md); 0 / "": the model's
  int moe_experts = 0;
  int moe_top_k = 0;
  std::string moe_router;
  double moe_aux_loss_coef = 0.0;  // only when set: the model's otherwise
  double moe_bias_rate = 1e-3;     // the sigmoid router's expert-bias step per optimizer step
  bool moe_balanced_routing = false;
  // optimizer and schedule
  double lr = 6e-4;
  std::string lr_schedule = "cosine";
  long long warmup_steps = 100;
  double final_lr_frac = 0.1;
  double weight_decay = 0.0;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double adam_eps = 1e-8;
  double grad_clip = 1.0;
  // run
  long long max_steps = 1000;  // 0: evaluate the model on --val-data and exit, writing nothing
  long long val_every = 100;
  long long val_steps = 20;
  std::string out_dir = "out";
  std::string export_hf;  // a Hugging Face Llama directory written after the final model.bin
  std::string save_dtype;  // storage of the final DIR/model.bin; "": the run's dtype
  std::string config_file;
  // data parallel
  int zero = 0;
  int zero3_prefetch = kDefaultZero3Prefetch;
  int tp = 1;                      // tensor-parallel group size (src/dist/parallel_groups.h)
  bool sequence_parallel = true;   // with tp > 1: the LayerNorm/residual region split too
  int pp = 1;                          // pipeline stages (src/dist/parallel_groups.h, pipeline_stages.h)
  std::string pp_schedule = "1f1b";    // src/dist/pipeline_schedule.h's kinds
  int pp_virtual = 1;                  // model chunks per pipeline rank (interleaved only)
  std::vector<int> pp_layers;          // layers per pipeline rank; empty: balanced by cost
  std::vector<int> pp_recompute;       // --recompute per pipeline rank; empty: --recompute on every one
  int cp = 1;                          // context-parallel group size: each sequence split over it (zigzag)
  int ep = 1;                          // expert-parallel group size (src/model/expert_parallel.h, docs/MOE.md)
  double bucket_mib = kDefaultBucketMiB;
  std::string rendezvous;
  double comm_timeout = 600.0;  // every wait for the other ranks (start-up, each collective)
  // checkpoints and bad-step guards (src/ckpt/checkpoint.h, src/model/step_guards.h)
  long long checkpoint_every = 0;  // 0: only the final checkpoint (last step or signal)
  bool save = true;                // checkpoints and the final model.bin; false: a measurement run
  long long keep_checkpoints = 3;  // 0: keep all
  long long keep_every = 0;        // 0: none kept for good
  std::string resume;              // "", "auto" or a checkpoint directory
  bool overwrite = false;          // a new history may replace what --out-dir holds (src/ckpt/out_dir_history.h)
  double skip_loss_z = 0.0;        // 0: off
  double skip_norm_z = 0.0;        // 0: off
  // HellaSwag evaluation (src/data/hellaswag.h) and MFU (src/run/throughput.h)
  std::string eval_data;       // "": none
  long long eval_every = 0;    // 0: never during training
  bool eval = false;           // evaluate --eval-data on the model and exit, writing nothing
  std::string eval_losses;     // with --eval: each example's completion losses (JSON lines)
  double peak_tflops = 0.0;    // 0: from the device name (src/run/throughput.h's table)
  long long profile = 0;  // --profile N: train N steps, then the device work per call site (src/run/profile_report.h)
  // Memory planner (src/run/memory_plan.h)
  bool plan = false;           // print the per-rank device memory plan and exit
  double gpu_memory = 0.0;     // GiB; 0: the device's (free memory before a run, total for --plan)
  int world_size = 0;          // --plan for this many ranks; 0: the run's
  std::string pp_timeline;     // with --plan and --pp: the schedule's timeline written here as JSON
  // Text generation (src/gen/generate.h, src/gen/sample_text.h)
  bool generate = false;       // print the prompt and its continuation, then exit, writing nothing
  std::string prompt;          // "": start from <|endoftext|>
  int max_new_tokens = 64;
  double temperature = 1.0;    // 0: greedy
  int top_k = 40;              // 0: the whole vocabulary
  std::string vocab_dir = "data/gpt2_bpe";
  long long sample_every = 0;  // 0: no samples during training

  // Flag names given on the command line or in the config file (not left at the default).
  std::set<std::string> explicitly_set;
  bool was_set(const std::string& name) const { return explicitly_set.count(name) != 0; }
};

// The --recompute of pipeline rank `stage`: its --pp-recompute value, else --recompute.
inline int stage_recompute(const TrainConfig& cfg, int stage) {
  return cfg.pp_recompute.empty() ? cfg.recompute : cfg.pp_recompute[stage];
}

// Allowed interval for a numeric flag.
struct Range {
  double lo, hi;
  bool lo_open, hi_open;
  Range(double lo_ = -HUGE_VAL, double hi_ = HUGE_VAL, bool lo_open_ = false, bool hi_open_ = false)
      : lo(lo_), hi(hi_), lo_open(lo_open_), hi_open(hi_open_) {}
  bool contains(double v) const {
    return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
  }
};

// A std::vector<int> flag is a comma-separated list ("4,4,5"; in JSON also an array of integers),
// each entry within the flag's range.
using FlagField = std::variant<std::string TrainConfig::*, bool TrainConfig::*, int TrainConfig::*,
                               long long TrainConfig::*, double TrainConfig::*, std::vector<int> TrainConfig::*>;

struct Flag {
  const char* name;      // without the leading "--"; also the JSON key
  const char* metavar;   // what the value looks like, for --help
  const char* help;
  FlagField field;
  Range range;                       // numeric flags
  std::vector<std::string> choices;  // text flags with a fixed set of values (empty: any text)
  const char* default_text;  // --help's default when the field's value would mislead
  bool command_line_only;    // not accepted as a JSON key

  Flag(const char* name_, const char* metavar_, const char* help_, FlagField field_, Range range_ = {},
       std::vector<std::string> choices_ = {}, const char* default_text_ = nullptr, bool command_line_only_ = false)
      : name(name_), metavar(metavar_), help(help_), field(field_), range(range_), choices(std::move(choices_)),
        default_text(default_text_), command_line_only(command_line_only_) {}
};

const std::vector<Flag>& flag_table();

const Flag* find_flag(const std::string& name);

namespace config_detail {

// A number as --help and the summary print it: inf, max, an integer, or 10 significant digits.
std::string format_number(double v);

// A flag's value in cfg as text (--help's default, the start-up summary, the manifest).
std::string value_text(const TrainConfig& cfg, const Flag& flag);

}  // namespace config_detail

// The run's flags as the manifest records them ({"lr": "0.0006", ...}); "model" is "-" when the
// architecture came from --init-from.
nlohmann::json config_json(const TrainConfig& cfg);

// Applies a JSON config file (an object of flag values) to cfg.
void apply_config_file(TrainConfig& cfg, const std::string& path);

struct ParsedArgs {
  TrainConfig config;
  bool help = false;
};

// Parses argv (argv[0] is the program). Reads --config first, then applies the other flags
// in order. Checks each value and that no flag is given twice; cross-flag checks are
// validate_config's.
ParsedArgs parse_args(int argc, const char* const* argv);
