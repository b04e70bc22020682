"""Named random-number states of the accelerator, with DeepSpeed's (and Megatron's) API:
`deepspeed.checkpointing.get_cuda_rng_tracker()` and `model_parallel_cuda_manual_seed(seed)`.

Megatron-style models draw dropout in tensor-parallel regions from a state of their own,
`with get_cuda_rng_tracker().fork(): ...`, and the default state elsewhere. fork() swaps the
tracked state in, runs the block, keeps the state the block advanced to and puts the default
state back. A checkpointed block that forks draws again when backward recomputes it, so
the package (__init__.py) replays the tracked states the forward started from (torch's
checkpoint restores only the default generators). zerostream runs tensor-parallel size 1,
so the model-parallel state is seeded as DeepSpeed seeds tensor-parallel rank 0.
"""

from __future__ import annotations

import contextlib
from typing import Dict, Iterator

import torch

MODEL_PARALLEL_RNG = "model-parallel-rng"  # DeepSpeed's name of the tracked state
MODEL_PARALLEL_SEED_OFFSET = 2718  # DeepSpeed's: model-parallel seed = seed + 2718 + tp rank


def _accelerator():
    from ..accelerator import get_accelerator

    return get_accelerator()


class CudaRNGStatesTracker:
    """Named generator states of the accelerator (its default generator's, swapped in and
    out); DeepSpeed's class name, whatever the device."""

    def __init__(self):
        self.states_: Dict[str, torch.Tensor] = {}
        self.seeds_: set = set()

    def reset(self) -> None:
        self.states_, self.seeds_ = {}, set()

    def get_states(self) -> Dict[str, torch.Tensor]:
        """A copy of the name -> state map (the states are replaced, never changed in place,
        so the copy keeps the states of this moment)."""
        return dict(self.states_)

    def set_states(self, states: Dict[str, torch.Tensor]) -> None:
        self.states_ = states

    def add(self, name: str, seed: int) -> None:
        """Tracks a new state `name`, the generator's state after seeding it with `seed`; the
        generator itself is left as it was."""
        if seed in self.seeds_:
            raise ValueError(f"rng tracker: seed {seed} is already tracked")
        if name in self.states_:
            raise ValueError(f"rng tracker: a state named {name!r} is already tracked")
        acc = _accelerator()
        current = acc.get_rng_state()
        acc.manual_seed(seed)
        self.states_[name] = acc.get_rng_state()
        acc.set_rng_state(current)
        self.seeds_.add(seed)

    @contextlib.contextmanager
    def fork(self, name: str = MODEL_PARALLEL_RNG) -> Iterator[None]:
        """Draws from state `name` inside the block; it keeps what the block advanced it to,
        and the generator is back where it was after the block."""
        if name not in self.states_:
            raise KeyError(f"rng tracker: no state named {name!r} (add() it first)")
        acc = _accelerator()
        current = acc.get_rng_state()
        acc.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = acc.get_rng_state()
            acc.set_rng_state(current)

    @contextlib.contextmanager
    def replaying(self, states: Dict[str, torch.Tensor]) -> Iterator[None]:
        """The tracked states of an earlier moment for the block (a recomputation), then the
        ones of now again."""
        now = self.get_states()
        self.set_states(dict(states))
        try:
            yield
        finally:
            self.set_states(now)


_TRACKER = CudaRNGStatesTracker()


def get_cuda_rng_tracker() -> CudaRNGStatesTracker:
    return _TRACKER


def model_parallel_cuda_manual_seed(seed: int) -> None:
    """Seeds the accelerator's default generator with `seed` (the data-parallel state) and
    tracks the model-parallel state from seed + 2718 + the tensor-parallel rank (0 here), as
    DeepSpeed does; forgets any state tracked before."""
    _TRACKER.reset()
    _accelerator().manual_seed(seed)
    _TRACKER.add(MODEL_PARALLEL_RNG, seed + MODEL_PARALLEL_SEED_OFFSET)
