"""DeepSpeed's memory estimators reached by DeepSpeed's module paths in the installed
compatibility package (run by test_estimators.py in a subprocess): prints one JSON object
with the tables they print and whether they are zerostream's own functions."""

import contextlib
import io
import json

import torch
from deepspeed.runtime.zero import stage3, stage_1_and_2

import zerostream.estimate as zs


class Tied(torch.nn.Module):
    """An 8000 x 1024 embedding tied to the output head, and a 1024 -> 4096 layer."""

    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(8000, 1024)
        self.up = torch.nn.Linear(1024, 4096)
        self.head = torch.nn.Linear(1024, 8000, bias=False)
        self.head.weight = self.emb.weight


def printed(fn, *args, **kwargs) -> list:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        fn(*args, **kwargs)
    return out.getvalue().splitlines()


def main():
    model = Tied()
    names = [
        (stage_1_and_2, "estimate_zero2_model_states_mem_needs_all_live"),
        (stage_1_and_2, "estimate_zero2_model_states_mem_needs_all_cold"),
        (stage3, "estimate_zero3_model_states_mem_needs_all_live"),
        (stage3, "estimate_zero3_model_states_mem_needs_all_cold"),
    ]
    print(
        json.dumps(
            {
                "same_functions": [getattr(m, n) is getattr(zs, n) for m, n in names],
                "zero2_live": printed(
                    stage_1_and_2.estimate_zero2_model_states_mem_needs_all_live,
                    model,
                    num_gpus_per_node=4,
                    num_nodes=2,
                ),
                "zero2_cold": printed(
                    stage_1_and_2.estimate_zero2_model_states_mem_needs_all_cold, 2851e6, 8, 1
                ),
                "zero3_live": printed(
                    stage3.estimate_zero3_model_states_mem_needs_all_live,
                    model,
                    num_gpus_per_node=4,
                    num_nodes=2,
                ),
                "zero3_cold": printed(
                    stage3.estimate_zero3_model_states_mem_needs_all_cold, 2851e6, 32e6, 8, 1
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
