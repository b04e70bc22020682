"""`zero.Init`: parameters are partitioned as modules are constructed, so a model larger than
one rank's memory can be built.

While the context is open every nn.Module subclass's `__init__` is wrapped: when the
outermost `__init__` of an instance returns, the parameters it created are converted to the
run's dtype, rank 0's values are broadcast (as DeepSpeed does) and each rank keeps only its
shard. Each parameter is initialised once, by its module's own code, from the same random
stream as a plain construction, so a seeded build matches one made without zero.Init.
`nn.Module.apply` is wrapped too (zero_optimization.override_module_apply, DeepSpeed's
default): Hugging Face's `post_init` re-initialises weights through it after children are
partitioned, so each module's params are gathered around `fn` and rank 0's result kept.
A model built here runs forward and backward without an engine (params gathered on demand,
gradients left whole on `param.grad`); initialize() takes the partitions over.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Dict, List, Optional

import torch

from ... import comm
from . import hooks
from .coordinator import ParamCoordinator
from .gathered import GatheredParameters
from .module_state import ensure_state
from .partitioner import Partitioner


def _return_freed_host_memory() -> None:
    """Construction allocated and freed one full tensor per module; glibc keeps freed heap
    pages mapped (the process's RSS stays up by up to the model's size) until trimmed."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass


def _all_subclasses(cls) -> List[type]:
    out, todo = [], [cls]
    while todo:
        c = todo.pop()
        for sub in c.__subclasses__():
            out.append(sub)
            todo.append(sub)
    return out


def contradicting_single_rank_group(
    dp_world_size: int, explicit_process_group, env=None
) -> Optional[str]:
    """The error when zero.Init would partition over one rank while the launcher started
    several (WORLD_SIZE above 1): a process group of one made before the launcher's world
    (torch.distributed initialised by hand, or by a library, with world size 1) would leave
    every rank holding the whole model, each running out of memory or training alone. None
    when the group really is the world, or was handed over explicitly (a group of one on
    purpose), or WORLD_SIZE does not say otherwise."""
    import os

    if dp_world_size != 1 or explicit_process_group is not None:
        return None
    raw = (os.environ if env is None else env).get("WORLD_SIZE")
    try:
        launched = int(raw) if raw is not None else 1
    except (TypeError, ValueError):
        return None
    if launched <= 1:
        return None
    return (
        f"zero.Init: the launcher started WORLD_SIZE={launched} processes, but the "
        f"data-parallel group it would partition over has 1 rank (torch.distributed was "
        f"initialised with world size 1 before zero.Init), so every rank would hold the whole "
        f"model. Call deepspeed.init_distributed() (zerostream.init_distributed()) before "
        f"building the model, or pass data_parallel_group= for a group of one on purpose."
    )


