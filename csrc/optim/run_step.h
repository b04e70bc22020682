// Shared by the optimizer front ends: validated buffers in, one kernel call per thread chunk.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/check.h"
#include "optim/kernels/kernel_table.h"
#include "optim/parallel.h"
#include "optim/step_types.h"

namespace zs::optim {

template <class Kernel, class Coeffs>
void run_step(Kernel kernel, const Coeffs& c, const StepBuffers& b, const RunOptions& o) {
  const int threads = resolve_threads(o.threads, b.numel);
  const NonTemporal nt = resolve_nontemporal(o.nontemporal);
  for_each_chunk(
      b.param, b.numel, threads, [&](int64_t begin, int64_t end) { kernel(c, b, begin, end, nt); },
      static_cast<int>(dtype_size(b.param_dtype)));
}

// The body of every *_step_many: one hyperparameter set per item (step counts may differ),
// each checked and turned into coefficients, each item's buffers checked naming its index;
// then every item runs in one parallel region (Note [Many tensors, one region]).
template <class Params, class CoeffsFn, class Kernel>
void step_many(const std::vector<Params>& params, const std::vector<StepBuffers>& b,
               const RunOptions& run, int states, const char* who, CoeffsFn coeffs_of,
               Kernel kernel) {
  ZS_CHECK_VALUE(params.size() == b.size(), who, ": ", params.size(), " hyperparameter sets for ",
                 b.size(), " buffers");
  using Coeffs = decltype(coeffs_of(params[0]));
  std::vector<Coeffs> c;
  c.reserve(b.size());
  std::vector<const void*> anchors(b.size());
  std::vector<int> widths(b.size());
  std::vector<int64_t> numels(b.size());
  int64_t total = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    c.push_back(coeffs_of(params[i]));
    check_step_buffers(b[i], states, (std::string(who) + " tensor " + std::to_string(i)).c_str());
    anchors[i] = b[i].param;
    widths[i] = static_cast<int>(dtype_size(b[i].param_dtype));
    numels[i] = b[i].numel;
    total += b[i].numel;
  }
  const int threads = resolve_threads(run.threads, total);
  const NonTemporal nt = resolve_nontemporal(run.nontemporal);
  for_each_item_chunk(
      anchors.data(), widths.data(), numels.data(), static_cast<int64_t>(b.size()), threads,
      [&](int64_t i, int64_t begin, int64_t end) { kernel(c[i], b[i], begin, end, nt); });
}

}  // namespace zs::optim
