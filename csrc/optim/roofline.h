// The memory roofline of a fused optimizer step on this machine, measured by moving exactly
// the bytes the step moves with no arithmetic: read grad (2 or 4 B), p, m, v (12 B); write
// p, m, v (12 B) and the optional 16-bit param copy (2 B). Full-width vector loads and
// stores (64 bytes per instruction on AVX-512, the 16-bit streams included), all threads,
// the same chunking as the kernels. Run with streaming and with ordinary stores: which one
// is faster depends on the machine (Note [Non-temporal stores]), and `bench optim` takes
// the better as the roofline, so the kernel is never flattered by a weak probe.
#pragma once

#include <cstdint>

#include "optim/kernels/kernel_table.h"
#include "optim/step_types.h"

namespace zs::optim {

// One pass over numel elements. p, m, v and copy must be 64-byte aligned (zs::ValueError
// otherwise); grad_bytes is 2 or 4. The values in p, m, v are permuted, not preserved.
// run.nontemporal: kOn streams every store, kCopy only the copy, kOff/kAuto none.
void roofline_pass(const RooflineBuffers& buffers, int64_t numel, const RunOptions& run = {});

}  // namespace zs::optim
