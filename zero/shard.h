// Which elements a data-parallel rank owns. One place answers it for every stage
// (STYLE.md item 5; model: ShardInfo in llm.c's llmc/zero.cuh).
#pragma once

#include <cstdint>

namespace zs::zero {

struct ShardRange {
  int64_t begin = 0;  // first element owned, in the padded index space
  int64_t numel = 0;  // elements owned (padding included)
  int64_t valid = 0;  // elements of [begin, begin + numel) that hold real data
};

// Stage 3: each parameter of `numel` elements is split on its own into ceil(numel / world)
// elements per rank; rank r holds [r*k, (r+1)*k), zero-padded at the end
// (DeepSpeed's layout, which zero_to_fp32 reads).
//
// All three functions throw zs::ValueError naming the argument for numel < 0, world < 1,
// rank outside [0, world), alignment < 1, or a padded size beyond int64 (see Note [Shard
// arguments] in shard.cpp); every returned range then lies in [0, padded size].
ShardRange stage3_param_shard(int64_t numel, int world, int rank);

// Stages 1/2: a flat group of `numel` elements is padded to a multiple of
// `alignment * world` (DeepSpeed: alignment 2) and cut into `world` equal partitions.
int64_t stage12_padded_numel(int64_t numel, int world, int alignment = 2);
ShardRange stage12_partition(int64_t numel, int world, int rank, int alignment = 2);

}  // namespace zs::zero
