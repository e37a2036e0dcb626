// config.cpp — the flag table, parsing of the command line and --config files, the configuration as JSON
#include "src/config/config.h"

#include "src/base/utf8_text.h"
#include "src/config/model_config.h"
#include "src/config/lr_schedule.h"

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <limits>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

// The largest value an fp32 holds: flags the optimizer and the sampler use as fp32 stay finite.
constexpr double kMaxFp32 = FLT_MAX;

const std::vector<Flag>& flag_table() {
  static const std::vector<Flag> flags = {
      {"config", "FILE", "JSON object of flag values (keys = flag names without '--'); command-line flags override it",
       &TrainConfig::config_file, {}, {}, "none", true},
      {"train-data", "GLOB", "training token shards (llm.c .bin format)", &TrainConfig::train_data},
      {"val-data", "GLOB", "validation token shards", &TrainConfig::val_data},
      {"shuffle", "0|1", "shuffle the training data (validation is never shuffled)", &TrainConfig::shuffle},
      {"seed", "N", "seed for weight init, data shuffling, stochastic rounding and sampling", &TrainConfig::seed, {0, (double)LLONG_MAX}},
      {"init-from", "FILE|DIR", "start from this model file (its header, GPT-2's or Llama 3's, defines the architecture), "
       "or a Hugging Face Llama or Mixtral directory (config.json and model.safetensors or its shards); excludes --model",
       &TrainConfig::init_from, {}, {}, "none (random init of --model)"},
      {"model", "PRESET", "architecture for random init: d12 d24 d36 d48 (GPT-2 124M..1.5B), gpt3-125m gpt3-350m "
       "gpt3-760m gpt3-2.7b gpt3-6.7b gpt3-175b (GPT-3's sizes, T up to 2048), micro, nano: GPT-2's vocabulary; "
       "llama3.2-1b llama3.2-3b llama3.1-8b llama3.1-70b llama3.1-405b (Meta's shapes), llama-micro, llama-nano: "
       "Llama 3's vocabulary (shards from tokenize --encoding llama3); moe-nano (4 experts, top-2), olmoe-1b-7b, "
       "mixtral-8x7b: mixtures of experts", &TrainConfig::model},
      {"dtype", "bf16|fp32", "storage type of parameters, activations and gradients", &TrainConfig::dtype, {}, {"bf16", "fp32"}},
      {"batch-size", "B", "sequences per micro-batch (per rank)", &TrainConfig::batch_size, {1, INT_MAX}},
      {"seq-len", "T", "tokens per sequence (at most the model's max sequence length)", &TrainConfig::seq_len, {1, INT_MAX}},
      {"max-seq-len", "N", "with --model: a fresh model of the preset with N positions (GPT-2: N rows of wpe; Llama 3: "
       "RoPE's table) instead of the preset's, e.g. for long sequences over --cp ranks",
       &TrainConfig::max_seq_len, {0, INT_MAX}, {}, "0 (the preset's)"},
      {"total-batch-tokens", "N",
       "tokens per optimizer step; a multiple of B*T*ranks, the rest is done by gradient accumulation",
       &TrainConfig::total_batch_tokens, {0, (double)LLONG_MAX}, {}, "B*T*ranks (no accumulation)"},
      {"recompute", "0|1|2|3",
       "activation memory vs compute: 0 keep every activation, 1 recompute the MLP activations (GELU or SwiGLU outputs), 2 also the norm outputs, "
       "3 keep only block inputs and rerun each block's forward in its backward (least memory, ~20% more compute)",
       &TrainConfig::recompute, {0, 3}},
      {"attention", "auto|flash|simple",
       "attention kernel: flash (tensor cores; bf16, head size C/NH of 16, 32, 64 or 128) or simple (CUDA cores; "
       "fp32 and every head size); auto picks flash wherever it can run",
       &TrainConfig::attention, {}, {"auto", "flash", "simple"}},
      {"fp8", "0|1", "the blocks' Linear products (QKV, attention output, MLP up/gate/down; not the LM head) in FP8 "
       "on cuBLASLt: E4M3 activations and weights, E5M2 gradients, bf16 results (sm_90 and newer; --dtype bf16)",
       &TrainConfig::fp8},
      {"fp8-scaling", "delayed|current", "FP8 per-tensor scales: delayed (from the amax history of past steps, "
       "reduced over the ranks) or current (from each cast's own amax, reduced over the tensor-parallel group)", &TrainConfig::fp8_scaling, {},
       {"delayed", "current"}},
      {"fp8-amax-history", "N", "with --fp8-scaling delayed: steps of amaxes a scale is computed from",
       &TrainConfig::fp8_amax_history, {1, 1024}},
      {"fp8-margin", "M", "FP8 scales leave 2^M of headroom below the format's largest value", &TrainConfig::fp8_margin,
       {0, 32}},
      {"moe-experts", "E", "with --model (Llama 3): E experts of H per MLP", &TrainConfig::moe_experts, {0, kMaxExperts}, {}, "0 (the preset's)"},
      {"moe-top-k", "K", "with --model: experts per token (1..E)", &TrainConfig::moe_top_k, {0, kMaxExperts}, {}, "0 (the preset's)"},
      {"moe-router", "softmax|sigmoid", "with --model: top-K of the softmax, gates renormalised (Mixtral), or of "
       "sigmoid + a balancing bias (E a multiple of 8, no aux loss)", &TrainConfig::moe_router, {}, {"softmax", "sigmoid"}, "the preset's"},
      {"moe-aux-loss-coef", "X", "softmax router: weight of the load-balancing loss E*sum(f_i*P_i) in the objective (0: none)",
       &TrainConfig::moe_aux_loss_coef, {0, kMaxFp32}, {}, "the model's (0.01 for --moe-experts)"},
      {"moe-bias-rate", "X", "sigmoid router: after each step, per layer bias += X*sign(mean load - load)", &TrainConfig::moe_bias_rate, {0, kMaxFp32}},
      {"moe-balanced-routing", "0|1", "timing only: row n's k-th expert is (n*K + k) mod E, whatever the router's "
       "scores (the gates still from them), to time a perfectly balanced step", &TrainConfig::moe_balanced_routing},
      {"lr", "X", "peak learning rate", &TrainConfig::lr, {0, kMaxFp32}},
      {"lr-schedule", "NAME", "cosine | linear | constant | wsd (warmup-stable-decay, decay over the last 20% of steps)",
       &TrainConfig::lr_schedule, {}, lr_schedule_names()},
      {"warmup-steps", "N", "steps of linear warmup from lr/N to lr", &TrainConfig::warmup_steps, {0, (double)LLONG_MAX}},
      {"final-lr-frac", "X", "learning rate at the last step, as a fraction of --lr", &TrainConfig::final_lr_frac, {0, 1}},
      {"weight-decay", "X", "AdamW weight decay (matrices and embeddings only)", &TrainConfig::weight_decay, {0, kMaxFp32}},
      {"beta1", "X", "AdamW beta1", &TrainConfig::beta1, {0, 1, false, true}},
      {"beta2", "X", "AdamW beta2", &TrainConfig::beta2, {0, 1, false, true}},
      {"adam-eps", "X", "AdamW epsilon", &TrainConfig::adam_eps, {0, kMaxFp32, true, false}},
      {"grad-clip", "X", "clip the global gradient norm to X (0 = off)", &TrainConfig::grad_clip, {0, kMaxFp32}},
      {"max-steps", "N", "optimizer steps to run (0 = only evaluate the model on --val-data and exit, writing nothing)",
       &TrainConfig::max_steps, {0, INT_MAX}},
      {"val-every", "N", "validate after every N-th step and after the last (0 = never)", &TrainConfig::val_every, {0, (double)LLONG_MAX}},
      {"val-steps", "N", "validation batches (B x T each) averaged per validation", &TrainConfig::val_steps,
       {1, (double)LLONG_MAX}},
      {"out-dir", "DIR", "where metrics.jsonl, the checkpoints and the final model.bin go; a run adds to the history "
       "it continues and never replaces another run's files unless --overwrite", &TrainConfig::out_dir},
      {"save-dtype", "bf16|fp32", "storage type of the final model file DIR/model.bin (checkpoints keep the run's)",
       &TrainConfig::save_dtype, {}, {"bf16", "fp32"}, "the run's --dtype"},
      {"export-hf", "DIR", "after the final model.bin, also write it (Llama 3 only, in --save-dtype) as a Hugging Face "
       "directory: config.json and model.safetensors, which transformers' LlamaForCausalLM loads",
       &TrainConfig::export_hf, {}, {}, "none"},
      {"zero", "0|1|2|3", "ZeRO stage with several ranks: 0 all-reduces gradients; 1 shards the AdamW state (moments, "
       "fp32 master weights) over the ranks; 2 also shards the gradients; 3 also shards the parameters, each bucket "
       "gathered just ahead of its layers", &TrainConfig::zero, {0, 3}},
      {"zero3-prefetch", "N", "at --zero 3: buckets of parameters gathered ahead of the one computing (N + 1 gather "
       "windows)", &TrainConfig::zero3_prefetch, {1, kMaxZero3Prefetch}},
      {"tp", "N", "tensor parallelism: each layer's matrices (whole heads, the MLP's hidden units, wte's vocabulary "
       "rows) split over groups of N consecutive ranks, data parallelism (and --zero) across the groups; N divides "
       "the ranks, NH and Vp/8", &TrainConfig::tp, {1, 1 << 16}},
      {"sequence-parallel", "0|1", "with --tp > 1: the LayerNorm/residual region holds 1/N of the token rows per "
       "rank (all-gathers and reduce-scatters around the split products) instead of all of them (all-reduces)",
       &TrainConfig::sequence_parallel, {}, {}, "1"},
      {"pp", "N", "pipeline parallelism: the layers cut into N stages (balanced by cost, or --pp-layers), --tp inside "
       "each stage, data parallelism (and --zero 0|1) across; N x --tp divides the ranks, and a step needs at least N "
       "micro-batches (--total-batch-tokens / (B*T*data-parallel ranks))", &TrainConfig::pp, {1, 1 << 16}},
      {"cp", "N", "context parallelism: each sequence of T tokens cut into 2N chunks, rank r of a group of N holding "
       "chunks r and 2N-1-r (equal causal work), K/V passed around the group (ring attention); N x --tp x --pp "
       "divides the ranks and 2N divides --seq-len", &TrainConfig::cp, {1, 1 << 16}},
      {"ep", "N", "expert parallelism (--moe-experts): each mixture layer's experts split over groups of N data-parallel "
       "ranks, E/N whole experts per rank, rows sent to their experts' ranks and back (all-to-all); N divides E and the ranks", &TrainConfig::ep, {1, 1 << 16}},
      {"pp-schedule", "NAME", "gpipe | 1f1b | interleaved | zb-h1: with --pp > 1, the order of each stage's work "
       "(zb-h1 splits each backward into input and weight gradients and needs --recompute 0, its default there)",
       &TrainConfig::pp_schedule, {}, {"gpipe", "1f1b", "interleaved", "zb-h1"}},
      {"pp-virtual", "V", "with --pp-schedule interleaved: model chunks per pipeline rank (V times less bubble)",
       &TrainConfig::pp_virtual, {1, 1 << 16}},
      {"pp-layers", "A,B,...", "layers per pipeline rank, first to last: --pp counts summing to the model's layers, each "
       "a multiple of --pp-virtual", &TrainConfig::pp_layers, {1, INT_MAX}, {}, "none (balanced by cost)"},
      {"pp-recompute", "A,B,...", "--recompute per pipeline rank, first to last (--pp values of 0..3; the first stages, "
       "which keep the most micro-batches in flight, may recompute more)", &TrainConfig::pp_recompute, {0, 3}, {},
       "none (--recompute on every stage)"},
      {"bucket-mib", "MIB", "gradients travel between ranks in buckets of about MIB MiB (whole layers, at least one), "
       "each sent as soon as its layers' backward is done", &TrainConfig::bucket_mib, {0, HUGE_VAL, true, false}},
      {"rendezvous", "file:PATH|tcp:HOST:PORT",
       "how ranks started without MPI (plain srun) exchange the NCCL id: a file on a shared filesystem or rank 0's "
       "TCP port", &TrainConfig::rendezvous, {}, {}, "none (mpirun, srun --mpi=pmix: MPI)"},
      {"comm-timeout", "SECONDS",
       "the longest a rank waits for the others: a start-up wait fails naming the missing ranks, a collective "
       "not finished by then aborts the run naming it and the step", &TrainConfig::comm_timeout, {0, HUGE_VAL, true, false}},
      {"save", "0|1", "write checkpoints and the final DIR/model.bin (0: a measurement that writes only metrics.jsonl "
       "and --profile's profile.json; a stop signal then ends the run with nothing to resume)", &TrainConfig::save, {},
       {}, "1"},
      {"checkpoint-every", "N",
       "write a checkpoint (DIR/checkpoint_<step>) after every N-th step; one is always written at the end (0 = only then)",
       &TrainConfig::checkpoint_every, {0, (double)LLONG_MAX}},
      {"keep-checkpoints", "K", "keep the newest K checkpoints, delete older ones (0 = keep all)",
       &TrainConfig::keep_checkpoints, {0, (double)LLONG_MAX}},
      {"keep-every", "M", "never delete checkpoints at steps that are multiples of M (0 = off)", &TrainConfig::keep_every,
       {0, (double)LLONG_MAX}},
      {"resume", "auto|DIR",
       "continue from the newest complete checkpoint in --out-dir (auto) or from checkpoint directory DIR",
       &TrainConfig::resume, {}, {}, "none (start fresh; refused if --out-dir holds another run's files)"},
      {"overwrite", "0|1",
       "a run that starts a new history in --out-dir may delete the checkpoints and replace the metrics.jsonl and "
       "model.bin another or an earlier run left there (without it: refused; '--overwrite' alone means 1)",
       &TrainConfig::overwrite},
      {"skip-loss-z", "X", "skip the update of a step whose loss is > X std above the recent mean (0 = off)",
       &TrainConfig::skip_loss_z, {0, HUGE_VAL}},
      {"skip-norm-z", "X", "skip the update of a step whose gradient norm is > X std above the recent mean (0 = off)",
       &TrainConfig::skip_norm_z, {0, HUGE_VAL}},
      {"eval-data", "FILE", "multiple-choice eval file (HellaSwag in llm.c's eval format; data/hellaswag.sh writes one)",
       &TrainConfig::eval_data, {}, {}, "none"},
      {"eval-every", "N", "evaluate --eval-data after every N-th step and after the last (0 = never)",
       &TrainConfig::eval_every, {0, (double)LLONG_MAX}},
      {"eval", "0|1",
       "only evaluate --eval-data on the model (--init-from, --resume's checkpoint or the random init): print the "
       "accuracy and exit, writing nothing ('--eval' alone means 1)", &TrainConfig::eval},
      {"eval-losses", "FILE", "with --eval: also write each example's completion losses to FILE, one JSON line each",
       &TrainConfig::eval_losses, {}, {}, "none"},
      {"peak-tflops", "X", "the GPU's dense bf16 peak (TFLOP/s) that MFU is measured against (0 = the table of known "
       "GPUs, matched on the device name)", &TrainConfig::peak_tflops, {0, HUGE_VAL}, {}, "0 (the table)"},
      {"profile", "N", "train N steps (in place of --max-steps), then print the device work of steps 2..N per kernel "
       "and cuBLASLt call site (launches, time, bytes, FLOPs) and write it to DIR/profile.json (0 = off)",
       &TrainConfig::profile, {0, INT_MAX}, {}, "0 (off)"},
      {"plan", "0|1", "print each rank's device memory by term and whether it fits, then exit without training (no "
       "GPU needed; '--plan' alone means 1)", &TrainConfig::plan},
      {"gpu-memory", "GiB", "device memory a rank may use: --plan's budget, and a run stops before allocating if its "
       "plan exceeds it (0 = the device's: free memory for a run, total for --plan)", &TrainConfig::gpu_memory,
       {0, kMaxGpuMemoryGiB}, {}, "0 (the device's)"},
      {"world-size", "N", "with --plan: plan for N ranks (ZeRO shards, batch per rank) (0 = the run's)",
       &TrainConfig::world_size, {0, 1 << 20}, {}, "0 (the run's)"},
      {"pp-timeline", "FILE", "with --plan and --pp: write the schedule's timeline at unit costs to FILE as JSON "
       "(dev/pipeline_timeline.py FILE -o FILE.png draws it)", &TrainConfig::pp_timeline, {}, {}, "none"},
      {"generate", "0|1", "print --prompt and its continuation by the model (--init-from or --resume), then exit "
       "writing nothing ('--generate' alone means 1)", &TrainConfig::generate},
      {"prompt", "TEXT", "text the model continues (--generate, --sample-every); a Llama 3 model's starts with BOS",
       &TrainConfig::prompt, {}, {}, "none (GPT-2: start from <|endoftext|>; Llama 3: from BOS)"},
      {"max-new-tokens", "N", "tokens to generate; the prompt and these must fit the model's context (max_seq_len)",
       &TrainConfig::max_new_tokens, {1, INT_MAX}},
      {"temperature", "X", "sampling temperature (0 = greedy: always the most likely token)", &TrainConfig::temperature,
       {0, kMaxFp32}},
      {"top-k", "K", "sample among the K most likely tokens (0 = the whole vocabulary)", &TrainConfig::top_k, {0, INT_MAX}},
      {"vocab-dir", "DIR", "the model's vocabulary for the prompt and the generated text: GPT-2's BPE files "
       "(encoder.json, vocab.bpe) or, for a 128,256-token model, Llama 3's tokenizer.model", &TrainConfig::vocab_dir, {},
       {}, "data/gpt2_bpe (Llama 3: data/llama3_bpe)"},
      {"sample-every", "N", "print and record (metrics.jsonl) a generated sample after every N-th step (0 = never)",
       &TrainConfig::sample_every, {0, (double)LLONG_MAX}},
  };
  return flags;
}

