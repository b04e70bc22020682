// Fused CPU Adam / AdamW over raw buffers: the kernel behind zerostream.ops.adam and the
// ZeRO-Offload step (one call per sub-group, any slice of the flat fp32 buffers).
#pragma once

#include <cstdint>
#include <vector>

#include "optim/kernels/kernel_table.h"
#include "optim/step_types.h"

namespace zs::optim {

struct AdamParams {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool bias_correction = true;
  bool adamw_mode = true;   // decoupled weight decay (AdamW); false: L2 added to the grad
  int64_t step = 1;         // 1-based count of this update, for bias correction
  double grad_scale = 1.0;  // grads are multiplied by this: 1 / (loss_scale * clip_coef)
};

// Per-element constants for a step; throws zs::ValueError naming a bad hyperparameter.
AdamCoeffs adam_coeffs(const AdamParams& params);

// One Adam/AdamW step over b.numel elements: state0 = exp_avg, state1 = exp_avg_sq, grads
// fp32/bf16/fp16, optional bf16/fp16 param copy written in the same pass.
void adam_step(const AdamParams& params, const StepBuffers& b, const RunOptions& run = {});

// Item i steps b[i] with params[i], every item in one parallel region (Note [Many tensors,
// one region] in optim/parallel.h): the list form for a model's parameter list.
void adam_step_many(const std::vector<AdamParams>& params, const std::vector<StepBuffers>& b,
                    const RunOptions& run = {});

}  // namespace zs::optim
