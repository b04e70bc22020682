// The memory roofline of a fused optimizer step on this machine, measured by moving exactly
// the bytes the step moves with no arithmetic: read grad (2 or 4 B), p, m, v (12 B); write
// p, m, v (12 B) and the optional 16-bit param copy (2 B). Full-width vector loads,
// streaming (or, to compare, ordinary) stores, all threads, the same chunking as the kernels. A naive scalar triad
// understates what the hardware gives this access pattern (by about a third on a 2-core
// Sapphire/Emerald Rapids VM), which would flatter the optimizer's ratio.
#pragma once

#include <cstdint>

#include "optim/kernels/kernel_table.h"
#include "optim/step_types.h"

namespace zs::optim {

// One pass over numel elements. p, m, v and copy must be 64-byte aligned (zs::ValueError
// otherwise); grad_bytes is 2 or 4. The values in p, m, v are permuted, not preserved.
// run.nontemporal == kOff uses ordinary stores; kAuto and kOn stream.
void roofline_pass(const RooflineBuffers& buffers, int64_t numel, const RunOptions& run = {});

}  // namespace zs::optim