const Flag* find_flag(const std::string& name) {
  for (const Flag& f : flag_table())
    if (name == f.name) return &f;
  return nullptr;
}

namespace config_detail {

std::string format_number(double v) {
  if (v == HUGE_VAL) return "inf";
  if (v == static_cast<double>(LLONG_MAX)) return "max";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return std::to_string(static_cast<long long>(v));
  std::ostringstream s;
  s << std::setprecision(10) << v;
  return s.str();
}

// "an integer >= 1", "a number in [0, 1)", "a number > 0", "one of: bf16 fp32", ...
std::string expectation(const Flag& flag) {
  return std::visit(
      [&](auto member) -> std::string {
        using V = std::remove_reference_t<decltype(std::declval<TrainConfig&>().*member)>;
        if constexpr (std::is_same_v<V, std::string>) {
          if (flag.choices.empty()) return "a non-empty string";
          std::string s = "one of:";
          for (const auto& c : flag.choices) s += " " + c;
          return s;
        } else if constexpr (std::is_same_v<V, bool>) {
          return "0 or 1";
        } else if constexpr (std::is_same_v<V, std::vector<int>>) {
          const bool bounded = flag.range.hi < static_cast<double>(INT_MAX);
          return "a comma-separated list of integers " +
                 (bounded ? "from " + format_number(flag.range.lo) + " to " + format_number(flag.range.hi)
                          : ">= " + format_number(flag.range.lo));
        } else {
          const char* kind = std::is_same_v<V, double> ? "a number" : "an integer";
          const Range& r = flag.range;
          // A type's limit (LLONG_MAX, fp32's largest value) is no chosen bound: fp32's is said only
          // to a value beyond it (assign).
          bool has_lo = std::isfinite(r.lo),
               has_hi = std::isfinite(r.hi) && r.hi != static_cast<double>(LLONG_MAX) && r.hi != kMaxFp32;
          if (has_lo && has_hi)
            return std::string(kind) + " in " + (r.lo_open ? "(" : "[") + format_number(r.lo) + ", " +
                   format_number(r.hi) + (r.hi_open ? ")" : "]");
          if (has_lo) return std::string(kind) + (r.lo_open ? " > " : " >= ") + format_number(r.lo);
          if (has_hi) return std::string(kind) + (r.hi_open ? " < " : " <= ") + format_number(r.hi);
          return kind;
        }
      },
      flag.field);
}

bool parse_integer(const std::string& text, long long* out) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return false;
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

bool parse_real(const std::string& text, double* out) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return false;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

// Throws unless a command-line value is UTF-8 text (see invalid_utf8_offset), naming the flag.
void check_utf8(const std::string& value, const std::string& where) {
  const size_t at = invalid_utf8_offset(value);
  if (at == std::string::npos) return;
  char byte[8];
  std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned char>(value[at]));
  throw std::invalid_argument(where + ": not valid UTF-8 text (byte " + byte + " at offset " + std::to_string(at) +
                              "); every value is recorded in JSON files (metrics.jsonl, checkpoint manifests)");
}

