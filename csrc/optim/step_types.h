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
// In theory streaming stores save the read-for-ownership of every written line (~14 of the
// 42-44 bytes per param an Adam step with a 16-bit copy moves with ordinary stores). On the
// machine this was tuned on (2-core Emerald Rapids KVM guest, 5e7 params) they measured
// slower, in the kernel and in the bare roofline probe alike (kernel 0.52-0.58 vs 0.63
// Gparam/s, probe 0.54-0.58 vs 0.62-0.65), and on data that fits in cache they would also
// push hot lines out. So kAuto means
// ordinary stores, and kOn is there for machines where `zerostream bench optim
// --nontemporal on` says it wins. Either way the results are bit-identical.
enum class NonTemporal : int { kAuto = 0, kOn = 1, kOff = 2 };

struct RunOptions {
  int threads = 0;                   // 0: omp_get_max_threads() (OMP_NUM_THREADS)
  int simd = -1;                     // -1: best_simd_level(); else a SimdLevel, capped by it
  NonTemporal nontemporal = NonTemporal::kAuto;
};

// The level a call runs at: the requested one capped by what the CPU and build support.
SimdLevel resolve_simd_level(int requested);

// Threads a call of `numel` elements uses: small calls stay on the caller's thread.
int resolve_threads(int requested, int64_t numel);

// Throws zs::ValueError naming `who` for null buffers or a bad copy dtype.
void check_step_buffers(const StepBuffers& b, int states, const char* who);

// Whether a call streams its stores (Note [Non-temporal stores]).
bool want_nontemporal(NonTemporal mode);

}  // namespace zs::optim
