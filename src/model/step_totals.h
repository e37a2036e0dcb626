// step_totals.h — an optimizer step's totals on the device: the loss sum its micro-steps add to and
// a value summed with it over the ranks (the trainer's stop votes), and their one copy to the host,
// with the gradient norm, when the step ends.
#pragma once
#include "src/base/device.h"
#include "src/dist/grad_sync.h"

#include <cmath>

// loss: the mean over every micro-step's tokens on every rank; grad_norm: the accumulated
// gradients' global norm; summed_with_loss: the caller's `with_loss` summed over the ranks.
struct StepFigures {
  double loss, summed_with_loss;
  float grad_norm;
};

class StepTotals {
 public:
  // The loss sum the classifier adds each micro-step's losses to.
  double* loss_sum() const { return scalars_.get(); }
  void zero(cudaStream_t stream) {
    cuda_check(cudaMemsetAsync(scalars_.get(), 0, scalars_.bytes(), stream), "zeroing the step's loss");
  }
  // The step's figures over `tokens` tokens per rank: the gradient norm queued on `grads` (into
  // norm_squared, with scratch), the totals summed over its ranks, all copied back together: the
  // step's one host synchronisation.
  template <typename Elem>
  StepFigures read(GradientSync<Elem>& grads, float* norm_squared, float* scratch, double with_loss, double tokens,
                   cudaStream_t stream) {
    grads.queue_norm_squared(norm_squared, scratch);
    Host* host = host_.get();
    host->summed_with_loss = with_loss;
    cuda_check(cudaMemcpyAsync(scalars_.get() + 1, &host->summed_with_loss, sizeof(double), cudaMemcpyHostToDevice,
                               stream),
               "uploading the value summed with the loss");
    grads.sum_over_ranks(scalars_.get(), kStepScalars);
    cuda_check(cudaMemcpyAsync(&host->loss, scalars_.get(), scalars_.bytes(), cudaMemcpyDeviceToHost, stream),
               "copying the step's loss");
    cuda_check(cudaMemcpyAsync(&host->norm_squared, norm_squared, sizeof(float), cudaMemcpyDeviceToHost, stream),
               "copying the gradient norm");
    cuda_check(cudaStreamSynchronize(stream), "the step's figures");
    return {host->loss / (tokens * grads.ranks_in_sums()), host->summed_with_loss, std::sqrt(host->norm_squared)};
  }

 private:
  struct Host {
    double loss, summed_with_loss;  // adjacent: copied back together from scalars_
    float norm_squared;
  };
  DeviceArray<double> scalars_{kStepScalars, "the step's loss sum and stop votes"};
  PinnedArray<Host> host_{1, "allocating pinned memory for the step's figures"};
};