// A value in its textual form plus the JSON it came from (null for command-line text).
struct RawValue {
  std::string text;
  const nlohmann::json* json = nullptr;
};

// Stores `raw` into cfg's field for `flag`; throws invalid_argument("<where>: expected ..., got ...").
void assign(TrainConfig& cfg, const Flag& flag, const RawValue& raw, const std::string& where) {
  const std::string shown = raw.json ? raw.json->dump() : "'" + raw.text + "'";
  auto bad = [&]() { return std::invalid_argument(where + ": expected " + expectation(flag) + ", got " + shown); };
  std::visit(
      [&](auto member) {
        using V = std::remove_cv_t<std::remove_reference_t<decltype(cfg.*member)>>;
        if constexpr (std::is_same_v<V, std::string>) {
          if (raw.json && !raw.json->is_string()) throw bad();
          if (!raw.json) check_utf8(raw.text, where);  // a JSON file's strings are UTF-8 already
          std::string v = raw.json ? raw.json->template get<std::string>() : raw.text;
          // Only a JSON file can carry one ("\u0000"); no path, choice or prompt text holds it.
          if (v.find('\0') != std::string::npos)
            throw std::invalid_argument(where + ": contains a NUL character (\\u0000 at offset " +
                                        std::to_string(v.find('\0')) + ")");
          if (v.empty() && !flag.command_line_only && std::string(flag.name) != "init-from") throw bad();
          if (!flag.choices.empty()) {
            bool known = false;
            for (const auto& c : flag.choices) known = known || c == v;
            if (!known) throw bad();
          }
          cfg.*member = v;
        } else if constexpr (std::is_same_v<V, bool>) {
          long long v = -1;
          if (raw.json) {
            if (raw.json->is_boolean()) v = raw.json->template get<bool>() ? 1 : 0;
            else if (raw.json->is_number_integer()) v = raw.json->template get<long long>();
          } else if (raw.text == "true") {
            v = 1;
          } else if (raw.text == "false") {
            v = 0;
          } else if (!parse_integer(raw.text, &v)) {
            throw bad();
          }
          if (v != 0 && v != 1) throw bad();
          cfg.*member = v == 1;
        } else if constexpr (std::is_same_v<V, std::vector<int>>) {
          if (raw.json && !raw.json->is_array()) throw bad();
          std::string text = raw.text;
          if (raw.json)  // [4, 4] reads as "4,4"; an entry that is not an integer fails below
            for (const auto& e : *raw.json) text += (text.empty() ? "" : ",") + (e.is_number_integer() ? e.dump() : "?");
          V list;
          std::istringstream entries(text);
          for (std::string entry; std::getline(entries, entry, ',');) {
            long long v = 0;
            if (!parse_integer(entry, &v) || !flag.range.contains(static_cast<double>(v)) || v > INT_MAX) throw bad();
            list.push_back(static_cast<int>(v));
          }
          if (list.empty() || text.back() == ',') throw bad();
          cfg.*member = list;
        } else if constexpr (std::is_same_v<V, double>) {
          double v = 0;
          if (raw.json) {
            if (!raw.json->is_number()) throw bad();
            v = raw.json->template get<double>();
          } else if (!parse_real(raw.text, &v)) {
            throw bad();
          }
          if (v > kMaxFp32 && flag.range.hi == kMaxFp32)
            throw std::invalid_argument(where + ": expected " + expectation(flag) + " that fits an fp32 (at most " +
                                        config_detail::format_number(kMaxFp32) + "), got " + shown);
          if (!std::isfinite(v) || !flag.range.contains(v)) throw bad();
          cfg.*member = v;
        } else {
          long long v = 0;
          if (raw.json) {
            if (!raw.json->is_number_integer()) throw bad();
            if (raw.json->is_number_unsigned() && raw.json->template get<unsigned long long>() > LLONG_MAX) throw bad();
            v = raw.json->template get<long long>();
          } else if (!parse_integer(raw.text, &v)) {
            throw bad();
          }
          if (!flag.range.contains(static_cast<double>(v)) || v > std::numeric_limits<V>::max()) throw bad();
          cfg.*member = static_cast<V>(v);
        }
      },
      flag.field);
  cfg.explicitly_set.insert(flag.name);
}