class Init(contextlib.ContextDecorator):
    """`with zero.Init(config_dict_or_path=ds_config): model = M()` (see the module doc)."""

    def __init__(
        self,
        module: Optional[torch.nn.Module] = None,
        data_parallel_group=None,
        mem_efficient_linear: bool = True,
        remote_device: Optional[str] = None,
        pin_memory: bool = False,
        config_dict_or_path=None,
        config=None,
        enabled: bool = True,
        dtype: Optional[torch.dtype] = None,
        mpu=None,
        **unsupported,
    ):
        self.enabled = enabled
        if not enabled:
            return
        if unsupported:
            raise NotImplementedError(
                f"zero.Init: arguments {sorted(unsupported)} are not supported by zerostream"
            )
        if config_dict_or_path is None:
            config_dict_or_path = config
        if not comm.is_initialized():
            comm.init_distributed()
        error = contradicting_single_rank_group(
            comm.get_world_size(data_parallel_group), data_parallel_group
        )
        if error is not None:
            raise RuntimeError(error)
        cfg = None
        if config_dict_or_path is not None:
            from ...config import load

            # The batch rule against the real data-parallel world: a config that gives all
            # three batch keys is consistent only with it (DeepSpeed's tests write such).
            world = comm.get_world_size(data_parallel_group)
            cfg = load(config_dict_or_path, world_size=world, require_batch=False, log=False)
        self.group = data_parallel_group
        self.dtype = self._dtype(cfg, dtype)
        zero = cfg.zero_optimization if cfg is not None else None
        offload = zero.offload_param if zero is not None else None
        if offload is None and remote_device in ("cpu", "nvme"):
            from ...config import OffloadParamConfig

            offload = OffloadParamConfig(remote_device, None, 5, 100_000_000, 10**9, pin_memory)
        self.override_apply = zero.override_module_apply if zero is not None else True
        from ...accelerator import bind_run_device

        device = bind_run_device(comm.get_local_rank())
        swapper = None
        if offload is not None and offload.device == "nvme":
            from ...offload.io_engine import io_config, io_config_for
            from .param_swap import ParamSwapper

            swapper = ParamSwapper(
                offload,
                io_config_for(cfg.aio) if cfg is not None else io_config(),
                rank=comm.get_rank(),
                verify_checksums=cfg.zerostream.verify_swap_checksums if cfg else False,
            )
        self.part = Partitioner(
            self.group,
            device,
            self.dtype,
            offload_param=offload,
            persistence_threshold=zero.stage3_param_persistence_threshold if zero else 0,
            model_persistence_threshold=(
                zero.stage3_model_persistence_threshold if zero else 2**63 - 1
            ),
            swapper=swapper,
            sanity_checks=zero.enable_sanity_checks if zero else False,
        )
        self.coord = ParamCoordinator(self.part, tracing=False)
        self._depth: Dict[int, int] = {}
        self._patched: List = []
        if module is not None:
            for m in reversed(list(module.modules())):
                self._post_init(m)

    @staticmethod
    def _dtype(cfg, dtype: Optional[torch.dtype]) -> torch.dtype:
        """The config's precision when no dtype is given (both fp16 and bf16 enabled is an
        error, as in DeepSpeed); else `dtype`; else, as DeepSpeed, fp16 where the accelerator
        supports it (GPUs; CPUs with AVX512-FP16), else bf16 where it does, else fp32."""
        if cfg is not None and dtype is None:
            if cfg.fp16.enabled and cfg.bf16.enabled:
                raise RuntimeError("zero.Init: fp16 and bf16 cannot both be enabled")
            return (
                torch.float16
                if cfg.fp16.enabled
                else (torch.bfloat16 if cfg.bf16.enabled else torch.float32)
            )
        if dtype is not None:
            if dtype not in (torch.float16, torch.bfloat16, torch.float32):
                raise ValueError(
                    f"zero.Init: dtype must be torch.float16, torch.bfloat16 or "
                    f"torch.float32; got {dtype}"
                )
            return dtype
        from ...accelerator import get_accelerator

        accel = get_accelerator()
        if accel.is_fp16_supported():
            return torch.float16
        return torch.bfloat16 if accel.is_bf16_supported() else torch.float32

    # --- construction hooks ----------------------------------------------------------------------
    def _post_init(self, module: torch.nn.Module) -> None:
        """Partitions the params `module` created and hooks it for on-demand gathers."""
        for name, p in list(module._parameters.items()):
            if p is not None and p.is_meta:
                # Built on "meta" (torch.nn.utils.skip_init): a meta tensor's data cannot be
                # replaced by a real one, so the param is; zeros, never NaN, until filled.
                real = torch.zeros(p.shape, dtype=p.dtype, device=self.part.device)
                module._parameters[name] = torch.nn.Parameter(real, p.requires_grad)
        fresh = [p for p in module._parameters.values() if p is not None]
        self.part.partition(fresh)
        state = ensure_state(module)
        if not state.init_hooks:
            state.init_hooks = hooks.install([module], self.coord)

    def _wrap_init(self, cls) -> None:
        if "__init__" not in cls.__dict__ or getattr(cls.__init__, "_zs_wrapped", False):
            return
        original = cls.__init__
        init = self

        @functools.wraps(original)
        def wrapped(module, *args, **kwargs):
            key = id(module)
            init._depth[key] = init._depth.get(key, 0) + 1
            try:
                original(module, *args, **kwargs)
            finally:
                init._depth[key] -= 1
            if init._depth[key] == 0:
                del init._depth[key]
                init._post_init(module)

        wrapped._zs_wrapped = True
        cls.__init__ = wrapped
        self._patched.append((cls, "__init__", original))

    def _apply_gathered(self, original):
        @functools.wraps(original)
        def apply(module, fn):
            def gathered_fn(m):
                with GatheredParameters(list(m._parameters.values()), modifier_rank=0):
                    fn(m)

            return original(module, gathered_fn)

        return apply

    def __enter__(self):
        if not self.enabled:
            return self
        for cls in [torch.nn.Module] + _all_subclasses(torch.nn.Module):
            self._wrap_init(cls)
        original_subclass = torch.nn.Module.__dict__.get("__init_subclass__")
        init = self

        def init_subclass(cls, **kwargs):
            super(torch.nn.Module, cls).__init_subclass__(**kwargs)
            init._wrap_init(cls)

        torch.nn.Module.__init_subclass__ = classmethod(init_subclass)
        self._patched.append((torch.nn.Module, "__init_subclass__", original_subclass))
        if self.override_apply:
            original_apply = torch.nn.Module.apply
            torch.nn.Module.apply = self._apply_gathered(original_apply)
            self._patched.append((torch.nn.Module, "apply", original_apply))
        return self

    def __exit__(self, *exc):
        if not self.enabled:
            return False
        for cls, name, original in reversed(self._patched):
            if original is None:
                delattr(cls, name)
            else:
                setattr(cls, name, original)
        self._patched.clear()
        _return_freed_host_memory()
        return False
