// Optimizer sub-groups: the unit in which offloaded optimizer state is stepped and swapped
// (ds_config zero_optimization.sub_group_size). One place cuts a rank's partitions into them.
#pragma once

#include <cstdint>
#include <vector>

namespace zs::zero {

struct SubGroup {
  int group = 0;      // param group index
  int64_t begin = 0;  // element range inside this rank's partition of the group
  int64_t end = 0;
};

// Cuts each group's partition [0, partition_numels[g]) into consecutive sub-groups, in group
// order. sub_group_size > 0: pieces of at most that many elements. sub_group_size == 0:
// DeepSpeed's meaning, one sub-group per parameter: cuts at `param_starts[g]` (offsets inside
// the partition where a parameter's owned piece begins; padding stays with the last piece).
// Empty partitions give no sub-group. Throws zs::ValueError on inconsistent input.
std::vector<SubGroup> plan_sub_groups(const std::vector<int64_t>& partition_numels,
                                      const std::vector<std::vector<int64_t>>& param_starts,
                                      int64_t sub_group_size);

}  // namespace zs::zero