std::string value_text(const TrainConfig& cfg, const Flag& flag) {
  return std::visit(
      [&](auto member) -> std::string {
        using V = std::remove_cv_t<std::remove_reference_t<decltype(cfg.*member)>>;
        if constexpr (std::is_same_v<V, std::string>) return cfg.*member;
        else if constexpr (std::is_same_v<V, bool>) return cfg.*member ? "1" : "0";
        else if constexpr (std::is_same_v<V, double>) return format_number(cfg.*member);
        else if constexpr (std::is_same_v<V, std::vector<int>>) {
          std::string list;
          for (int v : cfg.*member) list += (list.empty() ? "" : ",") + std::to_string(v);
          return list;
        } else return std::to_string(cfg.*member);
      },
      flag.field);
}

// The whole of a --config file; errors name the file. Only a regular file of at most
// kMaxConfigBytes is read: a directory opens but cannot be read, a named pipe blocks until
// someone writes to it, a device (/dev/zero) never ends.
std::string read_config_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw std::invalid_argument("--config " + path + ": cannot open the file: " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw std::invalid_argument("--config " + path + ": is a directory, expected a JSON file");
  if (!S_ISREG(st.st_mode))
    throw std::invalid_argument("--config " + path + ": is " + (S_ISFIFO(st.st_mode) ? "a named pipe" : "not a regular file") +
                                ", expected a JSON file");
  if (st.st_size > kMaxConfigBytes)
    throw std::invalid_argument("--config " + path + ": " + std::to_string(st.st_size) + " bytes, more than the " +
                                std::to_string(kMaxConfigBytes) + " a file of flag values may have");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("--config " + path + ": cannot open the file: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad() || text.fail()) throw std::invalid_argument("--config " + path + ": cannot read the file");
  if (static_cast<long long>(text.tellp()) > kMaxConfigBytes)  // it grew since stat
    throw std::invalid_argument("--config " + path + ": more than the " + std::to_string(kMaxConfigBytes) +
                                " bytes a file of flag values may have");
  return text.str();
}

}  // namespace config_detail

