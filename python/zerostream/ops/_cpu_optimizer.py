"""Shared machinery of zerostream's CPU optimizers (adam.py, adagrad.py, lion.py).

Tensors cross into the native kernels (``zerostream._C.optim``, csrc/optim) as
``(data_ptr, numel, dtype name)``: this module checks device, dtype, layout and sizes first,
so a bad tensor is a ``ValueError`` naming the argument, never a crash in native code.

``CPUOptimizerBase`` is the ``torch.optim.Optimizer`` behind DeepSpeedCPUAdam,
DeepSpeedCPUAdagrad and DeepSpeedCPULion: it walks the param groups, creates fp32 state,
and hands each group's parameters to its subclass's fused kernel in one native call
(``*_step_many``: one parallel region for the whole list, Note [Many tensors, one region]
in csrc/optim/parallel.h).
"""

from __future__ import annotations

from typing import Dict, Iterable, List, NamedTuple, Optional, Tuple

import torch

from zerostream import _C
from zerostream.aligned import aligned_empty
from zerostream.lazy_tensor import LazyTensor
from zerostream.ops.threads import optimizer_threads
from zerostream.precision import COPY_DTYPES

_DTYPE_NAMES: Dict[torch.dtype, str] = {
    torch.float32: "fp32",
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
}
GRAD_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_SIMD_NAMES = ("scalar", "neon", "avx2", "avx512")


def check_betas(betas) -> Tuple[float, float]:
    """(beta1, beta2) as floats, each in [0, 1); ValueError in torch's words otherwise."""
    try:
        beta1, beta2 = (float(b) for b in betas)
    except (TypeError, ValueError):
        raise ValueError(f"betas: expected a pair of floats; got {betas!r}") from None
    for i, b in enumerate((beta1, beta2)):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"Invalid beta parameter at index {i}: {b}")
    return beta1, beta2


def check_hyperparams(lr, weight_decay, eps=None) -> None:
    """torch's checks, in torch's words, of a constructor's lr, eps (when it has one) and
    weight_decay."""
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    if eps is not None and not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")


def dtype_name(dtype: torch.dtype, what: str) -> str:
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"{what}: expected dtype float32, bfloat16 or float16; got {dtype}")
    return _DTYPE_NAMES[dtype]


def check_buffer(what: str, t: torch.Tensor, numel: int, dtypes: Tuple[torch.dtype, ...]) -> int:
    """Returns t's data pointer after checking it can be handed to a kernel as raw memory."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{what}: expected a torch.Tensor; got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{what}: CPU optimizers need CPU tensors; got device {t.device}")
    if t.dtype not in dtypes:
        names = ", ".join(str(d) for d in dtypes)
        raise ValueError(f"{what}: expected dtype in ({names}); got {t.dtype}")
    if t.layout != torch.strided or not t.is_contiguous():
        raise ValueError(f"{what}: expected a contiguous dense tensor")
    if t.numel() != numel:
        raise ValueError(f"{what}: expected {numel} elements (as param); got {t.numel()}")
    return t.data_ptr()


def run_kwargs(threads: Optional[int], simd: Optional[str], nontemporal: str) -> dict:
    """Keyword arguments of every _C.optim step call that say how (not what) to run."""
    if threads is not None and (not isinstance(threads, int) or threads < 0):
        raise ValueError(f"threads: expected None or an int >= 0; got {threads!r}")
    if simd is not None and simd not in _SIMD_NAMES:
        raise ValueError(f"simd: expected None or one of {_SIMD_NAMES}; got {simd!r}")
    if nontemporal not in ("auto", "on", "off", "copy"):
        raise ValueError(
            f"nontemporal: expected 'auto', 'on', 'off' or 'copy'; got {nontemporal!r}"
        )
    return {
        "threads": optimizer_threads(threads or None),
        "simd": simd or "",
        "nontemporal": nontemporal,
    }


def step_buffers(
    param: torch.Tensor,
    grad: torch.Tensor,
    states: Dict[str, torch.Tensor],
    param_copy: Optional[torch.Tensor],
) -> dict:
    """The positional buffers of a _C.optim step call, checked. The param is the master the
    kernel updates: fp32, or a 16-bit tensor that is its own master; the states are fp32 or
    of the param's 16-bit dtype (Note [16-bit masters and states] in csrc/optim/step_types.h)."""
    numel = param.numel() if isinstance(param, torch.Tensor) else -1
    out = {
        "param": check_buffer("param", param, numel, GRAD_DTYPES),
        "param_dtype": dtype_name(param.dtype, "param"),
        "grad": check_buffer("grad", grad, numel, GRAD_DTYPES),
        "grad_dtype": dtype_name(grad.dtype, "grad"),
        "numel": numel,
        "state_dtype": "fp32",
    }
    first = None
    for name, t in states.items():
        out[name] = check_buffer(name, t, numel, (torch.float32, param.dtype))
        if first is not None and t.dtype != states[first].dtype:
            raise ValueError(f"{name}: {t.dtype}, but {first} is {states[first].dtype}")
        first = first or name
        out["state_dtype"] = dtype_name(t.dtype, name)
    if param_copy is not None:
        if param.dtype != torch.float32:
            raise ValueError(f"param_copy: a {param.dtype} param is its own 16-bit copy")
        out["param_copy"] = check_buffer("param_copy", param_copy, numel, COPY_DTYPES)
        out["copy_dtype"] = dtype_name(param_copy.dtype, "param_copy")
    return out


