"""The inner optimizer: from the client (instance or callable) or from the config, with
DeepSpeed's rules (reference §1.5): "Adam" means AdamW unless adam_w_mode is false, untested
optimizers need zero_allow_untested_optimizer, and a client optimizer with offload needs
zero_force_ds_cpu_optimizer false."""

from __future__ import annotations

import inspect
from typing import Callable, List, Optional

import torch

from .config import DeepSpeedConfig
from .ops import muon


class ZeRORuntimeException(Exception):
    """DeepSpeed's exception for ZeRO setups that cannot run (same name, same meaning)."""


# Optimizers ZeRO is tested with (DeepSpeed's ZERO_SUPPORTED_OPTIMIZERS, torch side).
_SUPPORTED = (torch.optim.Adam, torch.optim.AdamW, torch.optim.Adagrad, muon.MuonWithAuxAdam)
_CPU_OPTIMIZER_NAMES = ("DeepSpeedCPUAdam", "DeepSpeedCPUAdagrad", "DeepSpeedCPULion")
_UNIMPLEMENTED = (
    "lamb",
    "onebitadam",
    "zerooneadam",
    "onebitlamb",
    "muadam",
    "muadamw",
    "musgd",
)


def param_groups_of(model: torch.nn.Module, model_parameters) -> List[dict]:
    """Trainable param groups from `model_parameters` (tensors or group dicts) or the model."""
    source = model.parameters() if model_parameters is None else model_parameters
    items = list(source)
    if items and isinstance(items[0], dict):
        groups = [dict(g, params=[p for p in g["params"] if p.requires_grad]) for g in items]
    else:
        groups = [{"params": [p for p in items if p.requires_grad]}]
    seen = {}
    names = {id(p): n for n, p in model.named_parameters()}
    for gi, g in enumerate(groups):
        for p in g["params"]:
            if id(p) in seen:
                raise ValueError(
                    f"Parameter with name: {names.get(id(p), '?')} occurs multiple "
                    f"times in optimizer.param_groups (groups {seen[id(p)]} and {gi})"
                )
            seen[id(p)] = gi
    return [g for g in groups if g["params"]]


def _offloaded(cfg: DeepSpeedConfig) -> bool:
    return cfg.zero_optimization.offload_optimizer_device in ("cpu", "nvme")


class UntestedOptimizerError(ValueError, AssertionError):
    """A client optimizer DeepSpeed has not tested with ZeRO, without
    zero_allow_untested_optimizer (an AssertionError too, as DeepSpeed asserts it)."""


def check_client_optimizer(opt, cfg: DeepSpeedConfig) -> None:
    cls = type(opt)
    is_cpu_opt = cls.__name__ in _CPU_OPTIMIZER_NAMES
    if _offloaded(cfg) and not is_cpu_opt and cfg.zero_force_ds_cpu_optimizer:
        raise ZeRORuntimeException(
            "You are using ZeRO-Offload with a client provided optimizer "
            f"({cls.__name__}) which in most cases will yield poor performance. Please either "
            "use deepspeed.ops.adam.DeepSpeedCPUAdam or set an optimizer in your ds-config "
            "(https://www.deepspeed.ai/docs/config-json/#optimizer-parameters). If you really "
            "want to use a custom optimizer w. ZeRO-Offload and understand the performance "
            'impacts you can also set <"zero_force_ds_cpu_optimizer": false> in your '
            "configuration file."
        )
    if (
        cfg.zero_stage > 0
        and not (isinstance(opt, _SUPPORTED) or is_cpu_opt)
        and not cfg.zero_allow_untested_optimizer
    ):
        raise UntestedOptimizerError(
            f"You are using an untested ZeRO Optimizer ({cls.__name__}). Please add "
            '<"zero_allow_untested_optimizer": true> in the configuration file to use it.'
        )


