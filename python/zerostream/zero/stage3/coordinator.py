"""The stage-3 parameter coordinator: gathers a module's parameters before it runs (forward,
or backward), prefetches the next ones along the recorded trace, and releases them after.

Note [Stage-3 trace]
  The first micro-step of each kind (training with grad, evaluation without) records the
  order in which modules gather parameters, forward and backward: one event per module
  invocation, (module number, parameter ids). When the next step of that kind starts, every
  rank checks that all ranks recorded the same trace (the gathers are collectives, so they
  must be issued in one order everywhere) and the native planner (zero/prefetch_schedule.h)
  turns it into a plan: per event what to prefetch and what to release. Later steps replay
  it; an event that differs from the recording (control flow changed) invalidates the trace
  with one log line, the rest of that step runs on demand and the next step records again.
  The plan is advice for speed: correctness never depends on it. A parameter is gathered
  whenever a module needs it and not there, and never released while a running module uses
  it; in backward a parameter is released once its gradient is final (the optimizer's
  gradient hook) or at the end of backward, never by a forward that autograd re-runs
  (activation checkpointing recomputes forward inside backward).

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
import hashlib
import logging
from typing import Dict, List, Optional, Tuple

import torch

from ... import _C, comm
from ...offload.host_buffers import arena_bytes
from ..protocol import TrainingState
from .leaf import is_leaf
from .module_state import (
    external_params,
    register_external_parameter,
    unregister_external_parameter,
)
from .param import ShardState, ZeroParam, unique_zero_params, zero_param_of
from .partitioner import Partitioner

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


def _peak_read_ahead(trace: "Trace") -> int:
    """The most host staging (whole arena pages) that the plan's reads ahead from the swap
    store hold at once: a prefetch's reads stay in their buffers until an event needs one
    of its params (InflightGather lands them together), so prefetches issued two or more
    events ahead overlap."""
    pending: List[Tuple[set, int]] = []
    peak = 0
    for (_, ids), planned in zip(trace.events, trace.plan):
        needed = set(ids)
        pending = [(group, nbytes) for group, nbytes in pending if not group & needed]
        on_disk = [zp for zp in planned.prefetch if zp.on_nvme]
        if on_disk:
            nbytes = sum(arena_bytes(zp.shard_numel * zp.dtype.itemsize) for zp in on_disk)
            pending.append(({zp.ds_id for zp in planned.prefetch}, nbytes))
        peak = max(peak, sum(nbytes for _, nbytes in pending))
    return peak


class TraceMode(enum.Enum):
    RECORD = "record"
    COMPLETE = "complete"
    INVALID = "invalid"


class PlannedEvent:
    __slots__ = ("prefetch", "release")

    def __init__(self, prefetch: List[ZeroParam], release: List[ZeroParam]):
        self.prefetch, self.release = prefetch, release


class Trace:
    """One step kind's recorded events and, once complete, its plan (Note [Stage-3 trace])."""

    def __init__(self, key):
        self.key = key
        self.mode = TraceMode.RECORD
        self.events: List[Tuple[int, Tuple[int, ...]]] = []
        self.plan: List[PlannedEvent] = []
        self.peak_live = 0
        self.recordings = 0

    def digest(self) -> str:
        return hashlib.sha1(repr(self.events).encode()).hexdigest()


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
        self.module_ids: Dict[int, int] = {}
        self.traces: Dict[tuple, Trace] = {}
        self.trace: Optional[Trace] = None
        self.pos = 0
        self.frames: List[Tuple[torch.nn.Module, Optional[PlannedEvent], List[ZeroParam]]] = []
        self.phase = Phase.IDLE
        self.invalidations = 0
        self.externals_found = False  # a forward read another module's param (access())
        self.prefetched_numel = 0
        self.forward_peak_live = 0
        self.backward_peak_live = 0

    def number(self, module: torch.nn.Module) -> int:
        key = id(module)
        if key not in self.module_ids:
            self.module_ids[key] = len(self.module_ids)
        return self.module_ids[key]

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
        self._enter(Phase.IDLE)
        if not self.tracing:
            return
        trace = self.traces.setdefault(key, Trace(key))
        if trace.mode is TraceMode.INVALID:
            trace.mode, trace.events, trace.plan = TraceMode.RECORD, [], []
        self.trace, self.pos = trace, 0

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
        """Checks that every rank recorded the same trace and plans it."""
        trace.recordings += 1
        if self.part.world > 1:
            digests = [None] * self.part.world
            comm.all_gather_object(digests, (len(trace.events), trace.digest()), self.part.group)
            if len(set(digests)) != 1:
                mine = digests[self.part.rank]
                others = [r for r, d in enumerate(digests) if d != mine]
                raise RuntimeError(
                    f"[rank {comm.get_rank()}] ZeRO-3: data-parallel ranks ran modules in "
                    f"different orders in one step (ranks {others} differ from this one's "
                    f"{mine[0]} module invocations); stage 3 needs the same module order "
                    f"on every rank. A block that runs other submodules on each rank (a "
                    f"mixture of experts) must be a leaf module, gathered whole: name its "
                    f"class in zero_optimization.leaf_module.classes, or call "
                    f"deepspeed.utils.set_z3_leaf_modules(model, [BlockClass]) before "
                    f"initialize"
                )
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
            PlannedEvent([zps[i] for i in prefetch], [zps[i] for i in release])
            for _, prefetch, release, _, _ in events
        ]
        trace.mode = TraceMode.COMPLETE
        swapper = self.part.swapper
        if swapper is not None:
            reads = collections.Counter(i for _, ids in trace.events for i in ids)
            swapper.expect_rehome({self.part.params[i]: n for i, n in reads.items()})
            swapper.fit_read_ahead(_peak_read_ahead(trace))

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

    def _advance(self, module: torch.nn.Module, zps: List[ZeroParam]) -> Optional[PlannedEvent]:
        """Records or replays one event; returns its plan when replaying in order."""
        trace = self.trace
        if trace is None or trace.mode is TraceMode.INVALID:
            return None
        event = (self.number(module), tuple(zp.ds_id for zp in zps))
        if trace.mode is TraceMode.RECORD:
            trace.events.append(event)
            return None
        if self.pos < len(trace.events) and trace.events[self.pos] == event:
            self.pos += 1
            return trace.plan[self.pos - 1]
        self._invalidate(
            trace,
            f"event {self.pos} ran {type(module).__name__} (module {event[0]}), not the "
            f"recorded one",
        )
        return None

    # --- gather ----------------------------------------------------------------------------------
    def fetch(self, module: torch.nn.Module) -> Tuple[Optional[PlannedEvent], List[ZeroParam]]:
        """Before `module` runs: its params gathered, the next ones prefetched."""
        zps = module_params(module)
        emptied = [zp for zp in zps if zp.persist and zp.state is ShardState.SHARDED]
        if emptied:  # empty_partition_cache released persistent params too
            self.part.gather(emptied)
        needed = [zp for zp in zps if not zp.persist]
        if not needed:
            return None, zps
        planned = self._advance(module, zps)
        self.part.gather(needed)
        trace = self.trace
        if self.part.reading and planned is not None and self.pos < len(trace.events):
            # Reads ahead from NVMe issued at an earlier event for the next module: their
            # uploads and all-gather go out now, overlapping this module's compute (every
            # rank replays the same trace, so the collectives keep one order). Reads issued
            # below for the next module land only when it waits: they overlap this one.
            self.part.launch_reads(set(trace.events[self.pos][1]))
        if planned is not None and planned.prefetch:
            ahead, live = [], self.part.live_numel
            for zp in planned.prefetch:
                if zp.state is not ShardState.SHARDED:
                    continue
                if live + zp.numel > self.max_live:
                    break
                ahead.append(zp)
                live += zp.numel
            if ahead:
                self.prefetched_numel += sum(zp.numel for zp in ahead)
                self.part.gather(ahead, async_op=True)
        return planned, zps

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

    def pre_forward(self, module: torch.nn.Module) -> None:
        engine_backward = self.run is not None and self.run.state is TrainingState.BACKWARD
        if self.in_backward or engine_backward:
            self._open_backward()
            self._enter(Phase.RECOMPUTE)
        else:
            self._enter(Phase.FORWARD)
        planned, zps = self.fetch(module)
        for zp in zps:
            zp.users += 1
        self.frames.append((module, planned, zps))
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
        planned, zps = self._pop_frame()
        if returned and self.frames:
            self._hand_up(module, returned)
        if self.phase is Phase.RECOMPUTE:
            return  # a forward re-run by activation checkpointing: backward needs them
        if self.phase is not Phase.FORWARD:
            raise RuntimeError(
                f"ZeRO-3: forward of {type(module).__name__} ended during {self.phase.value}"
            )
        if not self.frames:
            self._enter(Phase.IDLE)
        candidates = planned.release if planned is not None else zps
        for zp in candidates:
            self.part.release(zp)

    def _pop_frame(self):
        _, planned, zps = self.frames.pop()
        for zp in zps:
            zp.users -= 1
        return planned, zps

    def _adopt_external(self, param: torch.nn.Parameter, zp: ZeroParam) -> None:
        """`param` (gathered) becomes an external parameter of the innermost running
        module: registered for later steps, held until that module's forward ends."""
        module, planned, zps = self.frames[-1]
        register_external_parameter(module, param)
        self.externals_found = True
        zp.modules += 1
        zp.users += 1
        self.frames[-1] = (module, planned, zps + [zp])

    def _hand_up(self, module: torch.nn.Module, params) -> None:
        """`module` returned params of its own (a bias its parent adds, DeepSpeed's external
        parameter return): the enclosing forward uses them next, so each becomes the
        enclosing module's external parameter (and no longer `module`'s, if it was: the
        outer module covers it)."""
        # Held by a forward still running (an outer module took it over earlier): it stays.
        held = {id(zp) for frame in self.frames for zp in frame[2]}
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
        self.part.gather([zp])
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
            zp.param.requires_grad and not zp.persist and zp.state is not ShardState.SHARDED
            for zp in zps
        ):
            return
        for zp in zps:
            if not zp.param.requires_grad and zp.modules <= 1:
                self.part.release(zp)

    def after_grad(self, zp: ZeroParam) -> None:
        """`zp`'s gradient is final for this backward: its full tensor is not needed again
        unless another module also uses it (tied weights wait for the end of backward)."""
        self._open_backward()
        self._enter(Phase.POST_BACKWARD)
        if zp.modules <= 1:
            self.part.release(zp)

    def end_backward(self) -> None:
        """No module runs now: forwards abandoned inside backward are closed, and every
        param that is not persistent is released."""
        self._enter(Phase.IDLE)
        while self.frames:
            self._pop_frame()
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
        }
