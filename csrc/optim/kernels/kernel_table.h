// The interface between the dispatching front ends (adam.cpp, adagrad.cpp, lion.cpp,
// grad_stats.cpp, roofline.cpp) and the per-ISA kernel translation units.
//
// Note [One math, three ISAs]
// The update rules are written once (kernels/update_rules.h) over a small vector-ops
// interface (vec_scalar.h, vec_avx2.h, vec_avx512.h). Each ISA's .cpp instantiates them
// with its own compile flags (no -march=native; see csrc/optim/CMakeLists.txt), and the
// front end picks a table at run time. The rules use no fused multiply-add: every product
// and sum is rounded on its own (and the code is compiled with -ffp-contract=off so the
// compiler fuses nothing either). So all levels produce the same bits, which tests check
// by forcing each level; the scalar code needs no FMA hardware (std::fma without it is a
// libm call, ~30x slower) and the compiler can vectorise it for SSE2 or NEON; and the
// results follow torch.optim's rounding, which also rounds each op. An fma per op would
// buy nothing here: the step is bound by memory, not by arithmetic.
//
// Note [ISA isolation]
// The same inline functions and templates (half.h, vec_scalar.h, the rules) are compiled
// in translation units with different -m flags. With external linkage, the linker keeps one
// copy of each and may pick the AVX-512 one for the scalar path, which then faults on older
// CPUs. So everything these headers define has internal linkage (anonymous namespaces):
// each TU keeps its own copy, and only the *_kernels() tables are shared.
#pragma once

#include <cstdint>

#include "optim/step_types.h"

namespace zs::optim {

// Hyperparameters folded into the per-element constants, computed once per call in double
// and rounded to fp32 (the precision torch.optim applies them in).
struct AdamCoeffs {
  float grad_scale;  // multiply grads by this first (unscale, clip)
  float l2;          // Adam (L2) mode: g += l2 * p
  float decay;       // AdamW mode: p *= decay = 1 - lr * weight_decay
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float inv_bias_correction2_sqrt;
  float eps;
  float neg_step_size;  // -lr / bias_correction1
  bool use_l2;
  bool use_decay;
};

struct AdagradCoeffs {
  float grad_scale;
  float l2;
  float eps;
  float neg_lr;
  bool use_l2;
};

struct LionCoeffs {
  float grad_scale;
  float decay;  // 1 - lr * weight_decay
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float neg_lr;
  bool use_decay;
};

// Each kernel updates elements [begin, end) of `b`. The store mode (kOn, kOff or kCopy,
// never kAuto) asks for streaming stores where the buffers' alignment allows them.
using AdamKernel = void (*)(const AdamCoeffs&, const StepBuffers&, int64_t, int64_t, NonTemporal);
using AdagradKernel = void (*)(const AdagradCoeffs&, const StepBuffers&, int64_t, int64_t,
                               NonTemporal);
using LionKernel = void (*)(const LionCoeffs&, const StepBuffers&, int64_t, int64_t, NonTemporal);

// Sum of squares of grad[begin, end) * scale, accumulated in double in a fixed order for a
// given level.
using SumSquaresKernel = double (*)(const void* grad, DType dtype, float scale, int64_t begin,
                                    int64_t end);

// The memory traffic of a fused step with no arithmetic: see roofline.h.
struct RooflineBuffers {
  float* p;
  float* m;
  float* v;
  const void* grad;
  int grad_bytes;  // 2 or 4
  void* copy;      // 16-bit copy, or nullptr
};
using RooflineKernel = void (*)(const RooflineBuffers&, int64_t, int64_t, NonTemporal);

struct KernelTable {
  SimdLevel level;
  AdamKernel adam;
  AdagradKernel adagrad;
  LionKernel lion;
  SumSquaresKernel sum_squares;
  RooflineKernel roofline;
};

// Defined in the per-ISA translation units. The AVX ones exist only on x86-64 builds.
const KernelTable& scalar_kernels();
#if defined(__x86_64__)
const KernelTable& avx2_kernels();
const KernelTable& avx512_kernels();
#endif

// The table for a resolved level (aarch64: kNeon runs the scalar table, which the compiler
// auto-vectorises for NEON).
const KernelTable& kernels_for(SimdLevel level);

}  // namespace zs::optim