def _from_config(cfg: DeepSpeedConfig) -> Callable[[List[dict]], torch.optim.Optimizer]:
    opt = cfg.optimizer
    low, params = opt.name, opt.params
    if low in _UNIMPLEMENTED:
        raise NotImplementedError(
            f'optimizer.type: "{opt.type}" is a DeepSpeed optimizer '
            f"that zerostream does not implement; pass your own optimizer "
            f"to initialize() or use Adam, AdamW, Adagrad, Lion or SGD"
        )
    offloaded = _offloaded(cfg) and cfg.zero_stage > 0
    threads = cfg.zerostream.cpu_optimizer_threads or None
    if low in ("adam", "adamw"):
        if params["amsgrad"]:
            raise NotImplementedError("optimizer.params.amsgrad: true is not supported")
        adamw = opt.adamw_mode
        if offloaded and not params["torch_adam"]:
            from .ops.adam import DeepSpeedCPUAdam  # the fused CPU kernel

            kwargs = opt.kwargs("lr", "betas", "eps", "weight_decay", "bias_correction")
            return lambda groups: DeepSpeedCPUAdam(
                groups, adamw_mode=adamw, threads=threads, **kwargs
            )
        kwargs = opt.kwargs("lr", "betas", "eps", "weight_decay")
        if not params["torch_adam"]:
            # DeepSpeed's default is its FusedAdam (one kernel pass over params, gradients
            # and moments); torch's fused implementation is that pass. Torch's default, the
            # foreach one, makes about eight passes over the fp32 state: on a GPU that was
            # most of the gap between no-offload ZeRO and plain torch (benchmarks/step.md).
            from .ops.fused_adam import FusedAdam

            return lambda groups: FusedAdam(groups, adam_w_mode=adamw, **kwargs)
        cls = torch.optim.AdamW if adamw else torch.optim.Adam
        return lambda groups: cls(groups, **kwargs)
    if low == "adagrad":
        if offloaded:
            from .ops.adagrad import DeepSpeedCPUAdagrad

            kwargs = opt.kwargs("lr", "eps", "weight_decay")
            return lambda groups: DeepSpeedCPUAdagrad(groups, threads=threads, **kwargs)
        kwargs = opt.kwargs("lr", "eps", "weight_decay", "lr_decay", "initial_accumulator_value")
        return lambda groups: torch.optim.Adagrad(groups, **kwargs)
    if low == "muon":
        settings = dict(params)

        def build_muon(groups):
            # ZeRO's flat groups carry use_muon from muon_groups(); a bare list (the
            # config check's dummy parameter) is split here.
            if not all("use_muon" in g for g in groups):
                groups = muon.config_groups(groups, settings)
            return muon.MuonWithAuxAdam(groups)

        return build_muon
    if low == "lion":
        kwargs = opt.kwargs("lr", "betas", "weight_decay")
        if not offloaded:  # the masters on the params' device: DeepSpeed's FusedLion
            from .ops.lion import FusedLion

            return lambda groups: FusedLion(groups, **kwargs)
        from .ops.lion import DeepSpeedCPULion  # the CPU kernels (ops issue)

        return lambda groups: DeepSpeedCPULion(groups, threads=threads, **kwargs)
    cls = getattr(torch.optim, opt.type, None)
    if cls is None:
        raise ValueError(
            f"optimizer.type: {opt.type!r} is not a DeepSpeed optimizer or a torch.optim class"
        )
    kwargs = {k: v for k, v in params.items() if v is not None and k != "max_grad_norm"}
    return lambda groups: cls(groups, **kwargs)


def muon_groups(
    client: Optional[object], cfg: DeepSpeedConfig, model: torch.nn.Module, groups: List[dict]
) -> List[dict]:
    """`groups` as the config's optimizer trains them: with "Muon" (and no client optimizer),
    the params flagged by DeepSpeed's rule and split into a Muon group and an AdamW group
    (ops/muon.py), so each ZeRO flat group is one kind; otherwise unchanged."""
    if client is not None or cfg.optimizer is None or cfg.optimizer.name != "muon":
        return groups
    refuse_swapped_muon(cfg)
    muon.mark_params(model)
    return muon.config_groups(groups, dict(cfg.optimizer.params))


