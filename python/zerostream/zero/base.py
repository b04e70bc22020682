"""What every ZeRO optimizer wrapper shares: the loss scaler, the one-scalar-per-step norm and
overflow check, clipping, and the surface HF Accelerate and LR schedulers touch."""

from __future__ import annotations

import logging
import math
from typing import Iterable, List, Optional

import torch

from .. import comm
from ..offload.placement import Placer, StepWindow
from ..precision import DTYPES, unscale_and_clip_coef
from .checkpoint import WholeWeightsCheckpoint
from .protocol import StageCheckpoint, StageContext, TrainingState
from .skips import first_non_finite

_NORM_CHUNK = 1 << 24  # elements squared at once: bounds the temporary of a huge partition


def _host_squared_sum(g: torch.Tensor) -> torch.Tensor:
    """One pass of the native kernel, which reads 16-bit values as they are
    (ops/_cpu_optimizer.grad_stats: deterministic, 10-25x faster than torch's convert,
    square and sum on 10M elements on this machine)."""
    from ..ops._cpu_optimizer import grad_stats

    return torch.tensor(grad_stats(g)[0], dtype=torch.float64)


def _squared_sum(g: torch.Tensor) -> torch.Tensor:
    """Sum of squares of a gradient buffer, in float64: a host buffer (offloaded
    partitions, the CPU machine) by the native kernel, a device one by torch, chunked."""
    from ..ops._cpu_optimizer import GRAD_DTYPES

    if g.device.type == "cpu" and g.dtype in GRAD_DTYPES and g.is_contiguous():
        return _host_squared_sum(g)
    if g.numel() <= _NORM_CHUNK:
        return g.float().pow(2).sum().double()
    return torch.stack([c.float().pow(2).sum() for c in g.split(_NORM_CHUNK)]).sum().double()


def place_buffers(module: torch.nn.Module, ctx: StageContext) -> None:
    """The module's buffers on the run's device; floating ones cast to
    data_types.buffer_dtype when it is set (DeepSpeed 0.19: otherwise they keep their dtype,
    an fp32 rotary inv_freq beside bf16 weights)."""
    dtype = ctx.config.data_types.buffer
    for b in module.buffers():
        if dtype is not None and b.is_floating_point():
            b.data = b.data.to(device=ctx.device, dtype=DTYPES[dtype])
        else:
            b.data = b.data.to(ctx.device)


