// Shared by the optimizer front ends: validated buffers in, one kernel call per thread chunk.
#pragma once

#include "optim/kernels/kernel_table.h"
#include "optim/parallel.h"
#include "optim/step_types.h"

namespace zs::optim {

template <class Kernel, class Coeffs>
void run_step(Kernel kernel, const Coeffs& c, const StepBuffers& b, const RunOptions& o) {
  const int threads = resolve_threads(o.threads, b.numel);
  const NonTemporal nt = resolve_nontemporal(o.nontemporal);
  for_each_chunk(b.param, b.numel, threads,
                 [&](int64_t begin, int64_t end) { kernel(c, b, begin, end, nt); });
}

}  // namespace zs::optim