def refuse_swapped_muon(cfg: DeepSpeedConfig) -> None:
    """Muon where the optimizer state is stepped sub-group by sub-group across tiers (the
    swapped optimizer, offload/optimizer_swap.py, steps Adam's state only) is refused by
    name."""
    zero = cfg.zero_optimization
    if cfg.zero_stage > 0 and zero.offload_optimizer_device == "nvme":
        raise NotImplementedError(
            'optimizer "Muon" with zero_optimization.offload_optimizer.device "nvme" is not '
            'implemented (the swapped optimizer state is Adam\'s); use "cpu" or "none"'
        )
    if cfg.zero_stage > 0 and zero.offload_optimizer_device == "cpu":
        if zero.offload_optimizer.ratio < 1.0:
            raise NotImplementedError(
                f'optimizer "Muon" with zero_optimization.offload_optimizer.ratio '
                f"{zero.offload_optimizer.ratio} is not implemented (the device tier steps "
                "Adam's state); leave ratio at 1"
            )


def optimizer_maker(
    client: Optional[object], cfg: DeepSpeedConfig, groups: List[dict]
) -> Optional[Callable[[List[dict]], torch.optim.Optimizer]]:
    """A function building the inner optimizer over (master) param groups, or None when the
    run has no optimizer. Client optimizers are rebuilt with their own class and settings over
    the groups ZeRO gives them, as DeepSpeed rebinds them to its flat partitions."""
    if client is not None:
        if isinstance(client, torch.optim.Optimizer):
            check_client_optimizer(client, cfg)
            cls, defaults = type(client), _constructor_kwargs(type(client), client.defaults)
            # Settings a constructor takes but param groups do not carry (DeepSpeedCPUAdam's
            # adamw_mode, fp32_optimizer_states, threads): lost in a rebuild otherwise.
            defaults.update(getattr(client, "rebuild_kwargs", dict)())
            own = [id(p) for g in client.param_groups for p in g["params"]]

            def rebind(inner):
                # Over the model's own params (stage 0, fp32) the client's object is used as
                # is, keeping its state; over ZeRO's partitions it is rebuilt like it.
                if [id(p) for g in inner for p in g["params"]] == own:
                    return client
                return cls(inner, **defaults)

            return rebind
        if callable(client):

            def build(inner, _make=client):
                opt = _make(inner)
                check_client_optimizer(opt, cfg)
                return opt

            return build
        raise ValueError(
            f"optimizer: expected a torch.optim.Optimizer or a callable "
            f"params -> optimizer; got {type(client).__name__}"
        )
    if cfg.optimizer is None:
        return None
    return _from_config(cfg)


def _constructor_kwargs(cls: type, defaults: dict) -> dict:
    """The client's settings its constructor takes back. `defaults` can hold more than the
    constructor accepts (torch's AdamW records decoupled_weight_decay=True, which
    AdamW.__init__ does not take); the extra keys still reach the rebuilt optimizer through
    the param groups, which carry every key of the client's groups."""
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):  # a C-implemented or odd constructor: pass them all
        return dict(defaults)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(defaults)
    return {k: v for k, v in defaults.items() if k in params}


def client_groups(client, groups: List[dict]) -> List[dict]:
    """The param groups to train: a client optimizer instance brings its own (with options),
    less its frozen params (requires_grad False), as DeepSpeed trains only the trainable
    ones of each group."""
    if isinstance(client, torch.optim.Optimizer):
        return [
            dict(g, params=[p for p in g["params"] if p.requires_grad])
            for g in client.param_groups
            if g["params"]
        ]
    return groups
