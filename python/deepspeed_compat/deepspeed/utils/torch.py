"""`deepspeed.utils.torch`: `required_torch_version(min_version, max_version)`, whether the
running torch's major.minor lies in the closed range (either end may be None)."""

from __future__ import annotations

from typing import Optional

import torch
from packaging import version as _version


def required_torch_version(
    min_version: Optional[float] = None, max_version: Optional[float] = None
) -> bool:
    running = _version.parse(torch.__version__).release[:2]
    current = _version.parse(".".join(str(n) for n in running))
    if min_version is not None and current < _version.parse(str(min_version)):
        return False
    if max_version is not None and current > _version.parse(str(max_version)):
        return False
    return True


__all__ = ["required_torch_version"]
