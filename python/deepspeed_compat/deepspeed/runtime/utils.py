"""`deepspeed.runtime.utils`: helpers scripts import from DeepSpeed's runtime."""

from __future__ import annotations

from typing import Any

import torch


def move_to_device(item: Any, device, criterion_func=None) -> Any:
    """`item` with every tensor inside dicts, lists and tuples moved to `device` (only those
    for which `criterion_func(tensor)` is true, when given)."""
    if torch.is_tensor(item):
        if criterion_func is None or criterion_func(item):
            return item.to(device)
        return item
    if isinstance(item, dict):
        return type(item)((k, move_to_device(v, device, criterion_func)) for k, v in item.items())
    if isinstance(item, (list, tuple)):
        moved = [move_to_device(v, device, criterion_func) for v in item]
        return type(item)(*moved) if hasattr(item, "_fields") else type(item)(moved)
    return item


def see_memory_usage(message: str, force: bool = False) -> None:
    """Prints `message`, the accelerator's allocated bytes and the host's used memory, on
    rank 0 and only with `force` (DeepSpeed's contract: callers leave it in code and turn it
    on by hand)."""
    import gc

    import psutil

    from zerostream import comm
    from zerostream.accelerator import get_accelerator

    if not force or (comm.is_initialized() and comm.get_rank() != 0):
        return
    gc.collect()
    gib = 1024**3
    vm = psutil.virtual_memory()
    print(message)
    print(f"MA {get_accelerator().memory_allocated() / gib:.2f} GB")
    used = (vm.total - vm.available) / gib
    print(f"CPU Virtual Memory:  used = {used:.2f} GB, percent = {vm.percent}%")


def call_to_str(base: str, *args, **kwargs) -> str:
    """`base(arg, ..., key=value, ...)` with each value's repr (DeepSpeed's helper)."""
    parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return f"{base}({', '.join(parts)})"


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2, mpu=None):
    """Clips the gradients of `parameters` in place to a total norm of at most `max_norm`;
    returns the total norm before clipping. With `mpu` (model parallelism) refused by name:
    zerostream has no model-parallel groups."""
    if mpu is not None:
        raise NotImplementedError(
            "deepspeed.runtime.utils.clip_grad_norm_(mpu=...): zerostream has no model "
            "parallelism; call it without mpu"
        )
    return torch.nn.utils.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)


def prefix_sum_inc(weights) -> list:
    """Inclusive prefix sums: [3, 4, 5] -> [3, 7, 12]."""
    out, total = [], 0
    for w in weights:
        total += w
        out.append(total)
    return out


def partition_uniform(num_items: int, num_parts: int) -> list:
    """`num_parts + 1` boundaries splitting `num_items` items as evenly as counts allow (the
    first parts take the remainder); with no more items than parts, one item a part and
    empty parts at the end."""
    if num_items <= num_parts:
        return [min(p, num_items) for p in range(num_parts + 1)]
    size, extra = divmod(num_items, num_parts)
    bounds = [0]
    for p in range(num_parts):
        bounds.append(bounds[-1] + size + (1 if p < extra else 0))
    return bounds


def partition_balanced(weights, num_parts: int) -> list:
    """`num_parts + 1` boundaries cutting `weights` into `num_parts` contiguous, non-empty
    parts whose sums differ as little as the search finds (DeepSpeed's rule: the linear
    partition problem, by dynamic programming over (items, parts) keeping each state's
    heaviest and lightest part). With no more items than parts: partition_uniform."""
    n, m = len(weights), num_parts
    if n <= m:
        return partition_uniform(n, m)
    prefix = [0] + prefix_sum_inc(weights)
    inf = float("inf")
    # state[i][j]: (spread, heaviest, lightest, where part j starts) for i items in j parts.
    state = [[(inf, 0.0, 0.0, 0)] * (m + 1) for _ in range(n + 1)]
    state[0][0] = (0.0, -inf, inf, 0)
    for i in range(1, n + 1):
        for j in range(1, min(i, m) + 1):
            best = state[i][j]
            for k in range(j - 1, i):
                prev = state[k][j - 1]
                if prev[0] == inf:
                    continue
                part = prefix[i] - prefix[k]
                hi, lo = max(prev[1], part), min(prev[2], part)
                if hi - lo <= best[0]:  # ties: the later cut
                    best = (hi - lo, hi, lo, k)
            state[i][j] = best
    bounds, i = [n], n
    for j in range(m, 0, -1):
        i = state[i][j][3]
        bounds.append(i)
    return bounds[::-1]


class PartitionedTensor:
    """DeepSpeed's PartitionedTensor: each rank of `group` keeps its piece of a flattened
    tensor (partition_uniform's cut of its elements); `full()` gathers the pieces back into
    the original shape. `to_meta()` is DeepSpeed's long tensor [ndims, *size, parts, rank,
    *boundaries], which `from_meta` reads beside a rank's own piece."""

    def __init__(self, tensor: torch.Tensor, group, partition_meta=None):
        from zerostream import comm

        self.group = group
        self.num_parts = comm.get_world_size(group)
        self.rank = comm.get_rank(group)
        self.orig_size = list(tensor.size())
        self.orig_device = tensor.device
        self.partition = partition_uniform(tensor.numel(), self.num_parts)
        start, end = self.partition[self.rank], self.partition[self.rank + 1]
        self.local_data = tensor.detach().reshape(-1)[start:end].clone()

    @classmethod
    def from_meta(cls, meta: torch.Tensor, local_part: torch.Tensor, group, device=None):
        from zerostream import comm

        if meta.dtype != torch.long:
            raise ValueError(
                f"PartitionedTensor.from_meta: meta must be torch.long; got {meta.dtype}"
            )
        values = meta.tolist()
        ndims = values[0]
        obj = cls.__new__(cls)
        obj.group = group
        obj.orig_size = values[1 : 1 + ndims]
        obj.num_parts, obj.rank = values[1 + ndims], values[2 + ndims]
        obj.partition = values[3 + ndims :]
        obj.orig_device = local_part.device if device is None else torch.device(device)
        obj.local_data = local_part
        if obj.num_parts != comm.get_world_size(group) or obj.rank != comm.get_rank(group):
            raise ValueError(
                f"PartitionedTensor.from_meta: the meta is rank {obj.rank} of {obj.num_parts} "
                f"parts; this is rank {comm.get_rank(group)} of {comm.get_world_size(group)}"
            )
        return obj

    def full(self, device=None) -> torch.Tensor:
        """The whole tensor, gathered from every rank's piece (each padded to the largest)."""
        from zerostream import comm

        sizes = [b - a for a, b in zip(self.partition, self.partition[1:])]
        width = max(sizes)
        mine = torch.zeros(width, dtype=self.local_data.dtype, device=self.local_data.device)
        mine[: self.local_data.numel()].copy_(self.local_data.reshape(-1))
        pieces = [torch.empty_like(mine) for _ in sizes]
        comm.all_gather(pieces, mine, group=self.group)
        flat = torch.cat([p[:n] for p, n in zip(pieces, sizes)])
        out = flat.view(self.orig_size)
        return out if device is None else out.to(device)

    def to_meta(self) -> torch.Tensor:
        meta = [len(self.orig_size), *self.orig_size, self.num_parts, self.rank, *self.partition]
        return torch.tensor(meta, dtype=torch.long, device=self.orig_device)

    def data(self) -> torch.Tensor:
        return self.local_data

    def local_size(self) -> torch.Size:
        return self.local_data.size()

    def full_size(self) -> list:
        return self.orig_size
