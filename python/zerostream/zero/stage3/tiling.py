"""`TiledLinear` (DeepSpeed's `deepspeed.zero.TiledLinear`): one linear layer built as a grid of
smaller ones, so that ZeRO-3 gathers one tile's weights at a time.

A layer of `out_features x in_features` weights is cut into `out_splits` row blocks and
`in_splits` column blocks (the cuts of `uniform_cuts`, the first blocks one wider when the
size does not divide). Tile (r, c) is a `linear_cls(in block c, out block r)` module of its
own; under stage 3 each tile is a module whose parameters are gathered just before it runs
and released after, so the layer never needs its whole weight in device memory. The bias of
row block r lives in its last column tile (in_id = in_splits - 1), as in DeepSpeed.

forward: the input's last dimension is split by the column cuts; row block r's output is the
sum of its tiles' outputs, in column order; the row blocks are concatenated along the last
dimension (or returned as a list with combine_out_splits=False). The sum over tiles rounds
differently from one matrix product: equal to `nn.Linear` within floating-point tolerance.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch


def uniform_cuts(items: int, parts: int) -> List[int]:
    """parts + 1 boundaries splitting `items` into `parts` contiguous blocks whose sizes
    differ by at most one, the larger first (DeepSpeed's partition_uniform)."""
    if items <= parts:
        return [min(p, items) for p in range(parts + 1)]
    size, extra = divmod(items, parts)
    return [p * size + min(p, extra) for p in range(parts + 1)]


class TiledLinear(torch.nn.Module):
    """A drop-in for `torch.nn.Linear(in_features, out_features, bias)` made of
    `out_splits x in_splits` tiles (`self.linears[out_id][in_id]`)."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        in_splits: int = 1,
        out_splits: int = 1,
        input_is_already_split: bool = False,
        combine_out_splits: bool = True,
        linear_cls=torch.nn.Linear,
        init_linear: Optional[torch.nn.Module] = None,
        **kwargs,
    ):
        super().__init__()
        for name, splits, features in (
            ("in_splits", in_splits, in_features),
            ("out_splits", out_splits, out_features),
        ):
            if not 1 <= splits <= features:
                raise RuntimeError(
                    f"TiledLinear: {name}={splits} must be in [1, {features}] (the layer's "
                    f"{'input' if name == 'in_splits' else 'output'} features)"
                )
        self.in_features, self.out_features = in_features, out_features
        self.use_bias = bias
        self.in_splits, self.out_splits = in_splits, out_splits
        self.input_is_already_split = input_is_already_split
        self.combine_out_splits = combine_out_splits
        self.in_parts = uniform_cuts(in_features, in_splits)
        self.out_parts = uniform_cuts(out_features, out_splits)
        self.linears = torch.nn.ModuleList()
        for r in range(out_splits):
            row = torch.nn.ModuleList()
            rows = self.out_parts[r + 1] - self.out_parts[r]
            for c in range(in_splits):
                cols = self.in_parts[c + 1] - self.in_parts[c]
                row.append(linear_cls(cols, rows, bias=bias and c == in_splits - 1, **kwargs))
            self.linears.append(row)
        if init_linear is not None:
            self.copy_params_from(init_linear)

    def forward(self, input_):
        if self.in_splits == 1:
            inputs: Sequence = [input_]
        elif self.input_is_already_split:
            if len(input_) != self.in_splits:
                raise ValueError(
                    f"TiledLinear: the input comes in {len(input_)} pieces, in_splits is "
                    f"{self.in_splits}"
                )
            inputs = input_
        else:
            cuts = uniform_cuts(input_.shape[-1], self.in_splits)
            sizes = [cuts[i + 1] - cuts[i] for i in range(self.in_splits)]
            inputs = self._split_global_input(input_, sizes)
        outputs = []
        for r in range(self.out_splits):
            acc = None
            for c in range(self.in_splits):
                acc = self._reduce_local_output(c, r, acc, self._tile(r, c)(inputs[c]))
            outputs.append(acc)
        return self._combine_output_splits(outputs) if self.combine_out_splits else outputs

    def _tile(self, r: int, c: int) -> Any:  # a linear_cls module
        row = self.linears[r]
        assert isinstance(row, torch.nn.ModuleList)  # built so in __init__
        return row[c]

    def _split_global_input(self, input_, split_sizes: List[int]):
        """The input cut along its last dimension into the column blocks (a subclass taking
        another input type overrides this)."""
        return torch.split(input_, split_sizes, dim=-1)

    def _reduce_local_output(self, in_id: int, out_id: int, current_out, new_out):
        """Row block out_id's running sum with tile (out_id, in_id)'s output."""
        return new_out.clone() if current_out is None else current_out + new_out

    def _combine_output_splits(self, outputs: list):
        return torch.cat(outputs, dim=-1)

    @torch.no_grad()
    def copy_params_from(self, other: torch.nn.Module) -> None:
        """Copies `other`'s weight (and bias) into the tiles. Under ZeRO-3 it is a
        collective: every rank calls it, rank 0's values are kept (GatheredParameters with
        modifier_rank 0); a partitioned `other` is gathered for it."""
        from .gathered import GatheredParameters

        # A source built under zero.Init is partitioned: read whole for the copy.
        with GatheredParameters(list(other.parameters(recurse=False))):
            self._copy_from(other)

    def _copy_from(self, other: torch.nn.Module) -> None:
        from .gathered import GatheredParameters

        weight: Optional[torch.Tensor] = getattr(other, "weight", None)
        if weight is None or tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(
                f"TiledLinear.copy_params_from: expected a weight of shape "
                f"({self.out_features}, {self.in_features}), got "
                f"{None if weight is None else tuple(weight.shape)}"
            )
        other_bias: Optional[torch.Tensor] = getattr(other, "bias", None)
        if self.use_bias != (other_bias is not None):
            raise ValueError(
                f"TiledLinear.copy_params_from: this layer has bias={self.use_bias}, the "
                f"source {'has' if other_bias is not None else 'has no'} bias"
            )
        if other_bias is not None and tuple(other_bias.shape) != (self.out_features,):
            raise ValueError(
                f"TiledLinear.copy_params_from: expected a bias of shape ({self.out_features},), "
                f"got {tuple(other_bias.shape)}"
            )
        for r in range(self.out_splits):
            r0, r1 = self.out_parts[r], self.out_parts[r + 1]
            for c in range(self.in_splits):
                c0, c1 = self.in_parts[c], self.in_parts[c + 1]
                tile = self._tile(r, c)
                with GatheredParameters(tile.weight, modifier_rank=0):
                    tile.weight.copy_(weight[r0:r1, c0:c1])
                if tile.bias is not None and other_bias is not None:
                    with GatheredParameters(tile.bias, modifier_rank=0):
                        tile.bias.copy_(other_bias[r0:r1])


class TiledLinearReturnBias(TiledLinear):
    """TiledLinear over tiles that return `(output, bias)` (Megatron-LM's linear layers, which
    leave the bias addition to a later fused kernel): the outputs are summed over tiles, the
    bias taken from the tile that has it; returns `(output, bias)`, bias None without one."""

    def _reduce_local_output(self, in_id, out_id, current_out, new_out):
        out, bias = new_out
        if current_out is None:
            return out.clone(), bias
        running, running_bias = current_out
        return running + out, bias if bias is not None else running_bias

    def _combine_output_splits(self, outputs: list):
        tensors = [o for o, _ in outputs]
        biases = [b for _, b in outputs]
        bias = None if any(b is None for b in biases) else torch.cat(biases, dim=-1)
        return torch.cat(tensors, dim=-1), bias
