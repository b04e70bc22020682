// Fused CPU Adagrad over raw buffers (DeepSpeedCPUAdagrad's update; torch.optim.Adagrad
// with lr_decay=0 and initial_accumulator_value=0).
#pragma once

#include <cstdint>
#include <vector>

#include "optim/kernels/kernel_table.h"
#include "optim/step_types.h"

namespace zs::optim {

struct AdagradParams {
  double lr = 1e-2;
  double eps = 1e-10;
  double weight_decay = 0.0;  // L2: added to the grad, as torch and DeepSpeed do
  double grad_scale = 1.0;
};

AdagradCoeffs adagrad_coeffs(const AdagradParams& params);

// state0 = sum of squared grads; state1 unused.
void adagrad_step(const AdagradParams& params, const StepBuffers& b, const RunOptions& run = {});

// Item i steps b[i] with params[i], every item in one parallel region (Note [Many tensors,
// one region] in optim/parallel.h): the list form for a model's parameter list.
void adagrad_step_many(const std::vector<AdagradParams>& params, const std::vector<StepBuffers>& b,
                       const RunOptions& run = {});

}  // namespace zs::optim
