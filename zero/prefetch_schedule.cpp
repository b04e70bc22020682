#include "zero/prefetch_schedule.h"

#include <algorithm>
#include <utility>

#include "common/check.h"

namespace zs::zero {
namespace {

// The trace as the rules see it: persistent parameters and repeats inside an event dropped,
// all events in one array. Event i lists ids[begin[i], begin[i + 1]).
struct FlatTrace {
  std::vector<int64_t> ids;
  std::vector<size_t> begin;          // one per event, plus the end
  std::vector<size_t> event_of;       // event of each entry of ids
  std::vector<size_t> next_use;       // entry of the same id in a later event, ids.size() if none
  std::vector<int64_t> numel_before;  // elements listed by events 0..i-1, one per event plus one
};

// L of Note [Prefetch plan]: which parameters are gathered and how many elements they hold.
struct LiveSet {
  explicit LiveSet(const std::vector<int64_t>& param_numel)
      : numel(param_numel), has(param_numel.size(), 0) {}
  void add(int64_t p) {
    has[p] = 1;
    total += numel[p];
  }
  void remove(int64_t p) {
    has[p] = 0;
    total -= numel[p];
  }
  const std::vector<int64_t>& numel;
  std::vector<uint8_t> has;
  int64_t total = 0;
};

void check_inputs(const std::vector<int64_t>& param_numel, const std::vector<uint8_t>& persistent,
                  const PrefetchKnobs& knobs) {
  ZS_CHECK_VALUE(param_numel.size() == persistent.size(), "prefetch plan: ", param_numel.size(),
                 " parameter sizes but ", persistent.size(), " persistence flags");
  // L never holds more than every parameter once, so a total that fits keeps `live` exact.
  int64_t total = 0;
  for (size_t p = 0; p < param_numel.size(); ++p) {
    ZS_CHECK_VALUE(param_numel[p] >= 0, "prefetch plan: parameter ", p,
                   " has a negative numel: ", param_numel[p]);
    ZS_CHECK_VALUE(!__builtin_add_overflow(total, param_numel[p], &total),
                   "prefetch plan: the parameters hold more than 2^63 - 1 elements in all "
                   "(parameter ",
                   p, " has ", param_numel[p], ")");
  }
  const std::pair<const char*, int64_t> named[] = {
      {"stage3_prefetch_bucket_size", knobs.prefetch_bucket_size},
      {"stage3_max_live_parameters", knobs.max_live_parameters},
      {"stage3_max_reuse_distance", knobs.max_reuse_distance}};
  for (const auto& [key, value] : named)
    ZS_CHECK_VALUE(value >= 0, "zero_optimization.", key, ": expected an integer >= 0; got ",
                   value);
}

FlatTrace flatten(const std::vector<TraceEvent>& trace, const std::vector<int64_t>& param_numel,
                  const std::vector<uint8_t>& persistent) {
  const auto n_params = static_cast<int64_t>(param_numel.size());
  FlatTrace f;
  f.numel_before.push_back(0);
  std::vector<size_t> listed_by(param_numel.size(), trace.size());  // last event that listed p
  for (size_t i = 0; i < trace.size(); ++i) {
    f.begin.push_back(f.ids.size());
    int64_t event_numel = 0;
    for (const int64_t p : trace[i].params) {
      ZS_CHECK_VALUE(p >= 0 && p < n_params, "prefetch plan: trace event ", i,
                     " lists parameter id ", p, ", out of range for ", n_params, " parameters");
      if (persistent[p] || listed_by[p] == i) continue;
      listed_by[p] = i;
      f.ids.push_back(p);
      f.event_of.push_back(i);
      event_numel += param_numel[p];
    }
    // A parameter counts once per event that lists it, so this sum can pass the total above.
    int64_t before = 0;
    ZS_CHECK_VALUE(!__builtin_add_overflow(f.numel_before.back(), event_numel, &before),
                   "prefetch plan: the trace gathers more than 2^63 - 1 elements by event ", i,
                   "; reuse distances would not be exact");
    f.numel_before.push_back(before);
  }
  f.begin.push_back(f.ids.size());
  // One backward scan; ids are unique within an event, so the entry seen last is a later event's.
  std::vector<size_t> seen(param_numel.size(), f.ids.size());
  f.next_use.resize(f.ids.size());
  for (size_t k = f.ids.size(); k-- > 0;) {
    f.next_use[k] = seen[f.ids[k]];
    seen[f.ids[k]] = k;
  }
  return f;
}

}  // namespace

// Note [Prefetch cursor]
// A walk from event i+1 would re-read every entry that is already gathered, which for a trace
// whose parameters are all kept for reuse (a large max_reuse_distance) makes the plan quadratic.
// Instead `cursor` keeps the invariant: every entry in [begin[i + 1], cursor) is in L. A walk
// resumes at the cursor and leaves it at the misfit it stopped on. Fetches and prefetches only
// grow L; a release of p breaks the invariant only for p's later entries, so the cursor moves
// back to p's next use, the first of them.
PrefetchPlan plan_prefetch(const std::vector<TraceEvent>& trace,
                           const std::vector<int64_t>& param_numel,
                           const std::vector<uint8_t>& persistent, const PrefetchKnobs& knobs) {
  check_inputs(param_numel, persistent, knobs);
  const FlatTrace f = flatten(trace, param_numel, persistent);
  const size_t end = f.ids.size();
  LiveSet live(param_numel);
  size_t cursor = 0;
  PrefetchPlan plan;
  plan.events.resize(trace.size());
  for (size_t i = 0; i < trace.size(); ++i) {
    EventPlan& e = plan.events[i];
    for (size_t k = f.begin[i]; k < f.begin[i + 1]; ++k) {
      if (live.has[f.ids[k]]) continue;
      live.add(f.ids[k]);
      e.fetch.push_back(f.ids[k]);
    }
    int64_t bucket = 0;
    for (cursor = std::max(cursor, f.begin[i + 1]); cursor < end; ++cursor) {
      const int64_t p = f.ids[cursor];
      if (live.has[p]) continue;
      // Subtractions, not sums: no overflow for knobs near INT64_MAX (a caller's "no limit").
      const int64_t n = param_numel[p];
      if (n > knobs.prefetch_bucket_size - bucket || n > knobs.max_live_parameters - live.total)
        break;
      live.add(p);
      bucket += n;
      e.prefetch.push_back(p);
    }
    e.live_after_fetch = live.total;
    plan.peak_live = std::max(plan.peak_live, live.total);
    for (size_t k = f.begin[i]; k < f.begin[i + 1]; ++k) {
      const size_t next = f.next_use[k];
      if (next < end &&
          f.numel_before[f.event_of[next]] - f.numel_before[i + 1] < knobs.max_reuse_distance)
        continue;  // the nearest next use decides: the distance only grows with j
      live.remove(f.ids[k]);
      e.release.push_back(f.ids[k]);
      cursor = std::min(cursor, next);
    }
    e.live_after_release = live.total;
  }
  return plan;
}

}  // namespace zs::zero
