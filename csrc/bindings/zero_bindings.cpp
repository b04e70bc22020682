// ZeRO partition arithmetic for the Python engine: one answer to "which elements does rank r own",
// and the stage-3 prefetch schedule of a recorded trace.
#include <tuple>
#include <utility>
#include <vector>

#include <pybind11/stl.h>

#include "bindings/bindings.h"
#include "zero/prefetch_schedule.h"
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
  m.def(
      "plan_prefetch",
      [](const std::vector<std::tuple<int64_t, std::vector<int64_t>>>& trace,
         const std::vector<int64_t>& param_numel, const std::vector<bool>& persistent,
         int64_t prefetch_bucket_size, int64_t max_live_parameters, int64_t max_reuse_distance) {
        std::vector<zero::TraceEvent> events;
        events.reserve(trace.size());
        for (const auto& [module, params] : trace) events.push_back({module, params});
        const zero::PrefetchPlan plan = zero::plan_prefetch(
            events, param_numel, std::vector<uint8_t>(persistent.begin(), persistent.end()),
            {prefetch_bucket_size, max_live_parameters, max_reuse_distance});
        using Event = std::tuple<std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>,
                                 int64_t, int64_t>;
        std::vector<Event> out;
        out.reserve(plan.events.size());
        for (const zero::EventPlan& e : plan.events)
          out.emplace_back(e.fetch, e.prefetch, e.release, e.live_after_fetch,
                           e.live_after_release);
        return std::make_tuple(std::move(out), plan.peak_live);
      },
      "Stage 3: the prefetch schedule of a recorded trace of (module_id, [param ids]) events "
      "(Note [Prefetch plan] in zero/prefetch_schedule.h). Returns (events, peak_live), one "
      "(fetch, prefetch, release, live_after_fetch, live_after_release) per event.",
      py::arg("trace"), py::arg("param_numel"), py::arg("persistent"),
      py::arg("prefetch_bucket_size"), py::arg("max_live_parameters"),
      py::arg("max_reuse_distance"));
}

}  // namespace zs::bindings
