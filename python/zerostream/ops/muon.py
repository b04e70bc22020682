"""Muon (MomentUm Orthogonalized by Newton-Schulz) with an AdamW side for the parameters that
are not matrices: DeepSpeed's `optimizer.type: "Muon"` (its MuonWithAuxAdam, after Keller
Jordan's reference, https://kellerjordan.github.io/posts/muon/).

A group with `use_muon` True steps each matrix W with gradient G as

    M <- beta M + (1 - beta) G                      (momentum, kept per element)
    U <- (1 - beta) G + beta M  if nesterov else M
    O <- NS5(U) * max(1, rows / cols) ** 0.5        (Newton-Schulz, Note [Newton-Schulz])
    W <- W (1 - lr wd) - lr O

and a group with `use_muon` False is AdamW with bias correction (DeepSpeed's aux Adam:
betas (0.9, 0.95), eps 1e-10 by default).

Note [Muon needs the whole matrix]: momentum and the Nesterov mix are elementwise, but the
orthogonalisation is not: it needs every element of U. Over a ZeRO partition the
optimizer holds a flat slice that may cut matrices anywhere, so the partition's U is
all-gathered (`PartitionedMatrices.gather`), each matrix that overlaps the partition is
orthogonalised whole and the partition keeps its own piece of O (at stage 3 the partition
is the concatenated shards of its matrices, each cut into equal pieces over the ranks; the
same gather reassembles them). Every rank thus applies
what single-process Muon applies to the averaged gradient, while the momentum stays
partitioned (1/N of it per rank).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

import torch

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_EPS = 1e-7
NS_METHODS = ("gram", "standard")

# DeepSpeed's group defaults (MuonWithAuxAdam): what a group that does not set a key gets.
MUON_DEFAULTS = {
    "lr": 0.02,
    "momentum": 0.95,
    "weight_decay": 0.0,
    "ns_method": "gram",
    "ns_steps": 5,
    "nesterov": True,
}
ADAM_DEFAULTS = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-10, "weight_decay": 0.0}

# optimizer.params keys of "Muon" and the group each reaches. DeepSpeed's engine reads the
# first eight (muon_lr / adam_lr override lr for their side); ns_steps and nesterov are
# zerostream's (DeepSpeed always runs 5 Nesterov steps, its defaults here).
MUON_KEYS = ("lr", "momentum", "weight_decay", "ns_method", "ns_steps", "nesterov")
ADAM_KEYS = ("lr", "betas", "eps", "weight_decay")
CONFIG_KEYS = tuple(sorted(set(MUON_KEYS) | set(ADAM_KEYS) | {"muon_lr", "adam_lr"}))


# Note [Newton-Schulz]: a quintic iteration X <- a X + (b A + c A^2) X with A = X X^T pushes
# every singular value of X (normalised to spectral norm <= 1 by the Frobenius norm) towards
# ~1, giving roughly U V^T of the SVD. It runs on the wide orientation (rows <= cols) so A is
# the smaller Gram matrix. "gram" iterates on R = X X^T alone and applies the accumulated
# polynomial Q to X at the end (restarting once, at step 2, from the exact R of Q X, as
# DeepSpeed does); in exact arithmetic both give the same X. zerostream computes in fp32 on
# every device (DeepSpeed uses bf16 / fp16 where the accelerator has them).
def _standard(x: torch.Tensor, steps: int) -> torch.Tensor:
    a, b, c = NS_COEFFICIENTS
    for _ in range(steps):
        g = x @ x.mT
        x = a * x + (b * g + c * g @ g) @ x
    return x


def _gram(x: torch.Tensor, steps: int, restart: int = 2) -> torch.Tensor:
    a, b, c = NS_COEFFICIENTS
    if x.size(-2) == x.size(-1):
        return _standard(x, steps)  # a square X gains nothing from iterating on X X^T
    eye = torch.eye(x.size(-2), dtype=x.dtype, device=x.device)
    r = x @ x.mT
    q = None
    for i in range(steps):
        if i == restart and q is not None:
            x = q @ x
            r = x @ x.mT
            q = None
        p = a * eye + b * r + c * r @ r  # this step's polynomial: X_{i+1} = p X_i
        q = p if q is None else p @ q
        if i < steps - 1 and i + 1 != restart:
            r = p @ r @ p  # p commutes with r: X_{i+1} X_{i+1}^T
    return q @ x if q is not None else x


def orthogonalize(u: torch.Tensor, steps: int = 5, method: str = "gram") -> torch.Tensor:
    """NS5(u) over the last two dimensions, in fp32 (Note [Newton-Schulz])."""
    x = u.float()
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + NS_EPS)
    x = (_gram if method == "gram" else _standard)(x, steps)
    return x.mT if tall else x


def muon_direction(u: torch.Tensor, steps: int, method: str) -> torch.Tensor:
    """O of one parameter's U: orthogonalised and scaled by max(1, rows/cols)**0.5, in U's
    shape. A 4-D (convolution) U is orthogonalised as (out, in*kh*kw); the scale still
    reads U's last two sizes, as the reference does."""
    m = u.reshape(len(u), -1) if u.ndim == 4 else u
    o = orthogonalize(m, steps, method)
    return (o * max(1.0, u.size(-2) / u.size(-1)) ** 0.5).reshape(u.shape)


