#include "optim/grad_stats.h"

#include <omp.h>

#include <cmath>
#include <vector>

#include "common/check.h"
#include "optim/hyperparams.h"
#include "optim/kernels/kernel_table.h"

namespace zs::optim {

GradStats grad_stats(const void* grad, DType dtype, int64_t numel, double scale,
                     const RunOptions& run) {
  ZS_CHECK_VALUE(numel >= 0, "grad_stats: numel must be >= 0; got ", numel);
  ZS_CHECK_VALUE(numel == 0 || grad != nullptr, "grad_stats: grad is null");
  check_grad_scale(scale, "grad_stats");
  const SumSquaresKernel kernel = kernels_for(resolve_simd_level(run.simd)).sum_squares;
  const float s = static_cast<float>(scale);
  const int64_t blocks = (numel + kStatsBlock - 1) / kStatsBlock;
  std::vector<double> partial(static_cast<size_t>(blocks), 0.0);
  const int threads = static_cast<int>(
      std::min<int64_t>(resolve_threads(run.threads, numel), std::max<int64_t>(blocks, 1)));
#pragma omp parallel for num_threads(threads) schedule(dynamic, 4) if (threads > 1)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t begin = blk * kStatsBlock;
    partial[blk] = kernel(grad, dtype, s, begin, std::min(numel, begin + kStatsBlock));
  }
  GradStats out;
  for (double x : partial) out.sum_squares += x;
  // No finite float squared overflows a double, so a nonfinite sum means a nonfinite grad.
  out.finite = std::isfinite(out.sum_squares);
  return out;
}

}  // namespace zs::optim