nlohmann::json config_json(const TrainConfig& cfg) {
  nlohmann::json j = nlohmann::json::object();
  for (const Flag& f : flag_table()) j[f.name] = config_detail::value_text(cfg, f);
  if (!cfg.init_from.empty()) j["model"] = "-";  // the architecture is --init-from's, not a preset's
  return j;
}

void apply_config_file(TrainConfig& cfg, const std::string& path) {
  const std::string text = config_detail::read_config_file(path);
  // The parser keeps the last of two equal keys; the callback sees every key of the top-level
  // object (depth 1) as parsed, escapes decoded, so a repeated one is reported instead.
  std::set<std::string> keys;
  const auto no_repeated_keys = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && !keys.insert(parsed.get<std::string>()).second)
      throw std::invalid_argument("--config " + path + ": key \"" + parsed.get<std::string>() +
                                  "\" appears more than once (give each key once)");
    return true;
  };
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(text, no_repeated_keys);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::invalid_argument("--config " + path + ": not valid JSON (" + e.what() + ")");
  }
  if (!doc.is_object())
    throw std::invalid_argument("--config " + path + ": expected a JSON object of flag values, got " +
                                std::string(doc.type_name()));
  for (const auto& item : doc.items()) {
    const Flag* flag = find_flag(item.key());
    if (!flag || flag->command_line_only)
      throw std::invalid_argument("--config " + path + ": unknown key \"" + item.key() +
                                  "\" (keys are the flag names without '--'; see --help)");
    config_detail::assign(cfg, *flag, {"", &item.value()}, "--config " + path + ": key \"" + item.key() + "\"");
  }
}

