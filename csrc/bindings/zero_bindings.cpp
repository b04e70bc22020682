// ZeRO partition arithmetic for the Python engine: one answer to "which elements does rank r own".
#include <tuple>

#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "zero/shard.h"
#include "zero/sub_groups.h"

namespace py = pybind11;

namespace zs::bindings {

void init_zero_bindings(py::module_& m) {
  m.def(
      "stage12_partition",
      [](int64_t numel, int world, int rank, int alignment) {
        const zero::ShardRange s = zero::stage12_partition(numel, world, rank, alignment);
        return std::make_tuple(s.begin, s.numel, s.valid);
      },
      "Stage 1/2: (begin, numel, valid) of rank's partition of a flat group of numel elements, "
      "padded to a multiple of alignment*world.",
      py::arg("numel"), py::arg("world"), py::arg("rank"), py::arg("alignment") = 2);
  m.def("stage12_padded_numel", &zero::stage12_padded_numel, py::arg("numel"), py::arg("world"),
        py::arg("alignment") = 2);
  m.def(
      "stage3_param_shard",
      [](int64_t numel, int world, int rank) {
        const zero::ShardRange s = zero::stage3_param_shard(numel, world, rank);
        return std::make_tuple(s.begin, s.numel, s.valid);
      },
      "Stage 3: (begin, numel, valid) of rank's shard of one parameter.", py::arg("numel"),
      py::arg("world"), py::arg("rank"));
  m.def(
      "plan_sub_groups",
      [](const std::vector<int64_t>& partition_numels,
         const std::vector<std::vector<int64_t>>& param_starts, int64_t sub_group_size) {
        std::vector<std::tuple<int, int64_t, int64_t>> out;
        for (const zero::SubGroup& s :
             zero::plan_sub_groups(partition_numels, param_starts, sub_group_size))
          out.emplace_back(s.group, s.begin, s.end);
        return out;
      },
      "Optimizer sub-groups (group, begin, end) of a rank's partitions; sub_group_size 0 cuts "
      "at the parameter starts (one sub-group per parameter, DeepSpeed's meaning).",
      py::arg("partition_numels"), py::arg("param_starts"), py::arg("sub_group_size"));
}

}  // namespace zs::bindings
