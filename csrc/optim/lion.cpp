#include "optim/lion.h"

#include "optim/hyperparams.h"
#include "optim/run_step.h"

namespace zs::optim {

LionCoeffs lion_coeffs(const LionParams& p) {
  check_lr(p.lr, "lion");
  check_beta(p.beta1, "lion", "betas[0]");
  check_beta(p.beta2, "lion", "betas[1]");
  check_nonnegative(p.weight_decay, "lion", "weight_decay");
  check_grad_scale(p.grad_scale, "lion");
  LionCoeffs c{};
  c.grad_scale = static_cast<float>(p.grad_scale);
  c.decay = static_cast<float>(1.0 - p.lr * p.weight_decay);
  c.use_decay = p.weight_decay != 0.0;
  c.beta1 = static_cast<float>(p.beta1);
  c.one_minus_beta1 = static_cast<float>(1.0 - p.beta1);
  c.beta2 = static_cast<float>(p.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - p.beta2);
  c.neg_lr = static_cast<float>(-p.lr);
  return c;
}

void lion_step(const LionParams& params, const StepBuffers& b, const RunOptions& run) {
  const LionCoeffs c = lion_coeffs(params);
  check_step_buffers(b, 1, "lion");
  const KernelTable& k = kernels_for(resolve_simd_level(run.simd));
  run_step(k.lion, c, b, run);
}

void lion_step_many(const std::vector<LionParams>& params, const std::vector<StepBuffers>& b,
                    const RunOptions& run) {
  const KernelTable& k = kernels_for(resolve_simd_level(run.simd));
  step_many(params, b, run, 1, "lion", lion_coeffs, k.lion);
}

}  // namespace zs::optim