ParsedArgs parse_args(int argc, const char* const* argv) {
  ParsedArgs result;
  std::vector<std::pair<const Flag*, std::string>> given;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      result.help = true;
      return result;
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2)
      throw std::invalid_argument("unexpected argument '" + arg + "' (flags look like --name value; see --help)");
    std::string name = arg.substr(2), value;
    size_t eq = name.find('=');
    bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    const Flag* flag = find_flag(name);
    if (!flag) throw std::invalid_argument("unknown flag '--" + name + "' (see --help)");
    // A 0|1 flag without a value (last, or followed by another flag) means 1: `--eval`.
    const bool bare_switch = !inline_value && std::holds_alternative<bool TrainConfig::*>(flag->field) &&
                             (i + 1 >= argc || std::string(argv[i + 1]).rfind("--", 0) == 0);
    if (bare_switch) {
      value = "1";
    } else if (!inline_value) {
      if (i + 1 >= argc) throw std::invalid_argument("--" + name + ": missing value (expected " +
                                                     config_detail::expectation(*flag) + ")");
      value = argv[++i];
    }
    for (const auto& [earlier, earlier_value] : given)
      if (earlier == flag)
        throw std::invalid_argument("--" + name + " is given twice ('" + earlier_value + "', then '" + value +
                                    "'): give each flag once");
    given.emplace_back(flag, value);
  }
  for (const auto& [flag, value] : given)
    if (std::string(flag->name) == "config") {
      if (value.empty()) throw std::invalid_argument("--config: expected a file name");
      config_detail::check_utf8(value, "--config");
      result.config.config_file = value;
    }
  if (!result.config.config_file.empty()) apply_config_file(result.config, result.config.config_file);
  for (const auto& [flag, value] : given)
    if (std::string(flag->name) != "config") config_detail::assign(result.config, *flag, {value, nullptr}, std::string("--") + flag->name);
  return result;
}
