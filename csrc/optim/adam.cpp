#include "optim/adam.h"

#include <cmath>

#include "common/check.h"
#include "optim/hyperparams.h"
#include "optim/run_step.h"

namespace zs::optim {

AdamCoeffs adam_coeffs(const AdamParams& p) {
  check_lr(p.lr, "adam");
  check_beta(p.beta1, "adam", "betas[0]");
  check_beta(p.beta2, "adam", "betas[1]");
  check_nonnegative(p.eps, "adam", "eps");
  check_nonnegative(p.weight_decay, "adam", "weight_decay");
  check_grad_scale(p.grad_scale, "adam");
  ZS_CHECK_VALUE(p.step >= 1, "adam: step must be >= 1 (1-based); got ", p.step);
  // Bias corrections in double, as torch.optim computes them in Python floats.
  double bc1 = 1.0, bc2 = 1.0;
  if (p.bias_correction) {
    bc1 = 1.0 - std::pow(p.beta1, static_cast<double>(p.step));
    bc2 = 1.0 - std::pow(p.beta2, static_cast<double>(p.step));
  }
  AdamCoeffs c{};
  c.grad_scale = static_cast<float>(p.grad_scale);
  c.use_l2 = !p.adamw_mode && p.weight_decay != 0.0;
  c.use_decay = p.adamw_mode && p.weight_decay != 0.0;
  c.l2 = static_cast<float>(p.weight_decay);
  c.decay = static_cast<float>(1.0 - p.lr * p.weight_decay);
  c.one_minus_beta1 = static_cast<float>(1.0 - p.beta1);
  c.beta2 = static_cast<float>(p.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - p.beta2);
  c.inv_bias_correction2_sqrt = static_cast<float>(1.0 / std::sqrt(bc2));
  c.eps = static_cast<float>(p.eps);
  c.neg_step_size = static_cast<float>(-p.lr / bc1);
  return c;
}

void adam_step(const AdamParams& params, const StepBuffers& b, const RunOptions& run) {
  const AdamCoeffs c = adam_coeffs(params);
  check_step_buffers(b, 2, "adam");
  const KernelTable& k = kernels_for(resolve_simd_level(run.simd));
  run_step(k.adam, c, b, run);
}

void adam_step_many(const std::vector<AdamParams>& params, const std::vector<StepBuffers>& b,
                    const RunOptions& run) {
  const KernelTable& k = kernels_for(resolve_simd_level(run.simd));
  step_many(params, b, run, 2, "adam", adam_coeffs, k.adam);
}

}  // namespace zs::optim
