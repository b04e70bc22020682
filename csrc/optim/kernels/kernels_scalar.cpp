// Scalar kernels: the fallback on any CPU (and, auto-vectorised, the aarch64 path). Compiled
// with the baseline flags only.
#include "optim/kernels/drive.h"
#include "optim/kernels/kernel_table.h"
#include "optim/kernels/vec_scalar.h"

namespace zs::optim {
namespace {

void adam(const AdamCoeffs& c, const StepBuffers& b, int64_t begin, int64_t end, NonTemporal nt) {
  run_rule<VecScalar, AdamRule>(c, b, begin, end, nt);
}
void adagrad(const AdagradCoeffs& c, const StepBuffers& b, int64_t begin, int64_t end,
             NonTemporal nt) {
  run_rule<VecScalar, AdagradRule>(c, b, begin, end, nt);
}
void lion(const LionCoeffs& c, const StepBuffers& b, int64_t begin, int64_t end, NonTemporal nt) {
  run_rule<VecScalar, LionRule>(c, b, begin, end, nt);
}

// Same bytes as the fused step; the rotation p <- m <- v <- p keeps the stores from being
// optimised away as writes of the loaded value.
void roofline(const RooflineBuffers& r, int64_t begin, int64_t end, NonTemporal) {
  const auto* g16 = static_cast<const uint16_t*>(r.grad);
  auto* copy = static_cast<uint16_t*>(r.copy);
  const int stride = r.grad_bytes / 2;
  for (int64_t i = begin; i < end; ++i) {
    const float p = r.p[i], m = r.m[i], v = r.v[i];
    uint16_t g = g16[i * stride];
    if (stride == 2) g ^= g16[i * stride + 1];
    r.p[i] = m;
    r.m[i] = v;
    r.v[i] = p;
    if (copy != nullptr) copy[i] = g;
  }
}

}  // namespace

const KernelTable& scalar_kernels() {
  static const KernelTable table{SimdLevel::kScalar,     adam,    adagrad, lion,
                                 sum_squares<VecScalar>, roofline};
  return table;
}

}  // namespace zs::optim