@dataclass(frozen=True)
class MatrixPiece:
    """The elements [lo, hi) of a (flattened) matrix of `shape` that a partition holds,
    starting at element `local` of the partition."""

    shape: torch.Size
    local: int
    lo: int
    hi: int


@dataclass(frozen=True)
class PartitionedMatrices:
    """A ZeRO partition of a group of matrices (Note [Muon needs the whole matrix]): the
    pieces it holds and `gather`, the collective (every rank calls it, in group order) that
    turns every rank's partition of a tensor into the whole flattened matrix of each piece,
    in the order of `pieces`."""

    pieces: Tuple[MatrixPiece, ...]
    gather: Callable[[torch.Tensor], List[torch.Tensor]]


def check_options(options: dict, where: str) -> None:
    """ValueError naming `where`.<key> for an option out of its range."""
    for key in ("lr", "weight_decay", "eps"):
        if key in options and not float(options[key]) >= 0:
            raise ValueError(f"{where}.{key}: expected a number >= 0; got {options[key]!r}")
    if "momentum" in options and not 0.0 <= float(options["momentum"]) < 1.0:
        raise ValueError(
            f"{where}.momentum: expected 0 <= momentum < 1; got {options['momentum']!r}"
        )
    if "ns_method" in options and options["ns_method"] not in NS_METHODS:
        raise ValueError(
            f"{where}.ns_method: expected one of {', '.join(NS_METHODS)}; "
            f"got {options['ns_method']!r}"
        )
    steps = options.get("ns_steps", 5)
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps < 100:
        raise ValueError(f"{where}.ns_steps: expected an integer in [1, 100); got {steps!r}")
    if "nesterov" in options and not isinstance(options["nesterov"], bool):
        raise ValueError(f"{where}.nesterov: expected true or false; got {options['nesterov']!r}")
    betas = options.get("betas", (0.9, 0.95))
    if len(betas) != 2 or not all(0.0 <= float(b) < 1.0 for b in betas):
        raise ValueError(f"{where}.betas: expected two numbers in [0, 1); got {betas!r}")


