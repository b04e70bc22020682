// Stage-3 prefetch schedule: for each step of a recorded trace, which parameters to gather,
// which to gather ahead and which to release. Pure planning: no torch, no communication.
//
// The model is DeepSpeed's trace-driven prefetch (PartitionedParameterCoordinator). During the
// first training step the runtime records the order in which modules gather their parameters,
// one event per module invocation (forward, then backward); later steps replay that order, so
// at every module it is known which parameters come next. That knowledge is what this planner
// turns into a schedule: a module's own parameters are gathered before it runs, those of the
// modules after it are gathered ahead within stage3_prefetch_bucket_size elements per event
// and stage3_max_live_parameters elements gathered at once, and a parameter stays gathered
// after use only if it is needed again within stage3_max_reuse_distance elements of other
// gathers. Computing the whole schedule once per trace replaces DeepSpeed's per-hook
// bookkeeping; the caller still has to check that a replay follows the recorded order (the
// module ids are kept for that) and re-record when it does not. See Note [Prefetch plan].
#pragma once

#include <cstdint>
#include <vector>

namespace zs::zero {

// Note [Prefetch plan]
// The plan simulates L, the set of gathered parameters that are not persistent. Persistent
// parameters (small ones kept whole on every rank: stage3_param_persistence_threshold) are
// always gathered: they appear in no list and never count as live. "Live" is the sum of the
// elements of L. For each event i, in trace order:
//  1. fetch: the event's parameters not in L, in the event's order, once each. They join L
//     even beyond max_live_parameters: the module cannot run without them.
//  2. prefetch: walk the parameters of events i+1, i+2, ... in trace order, skipping those in
//     L. Each joins L while it fits in both the bucket (elements prefetched at this event <=
//     prefetch_bucket_size) and the cap (live <= max_live_parameters); the walk stops at the
//     first that does not fit instead of skipping it, so prefetches arrive in the order they
//     are needed. live_after_fetch is live after steps 1 and 2.
//  3. release: each of the event's parameters stays in L if its next use, event j > i, comes
//     after fewer than max_reuse_distance elements of gathers: the sum over events i+1..j-1 of
//     each event's own non-persistent elements (a parameter listed by two of them counts
//     twice). Otherwise it is released, in the event's order. max_reuse_distance 0 thus
//     releases every parameter right after use; a kept one is released after a later use that
//     has no near next use. live_after_release is live after this step.
// peak_live is the largest live_after_fetch: the gathered elements the schedule needs at once.

struct TraceEvent {
  int64_t module = 0;           // the module that gathered; not read by the planner
  std::vector<int64_t> params;  // parameter ids: indexes into param_numel
};

struct PrefetchKnobs {  // elements (numel), as in ds_config zero_optimization.stage3_*
  int64_t prefetch_bucket_size = 0;
  int64_t max_live_parameters = 0;
  int64_t max_reuse_distance = 0;
};

struct EventPlan {
  std::vector<int64_t> fetch;     // gather before the event runs (mandatory)
  std::vector<int64_t> prefetch;  // gather ahead for later events
  std::vector<int64_t> release;   // drop after the event ran
  int64_t live_after_fetch = 0;
  int64_t live_after_release = 0;
};

struct PrefetchPlan {
  std::vector<EventPlan> events;  // one per trace event
  int64_t peak_live = 0;
};

// The schedule of Note [Prefetch plan]. persistent[p] != 0 marks parameter p persistent.
// Time is linear in the trace plus what prefetch walks re-read after releases (each walk
// resumes where the last one stopped; see Note [Prefetch cursor] in prefetch_schedule.cpp).
// Throws zs::ValueError on an id out of range, size mismatch or a negative numel or knob.
PrefetchPlan plan_prefetch(const std::vector<TraceEvent>& trace,
                           const std::vector<int64_t>& param_numel,
                           const std::vector<uint8_t>& persistent, const PrefetchKnobs& knobs);

}  // namespace zs::zero
