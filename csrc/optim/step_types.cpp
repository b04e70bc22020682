#include "optim/step_types.h"

#include <omp.h>

#include "common/check.h"
#include "optim/kernels/kernel_table.h"

namespace zs::optim {

// Below this many elements a fork/join costs more than the memory time it would save.
constexpr int64_t kMinElementsPerThread = int64_t{1} << 15;

SimdLevel resolve_simd_level(int requested) {
  const SimdLevel best = best_simd_level();
  if (requested < 0) return best;
  ZS_CHECK_VALUE(requested <= static_cast<int>(SimdLevel::kAvx512),
                 "simd: expected a level 0..3 (scalar, neon, avx2, avx512); got ", requested);
  return static_cast<SimdLevel>(std::min(requested, static_cast<int>(best)));
}

int resolve_threads(int requested, int64_t numel) {
  ZS_CHECK_VALUE(requested >= 0, "threads: expected >= 0 (0 = default); got ", requested);
  const int wanted = requested > 0 ? requested : omp_get_max_threads();
  const int64_t useful = std::max<int64_t>(1, numel / kMinElementsPerThread);
  return static_cast<int>(std::min<int64_t>(wanted, useful));
}

const KernelTable& kernels_for(SimdLevel level) {
#if defined(__x86_64__)
  if (level == SimdLevel::kAvx512) return avx512_kernels();
  if (level == SimdLevel::kAvx2) return avx2_kernels();
#endif
  return scalar_kernels();
}

void check_step_buffers(const StepBuffers& b, int states, const char* who) {
  ZS_CHECK_VALUE(b.numel >= 0, who, ": numel must be >= 0; got ", b.numel);
  if (b.numel == 0) return;
  ZS_CHECK_VALUE(b.param != nullptr, who, ": param is null");
  ZS_CHECK_VALUE(b.grad != nullptr, who, ": grad is null");
  ZS_CHECK_VALUE(b.state0 != nullptr, who, ": optimizer state is null");
  ZS_CHECK_VALUE(states < 2 || b.state1 != nullptr, who, ": second optimizer state is null");
  ZS_CHECK_VALUE(b.param_copy == nullptr || b.copy_dtype != DType::kFloat32, who,
                 ": param_copy dtype must be bf16 or fp16; got fp32");
  ZS_CHECK_VALUE(b.param_copy == nullptr || b.param_dtype == DType::kFloat32, who, ": a ",
                 dtype_name(b.param_dtype),
                 " master param is its own 16-bit copy; param_copy must be null");
  ZS_CHECK_VALUE(b.state_dtype == DType::kFloat32 || b.state_dtype == b.param_dtype, who, ": ",
                 dtype_name(b.state_dtype), " optimizer states need ", dtype_name(b.state_dtype),
                 " params (fp32 states go with any params); got ", dtype_name(b.param_dtype),
                 " params");
}

NonTemporal resolve_nontemporal(NonTemporal mode) {
  return mode == NonTemporal::kAuto ? NonTemporal::kCopy : mode;
}

}  // namespace zs::optim
