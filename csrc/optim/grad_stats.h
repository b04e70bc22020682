// One read-only pass over a gradient buffer that yields what the engine needs before a step:
// the squared L2 norm (for clipping and logging) and whether any element is inf/nan (for
// the dynamic loss scaler). One scalar pair per buffer instead of per-parameter torch ops.
#pragma once

#include <cstdint>

#include "optim/dtype.h"
#include "optim/step_types.h"

namespace zs::optim {

struct GradStats {
  double sum_squares = 0.0;  // sum of (grad * scale)^2 in double; inf/nan if nonfinite
  bool finite = true;        // false when any (grad * scale) is inf or nan
};

// Note [Deterministic norm]
// Squares are summed in double over fixed blocks of kStatsBlock elements, and the block sums
// are added in index order, so the result is the same for any thread count (every rank and
// every run agree). Dispatch levels sum a block's lanes in different orders and may differ
// in the last bits of the double.
constexpr int64_t kStatsBlock = int64_t{1} << 16;

GradStats grad_stats(const void* grad, DType dtype, int64_t numel, double scale = 1.0,
                     const RunOptions& run = {});

}  // namespace zs::optim
