"""The stage-3 parameter coordinator: gathers a module's parameters before it runs (forward,
or backward), prefetches the next ones along the recorded trace, and releases them after.

Note [One gather sequence on every rank]
  A gather is a collective, so every rank must issue the same gathers in the same order,
  whichever modules its batch runs: an expert no token of this rank routes to, a head used
  on some batches, a vision tower only for batches with images. Gathering a module's
  parameters when it runs made that a local matter (a module run on rank 0 only was a
  gather rank 1 never joined: Gloo aborted, NCCL hangs). So the gathers of a traced step
  (engine.forward and its backward) follow a sequence every rank agrees on:

  - Rounds. When a module needs parameters it does not hold, the rank asks for its unit
    (a module's own parameters, or one parameter read by attribute) in a round: one
    all-reduce of the unit's key, the smallest key wanted on any rank wins, and every rank
    gathers that unit, exactly its parameters (Partitioner.gather_exact: what a rank holds
    already rides along). A rank whose want was not chosen lets the unit go and asks again.
    A rank at the end of a pass (its forward returned, its backward ended) answers rounds
    with DONE until every rank does. Any module order, any subset of modules, repeats and
    recomputation (activation checkpointing) on any rank: every rank gathers the same
    units in the same order, by construction. A unit's parameters are the module's own
    (a leaf's whole subtree): the same on every rank; parameters a module reads that
    belong to others go in rounds of their own.
  - The trace. The first step of each kind (training, evaluation) runs on rounds and
    records the chosen units: the same list on every rank. Later steps replay it without
    rounds: a module that needs parameters walks the trace from where this rank is,
    issuing each event's gathers and prefetches (the plan: zero/prefetch_schedule.h), until
    its parameters are there; events walked for modules this rank does not run are let go
    at once. Each pass ends by walking the rest of its events and one round, so a rank that
    needs what the trace does not bring (its batch went another way) walks to the pass end
    and asks in rounds, which the others join there; the trace is then recorded again
    (every rank saw the round). The plan releases each event's parameters after it (no
    reuse across events: that is what makes a rank's needs follow the trace), and what a
    rank holds longer (a running parent's, a recomputation's) only rides along.
  Rounds cost one small all-reduce and a host read each, in the recording step and at
  each pass end. A forward outside engine.forward (no traced step: generation, a
  module called directly) gathers on demand, as a rank-local decision: such forwards must
  run the same modules on every rank (DeepSpeed's requirement), or mark the block that
  branches as a leaf module.

Note [Stage-3 phases]
  The coordinator knows which part of the step runs from its own hooks, not from autograd's
  internals: a module's forward outside backward is FORWARD; the first hook of a backward
  (a module output's gradient, a param's final gradient, or the engine's run_backward
  phase seen by a forward hook) opens the backward, and from then until autograd's queued
  end-of-backward callback a module's backward gathering is PRE_BACKWARD, a gradient
  landing POST_BACKWARD, and any forward is a RECOMPUTE (activation checkpointing), whose
  params stay gathered for the backward that follows. `_enter` is the one place the phase
  changes and refuses a transition _ENTERED_FROM does not allow: a RECOMPUTE outside
  backward, or a FORWARD inside it, is a bug of this file, never silently wrong releases.
"""

from __future__ import annotations

import collections
import enum
import logging
from typing import Dict, List, Optional, Tuple

import torch

from ... import _C, comm
from ..protocol import TrainingState
from .leaf import is_leaf
from .module_state import (
    external_params,
    register_external_parameter,
    unregister_external_parameter,
)
from .param import ShardState, ZeroParam, unique_zero_params, zero_param_of
from .partitioner import Partitioner
from .trace import BUCKET_KEYS, DONE, PARAM_KEYS, PlannedEvent, Trace, TraceMode, peak_read_ahead

logger = logging.getLogger("zerostream")


class Phase(enum.Enum):
    """Which part of a step the coordinator's hooks are in (Note [Stage-3 phases])."""

    IDLE = "idle"  # no module runs
    FORWARD = "forward"  # modules run forward, outside backward
    PRE_BACKWARD = "pre_backward"  # in backward: a module's params gathered for its backward
    RECOMPUTE = "recompute"  # in backward: a forward re-run by activation checkpointing
    POST_BACKWARD = "post_backward"  # in backward: gradients final, params being released