class MuonWithAuxAdam(torch.optim.Optimizer):
    """Muon for the groups with `use_muon` True, AdamW for the others. Every group must say
    which it is (DeepSpeed's rule); missing options take MUON_DEFAULTS / ADAM_DEFAULTS."""

    def __init__(self, param_groups):
        groups = []
        for i, group in enumerate(param_groups):
            if not isinstance(group, dict) or "use_muon" not in group:
                raise ValueError(
                    f"MuonWithAuxAdam: param group {i} has no 'use_muon' key; give every "
                    "group use_muon=True (matrices) or False (the AdamW side)"
                )
            defaults = MUON_DEFAULTS if group["use_muon"] else ADAM_DEFAULTS
            group = {**defaults, **group}
            check_options(group, f"param group {i}")
            groups.append(group)
        super().__init__(groups, {})
        self._partitions: Dict[int, PartitionedMatrices] = {}

    def bind_partitions(self, tensor: torch.Tensor, layout: PartitionedMatrices) -> None:
        """`tensor` (a Muon group's parameter) is a flat ZeRO partition laid out as `layout`."""
        self._partitions[id(tensor)] = layout

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if group["use_muon"]:
                    self._muon_step(p, group)
                else:
                    self._adam_step(p, group)
        return loss

    def _grad(self, p: torch.Tensor) -> torch.Tensor:
        # A missing gradient counts as zero (DeepSpeed's too); in a partition every rank must
        # still join the gather.
        return p.grad if p.grad is not None else torch.zeros_like(p)

    def _muon_step(self, p: torch.Tensor, group: dict) -> None:
        grad = self._grad(p).to(p.dtype)
        state = self.state[p]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p)
        buf = state["momentum_buffer"]
        beta = group["momentum"]
        buf.lerp_(grad, 1 - beta)
        u = grad.lerp(buf, beta) if group["nesterov"] else buf
        layout = self._partitions.get(id(p))
        if layout is not None:
            o = self._partitioned_direction(u, layout, group)
        elif p.ndim >= 2:
            o = muon_direction(u, group["ns_steps"], group["ns_method"])
        else:
            raise ValueError(
                f"Muon: a use_muon parameter of shape {tuple(p.shape)} is not a matrix "
                "(Muon orthogonalises matrices; give it use_muon=False for the AdamW side)"
            )
        p.mul_(1 - group["lr"] * group["weight_decay"])
        p.add_(o.to(p.dtype), alpha=-group["lr"])

    def _partitioned_direction(
        self, u: torch.Tensor, layout: PartitionedMatrices, group: dict
    ) -> torch.Tensor:
        """This partition's slice of O (Note [Muon needs the whole matrix])."""
        out = torch.zeros_like(u)
        for piece, whole in zip(layout.pieces, layout.gather(u)):
            numel = math.prod(piece.shape)
            o = muon_direction(
                whole[:numel].view(piece.shape), group["ns_steps"], group["ns_method"]
            )
            n = piece.hi - piece.lo
            out[piece.local : piece.local + n].copy_(o.reshape(-1)[piece.lo : piece.hi])
        return out

    def _adam_step(self, p: torch.Tensor, group: dict) -> None:
        grad = self._grad(p)
        state = self.state[p]
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
            state["step"] = 0
        state["step"] += 1
        b1, b2 = group["betas"]
        m, v, t = state["exp_avg"], state["exp_avg_sq"], state["step"]
        m.lerp_(grad, 1 - b1)
        v.lerp_(grad.square(), 1 - b2)
        update = (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + group["eps"])
        p.mul_(1 - group["lr"] * group["weight_decay"])
        p.add_(update, alpha=-group["lr"])


def mark_params(model: torch.nn.Module) -> None:
    """DeepSpeed's rule for `use_muon` when the config names Muon: matrices (ndim >= 2) whose
    name mentions neither "embed" nor "lm_head" use Muon, everything else the AdamW side. It
    overwrites a flag the model set, as DeepSpeed's initialize() does."""
    for name, p in model.named_parameters():
        low = name.lower()
        # DeepSpeed's public flag, which models and their tests set and read on the param.
        p.use_muon = p.ndim >= 2 and "embed" not in low and "lm_head" not in low  # type: ignore[attr-defined]


def config_groups(groups: List[dict], params: dict) -> List[dict]:
    """The trainable params of `groups` in (at most) two groups as DeepSpeed's engine makes
    them: use_muon ones with the Muon options of `params` (optimizer.params), the rest with
    the AdamW ones. A param without a use_muon flag is Muon's when it is a matrix."""
    unknown = sorted(set(params) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(
            f"optimizer.params.{unknown[0]}: not a Muon parameter; Muon takes "
            f"{', '.join(CONFIG_KEYS)}"
        )
    check_options(params, "optimizer.params")
    flat = [p for g in groups for p in g["params"] if p.requires_grad]
    muon = [p for p in flat if getattr(p, "use_muon", p.ndim >= 2)]
    adam = [p for p in flat if not getattr(p, "use_muon", p.ndim >= 2)]
    for p in muon:
        if p.ndim < 2:
            raise ValueError(
                f"Muon: a parameter of shape {tuple(p.shape)} has use_muon True but is not a "
                "matrix; Muon orthogonalises matrices (set use_muon False for it)"
            )
    out = []
    if muon:
        opts = {k: params[k] for k in MUON_KEYS if k in params}
        if "muon_lr" in params:
            opts["lr"] = params["muon_lr"]
        out.append({"params": muon, "use_muon": True, "name": "muon-params", **opts})
    if adam:
        opts = {k: params[k] for k in ADAM_KEYS if k in params}
        if "betas" in opts:
            opts["betas"] = tuple(opts["betas"])
        if "adam_lr" in params:
            opts["lr"] = params["adam_lr"]
        out.append({"params": adam, "use_muon": False, "name": "adam-params", **opts})
    return out
