// Fused CPU Lion over raw buffers (DeepSpeedCPULion's update; decoupled weight decay).
#pragma once

#include <cstdint>
#include <vector>

#include "optim/kernels/kernel_table.h"
#include "optim/step_types.h"

namespace zs::optim {

struct LionParams {
  double lr = 1e-4;
  double beta1 = 0.9;
  double beta2 = 0.99;
  double weight_decay = 0.0;
  double grad_scale = 1.0;
};

LionCoeffs lion_coeffs(const LionParams& params);

// state0 = exp_avg; state1 unused.
void lion_step(const LionParams& params, const StepBuffers& b, const RunOptions& run = {});

// Item i steps b[i] with params[i], every item in one parallel region (Note [Many tensors,
// one region] in optim/parallel.h): the list form for a model's parameter list.
void lion_step_many(const std::vector<LionParams>& params, const std::vector<StepBuffers>& b,
                    const RunOptions& run = {});

}  // namespace zs::optim
