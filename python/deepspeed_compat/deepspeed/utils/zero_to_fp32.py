"""`deepspeed.utils.zero_to_fp32`: whole fp32 weights from a ZeRO checkpoint
(zerostream/checkpoint/zero_to_fp32.py; reads zerostream's and DeepSpeed's checkpoints).
Also runnable: `python -m deepspeed.utils.zero_to_fp32 CHECKPOINT_DIR OUTPUT_DIR`."""

import sys

from zerostream.checkpoint.zero_to_fp32 import (
    convert_zero_checkpoint_to_fp32_state_dict,
    get_checkpoint_files,
    get_fp32_state_dict_from_zero_checkpoint,
    get_model_state_file,
    get_model_state_files,
    get_optim_files,
    load_state_dict_from_zero_checkpoint,
    main,
)

__all__ = [
    "convert_zero_checkpoint_to_fp32_state_dict",
    "get_fp32_state_dict_from_zero_checkpoint",
    "get_checkpoint_files",
    "get_model_state_file",
    "get_model_state_files",
    "get_optim_files",
    "load_state_dict_from_zero_checkpoint",
    "main",
]

if __name__ == "__main__":
    sys.exit(main())
