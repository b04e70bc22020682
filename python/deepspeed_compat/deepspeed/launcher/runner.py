"""`deepspeed.launcher.runner`: the `deepspeed` command, served by zerostream's launcher.

`accelerate launch --use_deepspeed` on several nodes reads DEEPSPEED_ENVIRONMENT_NAME: the
file name of the environment exported to every node (DS_ENV_FILE overrides it, as in
DeepSpeed).
"""

from __future__ import annotations

import os
from typing import List, Optional

DEEPSPEED_ENVIRONMENT_NAME = os.getenv("DS_ENV_FILE", ".deepspeed_env")


def main(args: Optional[List[str]] = None):
    """`deepspeed [launcher options] script.py [script args]` (zerostream.launcher.main)."""
    from zerostream.launcher import main as zerostream_main

    return zerostream_main(args)
