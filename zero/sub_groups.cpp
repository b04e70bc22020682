#include "zero/sub_groups.h"

#include <algorithm>

#include "common/check.h"

namespace zs::zero {

std::vector<SubGroup> plan_sub_groups(const std::vector<int64_t>& partition_numels,
                                      const std::vector<std::vector<int64_t>>& param_starts,
                                      int64_t sub_group_size) {
  ZS_CHECK_VALUE(sub_group_size >= 0,
                 "zero_optimization.sub_group_size: expected an integer >= 0; got ",
                 sub_group_size);
  ZS_CHECK_VALUE(sub_group_size > 0 || param_starts.size() == partition_numels.size(),
                 "sub_group_size 0 needs the parameter boundaries of every group: got ",
                 param_starts.size(), " lists for ", partition_numels.size(), " groups");
  std::vector<SubGroup> out;
  for (size_t g = 0; g < partition_numels.size(); ++g) {
    const int64_t n = partition_numels[g];
    ZS_CHECK_VALUE(n >= 0, "group ", g, ": partition size must be >= 0; got ", n);
    if (n == 0) continue;
    std::vector<int64_t> cuts;
    if (sub_group_size > 0) {
      // Step by what is left, not `at += sub_group_size`: for a partition near INT64_MAX that
      // sum wrapped negative and the loop never ended.
      for (int64_t at = 0; at < n; at += std::min(sub_group_size, n - at)) cuts.push_back(at);
    } else {
      cuts = param_starts[g];
      cuts.push_back(0);
      std::sort(cuts.begin(), cuts.end());
      cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
      ZS_CHECK_VALUE(cuts.back() < n, "group ", g, ": parameter start ", cuts.back(),
                     " is outside its partition of ", n, " elements");
      ZS_CHECK_VALUE(cuts.front() >= 0, "group ", g, ": negative parameter start ", cuts.front());
    }
    for (size_t i = 0; i < cuts.size(); ++i) {
      const int64_t end = i + 1 < cuts.size() ? cuts[i + 1] : n;
      out.push_back({static_cast<int>(g), cuts[i], std::min(end, n)});
    }
  }
  return out;
}

}  // namespace zs::zero
