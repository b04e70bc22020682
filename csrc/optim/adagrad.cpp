#include "optim/adagrad.h"

#include "optim/hyperparams.h"
#include "optim/run_step.h"

namespace zs::optim {

AdagradCoeffs adagrad_coeffs(const AdagradParams& p) {
  check_lr(p.lr, "adagrad");
  check_nonnegative(p.eps, "adagrad", "eps");
  check_nonnegative(p.weight_decay, "adagrad", "weight_decay");
  check_grad_scale(p.grad_scale, "adagrad");
  AdagradCoeffs c{};
  c.grad_scale = static_cast<float>(p.grad_scale);
  c.l2 = static_cast<float>(p.weight_decay);
  c.use_l2 = p.weight_decay != 0.0;
  c.eps = static_cast<float>(p.eps);
  c.neg_lr = static_cast<float>(-p.lr);
  return c;
}

void adagrad_step(const AdagradParams& params, const StepBuffers& b, const RunOptions& run) {
  const AdagradCoeffs c = adagrad_coeffs(params);
  check_step_buffers(b, 1, "adagrad");
  const KernelTable& k = kernels_for(resolve_simd_level(run.simd));
  run_step(k.adagrad, c, b, run);
}

void adagrad_step_many(const std::vector<AdagradParams>& params, const std::vector<StepBuffers>& b,
                       const RunOptions& run) {
  const KernelTable& k = kernels_for(resolve_simd_level(run.simd));
  step_many(params, b, run, 1, "adagrad", adagrad_coeffs, k.adagrad);
}

}  // namespace zs::optim
