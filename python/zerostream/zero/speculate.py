"""The optimizer step started during the backward (`"zerostream": {"overlap_step":
"backward"}`).

Note [The step started during the backward]
  With the optimizer offloaded the CPU update is the longest part of a step, and under
  overlap_step "next_forward" it starts only when step() has every gradient. Most of it need
  not wait that long: ZeRO-3 reduces gradients bucket by bucket while autograd goes on, and a
  piece of the update (zero/overlap.py's plan_pieces) whose partition range has received all
  of its gradient for this step can be updated at once, on a thread of its own, while the
  backward produces the rest.

  What is not known then is the factor: gradient clipping and an fp16 overflow depend on the
  global norm of every gradient. The update is therefore speculative (SuperOffload's
  speculation then validation): it runs with the factor step() takes when nothing clips and
  nothing overflows, 1 / (loss scale x the data-parallel divisor), and the step's
  hyperparameters as they stand at the backward (the lr the scheduler set after the last
  step). Before a piece's kernel runs, its fp32 values and optimizer state are copied aside
  (at most `zerostream.speculative_step_bytes` of copies; pieces past it wait for step()).
  The kernel writes only the host state: the 16-bit shards the backward may still gather
  are not touched until step() confirms.

  step() then decides with what it computes anyway: if the factor and the hyperparameters
  are the speculated ones, each speculated piece is final and only its 16-bit values are
  handed on (in the update's order, behind the next forward as under "next_forward"); the
  other pieces are updated there as usual. If the clip coefficient came out below 1, the
  step overflowed, the lr changed, or a piece received more gradient after its update (a
  late part: reentrant checkpointing, a tied weight in two segments), the copies are put
  back first and those pieces are updated again with the real factor. Either way the result
  is the serial step's, bit for bit: a kept piece ran the same kernel on the same values
  with the same factor, and a restored one is the serial step itself. The speculation costs
  only CPU time when it is proved wrong, and the copies' host memory.

  Readiness is per partition element, counted by the gradient landing itself (Landing's
  listener, zero/grad_reduce.py): a piece is ready when every one of its elements has
  landed once since the backward began. A landing through a copy-stage slot reports after
  its host-side add; a direct 16-bit download reports with the copy's mark, and the thread
  waits on the host for that mark before it reads (on the simulated device the values
  reach the host only then). Elements no gradient reaches in the backward (a parameter
  without one on this rank, alignment padding) keep their pieces for step().

  Stages: at ZeRO-3 step() hands the rest to the update behind the next forward
  (zero/overlap.py); at ZeRO-2, whose buckets land in the partitions during the backward as
  well, step() runs the rest itself (ShardedOptimizerBase._update_kept) and all-gathers as
  usual, so the update that was hidden is the part the backward's length allowed. Stage 1
  reduces at the step: nothing lands earlier, and the mode is refused there.

  Only the backward that ends the accumulation is speculated on (the engine says which),
  never one inside coalesce_grad_reduction. Anything that reads or writes the optimizer
  state between that backward and step() (another backward, zero_grad, a checkpoint, the
  fp32 accessors) first puts every copy back and the run goes on as if nothing had been
  speculated. No collective runs on the thread: the collectives are step()'s, on every rank.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from typing import Dict, List, Optional, Set

import torch

from .grad_reduce import Coverage
from .overlap import Piece, UpdateFailed


def make_speculation(opt, ctx) -> "Speculation":
    """The speculation of a sharded ZeRO optimizer under overlap_step "backward": zerostream's
    CPU kernels over host masters, their pieces handed on through the copy stage."""
    from .overlap import require_cpu_kernels

    require_cpu_kernels(opt, "backward", "during the backward")
    return Speculation(opt, ctx.config.zerostream.speculative_step_bytes)


def _value(v):
    """A hyperparameter by value: a scheduler may change a tensor lr (fill_) or a list in
    place, which a reference would follow."""
    if torch.is_tensor(v):
        return float(v) if v.numel() == 1 else tuple(v.detach().reshape(-1).tolist())
    if isinstance(v, (list, tuple)):
        return tuple(_value(x) for x in v)
    return v


def _hyper_of(groups) -> list:
    """The param groups' hyperparameters (all but "params"), by value."""
    return [{k: _value(v) for k, v in g.items() if k != "params"} for g in groups]


