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
//
// Note [16-bit masters and states]
// The master params are fp32 by default; `param_dtype` bf16 or fp16 makes the 16-bit tensor
// itself the master (DeepSpeed's bf16.bf16_master_weights_and_grads with an offloaded
// optimizer: 2 bytes an element instead of 4, no separate copy). The states are fp32, or
// `state_dtype` bf16/fp16 (bf16.bf16_optimizer_states, DeepSpeedCPUAdam's
// fp32_optimizer_states=False: 2 bytes each instead of 4). Either way the update is computed
// in fp32 from the loaded values, op for op as with fp32 buffers, and each 16-bit result is
// rounded to nearest even once, on its store. A 16-bit master is its own copy: param_copy
// must then be null. 16-bit buffers use ordinary stores (the streaming modes are for the fp32
// layout, Note [Non-temporal stores]).
struct StepBuffers {
  void* param = nullptr;       // master params, param_dtype, updated in place
  const void* grad = nullptr;  // gradients, grad_dtype
  DType grad_dtype = DType::kFloat32;
  void* state0 = nullptr;               // Adam exp_avg, Adagrad sum of squares, Lion exp_avg
  void* state1 = nullptr;               // Adam exp_avg_sq; unused (nullptr) otherwise
  void* param_copy = nullptr;           // optional 16-bit copy of the updated fp32 params
  DType copy_dtype = DType::kBFloat16;  // bf16 or fp16; ignored when param_copy is null
  int64_t numel = 0;
  DType param_dtype = DType::kFloat32;  // Note [16-bit masters and states]
  DType state_dtype = DType::kFloat32;
};

// Note [Non-temporal stores]
// An optimizer step updates p, m and v in place: their lines were read just before they are
// written, so ordinary stores cost no read-for-ownership there, and streaming them only
// pushes the lines out early. Measured on the 2-core Emerald Rapids KVM guest (2e8 and 5e7
// params, AdamW, bf16 grads and copy): streaming p, m, v (kOn) ran 15-20% below ordinary
// stores, in the kernel and in the bare roofline probe alike. The 16-bit copy is different:
// it is only written, so each of its lines is read first unless streamed, and streaming it
// in whole lines (kCopy) ran 5-15% faster than ordinary stores (probe: +13-18%). So kAuto
// means kCopy, which levels without whole-line copy stores (AVX2, scalar) run as kOff.
// All modes produce the same bits.
// kCopy streams only the 16-bit param copy, in whole 64-byte lines (AVX-512; elsewhere it
// means kOff): see Note [No streaming for the 16-bit copy].
enum class NonTemporal : int { kAuto = 0, kOn = 1, kOff = 2, kCopy = 3 };

struct RunOptions {
  int threads = 0;  // 0: omp_get_max_threads() (OMP_NUM_THREADS)
  int simd = -1;    // -1: best_simd_level(); else a SimdLevel, capped by it
  NonTemporal nontemporal = NonTemporal::kAuto;
};

// The level a call runs at: the requested one capped by what the CPU and build support.
SimdLevel resolve_simd_level(int requested);

// Threads a call of `numel` elements uses: small calls stay on the caller's thread.
int resolve_threads(int requested, int64_t numel);

// Throws zs::ValueError naming `who` for null buffers or a bad copy dtype.
void check_step_buffers(const StepBuffers& b, int states, const char* who);

// The store mode a call runs with: kAuto resolved (Note [Non-temporal stores]).
NonTemporal resolve_nontemporal(NonTemporal mode);

}  // namespace zs::optim
