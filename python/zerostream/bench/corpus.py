"""The demo's text: the Python standard library's own source, read at run time (nothing is
downloaded) and tokenized byte by byte (a vocabulary of 256). examples/train_gpt.py trains on
it, and `bench capacity --corpus-mb` does, so a capacity run's losses are a real text's."""

from __future__ import annotations

import sysconfig
from pathlib import Path
from typing import Iterator, List, Tuple

import torch

VOCAB = 256  # bytes


def vocabulary(corpus_mb: float, synthetic: int) -> int:
    """A bench model's vocabulary: the demo's text is bytes, so with `corpus_mb` > 0 it is
    256; `synthetic` (a --vocab flag) is for synthetic tokens."""
    if corpus_mb < 0:
        raise ValueError(f"--corpus-mb: expected >= 0 MiB; got {corpus_mb}")
    return VOCAB if corpus_mb > 0 else synthetic


def read_corpus(max_mb: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) byte tensors from the standard library's .py files, in a fixed order
    so every rank and every run sees the same text; every 20th file is held out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)
    if not files:
        raise SystemExit(f"zerostream: no .py files under {root} to train on")
    train, valid, budget = [], [], int(max_mb * 2**20)
    for i, path in enumerate(files):
        data = path.read_bytes()
        (valid if i % 20 == 19 else train).append(data)
        budget -= len(data)
        if budget <= 0:
            break
    return _bytes(train), _bytes(valid)


def _bytes(chunks: List[bytes]) -> torch.Tensor:
    data = b"".join(chunks)
    if not data:  # a budget that ends within the first files holds out nothing
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def windows(text: torch.Tensor, count: int, seq: int, gen: torch.Generator) -> torch.Tensor:
    """`count` random windows of seq + 1 bytes (inputs and their next bytes), as int64."""
    starts = torch.randint(0, text.numel() - seq - 1, (count,), generator=gen)
    return torch.stack([text[s : s + seq + 1] for s in starts.tolist()]).long()


def text_batches(
    text: torch.Tensor, micro: int, seq: int, device, seed: int = 1
) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    """Endless (tokens, next tokens) micro-batches of `text`, the same for every peer."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        w = windows(text, micro, seq, gen).to(device)
        yield w[:, :-1].contiguous(), w[:, 1:].contiguous()
