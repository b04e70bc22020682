"""`deepspeed.runtime.zero.muon.original_muon`: the Muon update of one parameter by
DeepSpeed's signature, over zerostream's Newton-Schulz (`zerostream.ops.muon`)."""

import torch

from zerostream.ops.muon import NS_METHODS, MuonWithAuxAdam, muon_direction, orthogonalize

__all__ = ["NS_METHODS", "MuonWithAuxAdam", "muon_update", "zeropower_via_newtonschulz5"]


def muon_update(
    grad: torch.Tensor,
    momentum: torch.Tensor,
    beta: float = 0.95,
    ns_steps: int = 5,
    nesterov: bool = True,
    ns_method: str = "gram",
    is_expert_group: bool = False,
) -> torch.Tensor:
    """The orthogonalised update of `grad` in `grad`'s dtype. As DeepSpeed's, it updates
    `momentum` in place and, with nesterov, overwrites `grad` with the Nesterov mix. An
    expert group's 3-D tensor is orthogonalised matrix by matrix (zerostream's Newton-Schulz
    is batched over leading dimensions either way)."""
    if ns_method not in NS_METHODS:
        raise ValueError(f"ns_method: expected one of {', '.join(NS_METHODS)}; got {ns_method!r}")
    momentum.lerp_(grad, 1 - beta)
    update = grad.lerp_(momentum, beta) if nesterov else momentum
    return muon_direction(update, ns_steps, ns_method).to(grad.dtype)


def zeropower_via_newtonschulz5(G: torch.Tensor, steps: int) -> torch.Tensor:
    """Newton-Schulz orthogonalisation of the last two dimensions of G (fp32)."""
    return orthogonalize(G, steps, "standard")
