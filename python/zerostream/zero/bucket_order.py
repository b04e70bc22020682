"""Gradient buckets in one order on every rank, whichever gradients each rank's backward makes.

Note [Buckets in one order on every rank]
  A bucket's collective matches the other ranks' by position, so every rank must issue the
  same buckets, with the same parameters, in the same order. Filling buckets in the order
  autograd finishes gradients made that a local matter: a parameter that gets no gradient
  on one rank (a data-dependent branch, an auxiliary head used on some batches, an expert
  no token of this rank routes to) shifted every later bucket there, and the ranks
  reduced different sizes (Gloo aborts, NCCL hangs or mixes the bytes). So the buckets are
  planned once, from rank-independent inputs, and issued strictly in plan order:

  - the plan cuts the parameters, in reverse registration order (backward runs roughly
    that way), into buckets of at least `bucket_size` elements (the last may be smaller);
  - a gradient waits in its bucket; a bucket is issued when it is complete and every
    earlier one has been, so gradients that arrive out of plan order wait, they never
    reorder the collectives;
  - at the end of backward the remaining buckets are issued in order, a parameter that
    got no gradient on this rank counted as zeros (the average over ranks then counts it
    as zero, as plain PyTorch summing the ranks' gradients over the world size does);
  - after the first backward, the plan is cut again in the order rank 0 saw the
    gradients arrive (handed to the others through the store), so buckets fill as
    autograd runs, as DDP rebuilds its buckets; parameters rank 0 never saw keep their old
    relative order, at the end. Stage 3 with several ranks keeps its first plan: its
    buckets take their places in the sequence of gathers the ranks share, recorded with
    that plan (Note [One gather sequence on every rank] in stage3/coordinator.py), and a
    bucket whose gradients are not all here when the sequence reaches it goes then, its
    missing parts late.

  A gradient part that arrives after its bucket was issued (reentrant activation
  checkpointing gives a weight used in two segments two parts: Note [A gradient that
  arrives in parts] in grad_reduce.py) is kept aside, summed with later parts, until the
  end of that backward. Then every rank says, one flag per bucket, whether it holds such
  parts (one small all-reduce, as DDP's find_unused_parameters adds one), and every rank
  reduces the buckets any rank flagged once more: late parts, zeros elsewhere, added into
  the partitions. So the gradients are whole when backward returns, as DeepSpeed promises
  (safe_get_full_grad reads them before the step).
"""

from __future__ import annotations

import itertools
from typing import Dict, Generic, Hashable, List, Optional, Sequence, Tuple, TypeVar

import torch

from .. import comm

K = TypeVar("K", bound=Hashable)
_INSTANCES = itertools.count()


def cut(keys: Sequence[K], numel: Dict[K, int], bucket_size: int) -> List[List[K]]:
    """Consecutive runs of `keys` holding at least `bucket_size` elements each (the last
    may hold fewer)."""
    buckets: List[List[K]] = []
    current: List[K] = []
    size = 0
    for key in keys:
        current.append(key)
        size += numel[key]
        if size >= bucket_size:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


class BucketOrder(Generic[K]):
    """Which bucket each gradient belongs to, which buckets may be issued now, and the late
    parts (Note [Buckets in one order on every rank])."""

    def __init__(self, keys: Sequence[K], numel: Dict[K, int], bucket_size: int):
        """`keys` in the order of the parameters' registration (the plan reverses it)."""
        self.numel = dict(numel)
        self.bucket_size = max(1, bucket_size)
        self._plan(list(reversed(keys)))
        self.arrivals: Optional[List[K]] = []  # the first backward's order; None once replanned
        self.late: Dict[K, torch.Tensor] = {}
        self.replans = 0
        # Names this plan's key in the store: every rank makes its plans in one order.
        self.instance = next(_INSTANCES)

    def _plan(self, order: List[K]) -> None:
        self.order = order
        self.buckets = cut(order, self.numel, self.bucket_size)
        self.bucket_of = {k: b for b, keys in enumerate(self.buckets) for k in keys}
        self.held: List[Dict[K, torch.Tensor]] = [{} for _ in self.buckets]
        self.next = 0  # the first bucket neither complete nor issued
        self.issued = 0  # the first bucket not issued: take() issues them in order

    def put(self, key: K, grad: torch.Tensor) -> List[int]:
        """Takes `key`'s gradient (or another part of it); returns the buckets it made
        ready to issue, in order (take() each, now or when the ranks' agreed sequence
        says: Note [One gather sequence on every rank] in stage3/coordinator.py)."""
        if key not in self.bucket_of:
            raise KeyError(key)
        if self.arrivals is not None:
            self.arrivals.append(key)
        b = self.bucket_of[key]
        if b < self.issued:  # its bucket went: a late part
            prior = self.late.get(key)
            self.late[key] = grad if prior is None else prior + grad
            return []
        held = self.held[b]
        prior = held.get(key)
        held[key] = grad if prior is None else prior + grad
        ready = []
        while self.next < len(self.buckets) and len(self.held[self.next]) == len(
            self.buckets[self.next]
        ):
            ready.append(self.next)
            self.next += 1
        return ready

    def rest(self) -> List[int]:
        """The end of backward: every bucket not issued yet, in order."""
        return list(range(self.issued, len(self.buckets)))

    def take(self, b: int) -> List[Tuple[K, Optional[torch.Tensor]]]:
        """Issues bucket b, the next in order: its keys in plan order with their gradients
        (None: none on this rank, yet; a part that comes later is a late part)."""
        if b != self.issued:
            raise RuntimeError(f"bucket {b} issued out of order (next is {self.issued})")
        held, self.held[b] = self.held[b], {}
        self.issued = b + 1
        self.next = max(self.next, self.issued)
        return [(k, held.get(k)) for k in self.buckets[b]]

    def restart(self) -> None:
        """A new backward begins with nothing issued (after rest() and take())."""
        self.next = self.issued = 0

    def replan(self, group, world: int) -> bool:
        """After the first backward: the plan cut again in the order rank 0's gradients
        arrived, handed to the other ranks through the default group's store (no
        collective, no device read). Returns whether it ran."""
        if self.arrivals is None:
            return False
        seen, self.arrivals = self.arrivals, None
        position = {k: i for i, k in enumerate(self.order)}
        chosen = [position[k] for k in dict.fromkeys(seen)]
        if world > 1:
            chosen = comm.store_broadcast(f"bucket_order/{self.instance}", chosen, group)
        order = [self.order[i] for i in chosen]
        listed = set(order)
        order += [k for k in self.order if k not in listed]
        self._plan(order)
        self.replans += 1
        return True

    # --- late parts ------------------------------------------------------------------------
    def late_buckets(self) -> List[int]:
        """The buckets this rank holds late parts of, in order."""
        return sorted({self.bucket_of[key] for key in self.late})

    def late_flags(self, device: torch.device) -> torch.Tensor:
        """One float64 per bucket: 1 where this rank holds late parts (for the all-reduce
        that tells every rank which buckets to reduce again)."""
        if not self.late:  # made on the device: no copy (the usual case)
            return torch.zeros(len(self.buckets), dtype=torch.float64, device=device)
        flags = torch.zeros(len(self.buckets), dtype=torch.float64)
        for key in self.late:
            flags[self.bucket_of[key]] = 1.0
        return flags.to(device)

    def take_late(self, b: int) -> List[Tuple[K, Optional[torch.Tensor]]]:
        """Bucket b's keys with this rank's late parts (None where it holds none)."""
        return [(k, self.late.pop(k, None)) for k in self.buckets[b]]

    def drop_late(self) -> None:
        self.late.clear()
