"""Counts and sizes as people type them (70B, 1.3B, 40GB, 80GiB, 1TB) and as the planner
prints them. GB is 10^9 bytes and GiB 2^30 everywhere in the planner; DeepSpeed's estimator
tables (zero_estimators.py) print GiB labelled "GB", as DeepSpeed does."""

from __future__ import annotations

import math
import re

GB = 10**9
GIB = 2**30

_COUNT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtT]?)\s*$")
_COUNT_SCALE = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")
_SIZE_SCALE = {
    "": GB,  # a bare number is GB, as in "--gpu-mem 40"
    "b": 1,
    "kb": 1e3,
    "mb": 1e6,
    "gb": 1e9,
    "tb": 1e12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_count(text: str, what: str = "count") -> int:
    """'70B' -> 70_000_000_000; also 1.3B, 350M, 7e10, 124439808. ValueError names `what`."""
    m = _COUNT.match(str(text))
    if not m:
        raise ValueError(f"{what}: expected a count like 70B, 1.3B, 350M or 7e10; got {text!r}")
    value = float(m.group(1)) * _COUNT_SCALE[m.group(2).lower()]
    if not math.isfinite(value) or value < 1:
        raise ValueError(f"{what}: expected a positive count; got {text!r}")
    return int(round(value))


def parse_size(text: str, what: str = "size") -> int:
    """'40GB' -> 40e9 bytes, '80GiB' -> 80 * 2^30, '1TB' -> 1e12; a bare number is GB."""
    m = _SIZE.match(str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _SIZE_SCALE:
        raise ValueError(
            f"{what}: expected a size like 40GB, 80GiB, 512MB or 1TB (a bare number is GB); "
            f"got {text!r}"
        )
    value = float(m.group(1)) * _SIZE_SCALE[unit]
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what}: expected a non-negative size; got {text!r}")
    return int(round(value))


def parse_rate(text: str, what: str = "rate") -> float:
    """A positive number (GB/s, Gparam/s, TFLOP/s)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: expected a positive number; got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{what}: expected a positive number; got {text!r}")
    return value


def gb(nbytes: float) -> str:
    """Bytes as GB with a precision that stays readable from 0.01 to 10^5 GB."""
    v = nbytes / GB
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


def count(n: float) -> str:
    """A parameter count the way papers write it: 68.98 B, 124.4 M, 15.3 K."""
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            v = n / scale
            return f"{v:.2f} {suffix}" if v < 100 else f"{v:.1f} {suffix}"
    return f"{n:.0f}"


def seconds(s: float) -> str:
    if s >= 100:
        return f"{s:.0f}"
    if s >= 1:
        return f"{s:.2f}"
    if s >= 0.001:
        return f"{s:.3f}"
    return "0" if s == 0 else f"{s:.1e}"
