"""`deepspeed.checkpoint.ds_to_universal`: a ZeRO stage 1-3 checkpoint (a tag folder) to
DeepSpeed's universal layout, loadable with checkpoint.load_universal at any data-parallel
world size and stage (zerostream/checkpoint/universal.py). DeepSpeed's command line:

    python -m deepspeed.checkpoint.ds_to_universal --input_folder CKPT/global_step10 \\
        --output_folder CKPT/global_step10_universal [--inject_missing_state] [--no_strict]
"""

from __future__ import annotations

import argparse
from typing import List, Optional

from zerostream.checkpoint.universal import main as _convert


def parse_arguments(argv: Optional[List[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="ds_to_universal", description="Convert a ZeRO checkpoint to a universal one"
    )
    parser.add_argument("--input_folder", type=str, required=True, help="the tag folder to read")
    parser.add_argument("--output_folder", type=str, required=True, help="the folder to write")
    # DeepSpeed spreads its fragment files over worker processes; zerostream reads each saved
    # tensor once in one process and writes no fragment files, so these three change nothing.
    parser.add_argument("--num_extract_workers", default=4, type=int, help="accepted; unused")
    parser.add_argument("--num_merge_workers", default=2, type=int, help="accepted; unused")
    parser.add_argument("--keep_temp_folder", action="store_true", help="accepted; unused")
    parser.add_argument(
        "--no_strict",
        dest="strict",
        action="store_false",
        help="accept universal_checkpoint_info patterns that match no parameter",
    )
    parser.add_argument(
        "--inject_missing_state",
        action="store_true",
        help="add universal_checkpoint_info when the checkpoint lacks it",
    )
    return parser.parse_args(argv)


def main(args: argparse.Namespace) -> None:
    _convert(args)


if __name__ == "__main__":
    main(parse_arguments())
