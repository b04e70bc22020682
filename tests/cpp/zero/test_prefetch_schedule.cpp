// The stage-3 prefetch schedule (Note [Prefetch plan]): one behaviour per test, then a
// cross-check against a reference simulator that follows the rules word by word.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/check.h"
#include "zero/prefetch_schedule.h"

namespace zs::zero {
namespace {

using Ids = std::vector<int64_t>;
constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

// Event i is module i, listing params[i].
std::vector<TraceEvent> trace_of(const std::vector<Ids>& params) {
  std::vector<TraceEvent> trace;
  for (size_t i = 0; i < params.size(); ++i) trace.push_back({static_cast<int64_t>(i), params[i]});
  return trace;
}

PrefetchPlan plan(const std::vector<Ids>& params, const Ids& numel, PrefetchKnobs knobs,
                  std::vector<uint8_t> persistent = {}) {
  persistent.resize(numel.size(), 0);
  return plan_prefetch(trace_of(params), numel, persistent, knobs);
}

int64_t numel_of(const Ids& ids, const Ids& numel) {
  int64_t n = 0;
  for (const int64_t p : ids) n += numel[p];
  return n;
}

// What a fetch or prefetch adds and a release removes is what the live counts say.
void expect_live_accounting(const PrefetchPlan& p, const Ids& numel) {
  int64_t before = 0, peak = 0;
  for (size_t i = 0; i < p.events.size(); ++i) {
    const EventPlan& e = p.events[i];
    SCOPED_TRACE("event " + std::to_string(i));
    EXPECT_EQ(before + numel_of(e.fetch, numel) + numel_of(e.prefetch, numel), e.live_after_fetch);
    EXPECT_EQ(e.live_after_fetch - numel_of(e.release, numel), e.live_after_release);
    before = e.live_after_release;
    peak = std::max(peak, e.live_after_fetch);
  }
  EXPECT_EQ(p.peak_live, peak);
}

TEST(PrefetchSchedule, ReleasesAfterUseWithoutReuse) {
  const Ids numel = {10, 10, 10, 10};
  const auto p = plan({{0, 1}, {2}, {3}}, numel, {0, 1000, 0});
  ASSERT_EQ(p.events.size(), 3u);
  const std::vector<Ids> own = {{0, 1}, {2}, {3}};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(p.events[i].fetch, own[i]);
    EXPECT_TRUE(p.events[i].prefetch.empty());
    EXPECT_EQ(p.events[i].release, own[i]);
    EXPECT_EQ(p.events[i].live_after_release, 0);
  }
  EXPECT_EQ(p.events[0].live_after_fetch, 20);
  EXPECT_EQ(p.peak_live, 20);
}

TEST(PrefetchSchedule, ReuseDistanceKeepsANearUseAndReleasesAFarOne) {
  // Parameter 0 is used again after 10 elements of other gathers, parameter 1 after 40.
  const auto p = plan({{0, 1}, {2}, {0}, {3}, {4}, {1}}, {10, 10, 10, 10, 10}, {0, 1000, 15});
  EXPECT_EQ(p.events[0].release, Ids{1});
  EXPECT_EQ(p.events[0].live_after_release, 10);
  EXPECT_TRUE(p.events[2].fetch.empty());
  EXPECT_EQ(p.events[2].release, Ids{0});  // no later use
  EXPECT_EQ(p.events[5].fetch, Ids{1});
}

TEST(PrefetchSchedule, ReuseDistanceIsStrict) {
  const auto p = plan({{0}, {1}, {0}}, {10, 10}, {0, 1000, 10});  // distance 10 is not < 10
  EXPECT_EQ(p.events[0].release, Ids{0});
  EXPECT_EQ(p.events[2].fetch, Ids{0});
}

TEST(PrefetchSchedule, TiedParameterUsedByTheFirstAndLastEvent) {
  // Parameter 0 is an embedding tied to the output head.
  const std::vector<Ids> trace = {{0, 1}, {2}, {3}, {4, 0}};
  const Ids numel = {100, 10, 10, 10, 10};
  const auto far = plan(trace, numel, {0, kNoLimit, 20});  // 20 is not < 20
  EXPECT_EQ(far.events[0].release, (Ids{0, 1}));
  EXPECT_EQ(far.events[3].fetch, (Ids{4, 0}));
  const auto near = plan(trace, numel, {0, kNoLimit, 21});
  EXPECT_EQ(near.events[0].release, Ids{1});
  EXPECT_EQ(near.events[1].live_after_release, 100);
  EXPECT_EQ(near.events[3].fetch, Ids{4});
  EXPECT_EQ(near.events[3].release, (Ids{4, 0}));
}

TEST(PrefetchSchedule, ModuleCalledTwiceInARowKeepsItsParametersUnlessTheDistanceIsZero) {
  const std::vector<TraceEvent> twice = {{7, {0, 1}}, {7, {0, 1}}};
  const std::vector<uint8_t> none(2, 0);
  const auto kept = plan_prefetch(twice, {5, 5}, none, {0, 100, 1});
  EXPECT_TRUE(kept.events[0].release.empty());
  EXPECT_TRUE(kept.events[1].fetch.empty());
  EXPECT_EQ(kept.events[1].release, (Ids{0, 1}));
  const auto zero = plan_prefetch(twice, {5, 5}, none, {0, 100, 0});
  EXPECT_EQ(zero.events[0].release, (Ids{0, 1}));
  EXPECT_EQ(zero.events[1].fetch, (Ids{0, 1}));
}

TEST(PrefetchSchedule, RepeatedIdsInAnEventCountOnce) {
  const auto p = plan({{0, 0, 1}, {1, 0, 1}}, {5, 7}, {0, 100, 0});
  EXPECT_EQ(p.events[0].fetch, (Ids{0, 1}));
  EXPECT_EQ(p.events[0].live_after_fetch, 12);
  EXPECT_EQ(p.events[1].release, (Ids{1, 0}));
}

TEST(PrefetchSchedule, PrefetchIsBoundedByTheBucketSize) {
  const auto p = plan({{0}, {1}, {2}, {3}}, {10, 10, 10, 10}, {25, 1000, 0});
  EXPECT_EQ(p.events[0].prefetch, (Ids{1, 2}));
  EXPECT_EQ(p.events[1].prefetch, Ids{3});  // a fresh bucket per event
  EXPECT_EQ(p.peak_live, 30);
}

TEST(PrefetchSchedule, PrefetchStopsAtTheFirstMisfit) {
  // Parameter 2 would fit, but prefetches arrive in trace order.
  const auto p = plan({{0}, {1}, {2}}, {10, 30, 5}, {20, 1000, 0});
  EXPECT_TRUE(p.events[0].prefetch.empty());
  EXPECT_EQ(p.events[1].fetch, Ids{1});
  EXPECT_EQ(p.events[1].prefetch, Ids{2});
}

TEST(PrefetchSchedule, PrefetchIsBoundedByMaxLiveParameters) {
  const auto p = plan({{0}, {1}, {2}, {3}}, {10, 10, 10, 10}, {1000, 25, 0});
  EXPECT_EQ(p.events[0].prefetch, Ids{1});
  EXPECT_EQ(p.events[0].live_after_fetch, 20);
  EXPECT_EQ(p.events[1].prefetch, Ids{2});
  EXPECT_EQ(p.peak_live, 20);
}

TEST(PrefetchSchedule, AFetchOverTheCapStillHappens) {
  const auto p = plan({{0}, {1}}, {100, 10}, {1000, 50, 0});
  EXPECT_EQ(p.events[0].fetch, Ids{0});
  EXPECT_TRUE(p.events[0].prefetch.empty());
  EXPECT_EQ(p.events[0].live_after_fetch, 100);
  EXPECT_EQ(p.events[1].fetch, Ids{1});
  EXPECT_EQ(p.peak_live, 100);
}

TEST(PrefetchSchedule, PersistentParametersNeverAppearNorCount) {
  // Parameter 0 is persistent and large: not live, and no distance between the uses of 1.
  const auto p = plan({{0, 1}, {0}, {1, 0, 2}}, {1000, 10, 10}, {100, 1000, 5}, {1, 0, 0});
  for (const EventPlan& e : p.events)
    for (const Ids* ids : {&e.fetch, &e.prefetch, &e.release})
      EXPECT_EQ(std::count(ids->begin(), ids->end(), 0), 0);
  EXPECT_EQ(p.events[0].release, Ids{});  // 1 is used again at distance 0
  EXPECT_EQ(p.events[2].release, (Ids{1, 2}));
  EXPECT_EQ(p.peak_live, 20);
}

TEST(PrefetchSchedule, PrefetchedParametersAreNotFetchedAgain) {
  const auto p = plan({{0}, {1, 2}, {2}}, {10, 10, 10}, {1000, 1000, 0});
  EXPECT_EQ(p.events[0].prefetch, (Ids{1, 2}));
  EXPECT_TRUE(p.events[1].fetch.empty());
  EXPECT_EQ(p.events[1].prefetch, Ids{});  // 2 is live until released after event 1
  EXPECT_EQ(p.events[2].fetch, Ids{2});
}

TEST(PrefetchSchedule, LiveAccountingIsConsistent) {
  const Ids numel = {4, 8, 15, 16, 23, 42};
  const std::vector<Ids> trace = {{0, 1}, {2}, {3, 0}, {4}, {5, 2}, {1}, {0, 5}};
  for (const PrefetchKnobs& k : {PrefetchKnobs{20, 60, 0}, PrefetchKnobs{50, 40, 30},
                                 PrefetchKnobs{kNoLimit, kNoLimit, kNoLimit}})
    expect_live_accounting(plan(trace, numel, k), numel);
}

TEST(PrefetchSchedule, NoLimitKnobsGatherEverythingOnceAndKeepIt) {
  const auto p = plan({{0}, {1}, {0}, {2}}, {3, 4, 5}, {kNoLimit, kNoLimit, kNoLimit});
  EXPECT_EQ(p.events[0].prefetch, (Ids{1, 2}));
  EXPECT_EQ(p.peak_live, 12);
  EXPECT_EQ(p.events[1].release, Ids{1});  // last use: nothing to keep it for
}

TEST(PrefetchSchedule, EmptyTraceIsAnEmptyPlan) {
  const auto p = plan({}, {5}, {1, 1, 1});
  EXPECT_TRUE(p.events.empty());
  EXPECT_EQ(p.peak_live, 0);
}

std::string error_of(const std::vector<Ids>& trace, const Ids& numel,
                     const std::vector<uint8_t>& persistent, PrefetchKnobs knobs) {
  try {
    plan_prefetch(trace_of(trace), numel, persistent, knobs);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "no error";
}

TEST(PrefetchSchedule, BadInputNamesTheProblem) {
  const std::vector<uint8_t> two(2, 0);
  EXPECT_EQ(error_of({{0}, {1, 7}}, {1, 1}, two, {}),
            "prefetch plan: trace event 1 lists parameter id 7, out of range for 2 parameters");
  EXPECT_NE(error_of({{-1}}, {1, 1}, two, {}).find("parameter id -1"), std::string::npos);
  EXPECT_EQ(error_of({}, {1, 1}, {0}, {}),
            "prefetch plan: 2 parameter sizes but 1 persistence flags");
  EXPECT_EQ(error_of({}, {1, -3}, two, {}), "prefetch plan: parameter 1 has a negative numel: -3");
  EXPECT_EQ(error_of({}, {1, 1}, two, {-1, 0, 0}),
            "zero_optimization.stage3_prefetch_bucket_size: expected an integer >= 0; got -1");
  EXPECT_NE(error_of({}, {1, 1}, two, {0, -1, 0}).find("stage3_max_live_parameters"),
            std::string::npos);
  EXPECT_NE(error_of({}, {1, 1}, two, {0, 0, -1}).find("stage3_max_reuse_distance"),
            std::string::npos);
}

// Sums of element counts past INT64_MAX wrapped negative: `live` and the reuse distances
// silently went wrong (signed overflow, undefined behaviour).
TEST(PrefetchSchedule, ElementSumsBeyondInt64AreErrors) {
  const int64_t half = int64_t{1} << 62;
  const std::vector<uint8_t> two(2, 0);
  EXPECT_EQ(error_of({}, {half, half}, two, {}),
            "prefetch plan: the parameters hold more than 2^63 - 1 elements in all (parameter 1 "
            "has 4611686018427387904)");
  EXPECT_EQ(error_of({{0}, {0}, {0}}, {half}, {0}, {kNoLimit, kNoLimit, kNoLimit}),
            "prefetch plan: the trace gathers more than 2^63 - 1 elements by event 1; reuse "
            "distances would not be exact");
  // Up to the limit the plan is exact: one parameter of 2^62 - 1 elements listed twice.
  const PrefetchPlan p = plan({{0}, {0}}, {half - 1}, {kNoLimit, kNoLimit, kNoLimit});
  EXPECT_EQ(p.peak_live, half - 1);
  EXPECT_TRUE(p.events[0].release.empty());
}

// The rules of Note [Prefetch plan] as written, rescanning the trace for every question.
PrefetchPlan reference_plan(const std::vector<TraceEvent>& trace, const Ids& numel,
                            const std::vector<uint8_t>& persistent, const PrefetchKnobs& k) {
  auto own = [&](size_t i) {
    Ids out;
    for (const int64_t p : trace[i].params)
      if (!persistent[p] && std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
    return out;
  };
  std::set<int64_t> live;
  auto live_numel = [&] {
    int64_t n = 0;
    for (const int64_t p : live) n += numel[p];
    return n;
  };
  PrefetchPlan out;
  for (size_t i = 0; i < trace.size(); ++i) {
    EventPlan e;
    for (const int64_t p : own(i))
      if (live.insert(p).second) e.fetch.push_back(p);
    int64_t bucket = 0;
    bool stop = false;
    for (size_t j = i + 1; j < trace.size() && !stop; ++j) {
      for (const int64_t p : trace[j].params) {
        if (persistent[p] || live.count(p)) continue;
        if (bucket + numel[p] > k.prefetch_bucket_size ||
            live_numel() + numel[p] > k.max_live_parameters) {
          stop = true;
          break;
        }
        live.insert(p);
        bucket += numel[p];
        e.prefetch.push_back(p);
      }
    }
    e.live_after_fetch = live_numel();
    out.peak_live = std::max(out.peak_live, e.live_after_fetch);
    for (const int64_t p : own(i)) {
      bool keep = false;
      int64_t distance = 0;
      for (size_t j = i + 1; j < trace.size(); ++j) {
        const Ids later = own(j);
        if (std::find(later.begin(), later.end(), p) != later.end()) {
          keep = distance < k.max_reuse_distance;
          break;
        }
        distance += numel_of(later, numel);
      }
      if (keep) continue;
      live.erase(p);
      e.release.push_back(p);
    }
    e.live_after_release = live_numel();
    out.events.push_back(e);
  }
  return out;
}

TEST(PrefetchSchedule, MatchesAReferenceSimulatorOnRandomTraces) {
  std::mt19937 rng(20240611);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  for (int round = 0; round < 400; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const auto n_params = uniform(1, 12);
    Ids numel(n_params);
    std::vector<uint8_t> persistent(n_params);
    for (int64_t p = 0; p < n_params; ++p) {
      numel[p] = uniform(0, 3) == 0 ? 0 : uniform(1, 20);
      persistent[p] = uniform(0, 4) == 0;
    }
    std::vector<TraceEvent> trace(uniform(0, 25));
    for (auto& e : trace) {
      e.module = uniform(0, 5);
      e.params.resize(uniform(0, 5));
      for (auto& p : e.params) p = uniform(0, n_params - 1);
    }
    const PrefetchKnobs k{uniform(0, 60), uniform(0, 80), uniform(0, 60)};
    const PrefetchPlan got = plan_prefetch(trace, numel, persistent, k);
    const PrefetchPlan want = reference_plan(trace, numel, persistent, k);
    ASSERT_EQ(got.events.size(), want.events.size());
    for (size_t i = 0; i < got.events.size(); ++i) {
      SCOPED_TRACE("event " + std::to_string(i));
      EXPECT_EQ(got.events[i].fetch, want.events[i].fetch);
      EXPECT_EQ(got.events[i].prefetch, want.events[i].prefetch);
      EXPECT_EQ(got.events[i].release, want.events[i].release);
      EXPECT_EQ(got.events[i].live_after_fetch, want.events[i].live_after_fetch);
      EXPECT_EQ(got.events[i].live_after_release, want.events[i].live_after_release);
    }
    EXPECT_EQ(got.peak_live, want.peak_live);
    expect_live_accounting(got, numel);
  }
}

TEST(PrefetchSchedule, ALongForwardBackwardTraceGathersEachParameterOnce) {
  // 10^4 events over 10^4 parameters with everything kept for reuse: the case where walks
  // that re-read gathered entries would be quadratic (Note [Prefetch cursor]).
  const int64_t layers = 5000;
  std::vector<Ids> trace;
  for (int64_t l = 0; l < layers; ++l) trace.push_back({2 * l, 2 * l + 1});
  for (int64_t l = layers; l-- > 0;) trace.push_back({2 * l + 1, 2 * l});
  const Ids numel(2 * layers, 1);
  const auto p = plan(trace, numel, {8, kNoLimit, kNoLimit});
  int64_t gathered = 0;
  for (const EventPlan& e : p.events)
    gathered += static_cast<int64_t>(e.fetch.size() + e.prefetch.size());
  EXPECT_EQ(gathered, 2 * layers);
  EXPECT_EQ(p.peak_live, 2 * layers);
  EXPECT_EQ(p.events.back().live_after_release, 0);
}

}  // namespace
}  // namespace zs::zero
