"""The page-locked pool that cpu_checkpointing parks saved inputs in (Note [Parked
activations] in offload/saved_activations.py): it locks at most one chunk beyond the most
that is parked at once, whatever the sizes, and reuses its buffers across steps. Before, each
new chunk was twice the last, and a run locked 1.6-1.9 times its peak for good."""

import random

import torch

from zerostream.offload import saved_activations


def _park_steps(monkeypatch, sizes_per_step, chunk):
    monkeypatch.setattr(saved_activations, "CHUNK_BYTES", chunk)
    pool = saved_activations._HostPool()
    peak = 0
    for sizes in sizes_per_step:
        held = [pool.empty(n, torch.uint8) for n in sizes]  # a forward parks them all
        peak = max(peak, sum(sizes))
        del held  # its backward gives them back
    return pool, peak


def test_the_pool_locks_at_most_one_chunk_beyond_what_is_parked_at_once(monkeypatch):
    rng = random.Random(0)
    chunk = 1 << 20
    # Three steps of 24 inputs from 60 KiB to 300 KiB each: about 4 MiB parked at once.
    steps = [[rng.randrange(60 << 10, 300 << 10) for _ in range(24)] for _ in range(3)]
    pool, peak = _park_steps(monkeypatch, steps, chunk)
    mapped = pool.bytes_mapped()
    # Each chunk leaves less than one request unused at its end (first fit), and the last
    # one may be mostly empty: the bound is the peak, one chunk and a request per chunk.
    slack = len(pool.chunks) * (300 << 10)
    assert peak <= mapped <= peak + chunk + slack, (mapped, peak, len(pool.chunks))
    assert mapped < 1.5 * peak, (mapped, peak)
    # The same steps again reuse what is mapped: no new chunk, no registration.
    chunks = len(pool.chunks)
    for sizes in steps:
        held = [pool.empty(n, torch.uint8) for n in sizes]
        del held
    assert len(pool.chunks) == chunks


def test_a_request_larger_than_a_chunk_gets_a_chunk_of_its_own_size(monkeypatch):
    pool, peak = _park_steps(monkeypatch, [[3 << 20, 5 << 20]] * 2, 1 << 20)
    assert pool.bytes_mapped() == peak == 8 << 20
    assert len(pool.chunks) == 2
