#include "optim/roofline.h"

#include "common/check.h"
#include "optim/parallel.h"

namespace zs::optim {
namespace {

bool aligned64(const void* p) { return reinterpret_cast<uintptr_t>(p) % 64 == 0; }

}  // namespace

void roofline_pass(const RooflineBuffers& b, int64_t numel, const RunOptions& run) {
  ZS_CHECK_VALUE(numel >= 0, "roofline: numel must be >= 0; got ", numel);
  ZS_CHECK_VALUE(b.grad_bytes == 2 || b.grad_bytes == 4,
                 "roofline: grad_bytes must be 2 or 4; got ", b.grad_bytes);
  if (numel == 0) return;
  ZS_CHECK_VALUE(b.p && b.m && b.v && b.grad, "roofline: null buffer");
  ZS_CHECK_VALUE(aligned64(b.p) && aligned64(b.m) && aligned64(b.v) &&
                     (b.copy == nullptr || aligned64(b.copy)),
                 "roofline: p, m, v and copy must be 64-byte aligned");
  const RooflineKernel kernel = kernels_for(resolve_simd_level(run.simd)).roofline;
  const int threads = resolve_threads(run.threads, numel);
  const NonTemporal nt = resolve_nontemporal(run.nontemporal);
  for_each_chunk(b.p, numel, threads,
                 [&](int64_t begin, int64_t end) { kernel(b, begin, end, nt); });
}

}  // namespace zs::optim
