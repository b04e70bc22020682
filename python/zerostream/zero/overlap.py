"""The optimizer step overlapped with the next forward (`"zerostream": {"overlap_step":
"next_forward"}`).

Note [The step overlapped with the next forward]
  With the optimizer offloaded (cpu or nvme), the step is the CPU's and the disk's: the device
  idles while the host updates every partition. Here step() does what must be done where every
  rank is (the gradients' reduction, the global norm and its one host read, the clip/unscale
  factor) and hands the update itself to a thread of its own, then returns. The next forward
  runs beside it: ZeRO-3 gathers each module's parameters from their shards just before the
  module runs, and each gather first waits for the pieces of the update that write those
  shards (`UpdateBehind.wait_range`: on the host for the kernel, then on the device for the
  piece's upload, so the compute stream waits for exactly what it reads, never for the whole
  step).

  Exact: the update is the serial step's, piece for piece (the kernel is elementwise and the
  factor is computed before the thread starts), with the hyperparameters snapshot at step()
  (a scheduler that sets the next lr meanwhile changes the next step, as in the serial run).
  Every other reader or writer of the optimizer's state waits for the whole update first
  (`settle`): the next backward (its gradients land in the partitions the update reads),
  another step(), zero_grad, checkpoints, the parameter accessors, offload_states, destroy.
  The update zeroes the gradient partitions itself, after it read them.

  Order: persistent parameters (stage3_param_persistence_threshold) are used by every
  forward without a gather of their own, so they are released at step() and gathered
  again where the next forward starts, on every rank (the coordinator's start_step); the
  update writes their shards first, in pieces of their own, then the rest of each partition
  in partition order, which is the model's parameter order. No collective runs on the
  update's thread: the sequence of collectives is the serial step's on every rank.

  With offload_optimizer "nvme" the thread runs the sub-group pipeline (offload/
  optimizer_swap.py's run_step: reads, kernel and write-backs overlapped), the persistent
  params' ranges first, read from their extents alone (Note [Persistent ranges first] in
  offload/swap_early.py); the step's start (the tiers' "auto", whose readings are agreed
  across ranks) stays on the caller's thread. With offload_param "nvme" the thread writes
  shards while the forward reads others (Note [Shard writes beside the forward's reads] in
  zero/stage3/shard_writes.py); "auto" moving shards into host memory waits for the update.

  On a GPU the thread binds the rank's device first (a thread starts on device 0). Its
  uploads go on the copy stage's lane, which waits for the compute stream where it stands at
  each upload: after the backward's last reads of the shards, and also after the forward's
  kernels queued by then, which an upload does not need (they read other shards, or wait for
  it). A stream of the thread's own that waited only for step()'s point would let uploads
  pass those kernels; the simulated device cannot yet tell that such a copy is ordered (it
  requires each copy's lane to wait for the compute stream at its current position), so
  that refinement waits for a measured GPU run that shows the cost.

  An exception on the thread (a kernel refusing its input, a fault) is raised again, naming
  the update, by the next call that waits for it; the run is then left inconsistent (the
  partitions were partly updated), as after a serial step that raised.

  overlap_step "backward" (zero/speculate.py) starts pieces during the backward; this update
  then hands on their 16-bit values in their turn, and runs the kernel on the rest.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from typing import Callable, Dict, List, Optional, Tuple

Piece = Tuple[int, int, int]  # (param group, lo, hi) of a partition
MERGE = 1 << 16  # elements: small params' pieces merged up to this, one kernel call each


class UpdateFailed(RuntimeError):
    """The optimizer update that ran behind the forward raised."""


class UpdateBehind:
    """One update at a time on a thread of its own, and which of its pieces are done."""

    def __init__(self, telemetry, bind_thread: Optional[Callable[[], None]] = None):
        self.telemetry = telemetry
        self._bind = bind_thread
        self._cv = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None
        self._starts: Dict[int, List[int]] = {}  # group -> sorted piece starts
        self._ends: Dict[int, List[int]] = {}
        self._done: Dict[int, List[bool]] = {}
        self._marks: Dict[int, list] = {}  # the copy stage's upload mark after each piece
        self._finished = True
        self.piece_hook: Optional[Callable[[Piece], None]] = None  # tests: before each piece
        self.log: Optional[list] = None  # tests: ("piece", g, lo, hi) in completion order
        self.launched = 0

    @property
    def running(self) -> bool:
        return self._thread is not None

    def launch(self, pieces: List[Piece], run: Callable[[Callable], None]) -> None:
        """Runs `run(done)` on the thread; run calls done(g, lo, hi, mark) after each piece of
        `pieces` (their order is run's)."""
        self.settle()
        self._starts, self._ends, self._done, self._marks = {}, {}, {}, {}
        for g, lo, hi in sorted(pieces):
            self._starts.setdefault(g, []).append(lo)
            self._ends.setdefault(g, []).append(hi)
            self._done.setdefault(g, []).append(False)
            self._marks.setdefault(g, []).append(None)
        self._finished = False
        self._error = None
        self.launched += 1

        def body() -> None:
            start = time.perf_counter()
            try:
                if self._bind is not None:
                    self._bind()
                run(self._piece_done)
            except BaseException as e:  # raised again by whoever waits for it
                self._error = e
            finally:
                self.telemetry.add_seconds("update_behind", time.perf_counter() - start)
                with self._cv:
                    self._finished = True
                    self._cv.notify_all()

        self._thread = threading.Thread(target=body, name="zerostream-update", daemon=True)
        self._thread.start()

    def before_piece(self, g: int, lo: int, hi: int) -> None:
        """Called by run before each piece (a test's hook holds the update there)."""
        if self.piece_hook is not None:
            self.piece_hook((g, lo, hi))

    def _piece_done(self, g: int, lo: int, hi: int, mark) -> None:
        with self._cv:
            i = bisect.bisect_right(self._starts[g], lo) - 1
            if i < 0 or self._starts[g][i] != lo or self._ends[g][i] != hi:
                raise RuntimeError(f"update piece ({g}, {lo}, {hi}) was not planned")
            self._done[g][i] = True
            self._marks[g][i] = mark
            if self.log is not None:
                self.log.append(("piece", g, lo, hi))
            self._cv.notify_all()

    def wait_range(self, g: int, lo: int, hi: int) -> list:
        """Waits (on the host) until every piece of group g overlapping [lo, hi) is updated;
        returns their upload marks, for the compute stream to wait on."""
        if self._thread is None or hi <= lo or g not in self._starts:
            return []
        starts, ends = self._starts[g], self._ends[g]
        first = max(0, bisect.bisect_right(starts, lo) - 1)
        last = bisect.bisect_left(starts, hi)
        idx = [i for i in range(first, last) if ends[i] > lo]
        waited = None
        with self._cv:
            while not self._finished and not all(self._done[g][i] for i in idx):
                if waited is None:
                    waited = time.perf_counter()
                self._cv.wait()
            if self._error is not None:
                self._raise()
            if not all(self._done[g][i] for i in idx):
                raise UpdateFailed(
                    f"the optimizer update behind the forward ended without updating "
                    f"elements [{lo}, {hi}) of param group {g}'s partition"
                )
            marks = [self._marks[g][i] for i in idx]
        if waited is not None:
            self.telemetry.add_seconds("update_wait", time.perf_counter() - waited)
        return [m for m in marks if m is not None]

    def settle(self) -> bool:
        """Waits for the whole update; raises its error. True when one was running."""
        thread = self._thread
        if thread is None:
            if self._error is not None:
                self._raise()
            return False
        if thread is threading.current_thread():  # would wait for itself forever
            raise RuntimeError("the optimizer update behind the forward waited for itself")
        start = time.perf_counter()
        thread.join()
        self.telemetry.add_seconds("update_wait", time.perf_counter() - start)
        self._thread = None
        if self._error is not None:
            self._raise()
        return True

    def _raise(self) -> None:
        e = self._error
        raise UpdateFailed(
            f"the optimizer update that ran behind the forward (zerostream.overlap_step) "
            f"failed: {type(e).__name__}: {e}; the partitions are partly updated, so this run "
            f"cannot go on: resume from the last checkpoint"
        ) from e


def plan_pieces(
    layout: List[List[Tuple[int, int, bool]]], numels: List[int], caps: List[int]
) -> List[Piece]:
    """The update's pieces (group, lo, hi), in the order it runs them. layout[g] lists group
    g's params as (offset, elements, early) in partition order; `early` ones (the persistent
    params) are pieces of their own, first; the others follow in partition order, consecutive
    ones merged while under MERGE elements, each cut at caps[g] (the copy stage's slot). The
    pieces cover each partition [0, numels[g]) exactly once."""
    early: List[Piece] = []
    rest: List[Piece] = []
    for g, (params, numel) in enumerate(zip(layout, numels)):
        cap = max(1, caps[g])

        run = None  # (lo, hi): the merge run of late params
        for off, n, is_early in sorted(params):
            if n <= 0:
                continue
            if is_early:
                _cut(g, off, off + n, cap, early)
                continue
            if run is not None and (run[1] != off or run[1] - run[0] >= MERGE):
                _cut(g, run[0], run[1], cap, rest)
                run = None
            run = (off if run is None else run[0], off + n)
        if run is not None:
            _cut(g, run[0], run[1], cap, rest)
        end = max((off + n for off, n, _ in params), default=0)
        if end < numel:  # the partition's tail past the last shard (alignment)
            _cut(g, end, numel, cap, rest)
    return early + rest


def _cut(g: int, lo: int, hi: int, cap: int, into: List[Piece]) -> None:
    for a in range(lo, hi, cap):
        into.append((g, a, min(a + cap, hi)))


def require_cpu_kernels(opt, mode: str, where: str) -> None:
    """overlap_step `mode` runs zerostream's CPU optimizer kernels `where` (behind the forward,
    during the backward), through the copy stage: refused, naming the key, otherwise."""
    from ..ops._cpu_optimizer import CPUOptimizerBase

    swapped = mode == "next_forward" and getattr(opt, "swapper", None) is not None
    also = ' or "nvme"' if mode == "next_forward" else ""
    if not (isinstance(opt.optimizer, CPUOptimizerBase) or swapped) or opt.copy_stage is None:
        raise ValueError(
            f'zerostream.overlap_step: "{mode}" runs zerostream\'s CPU optimizer kernels '
            f"{where}, with zero_optimization.offload_optimizer.device "
            f'"cpu"{also}; this run steps {type(opt.optimizer).__name__} with offload_optimizer '
            f'"{opt.offload_device}" (drop overlap_step, or use a DeepSpeed optimizer '
            f"type such as AdamW with offload_optimizer cpu)"
        )


def make_behind(opt, ctx) -> UpdateBehind:
    """The update's runner for a sharded ZeRO optimizer (zero/sharded.py) under
    overlap_step "next_forward": zerostream's CPU kernels (over host masters, or the NVMe
    sub-group pipeline) and the copy stage only."""
    require_cpu_kernels(opt, ctx.config.zerostream.overlap_step, "behind the forward")
    from ..accelerator import is_host_run

    if is_host_run(ctx.device):
        logging.getLogger("zerostream").info(
            "zerostream.overlap_step: without a GPU the update behind the forward shares the "
            "CPU cores with the forward itself (0.96x the serial step on 2 cores, "
            "benchmarks/step.md); it pays where the forward runs on a device"
        )
    return UpdateBehind(ctx.telemetry, opt.copy_stage.bind_thread)


def launch_update(opt, partitions: list, factor: float, taken=None) -> None:
    """The CPU kernel's pass of the sharded optimizer's update, piece by piece in
    `opt._behind_pieces`'s order, on the update's thread: each piece's 16-bit values go
    through the copy stage and its upload mark is handed to the waiting gathers; the
    gradient partitions are zeroed after (they are read until then). The pieces `taken`
    (zero/speculate.py) updated during the backward with this factor and these
    hyperparameters only hand their 16-bit values on; the others' copies are put back here,
    before the thread starts, and they are updated as the rest."""
    from ..offload import sinks

    if opt.swapper is not None:
        return _launch_swapped(opt, partitions, factor)
    behind, stage = opt.behind, opt.copy_stage
    pieces = opt._behind_pieces(partitions)
    hyper = [dict(g) for g in opt.optimizer.param_groups]  # as at this step()
    kept = taken.keep(opt, factor, hyper, pieces) if taken is not None else set()
    if kept:
        opt.speculation.kept_elements += sum(hi - lo for _, lo, hi in kept)

    def copy_to(gi, pi, lo, hi):
        behind.before_piece(gi, lo, hi)
        return sinks.fused_target(partitions[gi], lo, hi, opt.masters[gi].dtype)

    def stepped(gi, pi, lo, hi) -> bool:
        return (gi, lo, hi) in kept

    def run(done) -> None:
        def piece_done(gi, pi, lo, hi):
            master = opt.masters[gi][lo:hi]
            if (gi, lo, hi) in kept:  # updated during the backward: its 16-bit values now
                behind.before_piece(gi, lo, hi)
                sinks.hand_on(partitions[gi], lo, hi, master, fused=False, stable=True)
            else:
                sinks.hand_on(partitions[gi], lo, hi, master, fused=True, stable=True)
            done(gi, lo, hi, stage.upload_mark())

        work = [(g, 0, lo, hi) for g, lo, hi in pieces]
        with opt.telemetry.phase("cpu_update"):
            opt.optimizer.step_ranges(
                work, factor, copy_to, piece_done, hyper=hyper, stepped=stepped if kept else None
            )
        opt._zero_partition_grads()

    behind.launch(pieces, run)


class _Report:
    """The swapped update's pieces told to the UpdateBehind (offload/swap_early.py's
    PieceReport), each with the copy stage's upload mark after it."""

    def __init__(self, behind: UpdateBehind, stage, done: Callable):
        self.behind, self.stage, self._done = behind, stage, done

    def before(self, g: int, lo: int, hi: int) -> None:
        self.behind.before_piece(g, lo, hi)

    def done(self, g: int, lo: int, hi: int) -> None:
        self._done(g, lo, hi, self.stage.upload_mark())


def _launch_swapped(opt, partitions: list, factor: float) -> None:
    """offload_optimizer "nvme": the sub-group pipeline (offload/optimizer_swap.py) on the
    update's thread, the persistent params' ranges first (Note [Persistent ranges first] in
    offload/swap_early.py). Its start (the tiers' "auto", whose readings are agreed across
    ranks) runs here, on the caller's thread, so that no collective runs on the update's."""
    from ..offload.swap_early import EarlyRanges

    swapper, behind = opt.swapper, opt.behind
    swapper.begin_step(opt.grads)
    early = EarlyRanges(swapper, opt._early_ranges())
    pieces = swapper.update_pieces(partitions, early)
    hyper = [dict(g) for g in swapper.hyper.param_groups]  # as at this step()

    def run(done) -> None:
        report = _Report(behind, opt.copy_stage, done)
        with opt.swapped_step_counted():
            swapper.run_step(opt.grads, partitions, factor, opt.copy_stage, hyper, early, report)
        opt._zero_partition_grads()

    behind.launch(pieces, run)
