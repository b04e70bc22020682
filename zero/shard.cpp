#include "zero/shard.h"

#include <algorithm>

#include "common/check.h"

namespace zs::zero {
namespace {

void check_world(int64_t numel, int world, int rank) {
  ZS_CHECK(numel >= 0, "numel must be >= 0, got ", numel);
  ZS_CHECK(world > 0, "world size must be > 0, got ", world);
  ZS_CHECK(rank >= 0 && rank < world, "rank ", rank, " out of range for world size ", world);
}

ShardRange slice(int64_t total_valid, int64_t per_rank, int rank) {
  ShardRange r;
  r.begin = per_rank * rank;
  r.numel = per_rank;
  r.valid = std::clamp<int64_t>(total_valid - r.begin, 0, per_rank);
  return r;
}

}  // namespace

ShardRange stage3_param_shard(int64_t numel, int world, int rank) {
  check_world(numel, world, rank);
  return slice(numel, (numel + world - 1) / world, rank);
}

int64_t stage12_padded_numel(int64_t numel, int world, int alignment) {
  ZS_CHECK(alignment > 0, "alignment must be > 0, got ", alignment);
  const int64_t unit = static_cast<int64_t>(alignment) * world;
  return (numel + unit - 1) / unit * unit;
}

ShardRange stage12_partition(int64_t numel, int world, int rank, int alignment) {
  check_world(numel, world, rank);
  return slice(numel, stage12_padded_numel(numel, world, alignment) / world, rank);
}

}  // namespace zs::zero
