// ZeRO partition arithmetic for the Python engine: one answer to "which elements does rank r own".
#include <tuple>

#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "zero/shard.h"

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
}

}  // namespace zs::bindings
