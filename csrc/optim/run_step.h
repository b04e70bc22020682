// Shared by the optimizer front ends: validated buffers in, one kernel call per thread chunk.
#pragma once

#include "optim/kernels/kernel_table.h"
#include "optim/parallel.h"
#include "optim/step_types.h"

namespace zs::optim {

// Bytes one element of a step moves (the model of Note [Non-temporal stores] and the bench):
// read grad, p and the states; write p, the states and the optional 16-bit copy.
inline int64_t step_bytes_per_element(const StepBuffers& b, int states) {
  const int64_t copy = b.param_copy != nullptr ? 2 : 0;
  return static_cast<int64_t>(dtype_size(b.grad_dtype)) + 8 + 8 * states + copy;
}

template <class Kernel, class Coeffs>
void run_step(Kernel kernel, const Coeffs& c, const StepBuffers& b, const RunOptions& o,
              int states) {
  const int threads = resolve_threads(o.threads, b.numel);
  const bool nt = want_nontemporal(o.nontemporal, b.numel * step_bytes_per_element(b, states));
  for_each_chunk(b.param, b.numel, threads,
                 [&](int64_t begin, int64_t end) { kernel(c, b, begin, end, nt); });
}

}  // namespace zs::optim
