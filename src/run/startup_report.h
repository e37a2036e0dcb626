// startup_report.h — the lines a run prints before its first step: the configuration, device,
// model, memory by term, batch, data, what MFU is measured against, and the ranks' shares.
#pragma once
#include "src/base/device.h"
#include "src/base/units.h"
#include "src/config/config_text.h"
#include "src/dist/comm.h"
#include "src/model/activations.h"
#include "src/model/transformer.h"
#include "src/run/plan_report.h"
#include "src/run/run_setup.h"
#include "src/run/throughput.h"

#include <cstdio>
#include <optional>

template <typename Elem>
void print_startup_report(const RunSetup& setup, const Transformer<Elem>& model, const TrainingData& data,
                          const Communicator& comm, double flops_per_token, const std::optional<Peak>& peak) {
  const TrainConfig& cfg = setup.cfg;
  const cudaDeviceProp prop = device_properties();
  const int B = cfg.batch_size, seq_len = cfg.seq_len, world_size = comm.world_size();
  const int local_len = seq_len / cfg.cp;  // each sequence's tokens on this rank (context parallelism)
  const TensorParallelism& tp = model.tensor_parallelism();
  const ActivationBytes acts =
      model_activation_bytes(setup.model, B, local_len, model.recompute(), Transformer<Elem>::dtype, kLogitsChunkRows, tp);
  // What the model allocated, by the plan's terms (equal: test/simt/simt_counters.cpp).
  const MemoryPlan plan = run_memory_plan(cfg, setup.model, B, world_size,
                                          sampling_positions(cfg, setup.model, setup.sampler.get()),
                                          setup.grad_accum_steps, model.pipeline().rank);
  const size_t param_bytes = term_bytes(plan, "parameters"), grad_bytes = term_bytes(plan, "gradients"),
               optim_bytes = term_bytes(plan, "master weights (fp32)") + term_bytes(plan, "AdamW moments (fp32)"),
               act_bytes = acts.total();
  std::printf("train_gpt\nconfig:\n%s", config_summary(cfg).c_str());
  std::printf("device: %s (%s)\n", prop.name, mib(prop.totalGlobalMem).c_str());
  std::printf("model: %s from %s, %s parameters, %s attention\n", describe(setup.model).c_str(),
              setup.model_source.c_str(), thousands(model.num_parameters()).c_str(),
              attention_name(model.attention()));
  std::printf("memory: parameters+gradients %s, optimizer %s, activations %s, total %s\n",
              mib(plan.total() - optim_bytes - act_bytes).c_str(), mib(optim_bytes).c_str(), mib(act_bytes).c_str(),
              mib(plan.total()).c_str());
  std::printf("activations at --recompute %d: blocks %s, logits and buffers %s; blocks at --recompute",
              model.recompute(), mib(acts.blocks).c_str(), mib(acts.other).c_str());
  for (int r = 0; r <= kRecomputeMax; ++r)
    std::printf(" %d: %s%s", r,
                mib(model_activation_bytes(setup.model, B, local_len, r, Transformer<Elem>::dtype, kLogitsChunkRows, tp).blocks)
                    .c_str(),
                r < kRecomputeMax ? "," : "\n");
  std::printf("batch: %lld tokens per step = %d x %d tokens x %d data-parallel rank(s) x %d accumulation step(s)%s\n",
              cfg.total_batch_tokens, B, seq_len, world_size / (tp.size * cfg.pp * cfg.cp), setup.grad_accum_steps,
              cfg.cp > 1 ? (", each sequence over " + std::to_string(cfg.cp) + " context-parallel ranks (" +
                            std::to_string(local_len) + " tokens each)").c_str()
                         : "");
  const char* separator = "";
  if (data.train) {
    std::printf("train data: %zu shard(s), %s tokens", data.train->num_shards(),
                thousands(data.train->tokens_in_shards()).c_str());
    separator = "; ";
  }
  if (data.val)
    std::printf("%sval data: %zu shard(s), %s tokens", separator, data.val->num_shards(),
                thousands(data.val->tokens_in_shards()).c_str());
  std::printf("\n");
  if (data.eval)
    std::printf("eval data: %s, %zu examples (%zu completions); %lld context(s) cut from the left to fit --seq-len "
                "%d\n",
                data.eval->path.c_str(), data.eval->examples.size(), data.eval->completions, data.eval->truncated,
                seq_len);
  if (!(cfg.max_steps == 0) && !cfg.eval) {  // a run that trains: what its MFU is measured against
    if (peak)
      std::printf("throughput: %.4g FLOPs per token (%s), MFU against %.6g TFLOP/s per GPU (%s)\n", flops_per_token,
                  flops_formula_text(setup.model).c_str(), peak->tflops, peak->gpu.c_str());
    else
      std::printf("throughput: %.4g FLOPs per token (%s); MFU: n/a (unknown GPU; pass --peak-tflops)\n",
                  flops_per_token, flops_formula_text(setup.model).c_str());
  }
  std::printf("distributed: world size %d (%s), ZeRO stage %d; per rank: parameters %zu bytes, gradients %zu bytes, "
              "optimizer state %zu bytes\n",
              world_size, comm.launcher().c_str(), model.zero_stage(),
              param_bytes, grad_bytes, optim_bytes);
  if (tp.size > 1)
    std::printf("tensor parallel %d x data parallel %d: each layer's heads, hidden units and vocabulary rows split "
                "over %d consecutive ranks, sequence parallel %s\n",
                tp.size, world_size / tp.size, tp.size, tp.sequence_parallel ? "on" : "off");
  std::fflush(stdout);
}
