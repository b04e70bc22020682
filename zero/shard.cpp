#include "zero/shard.h"

#include <algorithm>
#include <limits>

#include "common/check.h"

namespace zs::zero {
namespace {

// Note [Shard arguments]
// numel, world, rank and alignment reach these functions from Python (a flat group's summed
// numel, the process group's size) and from checkpoint metadata, so they are user input: a
// bad one is a zs::ValueError naming the argument and its value. Without the checks a world
// of 0 divided by zero (SIGFPE, the interpreter gone) and a numel near INT64_MAX wrapped the
// padded size negative, which torch.zeros then rejected far from the cause.
void check_args(const char* fn, int64_t numel, int world, int rank) {
  ZS_CHECK_VALUE(numel >= 0, fn, ": numel must be >= 0; got ", numel);
  ZS_CHECK_VALUE(world > 0, fn, ": world must be > 0; got ", world);
  ZS_CHECK_VALUE(rank >= 0 && rank < world, fn, ": rank must be in [0, world); got rank ", rank,
                 " with world ", world);
}

// numel rounded up to a multiple of `unit` (> 0), or a ValueError when that is not an int64.
int64_t round_up(const char* fn, int64_t numel, int64_t unit, const char* unit_text) {
  const int64_t units = numel / unit + (numel % unit != 0 ? 1 : 0);
  int64_t padded = 0;
  ZS_CHECK_VALUE(!__builtin_mul_overflow(units, unit, &padded), fn, ": numel ", numel,
                 " padded to a multiple of ", unit_text, " = ", unit,
                 " exceeds the largest 64-bit element count (", std::numeric_limits<int64_t>::max(),
                 ")");
  return padded;
}

ShardRange slice(int64_t total_valid, int64_t per_rank, int rank) {
  ShardRange r;
  r.begin = per_rank * rank;  // < the padded total, which round_up checked
  r.numel = per_rank;
  r.valid = std::clamp<int64_t>(total_valid - r.begin, 0, per_rank);
  return r;
}

}  // namespace

ShardRange stage3_param_shard(int64_t numel, int world, int rank) {
  check_args("stage3_param_shard", numel, world, rank);
  return slice(numel, round_up("stage3_param_shard", numel, world, "world") / world, rank);
}

int64_t stage12_padded_numel(int64_t numel, int world, int alignment) {
  constexpr const char* fn = "stage12_padded_numel";
  ZS_CHECK_VALUE(numel >= 0, fn, ": numel must be >= 0; got ", numel);
  ZS_CHECK_VALUE(world > 0, fn, ": world must be > 0; got ", world);
  ZS_CHECK_VALUE(alignment > 0, fn, ": alignment must be > 0; got ", alignment);
  // Two ints: the product fits an int64.
  return round_up(fn, numel, static_cast<int64_t>(alignment) * world, "alignment * world");
}

ShardRange stage12_partition(int64_t numel, int world, int rank, int alignment) {
  check_args("stage12_partition", numel, world, rank);
  return slice(numel, stage12_padded_numel(numel, world, alignment) / world, rank);
}

}  // namespace zs::zero