def _same_hyper(a: list, b: list) -> bool:
    try:
        return len(a) == len(b) and all(bool(x == y) for x, y in zip(a, b))
    except (RuntimeError, TypeError, ValueError):  # values that do not compare: changed
        return False


class Taken:
    """What the speculation left for step(): the pieces it updated, with their copies."""

    def __init__(self, backups: Dict[Piece, List[torch.Tensor]], dirty: Set[Piece], factor, hyper):
        self.backups = backups
        self.dirty = dirty
        self.factor = factor
        self.hyper = hyper
        self.consumed = False  # keep() or restore() decided every piece

    def keep(self, opt, factor: float, hyper: list, pieces: List[Piece]) -> Set[Piece]:
        """The pieces step() may keep: the clean ones of its own plan `pieces` when its
        factor and hyperparameters are the speculated ones. Every other piece's copy is put
        back now."""
        valid = factor == self.factor and _same_hyper(_hyper_of(hyper), self.hyper)
        planned = set(pieces)
        kept = {p for p in self.backups if valid and p not in self.dirty and p in planned}
        self.restore(opt, [p for p in self.backups if p not in kept])
        self.consumed = True
        spec = opt.speculation
        spec.late_elements += sum(hi - lo for _, lo, hi in self.dirty & self.backups.keys())
        return kept

    def restore(self, opt, pieces=None) -> None:
        for piece in self.backups if pieces is None else pieces:
            g, lo, hi = piece
            for live, saved in zip(opt.optimizer.range_tensors(g, 0, lo, hi), self.backups[piece]):
                live.copy_(saved)
        if pieces is None:
            self.consumed = True


