"""Lazy 1-D slices over checkpoint tensors, and the plan that reads them (reshard.py).

Re-cutting optimizer state for another world size or stage (Note [Streamed re-cut]) needs,
per rank, only its own partitions: a few ranges of the saved ranks' tensors. A `Slice` names
such ranges without reading them (pieces of FileTensors, plain tensors or zeros), and
`Slice.read_into(dst, plan)` records where each range must land. `ReadPlan.run()` then reads
each saved tensor that anything needs once, front to back, through one bounded scratch
buffer, so its CRC32C is checked as on any load and memory holds only the destinations (a
tensor with no manifest range, as in DeepSpeed's files, has nothing to check: only its
wanted ranges are read).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from ..offload.host_buffers import aligned_empty

# A piece: (source, first element, element count); source None reads as zeros.
Piece = Tuple[Any, int, int]

SCRATCH_BYTES = 64 << 20  # one ordered pass reads a saved tensor in pieces this big


class Slice:
    """A 1-D run of elements made of pieces of saved tensors; nothing is read until a plan
    runs."""

    def __init__(self, pieces: List[Piece]):
        self.pieces = [p for p in pieces if p[2] > 0]
        self.numel = sum(n for _, _, n in self.pieces)

    @staticmethod
    def of(value: Any) -> "Slice":
        """A whole saved tensor (a FileTensor or a tensor of any shape), flattened."""
        if torch.is_tensor(value):
            value = value.reshape(-1)
        return Slice([(value, 0, value.numel())])

    @staticmethod
    def zeros(numel: int) -> "Slice":
        return Slice([(None, 0, numel)])

    @staticmethod
    def cat(slices: List["Slice"]) -> "Slice":
        return Slice([p for s in slices for p in s.pieces])

    def __getitem__(self, index: slice) -> "Slice":
        lo, hi, step = index.indices(self.numel)
        if step != 1:
            raise ValueError("a checkpoint slice takes contiguous ranges only")
        out, at = [], 0
        for src, first, n in self.pieces:
            a, b = max(lo, at), min(hi, at + n)
            if a < b:
                out.append((src, first + a - at, b - a))
            at += n
            if at >= hi:
                break
        return Slice(out)

    def read_into(self, dst: torch.Tensor, plan: "ReadPlan") -> None:
        """Plans dst (1-D, numel elements) to receive these elements; small sources are
        copied now."""
        if dst.numel() != self.numel:
            raise ValueError(f"a slice of {self.numel} elements into {dst.numel()}")
        at = 0
        for src, first, n in self.pieces:
            plan.add(src, first, dst[at : at + n])
            at += n


class ReadPlan:
    """Destinations for ranges of saved tensors, filled by run()."""

    def __init__(self):
        self._wanted: Dict[int, Tuple[Any, List[Tuple[int, torch.Tensor]]]] = {}

    def add(self, src: Any, first: int, dst: torch.Tensor) -> None:
        if src is None:
            dst.zero_()
        elif torch.is_tensor(src):
            dst.copy_(src[first : first + dst.numel()])
        else:
            self._wanted.setdefault(id(src), (src, []))[1].append((first, dst))

    def run(self) -> None:
        """Every FileTensor something needs, read once front to back (checked against its
        manifest range), its wanted ranges copied out on the way."""
        scratch: Optional[torch.Tensor] = None
        order = sorted(self._wanted.values(), key=lambda e: (e[0].path, e[0].offset))
        for src, wants in order:
            wants.sort(key=lambda w: w[0])
            if src.want is None:  # no manifest range to check: read only what is wanted
                for first, dst in wants:
                    src.read_into(dst, first)
                continue
            per = max(1, SCRATCH_BYTES // src.element_size())
            if scratch is None:
                scratch = aligned_empty(SCRATCH_BYTES)
            for lo in range(0, src.numel(), per):
                n = min(per, src.numel() - lo)
                chunk = scratch[: n * src.element_size()].view(src.dtype)
                src.read_into(chunk, lo)
                for first, dst in wants:
                    a, b = max(lo, first), min(lo + n, first + dst.numel())
                    if a < b:
                        dst[a - first : b - first].copy_(chunk[a - lo : b - lo])
        self._wanted.clear()