def grad_stats(
    grad: torch.Tensor,
    scale: float = 1.0,
    *,
    threads: Optional[int] = None,
    simd: Optional[str] = None,
) -> Tuple[float, bool]:
    """(sum of squares of grad * scale, all finite) in one pass over a CPU gradient buffer.

    fp32, bf16 or fp16; summed in double in a thread-count independent order, so every rank
    gets the same bits (csrc/optim/grad_stats.h).
    """
    ptr = check_buffer(
        "grad", grad, grad.numel() if isinstance(grad, torch.Tensor) else -1, GRAD_DTYPES
    )
    kw = run_kwargs(threads, simd, "auto")
    return _C.optim.grad_stats(
        ptr,
        dtype_name(grad.dtype, "grad"),
        grad.numel(),
        scale=float(scale),
        threads=kw["threads"],
        simd=kw["simd"],
    )


ALIGNED_STATE_BYTES = 1 << 20


def _state_tensor(shape, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An uninitialised state tensor. Large ones start on a 4 KiB boundary, so a
    checkpoint reads and writes them straight to and from the disk (aligned.py
    aligned_empty) instead of through the engine's bounce buffers at half the speed."""
    shape = torch.Size(shape)
    if shape.numel() * dtype.itemsize < ALIGNED_STATE_BYTES:
        return torch.empty(shape, dtype=dtype)
    return aligned_empty(shape, dtype)


def _reusable(t, shape, dtype: torch.dtype) -> Optional[torch.Tensor]:
    """`t` when a loaded state of `shape` can be written into it in place."""
    if not torch.is_tensor(t) or t.dtype != dtype or t.device.type != "cpu":
        return None
    return t if t.shape == torch.Size(shape) and t.is_contiguous() else None


class StepItem(NamedTuple):
    """One parameter of a group step: the fp32 tensor the kernel updates, its grad, its
    optimizer state, the 16-bit param to write (or None) and its place in param_groups."""

    p32: torch.Tensor
    grad: torch.Tensor
    state: dict
    copy: Optional[torch.Tensor]
    group: int
    index: int


def param_location(optimizer: str, group: int, index: int) -> str:
    """How errors name a parameter: "DeepSpeedCPUAdam: param_groups[0]['params'][4]"."""
    return f"{optimizer}: param_groups[{group}]['params'][{index}]"


def many_buffers(items: List[StepItem], state_names: Tuple[str, ...], optimizer: str) -> dict:
    """The list arguments of a _C.optim.*_step_many call, every tensor checked first (a bad
    one is a ValueError naming its param, and nothing has been stepped). Keys: params,
    param_dtypes, state_dtypes, grads, grad_dtypes, numels, param_copies (0: none),
    copy_dtypes and one list per state name."""
    out: dict = {
        "params": [],
        "param_dtypes": [],
        "state_dtypes": [],
        "grads": [],
        "grad_dtypes": [],
        "numels": [],
        "param_copies": [],
        "copy_dtypes": [],
    }
    out.update({name: [] for name in state_names})
    for it in items:
        try:
            b = step_buffers(it.p32, it.grad, {n: it.state[n] for n in state_names}, it.copy)
        except ValueError as e:
            raise ValueError(f"{param_location(optimizer, it.group, it.index)}: {e}") from None
        out["params"].append(b["param"])
        out["param_dtypes"].append(b["param_dtype"])
        out["state_dtypes"].append(b["state_dtype"])
        out["grads"].append(b["grad"])
        out["grad_dtypes"].append(b["grad_dtype"])
        out["numels"].append(b["numel"])
        out["param_copies"].append(b.get("param_copy", 0))
        out["copy_dtypes"].append(b.get("copy_dtype", "bf16"))
        for name in state_names:
            out[name].append(b[name])
    return out


class CPUOptimizerBase(torch.optim.Optimizer):
    """Walks param groups and calls the subclass's fused kernel once per group.

    fp32 params are updated in place, with fp32 states. bf16/fp16 params:
    - by default keep an fp32 master copy in ``state["fp32_param"]`` and fp32 states: the
      kernel updates the master and writes the 16-bit param in the same pass (the fused
      param copy), with the 16-bit grad read directly. More exact than DeepSpeed, which
      updates the 16-bit param itself.
    - with ``fp32_master_weights=False`` (zerostream's; the engine under
      ``bf16.bf16_master_weights_and_grads``): the 16-bit param is its own master, updated in
      place from the fp32 update (rounded to nearest even once), as DeepSpeedCPUAdam does;
      states stay fp32.
    - with ``fp32_optimizer_states=False`` (DeepSpeed's meaning): as above, and the states
      are of the param's dtype too (6 bytes an element for Adam instead of 16).
    Subclasses define ``_state_names`` and ``_group_step(group, items, grad_scale)``, which
    steps a list of StepItem in one native call with each item's ``state["step"] + 1``.
    """

    _state_names: Tuple[str, ...] = ()
    _display_name = "CPUOptimizer"
    _sparse_grads = False  # sparse COO gradients accepted (Adagrad: _step_item there)

    def __init__(
        self,
        params: Iterable,
        defaults: dict,
        fp32_optimizer_states: bool,
        threads: Optional[int],
        fp32_master_weights: bool = True,
    ):
        run_kwargs(threads, None, "auto")
        self.threads = threads
        self.fp32_optimizer_states = bool(fp32_optimizer_states)
        self.fp32_master_weights = bool(fp32_master_weights) and self.fp32_optimizer_states
        self._bound_grads: Dict[torch.Tensor, torch.Tensor] = {}
        super().__init__(params, defaults)

    def rebuild_kwargs(self) -> dict:
        """Constructor settings that are not param-group options, for a rebuild of this
        optimizer over other params (ZeRO's partitions: optim_factory.optimizer_maker)."""
        return {
            "fp32_optimizer_states": self.fp32_optimizer_states,
            "threads": self.threads,
            "fp32_master_weights": self.fp32_master_weights,
        }

    def state_dtype(self, p: torch.Tensor) -> torch.dtype:
        """The dtype of p's optimizer states: p's own 16-bit dtype with
        fp32_optimizer_states=False, fp32 otherwise."""
        return p.dtype if not self.fp32_optimizer_states else torch.float32

    def keeps_master(self, p: torch.Tensor) -> bool:
        """Whether p (16-bit) trains against an fp32 master in its state."""
        return p.dtype != torch.float32 and self.fp32_master_weights

    def bind_grads(self, grads: Dict[torch.Tensor, torch.Tensor]) -> None:
        """Gradients the kernel reads for these params instead of their .grad: a 16-bit
        gradient of an fp32 param, which torch refuses as .grad (the 16-bit host gradient
        partitions of the offloaded ZeRO stages, zero/sharded.py)."""
        for p, g in grads.items():
            if g.shape != p.shape or g.dtype not in GRAD_DTYPES:
                raise ValueError(
                    f"{self._display_name}.bind_grads: a {g.dtype} gradient of shape "
                    f"{tuple(g.shape)} for a param of shape {tuple(p.shape)}"
                )
        self._bound_grads.update(grads)

    def _grad(self, p: torch.Tensor) -> Optional[torch.Tensor]:
        bound = self._bound_grads.get(p)
        return p.grad if bound is None else bound

    def _check_param(self, gi: int, pi: int, p: torch.Tensor) -> None:
        where = param_location(self._display_name, gi, pi)
        if p.device.type != "cpu":
            raise ValueError(
                f"{where} is on {p.device}; CPU optimizers need CPU parameters "
                "(enable offload_optimizer with device 'cpu')"
            )
        if p.dtype not in GRAD_DTYPES:
            raise ValueError(f"{where}: expected float32, bfloat16 or float16; got {p.dtype}")
        if not p.is_contiguous():
            raise ValueError(f"{where}: expected a contiguous parameter")
        grad = self._grad(p)
        if grad is not None and grad.is_sparse and not self._sparse_grads:
            raise ValueError(f"{where}: sparse gradients are not supported")

    def _init_state(self, p: torch.Tensor, state: dict) -> None:
        state["step"] = 0
        for name in self._state_names:
            state[name] = _state_tensor(p.shape, self.state_dtype(p)).zero_()
        if self.keeps_master(p):
            state["fp32_param"] = _state_tensor(p.shape).copy_(p.detach())

    def set_step(self, p: torch.Tensor, step: int) -> None:
        """Sets p's step count, so its next update runs as step `step + 1` (bias correction
        included), its state made if it has none yet: ZenFlow numbers its host updates by
        the training step, as DeepSpeed's ZenFlowCPUAdam.step(step_id) does."""
        state = self.state[p]
        if len(state) == 0:
            self._init_state(p, state)
        state["step"] = int(step)

    @torch.no_grad()
    def step(self, closure=None, *, grad_scale: float = 1.0):
        """One update of every parameter with a gradient; grads are multiplied by grad_scale
        (1 / (loss_scale * clip_coef)) inside the same pass."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for gi, group, params in self._stepping():
            made = [self._step_item(gi, pi, p, state, master) for pi, p, state, master in params]
            if made:
                self._group_step(group, [item for item, _ in made], float(grad_scale))
                for item, finish in made:
                    if finish is None:
                        item.state["step"] += 1
                    else:
                        finish()
        return loss

    def _step_item(self, gi: int, pi: int, p: torch.Tensor, state: dict, master):
        """(the StepItem step() updates p through, a callable that completes p's step after
        the kernel ran, or None: its step count is advanced)."""
        copy = None if master is None else p.data
        target = p.data if master is None else master
        return StepItem(target, self._grad(p).contiguous(), state, copy, gi, pi), None

    @torch.no_grad()
    def step_in_pieces(self, piece: int, grad_scale: float, copy_to, done) -> None:
        """step(grad_scale=...) cut into pieces of at most `piece` elements of each param,
        for a caller that hands each piece on while the next one is updated (the copy stage,
        offload/copy_stage.py): copy_to(gi, pi, lo, hi) returns a 16-bit buffer the kernel
        writes the updated values into in the same pass (or None); done(gi, pi, lo, hi)
        runs after each piece. The kernel is elementwise, so the result is step()'s, bit for
        bit, and every param's step count still advances once."""
        if piece < 1:
            raise ValueError(f"step_in_pieces: piece must be >= 1; got {piece}")
        pieces = [
            (gi, pi, lo, min(lo + piece, p.numel()))
            for gi, group in enumerate(self.param_groups)
            for pi, p in enumerate(group["params"])
            for lo in range(0, p.numel(), piece)
        ]
        self.step_ranges(pieces, grad_scale, copy_to, done)

    @torch.no_grad()
    def step_ranges(
        self,
        pieces,
        grad_scale: float,
        copy_to,
        done,
        hyper=None,
        stepped=None,
        partial: bool = False,
    ) -> None:
        """step_in_pieces over the pieces a caller chose, in its order: `pieces` lists
        (gi, pi, lo, hi), covering each param with a gradient once (pieces of params without
        one are passed by, as step() passes them). `hyper[gi]` (lr, betas, ...) stands for
        param_groups[gi] where given: an update running behind the next forward reads the
        values of the step() that launched it, whatever a scheduler sets meanwhile.

        The step started during the backward (zero/speculate.py) runs some pieces early:
        there, `partial` steps just the pieces given, as step number state["step"] + 1,
        without counting the step; at step(), `stepped(gi, pi, lo, hi)` answers True for a
        piece it updated already, which is passed to `done` without a kernel call, and the
        step is counted once, here."""
        stepping = list(self._stepping())
        work = {}
        for gi, group, params in stepping:
            for pi, p, state, master in params:
                p32 = (p.data if master is None else master).view(-1)
                if self._grad(p).is_sparse:
                    raise ValueError(
                        f"{param_location(self._display_name, gi, pi)}: a sparse gradient is "
                        f"stepped by step() only, not in pieces"
                    )
                grad = self._grad(p).contiguous().view(-1)
                flat = {n: state[n].view(-1) for n in self._state_names}
                work[gi, pi] = (group if hyper is None else hyper[gi], p32, grad, flat, state)
        covered = dict.fromkeys(work, 0)
        for gi, pi, lo, hi in pieces:
            if (gi, pi) in covered:
                covered[gi, pi] += hi - lo
        short = [(k, n) for k, n in covered.items() if n != work[k][1].numel()]
        if short and not partial:
            (gi, pi), n = short[0]
            raise ValueError(
                f"{self._display_name}.step_ranges: the pieces of group {gi} param {pi} "
                f"cover {n} of its {work[gi, pi][1].numel()} elements"
            )
        for gi, pi, lo, hi in pieces:
            if (gi, pi) not in work:
                continue
            if stepped is not None and stepped(gi, pi, lo, hi):
                done(gi, pi, lo, hi)
                continue
            group, p32, grad, flat, state = work[gi, pi]
            views = {n: t[lo:hi] for n, t in flat.items()}
            views["step"] = state["step"]
            item = StepItem(p32[lo:hi], grad[lo:hi], views, copy_to(gi, pi, lo, hi), gi, pi)
            self._group_step(group, [item], float(grad_scale))
            done(gi, pi, lo, hi)
        if partial:
            return
        for _, _, params in stepping:
            for _, _, state, _ in params:
                state["step"] += 1

    def range_tensors(self, gi: int, pi: int, lo: int, hi: int) -> List[torch.Tensor]:
        """Elements [lo, hi) of what a step of param_groups[gi]["params"][pi] rewrites: its
        fp32 values (the master) and each state tensor, made at first use (the step
        started during the backward copies them before a speculative update)."""
        p = self.param_groups[gi]["params"][pi]
        state = self.state[p]
        if len(state) == 0:
            self._init_state(p, state)
        master = state.get("fp32_param")
        p32 = (p.data if master is None else master).view(-1)
        return [p32[lo:hi]] + [state[n].view(-1)[lo:hi] for n in self._state_names]

    def _stepping(self):
        """(group index, group, [(index, param, state, fp32 master or None)]) for every param
        group, over the params with a gradient: each checked, its state made at first use."""
        for gi, group in enumerate(self.param_groups):
            self._check_group(group)
            params = []
            for pi, p in enumerate(group["params"]):
                if self._grad(p) is None:
                    continue
                self._check_param(gi, pi, p)
                state = self.state[p]
                if len(state) == 0:
                    self._init_state(p, state)
                params.append((pi, p, state, state.get("fp32_param")))
            yield gi, group, params

    def _check_group(self, group: dict) -> None:
        pass

    def _group_step(self, group: dict, items: List[StepItem], grad_scale: float) -> None:
        raise NotImplementedError

    def load_state_dict(self, state_dict: dict) -> None:
        # torch casts floating state to the param's dtype on load; our states and masters
        # have the dtypes this optimizer keeps (state_dtype, fp32 masters), so they are
        # restored from the saved tensors, converted where the saved dtype differs.
        # A state tensor this optimizer already has is overwritten in place (a load into a
        # live run: no second copy in memory, no fresh pages to fault in).
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        previous = {p: dict(self.state[p]) for p in params if p in self.state}
        super().load_state_dict(state_dict)
        for pid, p in zip(saved_ids, params):
            for key, value in state_dict["state"].get(pid, {}).items():
                readable = isinstance(value, LazyTensor)  # a checkpoint's FileTensor
                if key == "step" or not (readable or torch.is_tensor(value)):
                    continue
                dtype = torch.float32 if key == "fp32_param" else self.state_dtype(p)
                dst = _reusable(previous.get(p, {}).get(key), value.shape, dtype)
                if dst is None:
                    dst = _state_tensor(value.shape, dtype)
                if readable:  # read in once, straight into the state (cast to its dtype)
                    self.state[p][key] = value.read_into(dst)
                else:
                    self.state[p][key] = dst.copy_(value.detach())
