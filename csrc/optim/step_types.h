// What every CPU optimizer step takes besides its hyperparameters: the buffers (raw
// pointers, so torch tensors, host-arena buffers and slices of flat buffers all fit) and
// how to run (threads, SIMD level, stores).
#pragma once

#include <cstdint>

#include "common/cpu_features.h"
#include "optim/dtype.h"

namespace zs::optim {

// One contiguous range of `numel` elements of a flat parameter group. Any slice of a larger
// buffer works: pointers need only their element alignment (see Note [Chunks and alignment]).
struct StepBuffers {
  float* param = nullptr;            // fp32 master params, updated in place
  const void* grad = nullptr;        // gradients, grad_dtype
  DType grad_dtype = DType::kFloat32;
  float* state0 = nullptr;           // Adam exp_avg, Adagrad sum of squares, Lion exp_avg
  float* state1 = nullptr;           // Adam exp_avg_sq; unused (nullptr) otherwise
  void* param_copy = nullptr;        // optional 16-bit copy of the updated params
  DType copy_dtype = DType::kBFloat16;  // bf16 or fp16; ignored when param_copy is null
  int64_t numel = 0;
};

// Note [Non-temporal stores]
// With buffers much larger than the caches, every ordinary store first reads its line
// (read-for-ownership): ~14 extra bytes per param on a 28-30 byte step. Streaming stores skip
// that read. On data that fits in cache (a small offload sub-group just copied in) they
// would push hot lines out to DRAM, so kAuto streams only above kNonTemporalAutoBytes.
enum class NonTemporal : int { kAuto = 0, kOn = 1, kOff = 2 };
constexpr int64_t kNonTemporalAutoBytes = int64_t{32} << 20;

struct RunOptions {
  int threads = 0;                   // 0: omp_get_max_threads() (OMP_NUM_THREADS)
  int simd = -1;                     // -1: best_simd_level(); else a SimdLevel, capped by it
  NonTemporal nontemporal = NonTemporal::kAuto;
};

// The level a call runs at: the requested one capped by what the CPU and build support.
SimdLevel resolve_simd_level(int requested);

// Threads a call of `numel` elements uses: small calls stay on the caller's thread.
int resolve_threads(int requested, int64_t numel);

}  // namespace zs::optim

namespace zs::optim {

// Throws zs::ValueError naming `who` for null buffers or a bad copy dtype.
void check_step_buffers(const StepBuffers& b, int states, const char* who);

// Whether a call that touches `bytes` of memory streams its stores (Note [Non-temporal stores]).
bool want_nontemporal(NonTemporal mode, int64_t bytes);

}  // namespace zs::optim