class ZeroOptimizerBase:
    """Wraps the inner torch optimizer (`self.optimizer`) the way DeepSpeed's ZeRO optimizers do:
    not a torch.optim.Optimizer itself; `param_groups` proxies the inner one. The shared part
    of the ZeroOptimizer protocol (zero/protocol.py, Note [Stage seam])."""

    def __init__(self, optimizer, ctx: StageContext):
        self.optimizer = optimizer
        self.ctx = ctx
        self.loss_scaler = ctx.loss_scaler
        self.clip = ctx.config.gradient_clipping
        # DeepSpeed's gradient_allreduce_op: "mean" averages the gradients over the
        # data-parallel ranks, "sum" keeps their sum (refused at stage 3 by the config).
        self.dp_divisor = ctx.world if ctx.config.gradient_allreduce_op == "mean" else 1
        self.dp_process_group = ctx.group
        self.telemetry = ctx.telemetry
        self.check_overflow = ctx.check_overflow
        self.overflow = False
        self._global_grad_norm: Optional[torch.Tensor] = None
        # A backward ran since the last step or zero_grad: gradients are held (what the
        # param helpers read, Note [Param access semantics] in zero/param_access.py).
        self.holding_grads = False
        self.param_access = None  # set by zero/param_access.register
        # Inside engine.coalesce_grad_reduction(): gradients stay on param.grad, summed by
        # autograd over the block's backwards, and are reduced once when it ends (Note
        # [Coalesced reduction]).
        self.coalescing = False
        self._held: dict = {}  # id(param) -> its fp32 sum in a block (grad_accum_dtype fp32)
        self._epilogue_queued = False  # a plain loss.backward()'s after_backward is queued

    # --- the module ------------------------------------------------------------------------
    @classmethod
    def prepare_module(cls, module: torch.nn.Module, ctx: StageContext) -> None:
        """Whole parameters on every rank (stages 0-2): moves them to the run's device and
        dtype (buffers keep their dtype: fp32 rotary inv_freq, norms' running stats), then
        rank 0's weights win, as in DeepSpeed, so ranks start from one model."""
        for p in module.parameters():
            p.data = p.data.to(
                device=ctx.device, dtype=ctx.dtype if p.is_floating_point() else p.dtype
            )
        place_buffers(module, ctx)
        if ctx.world > 1:
            src = comm.get_global_rank(ctx.group, 0)
            with torch.no_grad():
                for t in list(module.parameters()) + list(module.buffers()):
                    comm.broadcast(t.data, src, group=ctx.group)

    @classmethod
    def checkpointer(cls, module: torch.nn.Module, optimizer) -> StageCheckpoint:
        """The stage's side of a checkpoint of `module` and `optimizer` (None: a run without
        one), Note [Stage checkpoints]: the whole weights on every rank (stages 0-2)."""
        return WholeWeightsCheckpoint(module, optimizer)

    # Whether whole weights exist only by gathering them (DeepSpeed then asks for
    # zero_optimization.stage3_gather_16bit_weights_on_model_save before save_16bit_model).
    gathers_to_save = False
    # Whether the caller may take the gradient reduction over (engine.enable_backward_allreduce
    # False, engine.allreduce_gradients()): only where gradients stay whole until the step.
    caller_may_reduce = False
    # Whether ds_config's round_robin_gradients (a stage 1/2 partition order) is ignored here.
    ignores_round_robin = False

    @classmethod
    def whole_16bit_weights(cls, module: torch.nn.Module, exclude_frozen: bool = False):
        """The module's whole weights and buffers on global rank 0, None on the other ranks;
        every rank calls it. Below stage 3 they are the module's own."""
        if comm.get_rank() != 0:
            return None
        frozen = {n for n, p in module.named_parameters() if not p.requires_grad}
        return {
            k: v for k, v in module.state_dict().items() if not exclude_frozen or k not in frozen
        }

    @classmethod
    def release_gathered(cls, module: torch.nn.Module) -> None:
        """Frees every gathered full parameter that is not persistent (stage 3's
        empty_partition_cache); below stage 3 parameters are whole and nothing is gathered."""

    @classmethod
    def close(cls, module: torch.nn.Module, optimizer) -> None:
        """Ends the stage (engine.destroy): copies in flight finish, swap files go."""
        if optimizer is not None:
            optimizer.close_state()

    # The update running behind the next forward (zero/overlap.py), or None.
    behind = None
    # The update started during the backward (zero/speculate.py), or None; the engine says
    # whether the next backward ends the accumulation (the one speculated on).
    speculation = None
    boundary_backward = False
    # The held gradients are already reduced over the ranks (stage 0 after the boundary's
    # backward; the sharded stages reduce into partitions and read them there).
    reduced = False

    def settle_update(self, keep_speculation: bool = False) -> None:
        """Waits for an update running behind the forward (Note [The step overlapped with
        the next forward] in zero/overlap.py): every reader and writer of the optimizer's
        state but the forward's gathers calls it first. A failed update leaves the run
        inconsistent (its partitions partly updated) and raises, naming it. Pieces updated
        during the backward are put back first, unless step() asks to keep them (Note [The
        step started during the backward] in zero/speculate.py)."""
        if self.behind is None and self.speculation is None:
            return
        from .overlap import UpdateFailed

        try:
            if self.speculation is not None and not keep_speculation:
                self.speculation.discard()
            if self.behind is None:
                return
            ran = self.behind.settle()
        except UpdateFailed as e:
            self.ctx.run.set_inconsistent(str(e))
            raise
        if ran:
            self._update_settled()

    def _update_settled(self) -> None:
        """After the update behind the forward ended (the sharded stages fence its uploads)."""

    def close_state(self) -> None:
        """The optimizer's side of close(): its gradient hooks go (a later backward through
        the same module must not reach a closed engine); nothing else to end without
        offload."""
        from .overlap import UpdateFailed

        try:
            self.settle_update()
        except UpdateFailed as e:  # destroy goes on; the run could not have
            logging.getLogger("zerostream").error("%s", e)
        for hook in getattr(self, "_hooks", ()):
            hook.remove()
        self._hooks: list = []

    def after_backward(self) -> None:
        """loss.backward() returned (each stage finishes its micro-step's hand-off)."""
        raise NotImplementedError

    def make_placement(self, ctx: StageContext) -> None:
        """The stage's placer and its measuring window (offload/placement/): made before the
        state, as the tiers built with it attach to it; its readings are agreed over the
        data-parallel group (Note [Every rank places the same tiers])."""
        agree = comm.agreement(ctx.group, ctx.device) if ctx.world > 1 else None
        self.placement = Placer(StepWindow(), agree)

    def after_step(self) -> None:
        """The engine's one call after each optimizer step, applied or skipped: the
        placement's measuring window closes while an "auto" tier waits (Note [A step's
        excess]), host_malloc "retain" settling its heap first."""
        self.placement.step_ended()

    def before_forward(self) -> None:
        # A backward that raised never ran its queued epilogue (Note [A plain
        # loss.backward()]); the next forward starts a new micro-step.
        self._epilogue_queued = False

    def after_forward(self) -> None:
        pass

    # --- backward ------------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, retain_graph: bool = False) -> None:
        """DeepSpeed's ZeRO `optimizer.backward(loss, retain_graph=False)`: the loss times
        the loss scale, not divided by gradient_accumulation_steps (DeepSpeed's
        engine.backward divides before calling it; engine.backward does both here)."""
        self.run_backward(loss, self.loss_scaler.loss_scale, retain_graph)

    def run_backward(self, loss: torch.Tensor, factor: float, retain_graph: bool = False) -> None:
        """Autograd of `loss * factor` in the BACKWARD phase (the stage's hooks check it),
        then the stage's gradient hand-off (Note [Stage seam])."""
        if not torch.is_tensor(loss) or loss.numel() != 1 or loss.grad_fn is None:
            raise ValueError("backward: expected a scalar loss tensor with a grad_fn")
        run = self.ctx.run
        self.settle_update()  # its gradients land where the update reads
        run.require_consistent("backward")
        if self.speculation is not None and self.boundary_backward and not self.coalescing:
            self.arm_speculation()
        self._epilogue_queued = False  # see before_forward
        previous, run.state = run.state, TrainingState.BACKWARD
        try:
            timers = self.ctx.timers
            with self.telemetry.phase("backward"), timers.span("backward_inner"):
                (loss.float() * factor).backward(retain_graph=retain_graph)
            with timers.span("backward_allreduce"):
                self.after_backward()
        finally:
            run.state = previous
        self.holding_grads = True

    # Note [A plain loss.backward()]
    #   DeepSpeed 0.17+ accepts `loss.backward()` (after engine.scale(loss) with fp16, or
    #   one loss summed over several engines) in place of engine.backward: its gradient
    #   hooks notice that no engine.backward runs and finish the micro-step themselves. Here
    #   the first gradient hook of such a backward queues after_backward() on autograd's
    #   engine, which runs it when the backward's graph task ends: the stage-2 buckets are
    #   reduced and landed, stage 3's leaves handed on and its params released, and the
    #   gradient helpers see the gradients (holding_grads), as after engine.backward. The
    #   loss is not divided by gradient_accumulation_steps there, as in DeepSpeed.
    #   A reentrant activation checkpoint runs its recompute's backward as an autograd run
    #   of its own: when the first hook fires there, the epilogue runs at that inner run's
    #   end, mid-backward, and the next hook of the outer run queues another. Each runs on
    #   what has arrived by then (buckets flushed, params released), so every gradient is
    #   still reduced once (test_coalesce_and_plain_backward.py's reentrant test: bit-equal
    #   to engine.backward at stages 0-3).
    def grad_hook_entered(self) -> None:
        """Every stage's gradient hook calls it first (Note [A plain loss.backward()])."""
        if self.behind is not None and self.behind.running:
            self.settle_update()  # a plain loss.backward() after an overlapped step
        if self.ctx.run.state is TrainingState.BACKWARD or self._epilogue_queued:
            return
        self._epilogue_queued = True
        torch.autograd.Variable._execution_engine.queue_callback(self._plain_backward_done)

    def _plain_backward_done(self) -> None:
        self._epilogue_queued = False
        self.after_backward()
        self.holding_grads = True

    # Note [Coalesced reduction]
    #   engine.coalesce_grad_reduction() (DeepSpeed 0.18): several backwards, one reduction.
    #   Inside the block the stages that reduce during backward (2 and 3) leave each
    #   gradient on param.grad, where autograd sums the block's backwards (stage 3 still
    #   releases the param: only its gradient stays whole, as DeepSpeed's does), and
    #   end_coalescing() hands every trained param's gradient to the reducer in group order
    #   (zeros for one that got none on this rank, so every rank issues the same buckets),
    #   one pass of buckets instead of one per backward. Stages 0 and 1 reduce at the step
    #   anyway. The price is the one DeepSpeed pays: a whole gradient per param in the
    #   model's dtype for the length of the block; with data_types.grad_accum_dtype fp32
    #   and a 16-bit model, each backward's gradient is added into an fp32 copy instead
    #   (twice the bytes), so the sum is not rounded to 16 bits per backward.
    def begin_coalescing(self) -> None:
        self.coalescing = True

    def hold_coalesced(self, param: torch.nn.Parameter) -> None:
        """A stage's gradient hook inside the block: the gradient stays unreduced."""
        accum = self.ctx.grad_accum_dtype
        if param.grad is None or param.grad.dtype == accum:
            return  # autograd adds the next backward's into param.grad
        grad, param.grad = param.grad, None
        held = self._held.get(id(param))
        self._held[id(param)] = grad.to(accum) if held is None else held.add_(grad)

    def coalesced_grad(self, param: torch.nn.Parameter) -> Optional[torch.Tensor]:
        """What the block holds for `param` (None: nothing yet)."""
        return self._held.get(id(param), param.grad)

    def take_coalesced(self, param: torch.nn.Parameter) -> Optional[torch.Tensor]:
        grad = self._held.pop(id(param), None)
        if grad is None:
            grad = param.grad
        param.grad = None
        return grad

    def end_coalescing(self, reduce: bool = True) -> None:
        """Leaves the block: its gradients reduced once (`reduce`), or, when the block
        raised, the ones it left on param.grad dropped: some ranks may not have run its
        backwards, so no collective is started."""
        self.coalescing = False
        if reduce:
            self.flush_coalesced()
        else:
            self.drop_coalesced()
        self._held.clear()

    def flush_coalesced(self) -> None:
        """Stages 0 and 1 accumulate locally and reduce at the step: nothing to do."""

    def drop_coalesced(self) -> None:
        """Stages 0 and 1 held nothing apart: their local gradients stay for the step."""

    def _comm(self, kind: str, tensor: torch.Tensor, seconds: float) -> None:
        """Counts a collective's payload (the whole gathered or reduced tensor) for the
        per-step report, under its kind (StepTelemetry.COLLECTIVES)."""
        self.telemetry.moved(kind, tensor.numel() * tensor.element_size(), seconds)

    # --- surface -----------------------------------------------------------------------------
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        self.settle_update()
        return self.optimizer.state

    @property
    def loss_scale(self) -> float:
        return self.loss_scaler.loss_scale

    @property
    def cur_scale(self) -> float:
        return self.loss_scaler.loss_scale

    @property
    def dynamic_loss_scale(self) -> bool:
        """fp16 with `loss_scale` 0: the scale adapts to overflows (DeepSpeed's attribute)."""
        return self.loss_scaler.dynamic

    # DeepSpeed's optimizer wrappers name the model's training dtype and their loss-scale
    # settings so (its test_ds_initialize reads both); the engine's scaler holds the latter.
    @property
    def low_precision_dtype(self) -> torch.dtype:
        return self.ctx.dtype

    @property
    def loss_scale_config(self):
        return self.loss_scaler

    @property
    def global_grad_norm(self) -> Optional[torch.Tensor]:
        """The last step's pre-clip, unscaled global norm (inf after an overflow)."""
        return self._global_grad_norm

    def _scaler_state(self) -> dict:
        return {
            "loss_scaler": self.loss_scaler.state_dict(),
            "dynamic_loss_scale": self.loss_scaler.dynamic,
            "overflow": self.overflow,
            "clip_grad": self.clip,
        }

    def _load_scaler_state(self, state: dict) -> None:
        self.loss_scaler.load_state_dict(state["loss_scaler"])
        self.overflow = bool(state.get("overflow", False))

    # --- health ---------------------------------------------------------------------------------
    def non_finite_state(self) -> Optional[str]:
        """What in this rank's fp32 weights or optimizer state holds inf/NaN, or None (asked
        after a skipped step, zero/skips.py). This default walks the inner optimizer's params
        and their state tensors; the offloaded stages override it where state is on NVMe."""
        found = []
        for g, group in enumerate(self.optimizer.param_groups):
            for i, p in enumerate(group["params"]):
                named = {"fp32 weights": p, **self.optimizer.state.get(p, {})}
                for kind, value in named.items():
                    at = first_non_finite(value) if torch.is_tensor(value) else -1
                    if at >= 0:
                        what = kind if kind == "fp32 weights" else f"optimizer state {kind!r}"
                        found.append(f"the {what} of param group {g}, tensor {i} (first at {at})")
        if not found:
            return None
        return "; ".join(found) + " hold inf/NaN"

    # --- the step's shared arithmetic ------------------------------------------------------------
    def _norm_and_overflow(self, grads: Iterable[torch.Tensor], partitioned: bool) -> float:
        """Squared norm of the still-scaled grads, summed over ranks when each holds a
        partition; inf or nan anywhere makes it non-finite, so one scalar tells both."""
        grads = [g for g in grads if g is not None and g.numel() > 0]
        by_device: dict = {}  # host partitions and the device tier's (offload_optimizer.ratio)
        for g in grads:
            by_device.setdefault(g.device, []).append(_squared_sum(g))
        if len(by_device) > 1:
            total = sum(
                torch.stack(sums).sum().to(self.ctx.device, non_blocking=True)
                for sums in by_device.values()
            )
        elif grads:
            total = torch.stack(next(iter(by_device.values()))).sum()
        else:
            total = torch.zeros((), dtype=torch.float64, device=self.ctx.device)
        if partitioned and self.ctx.world > 1:
            # The collective runs on the run's device (NCCL: the GPU, even offloaded); a
            # scalar summed on the host goes up without the host waiting for the stream.
            total = total.to(self.ctx.device, non_blocking=True)
            comm.all_reduce(total, group=self.dp_process_group)
        return self._host_scalar(total)

    def _host_scalar(self, value: torch.Tensor) -> float:
        """The step's one device-to-host read: the squared norm that decides overflow and
        clipping for every sub-group at once (tests count the calls)."""
        return float(value)

    def _grad_factor(self, norm_sq: float) -> Optional[float]:
        """The factor 1/(loss_scale*clip_coef) the grads need, or None on overflow. Records
        the overflow flag and the pre-clip, unscaled global norm."""
        scale = self.loss_scaler.loss_scale
        if not math.isfinite(norm_sq) and self.check_overflow:
            self.overflow = True
            self._global_grad_norm = torch.tensor(float("inf"))
            return None
        self.overflow = False
        norm = math.sqrt(norm_sq)
        self._global_grad_norm = torch.tensor(norm / scale)
        return 1.0 / (unscale_and_clip_coef(norm, scale, self.clip) * scale)

    def _unscale_and_clip(self, grads: List[torch.Tensor], norm_sq: float) -> bool:
        """Applies the factor to `grads` in place; returns False on overflow."""
        factor = self._grad_factor(norm_sq)
        if factor is None:
            return False
        if factor != 1.0:
            for g in grads:
                g.mul_(factor)
        return True