_BACKWARD = {Phase.PRE_BACKWARD, Phase.RECOMPUTE, Phase.POST_BACKWARD}
# The phases each phase may be entered from.
_ENTERED_FROM = {
    Phase.IDLE: set(Phase),
    Phase.FORWARD: {Phase.IDLE, Phase.FORWARD},
    Phase.RECOMPUTE: _BACKWARD,
    Phase.PRE_BACKWARD: set(Phase),  # the backward opens (from any phase) or goes on
    Phase.POST_BACKWARD: _BACKWARD,
}


def module_params(module: torch.nn.Module) -> List[ZeroParam]:
    """The ZeRO-3 params a module's forward uses: its own (not its children's) and the
    external ones registered with zero.register_external_parameter; for a leaf module
    (Note [Leaf modules] in leaf.py), those of its whole subtree."""
    if not is_leaf(module):
        return unique_zero_params(list(module._parameters.values()) + external_params(module))
    external = [p for m in module.modules() for p in external_params(m)]
    return unique_zero_params(list(module.parameters()) + external)


def _host_int(t: torch.Tensor) -> int:
    """A round's one read of its result (tests count the calls); a device-to-host read where
    the group has no host twin."""
    return int(t.item())


class ParamCoordinator:
    """Gathers, prefetches and releases stage-3 params around module invocations."""

    def __init__(self, partitioner: Partitioner, zero=None, tracing: bool = True, run=None):
        self.part = partitioner
        # Set by the optimizer when the module has leaves (leaf.LeafGrads).
        self.leaf_grads = None
        self.run = run  # the engine's protocol.RunState (None under zero.Init alone)
        self.tracing = tracing
        self.prefetch_bucket_size = zero.stage3_prefetch_bucket_size if zero else 0
        if zero is not None and zero.stage3_allgather_sequential:
            self.prefetch_bucket_size = 1  # DeepSpeed's meaning: no bucketing ahead
        self.max_live = zero.stage3_max_live_parameters if zero else 2**62
        self.max_reuse = zero.stage3_max_reuse_distance if zero else 0
        self.keys: Dict[int, int] = {}  # id(module) -> its unit key: the order of install
        self.units: List[torch.nn.Module] = []
        self.traces: Dict[tuple, Trace] = {}
        self.trace: Optional[Trace] = None
        self.pos = 0  # the next event of the trace this rank has not walked
        self.replaying = False  # this pass walks the trace (else: rounds)
        self.open_pass: Optional[str] = None  # "forward" | "backward" while one runs
        self.frames: List[Tuple[torch.nn.Module, List[ZeroParam]]] = []
        self.phase = Phase.IDLE
        self.invalidations = 0
        self.externals_found = False  # a forward read another module's param (access())
        self.prefetched_numel = 0
        self.forward_peak_live = 0
        self.backward_peak_live = 0
        self.rounds = 0  # rounds that gathered a unit (Note [One gather sequence ...])
        self.walked = 0  # trace events walked for modules this rank did not run
        self.reducer = None  # the stage-3 reducer whose buckets join the sequence
        self.used: set = set()  # ds_ids this rank's modules fetched in the pass under way
        # The plan's live set as the walk has executed it (Note [The plan's live params]):
        # pinned ds_ids are not released before the plan releases them; a release asked
        # for meanwhile waits in `deferred`.
        self.pinned: set = set()
        self.deferred: set = set()
        self.unpinned_to = 0  # events whose plan releases have been applied

    def register(self, module: torch.nn.Module) -> None:
        """hooks.install, in the same module order on every rank: the module's unit key."""
        if id(module) not in self.keys:
            self.keys[id(module)] = len(self.units)
            self.units.append(module)

    # --- step boundaries -------------------------------------------------------------------------
    def start_step(self, key: tuple) -> None:
        """A forward of the root module begins: closes the previous step's trace and picks
        the trace of this kind of step."""
        self._finish_trace()
        if self.part.swapper is not None:
            self.part.swapper.rehome_when_measured()
        for zp in self.part.params.values():
            zp.users = 0
        self.frames.clear()  # forwards an exception abandoned
        self.open_pass = None
        self._drop_pins()
        self._enter(Phase.IDLE)
        if not self.tracing:
            return
        # empty_partition_cache released the persistent params too: gathered again here,
        # where every rank is (not by whichever module of this rank needs one first).
        emptied = [
            zp for zp in self.part.params.values() if zp.persist and zp.state is ShardState.SHARDED
        ]
        if emptied:
            self.part.gather(emptied)
        trace = self.traces.setdefault(key, Trace(key))
        if trace.mode is TraceMode.INVALID:
            trace.mode, trace.events, trace.plan = TraceMode.RECORD, [], []
            trace.forward_end = None
        self.trace, self.pos = trace, 0
        self.replaying = trace.mode is TraceMode.COMPLETE

    def _finish_trace(self) -> None:
        trace, self.trace = self.trace, None
        if trace is None:
            return
        if trace.mode is TraceMode.RECORD:
            self._complete(trace)
        elif trace.mode is TraceMode.COMPLETE and self.pos != len(trace.events):
            self._invalidate(
                trace, f"the step ended after {self.pos} of {len(trace.events)} recorded events"
            )
        elif trace.mode is TraceMode.COMPLETE and self.part.swapper is not None:
            self.part.swapper.plan_ran()

    def _complete(self, trace: Trace) -> None:
        """Plans the recorded units (the same on every rank: they came from rounds)."""
        trace.recordings += 1
        if trace.forward_end is None:
            trace.forward_end = len(trace.events)
        index: Dict[int, int] = {}
        zps: List[ZeroParam] = []
        for _, ids in trace.events:
            for i in ids:
                if i not in index:
                    index[i] = len(zps)
                    zps.append(self.part.params[i])
        events, trace.peak_live = _C.plan_prefetch(
            [(m, [index[i] for i in ids]) for m, ids in trace.events],
            [zp.numel for zp in zps],
            [zp.persist for zp in zps],
            self.prefetch_bucket_size,
            self.max_live,
            self.max_reuse,
        )
        trace.plan = [
            PlannedEvent(
                [zps[i] for i in fetch],
                [zps[i] for i in prefetch],
                [zps[i].ds_id for i in release],
            )
            for fetch, prefetch, release, _, _ in events
        ]
        trace.mode = TraceMode.COMPLETE
        swapper = self.part.swapper
        if swapper is not None:
            reads = collections.Counter(i for _, ids in trace.events for i in ids)
            swapper.expect_rehome({self.part.params[i]: n for i, n in reads.items()})
            swapper.fit_read_ahead(peak_read_ahead(trace))

    def _invalidate(self, trace: Trace, why: str) -> None:
        self.invalidations += 1
        level = logging.WARNING if self.invalidations == 1 else logging.DEBUG
        if self.externals_found:
            # Expected once: the recording did not know the external params yet.
            self.externals_found = False
            why = "modules were found using other modules' parameters (now external params)"
            level = logging.INFO
        logger.log(level, "ZeRO-3: %s; the module trace is recorded again on the next step", why)
        trace.mode = TraceMode.INVALID
        if self.part.swapper is not None:
            self.part.swapper.plan_abandoned()

    # --- the agreed gather sequence (Note [One gather sequence on every rank]) ------------------
    def _traced(self) -> bool:
        return self.trace is not None and self.open_pass is not None

    def _present(self, zp: ZeroParam) -> bool:
        """Gathered, or in flight with its collective issued (a read ahead from disk whose
        all-gather is not issued yet is launched by the walk, where every rank launches
        it)."""
        if zp.persist or zp.state is ShardState.GATHERED:
            return True
        if zp.state is ShardState.INFLIGHT:
            return self.part.inflight[zp.ds_id].reads is None
        return False

    def _acquire(self, key: int, zps: List[ZeroParam]) -> None:
        """`zps` gathered here, by collectives every rank issues at the same point."""
        if any(not self._present(zp) for zp in zps) and self._traced():
            if not (self.replaying and self._walk(zps, self._pass_end())):
                if self.replaying:
                    logger.debug(
                        "ZeRO-3: unit %d needs ds_ids %s, not brought by the trace's events "
                        "up to %d (the %s pass ends at %d)",
                        key,
                        [zp.ds_id for zp in zps if not self._present(zp)],
                        self.pos,
                        self.open_pass,
                        self._pass_end(),
                    )
                    self._leave_trace()
                self._rounds(key, zps)
        self.part.gather(zps)  # waits for those in flight; untraced: gathers on demand

    def _pass_end(self) -> int:
        trace = self.trace
        if self.open_pass == "forward" and trace.forward_end is not None:
            return trace.forward_end
        return len(trace.events)

    def _walk(self, need: Optional[List[ZeroParam]], end: int) -> bool:
        """Walks the trace up to `end` until `need` is there (None: to `end`), issuing each
        event's gathers and prefetches; what a walked event brought that this rank does not
        need now is let go. Returns whether `need` is there."""
        trace = self.trace
        wanted = {zp.ds_id for zp in need} if need is not None else set()
        while need is None or any(not self._present(zp) for zp in need):
            if self.pos >= end:
                return need is None
            j, self.pos = self.pos, self.pos + 1
            key = trace.events[j][0]
            if key >= BUCKET_KEYS:  # a bucket's reduce-scatter, with what this rank has
                self.reducer.issue_next(key - BUCKET_KEYS)
                continue
            self._unpin_through(j)
            planned = trace.plan[j]
            ids = trace.events[j][1]
            # What this event brings that this rank did not hold, and what an earlier event
            # brought ahead that no module here has used: both are for another rank's
            # modules (or for none) when this rank does not need them now.
            brought = {zp.ds_id for zp in planned.fetch if zp.state is ShardState.SHARDED}
            if self.part.reading:
                # Reads ahead from NVMe of this event's params not launched at the event
                # before: their all-gather goes out now, here on every rank.
                self.part.launch_reads(set(ids), early=False)
            self.part.gather_exact(planned.fetch)
            self.pinned.update(zp.ds_id for zp in planned.fetch)
            unused = [
                i
                for i in ids
                if i not in wanted
                and self.part.params[i].state is not ShardState.SHARDED
                and (i in brought or i not in self.used)
            ]
            if self.part.reading and self.pos < len(trace.events):
                # Reads ahead from NVMe issued at an earlier event for the next one: their
                # uploads and all-gather go out now, at the same event on every rank.
                self.part.launch_reads(set(trace.events[self.pos][1]))
            if planned.prefetch:
                self.prefetched_numel += sum(zp.numel for zp in planned.prefetch)
                self.part.gather_exact(planned.prefetch, async_op=True)
                self.pinned.update(zp.ds_id for zp in planned.prefetch)
            if unused:
                self.walked += 1
                logger.debug("ZeRO-3: event %d lets go %s (need %s)", j, unused, sorted(wanted))
                self._let_go([self.part.params[i] for i in unused])
        return True

    def _leave_trace(self) -> None:
        """This rank needs what the trace does not bring: it walks the rest of the pass's
        events, as the others will, and goes on in rounds (they join at their pass end)."""
        self._walk(None, self._pass_end())
        self._unpin_through(self.pos)
        self.replaying = False
        self._invalidate(self.trace, "this rank's modules left the recorded order")

    def _let_go(self, zps: List[ZeroParam]) -> None:
        """Releases what no running module here uses (a unit gathered for another rank),
        when the plan does (Note [The plan's live params])."""
        for zp in zps:
            if zp.users == 0 and zp.state is ShardState.INFLIGHT:
                self.part.inflight[zp.ds_id].wait()
            self._release(zp)

    # Note [The plan's live params]
    #   The plan (zero/prefetch_schedule.h) gathers a param at one event and keeps it for
    #   its later events (a prefetch; a reuse within stage3_max_reuse_distance); those
    #   events then list nothing to gather. So this rank must still hold it there, even if
    #   its own modules were done with it in between (a parent releases its params when its
    #   forward ends, after the plan gathered them again for a later event). The walk pins
    #   what each event fetches or prefetches and unpins each event's release list once the
    #   walk is past it; a release asked for while a param is pinned happens at the unpin.
    #   What this rank holds beyond the plan only rides along: the plan alone says what is
    #   gathered, on every rank.
    def _release(self, zp: ZeroParam) -> None:
        if zp.ds_id in self.pinned:
            self.deferred.add(zp.ds_id)
        else:
            self.part.release(zp)

    def _unpin_through(self, end: int) -> None:
        """Applies the plan's releases of the events before `end`."""
        trace = self.trace
        while self.unpinned_to < end:
            for i in trace.plan[self.unpinned_to].release:
                self.pinned.discard(i)
                if i in self.deferred:
                    self.deferred.discard(i)
                    self.part.release(self.part.params[i])
            self.unpinned_to += 1

    def _drop_pins(self) -> None:
        """A pass's end, a step's start: the plan's holds end with it."""
        self.pinned.clear()
        self.deferred.clear()
        self.unpinned_to = 0

    def _round(self, want: int) -> int:
        """One round: the smallest unit key any rank wants (DONE: none)."""
        if self.part.world == 1:
            return want
        # On the host where the group has a host twin (Note [Agreements on the host] in
        # comm/): a round in a pass then waits for no kernel queued before it.
        host = comm.host_group(self.part.group)
        t = torch.tensor([want], dtype=torch.int64, device="cpu" if host else self.part.device)
        comm.all_reduce(t, op=comm.ReduceOp.MIN, group=host or self.part.group)
        return _host_int(t)

    def _unit(self, key: int) -> List[ZeroParam]:
        """A unit's parameters, the same on every rank: a module's own (a leaf's subtree),
        or one parameter; none for a bucket."""
        if key >= BUCKET_KEYS:
            return []
        if key >= PARAM_KEYS:
            return [self.part.params[key - PARAM_KEYS]]
        module = self.units[key]
        own = module.parameters() if is_leaf(module) else module._parameters.values()
        return [zp for zp in unique_zero_params(list(own)) if not zp.persist]

    def _rounds(self, want: int, need: Optional[List[ZeroParam]] = None) -> int:
        """Rounds until `need` is here (want DONE: until no rank wants anything); returns
        how many gathered a unit."""
        gathered = 0
        wanted = {zp.ds_id for zp in need} if need is not None else set()
        while True:
            chosen = self._round(want)
            if chosen == DONE:
                return gathered
            gathered += 1
            self.rounds += 1
            unit = self._unit(chosen)
            # Only what this round brings is let go: what this rank held stays its own.
            fresh = [zp for zp in unit if zp.state is ShardState.SHARDED]
            if chosen >= BUCKET_KEYS:
                self.reducer.issue_next(chosen - BUCKET_KEYS)
            else:
                self.part.gather_exact(unit)
            if self.trace is not None and self.trace.mode is TraceMode.RECORD:
                self.trace.events.append((chosen, tuple(zp.ds_id for zp in unit)))
            self._let_go([zp for zp in fresh if zp.ds_id not in wanted])
            if chosen == want or (need is not None and all(self._present(zp) for zp in need)):
                return gathered

    def bucket_ready(self, b: int) -> bool:
        """The reducer's bucket b is complete here. In a traced pass with several ranks its
        reduce-scatter takes its place in the agreed sequence (Note [One gather sequence on
        every rank]): in a round now, or where the trace has it (the walk issues it).
        Returns whether the coordinator took it; False: issue it now."""
        if self.reducer is None or not self._traced():
            return False
        if not self.replaying:
            self._rounds(BUCKET_KEYS + b)
        return True

    def step_is_planned(self) -> bool:
        """Whether the step under way replays a recorded trace and has not left it: its
        gathers, prefetches included, are the plan's (the same answer on every rank)."""
        trace = self.trace or next(iter(self.traces.values()), None)
        return trace is not None and trace.mode is TraceMode.COMPLETE and self.replaying

    def _begin_pass(self, kind: str) -> None:
        if self.trace is not None and self.open_pass is None:
            self.open_pass = kind

    def _end_pass(self, kind: str) -> None:
        """This rank's pass is over: the trace's rest walked, then rounds until no rank
        wants anything. A round that gathered means some rank left the trace: every rank
        saw it, and the trace is recorded again."""
        if self.open_pass != kind:
            return
        if self.replaying:
            self._walk(None, self._pass_end())
            self._unpin_through(self.pos)
        extra = self._rounds(DONE)
        trace = self.trace
        if self.replaying and extra and trace.mode is TraceMode.COMPLETE:
            self._invalidate(trace, "another rank's modules left the recorded order")
        if trace.mode is TraceMode.INVALID:
            self.replaying = False
        if kind == "forward" and trace.mode is TraceMode.RECORD:
            trace.forward_end = len(trace.events)
        self.open_pass = None
        self.used.clear()

    # --- gather ----------------------------------------------------------------------------------
    def fetch(self, module: torch.nn.Module) -> List[ZeroParam]:
        """Before `module` runs: its params gathered (Note [One gather sequence on every
        rank])."""
        zps = module_params(module)
        emptied = [zp for zp in zps if zp.persist and zp.state is ShardState.SHARDED]
        if emptied:  # empty_partition_cache released persistent params (untraced forwards)
            self.part.gather(emptied)
        needed = [zp for zp in zps if not zp.persist]
        if needed:
            key = self.keys.get(id(module), DONE)
            unit = {zp.ds_id for zp in self._unit(key)} if key != DONE else set()
            own = [zp for zp in needed if zp.ds_id in unit or key == DONE]
            if own:
                self._acquire(key, own)
            for zp in needed:  # params of other modules it uses: rounds of their own
                if zp.ds_id not in unit and key != DONE:
                    self._acquire(PARAM_KEYS + zp.ds_id, [zp])
            self.used.update(zp.ds_id for zp in needed)
            # In use again: a release asked for before (and waiting for the plan) is void.
            self.deferred.difference_update(zp.ds_id for zp in needed)
        return zps

    # --- forward ---------------------------------------------------------------------------------
    # --- phases (Note [Stage-3 phases]) ---------------------------------------------------------
    def _enter(self, phase: Phase) -> None:
        if self.phase not in _ENTERED_FROM[phase]:
            raise RuntimeError(
                f"ZeRO-3 coordinator: {phase.value} cannot follow {self.phase.value} "
                f"(Note [Stage-3 phases])"
            )
        self.phase = phase

    @property
    def in_backward(self) -> bool:
        return self.phase in _BACKWARD

    def _open_backward(self) -> None:
        """The first hook of a backward enters it: end_backward is queued to run when
        autograd ends."""
        if not self.in_backward:
            torch.autograd.Variable._execution_engine.queue_callback(self.end_backward)
            self._enter(Phase.PRE_BACKWARD)
            if self.open_pass == "forward":  # a backward inside the forward's frames
                self._end_pass("forward")
            self._begin_pass("backward")

    def pre_forward(self, module: torch.nn.Module) -> None:
        engine_backward = self.run is not None and self.run.state is TrainingState.BACKWARD
        if self.in_backward or engine_backward:
            self._open_backward()
            self._enter(Phase.RECOMPUTE)
        else:
            self._enter(Phase.FORWARD)
            if not self.frames:
                self._begin_pass("forward")
        zps = self.fetch(module)
        for zp in zps:
            zp.users += 1
        self.frames.append((module, zps))
        if self.phase is Phase.FORWARD:
            self.forward_peak_live = max(self.forward_peak_live, self.part.live_numel)

    def post_forward(self, module: torch.nn.Module, returned=()) -> None:
        """`module`'s forward returned; `returned`: the params it returned as outputs."""
        # Frames above this module's belong to forwards that never returned: activation
        # checkpointing stops a recomputation by raising once it has what backward needs.
        depth = len(self.frames)
        while depth and self.frames[depth - 1][0] is not module:
            depth -= 1
        if not depth:
            raise RuntimeError(
                f"ZeRO-3: forward of {type(module).__name__} ended without having started"
            )
        while len(self.frames) > depth:
            self._pop_frame()
        zps = self._pop_frame()
        if returned and self.frames:
            self._hand_up(module, returned)
        if self.phase is Phase.RECOMPUTE:
            return  # a forward re-run by activation checkpointing: backward needs them
        if self.phase is not Phase.FORWARD:
            raise RuntimeError(
                f"ZeRO-3: forward of {type(module).__name__} ended during {self.phase.value}"
            )
        for zp in zps:
            self._release(zp)
        if not self.frames:
            self._enter(Phase.IDLE)
            self._end_pass("forward")

    def _pop_frame(self) -> List[ZeroParam]:
        _, zps = self.frames.pop()
        for zp in zps:
            zp.users -= 1
        return zps

    def _adopt_external(self, param: torch.nn.Parameter, zp: ZeroParam) -> None:
        """`param` (gathered) becomes an external parameter of the innermost running
        module: registered for later steps, held until that module's forward ends."""
        module, zps = self.frames[-1]
        register_external_parameter(module, param)
        self.externals_found = True
        zp.modules += 1
        zp.users += 1
        self.frames[-1] = (module, zps + [zp])

    def _hand_up(self, module: torch.nn.Module, params) -> None:
        """`module` returned params of its own (a bias its parent adds, DeepSpeed's external
        parameter return): the enclosing forward uses them next, so each becomes the
        enclosing module's external parameter (and no longer `module`'s, if it was: the
        outer module covers it)."""
        # Held by a forward still running (an outer module took it over earlier): it stays.
        held = {id(zp) for frame in self.frames for zp in frame[1]}
        for param in params:
            zp = zero_param_of(param)
            if zp is None or id(zp) in held:
                continue
            unregister_external_parameter(module, param)
            param.is_external_param = True  # DeepSpeed's flag
            self._adopt_external(param, zp)
            held.add(id(zp))

    def access(self, param: torch.nn.Parameter) -> None:
        """A param was read by attribute while a forward runs: if it is not gathered, the
        running module uses a param it does not own. It is gathered now, held until that
        module's forward ends, and registered as the module's external parameter."""
        zp = zero_param_of(param)
        if zp is None or zp.state is ShardState.GATHERED:
            return
        self._acquire(PARAM_KEYS + zp.ds_id, [zp])
        self._adopt_external(param, zp)

    # --- backward --------------------------------------------------------------------------------
    def pre_backward(self, module: torch.nn.Module) -> None:
        """The gradient of one of `module`'s outputs exists: its backward runs next."""
        self._open_backward()
        self._enter(Phase.PRE_BACKWARD)
        self.fetch(module)
        self.backward_peak_live = max(self.backward_peak_live, self.part.live_numel)

    def leaf_started(self, module: torch.nn.Module) -> None:
        """A leaf module's forward runs with grad (Note [A leaf's gradients reach the reduce
        in one order] in leaf.py)."""
        if self.leaf_grads is not None:
            self.leaf_grads.started(module)

    def has_frozen(self, module: torch.nn.Module) -> bool:
        """Whether `module` uses a frozen param that is released after use: no gradient hook
        fires for it, so post_backward releases it (hooks.py)."""
        return any(not zp.param.requires_grad and not zp.persist for zp in module_params(module))

    def post_backward(self, module: torch.nn.Module) -> None:
        """`module`'s backward has produced its inputs' gradients. Its frozen params are not
        needed again in this backward (unless another module also uses them) once its
        trained params' gradients are final too: then every node of its backward that could
        hold a frozen weight has run. The trained ones are released by after_grad, which for
        a node computing both runs first (autograd runs gradient accumulation first); if one
        is still gathered, the frozen ones wait for the end of backward."""
        self._open_backward()
        self._enter(Phase.POST_BACKWARD)
        if self.leaf_grads is not None and is_leaf(module):
            self.leaf_grads.done(module)
        zps = module_params(module)
        if any(
            zp.param.requires_grad
            and not zp.persist
            and zp.state is not ShardState.SHARDED
            and zp.ds_id not in self.deferred  # released already, once the plan lets go
            for zp in zps
        ):
            return
        for zp in zps:
            if not zp.param.requires_grad and zp.modules <= 1:
                self._release(zp)

    def after_grad(self, zp: ZeroParam) -> None:
        """`zp`'s gradient is final for this backward: its full tensor is not needed again
        unless another module also uses it (tied weights wait for the end of backward)."""
        self._open_backward()
        self._enter(Phase.POST_BACKWARD)
        if zp.modules <= 1:
            self._release(zp)

    def end_backward(self) -> None:
        """No module runs now: forwards abandoned inside backward are closed, the backward's
        gathers end where every rank's do (Note [One gather sequence on every rank]), and
        every param that is not persistent is released. Autograd's callback and the
        optimizer's after_backward both call it; the second finds nothing to do."""
        self._enter(Phase.IDLE)
        while self.frames:
            self._pop_frame()
        if self.open_pass == "forward":  # a forward whose outputs had no gradient
            self._end_pass("forward")
        self._end_pass("backward")
        self._drop_pins()
        self.part.release_all()

    def summary(self) -> dict:
        trace = self.trace or next(iter(self.traces.values()), None)
        return {
            "trace_mode": trace.mode.value if trace else None,
            "trace_events": len(trace.events) if trace else 0,
            "trace_recordings": sum(t.recordings for t in self.traces.values()),
            "planned_peak_live": trace.peak_live if trace else 0,
            "invalidations": self.invalidations,
            "prefetched_numel": self.prefetched_numel,
            "forward_peak_live": self.forward_peak_live,
            "backward_peak_live": self.backward_peak_live,
            "rounds": self.rounds,
            "walked_for_others": self.walked,
        }