class Speculation:
    """The speculative updates of one backward, on a thread of the optimizer's own."""

    def __init__(self, opt, budget_bytes: int):
        self.opt = opt
        self.budget = int(budget_bytes)
        self._cv = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._armed = False
        self._closed = False
        self._pool: Optional[torch.Tensor] = None  # the copies' bytes, reused every backward
        self._pool_bytes = 0
        self._queue: deque = deque()
        self._running: Optional[Piece] = None
        self._error: Optional[BaseException] = None
        self._backups: Dict[Piece, List[torch.Tensor]] = {}
        self._dirty: Set[Piece] = set()
        self._factor: Optional[float] = None
        self._hyper: list = []
        self._pieces: List[Piece] = []
        self._starts: Dict[int, List[int]] = {}
        self._index: Dict[int, List[int]] = {}  # group -> indices into _pieces, by start
        self._left: List[int] = []  # elements not landed yet, per piece
        self._marks: List[list] = []
        self._state: List[str] = []  # "open", "queued", "running", "done", "skipped"
        self._coverage = Coverage(0)
        self._used = 0
        # Counters for tests and telemetry: pieces and elements updated during backwards.
        self.speculated = 0
        self.speculated_elements = 0
        self.kept_elements = 0
        self.late_elements = 0  # speculated, then put back: more gradient came after
        self.piece_hook = None  # tests: called on the thread before each piece
        # tests: (piece, training state, elements landed by then, of all) as each ran
        self.log: Optional[list] = None
        # tests: the landing waits until the pieces it made ready ran, so that each runs
        # while the backward is still producing gradients, whatever the threads' timing
        self.lockstep = False
        self._landed_elements = 0
        self._total = 0

    # --- the main thread ------------------------------------------------------------------------
    def arm(self, pieces: List[Piece], factor: float, hyper: list) -> None:
        """At the start of the backward that ends the accumulation: the update's pieces, the
        factor and hyperparameters step() takes when nothing clips or overflows."""
        self.discard()
        with self._cv:
            if self._closed:
                raise RuntimeError("the speculation of a closed optimizer was armed")
            self._pieces = list(pieces)
            self._starts, self._index = {}, {}
            for i in sorted(range(len(pieces)), key=lambda i: pieces[i][:2]):
                g, lo, _ = pieces[i]
                self._starts.setdefault(g, []).append(lo)
                self._index.setdefault(g, []).append(i)
            self._left = [hi - lo for _, lo, hi in pieces]
            self._marks = [[] for _ in pieces]
            self._state = ["open"] * len(pieces)
            groups = 1 + max((g for g, _, _ in pieces), default=-1)
            self._coverage = Coverage(groups)
            self._factor, self._hyper = factor, _hyper_of(hyper)
            self._used = 0
            # The copies' pool: as much as the budget allows of what every piece would take.
            self._pool_bytes = min(self.budget, sum(self._backup_bytes(p) for p in pieces))
            self._landed_elements = 0
            self._total = sum(hi - lo for _, lo, hi in pieces)
            self._armed = True
        self.opt.reducer.landing.listener = self.landed
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="zerostream-speculate", daemon=True
            )
            self._thread.start()

    def take(self) -> Optional[Taken]:
        """At step(), once every gradient has landed: stops the speculation (the piece being
        updated finishes) and hands its pieces over; None when none ran."""
        with self._cv:
            if not self._armed and not self._backups:
                return None
            self._armed = False
            stop = None in self._queue  # close()'s marker stays
            self._queue.clear()
            if stop:
                self._queue.append(None)
            self._cv.notify_all()  # a lockstep landing waiting for a piece no longer queued
            while self._running is not None:
                self._cv.wait()
            self.opt.reducer.landing.listener = None
            if self._error is not None:
                e, self._error = self._error, None
                self._backups_restore_all()
                raise UpdateFailed(
                    f"the optimizer update started during the backward (zerostream."
                    f'overlap_step "backward") failed: {type(e).__name__}: {e}'
                ) from e
            taken = Taken(self._backups, self._dirty, self._factor, self._hyper)
            self._backups, self._dirty, self._used = {}, set(), 0
        return taken

    def discard(self) -> None:
        """Puts every speculated piece back (a reader of the state, or another backward,
        came before step())."""
        taken = self.take()
        if taken is not None:
            taken.restore(self.opt)

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Waits until every ready piece was taken up (tests: proves the pieces ran before
        the backward returned). False on timeout."""
        with self._cv:
            return self._cv.wait_for(
                lambda: not self._queue and self._running is None, timeout=timeout
            )

    def _backups_restore_all(self) -> None:
        Taken(self._backups, set(), None, []).restore(self.opt)
        self._backups, self._dirty, self._used = {}, set(), 0

    def close(self) -> None:
        with self._cv:
            self._armed = False
            self._closed = True
            self._queue.append(None)
            self._cv.notify_all()

    # --- the landing (main thread, or the copy stage's consumer thread) ------------------------
    def landed(self, g: int, at: int, n: int, mark) -> None:
        ready = []
        with self._cv:
            if not self._armed or g not in self._starts:
                return
            fresh, seen = self._coverage.claim(g, at, at + n)
            for lo, hi in seen:  # more gradient into elements that had theirs
                for i in self._overlapping(g, lo, hi):
                    if self._state[i] in ("queued", "running", "done"):
                        self._dirty.add(self._pieces[i])
            for lo, hi in fresh:
                for i in self._overlapping(g, lo, hi):
                    _, plo, phi = self._pieces[i]
                    self._left[i] -= min(hi, phi) - max(lo, plo)
                    self._landed_elements += min(hi, phi) - max(lo, plo)
                    if mark is not None:
                        self._marks[i].append(mark)
                    if self._left[i] == 0 and self._state[i] == "open":
                        self._state[i] = "queued"
                        self._queue.append(i)
                        ready.append(i)
                        self._cv.notify_all()
            if self.lockstep and ready:
                self._cv.wait_for(
                    lambda: (
                        all(self._state[i] in ("done", "skipped") for i in ready) or not self._armed
                    ),
                    timeout=60,
                )

    def _overlapping(self, g: int, lo: int, hi: int) -> List[int]:
        starts, index = self._starts[g], self._index[g]
        first = max(0, bisect.bisect_right(starts, lo) - 1)
        last = bisect.bisect_left(starts, hi)
        return [index[k] for k in range(first, last) if self._pieces[index[k]][2] > lo]

    # --- the thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        from ..ops.threads import leave_one_core

        leave_one_core()  # the backward's own thread keeps a core
        stage = self.opt.copy_stage
        if stage is not None:
            stage.bind_thread()  # its host waits on the copies' events are CUDA calls
        while True:
            with self._cv:
                while not self._queue:
                    self._cv.wait()
                i = self._queue.popleft()
                if i is None:
                    return
                piece = self._pieces[i]
                need = self._backup_bytes(piece)
                if self._used + need > self.budget:
                    self._state[i] = "skipped"  # left for step()
                    self._cv.notify_all()
                    continue
                offset, self._used = self._used, self._used + need
                self._state[i] = "running"
                self._running = piece
                marks, hyper = list(self._marks[i]), self._hyper
                factor = self._factor  # set by arm() before any piece is queued
                assert factor is not None
            try:
                self._update(piece, marks, factor, hyper, offset)
            except BaseException as e:  # raised by take(), naming the update
                with self._cv:
                    self._error = e
            finally:
                with self._cv:
                    self._state[i] = "done"
                    self._running = None
                    self._cv.notify_all()

    def _backup_bytes(self, piece: Piece) -> int:
        g, lo, hi = piece
        n = hi - lo
        inner = self.opt.optimizer
        p = inner.param_groups[g]["params"][0]
        state = inner.state.get(p) or {}
        per = 4 + sum((state[s].element_size() if s in state else 4) for s in inner._state_names)
        return n * per + 8 * (1 + len(inner._state_names))  # each copy 8-byte aligned

    def _copies(self, tensors: List[torch.Tensor], offset: int) -> List[torch.Tensor]:
        """Copies of `tensors` in the pool from byte `offset` (reserved by the caller). The
        pool is allocated once and reused by every backward, so the copies fault in no fresh
        pages after the first step (0.4 s a GB on a VM: Note [Fresh pages cost more than the
        math] in host_malloc.py)."""
        if self._pool is None or self._pool.numel() < self._pool_bytes:
            self._pool = torch.empty(self._pool_bytes, dtype=torch.uint8)
        out, at = [], offset
        for t in tensors:
            at = -(-at // 8) * 8
            nbytes = t.numel() * t.element_size()
            copy = self._pool[at : at + nbytes].view(t.dtype)
            copy.copy_(t)
            out.append(copy)
            at += nbytes
        return out

    def _update(self, piece: Piece, marks: list, factor: float, hyper: list, offset: int) -> None:
        g, lo, hi = piece
        if self.piece_hook is not None:
            self.piece_hook(piece)
        lanes = self.opt.copy_stage.lanes if self.opt.copy_stage is not None else None
        for mark in marks:  # the direct downloads of its gradients have landed
            if lanes is not None and not lanes.ready(mark):
                lanes.host_wait(mark)
        inner = self.opt.optimizer
        start = time.perf_counter()
        saved = self._copies(inner.range_tensors(g, 0, lo, hi), offset)
        with self._cv:  # before the kernel: a kernel that fails midway is put back too
            self._backups[piece] = saved
        groups = [dict(h, params=pg["params"]) for h, pg in zip(hyper, inner.param_groups)]
        inner.step_ranges(
            [(g, 0, lo, hi)],
            factor,
            lambda *a: None,  # the 16-bit shards wait for step()'s verdict
            lambda *a: None,
            hyper=groups,
            partial=True,
        )
        self.speculated += 1
        self.speculated_elements += hi - lo
        if self.log is not None:
            with self._cv:
                landed = self._landed_elements
            self.log.append((piece, self.opt.ctx.run.state.name, landed, self._total))
        self.opt.telemetry.add_seconds("speculate", time.perf_counter() - start)
