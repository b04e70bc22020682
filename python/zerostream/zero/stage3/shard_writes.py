"""Stage-3 shard writes in flight, for the param swap store (param_swap.py).

Note [Shard writes beside the forward's reads]
  An optimizer update writes shards a piece at a time, and behind the next forward
  (zero/overlap.py) from its own thread while the forward reads others (a shard is read only
  once its piece is written: the gather waits for the piece first). Writes are asynchronous,
  so the update goes on to its next piece (and its disk reads) while they land: each is
  copied into a write buffer of its own (an O_DIRECT-aligned pool, never the reads' staging
  arena: a write that waited there for a buffer held by a read ahead, which the forward lands
  only after its next gather, waiting for this very update, would wait forever), at most
  WRITES_IN_FLIGHT at once. Every read of the store first waits for the writes in flight
  (`flush`): a piece reported written may still be landing, and a serial step's last writes
  are read by the next forward. The reads' state (the arena, the reads ahead) is the
  forward's thread's alone.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Deque, List

import torch

from ... import sizing
from ...aligned import aligned_empty

WRITES_IN_FLIGHT = sizing.PARAM_WRITES_IN_FLIGHT


class _Write:
    """A shard write in flight: its ticket, its buffer and when it was issued."""

    __slots__ = ("ticket", "buf", "nbytes", "start")

    def __init__(self, ticket, buf: torch.Tensor, nbytes: int, start: float):
        self.ticket, self.buf, self.nbytes, self.start = ticket, buf, nbytes, start


class ShardWrites:
    """The writes in flight to `store` (a SwapStore); `telemetry()` gives the engine's
    telemetry when a write is seen done."""

    def __init__(self, store, telemetry: Callable):
        self.store, self._telemetry = store, telemetry
        self._lock = threading.Lock()
        self._writing: Deque[_Write] = collections.deque()
        self._pool: List[torch.Tensor] = []
        self._buf_bytes = 0

    def write(self, tensor_id: int, values: torch.Tensor) -> None:
        """Copies `values` into a write buffer and writes it as `tensor_id`, returning once
        the write is issued (the oldest is waited for when WRITES_IN_FLIGHT are)."""
        nbytes = values.numel() * values.element_size()
        with self._lock:
            oldest = self._writing[0] if len(self._writing) >= WRITES_IN_FLIGHT else None
        if oldest is not None:
            self._reap([oldest])
        with self._lock:
            # Every buffer as large as the largest shard written yet: a few sizes over a run,
            # not one allocation per write (a retained heap would fragment under them).
            self._buf_bytes = max(self._buf_bytes, nbytes)
            pool = [b for b in self._pool if b.numel() >= self._buf_bytes]
            buf = pool.pop() if pool else aligned_empty(self._buf_bytes, torch.uint8)
            self._pool = pool
        staged = buf[:nbytes].view(values.dtype)
        staged.copy_(values.reshape(-1))
        write = _Write(self.store.write(tensor_id, staged), buf, nbytes, time.perf_counter())
        with self._lock:
            self._writing.append(write)

    def in_flight(self) -> list:
        """The tickets of the writes not yet waited for (tests)."""
        with self._lock:
            return [w.ticket for w in self._writing]

    def flush(self) -> None:
        """Waits for every write in flight now (before any read of the store)."""
        with self._lock:
            writing = list(self._writing)
        self._reap(writing)

    def _reap(self, writes: List[_Write]) -> None:
        """Waits for `writes` (raising a failed one's error, naming its file) and gives
        their buffers back to the pool."""
        for w in writes:
            w.ticket.wait()
        with self._lock:
            for w in writes:
                if w in self._writing:
                    self._writing.remove(w)
                    if len(self._pool) < WRITES_IN_FLIGHT:
                        self._pool.append(w.buf)
                    took = time.perf_counter() - w.start
                    self._telemetry().moved("param_nvme_write", w.nbytes, took)
