"""Resume equivalence and resharding (issue 13), on Gloo ranks.

Same world size: train k steps, save, train k more; a fresh set of processes loads the
checkpoint and trains the same k steps. The losses and the final fp32 weights (read back
from a checkpoint saved at the end, through zero_to_fp32) must be bitwise equal, for
stages 0-3 x offload none/cpu/nvme (stage 3 with parameter offload too) and bf16.
Another world size: a checkpoint of N ranks is loaded by M ranks for every N != M in
{1, 2, 4}; the losses must continue those of the run that never changed size (within fp32
reduction-order rounding).
"""

import os

import pytest
import torch
from ckpt_run import STEPS, build, case_id, train

from multirank import run_ranks

K = STEPS // 2
CASES = [
    (0, "none", "none", "fp32"),
    (0, "none", "none", "bf16"),
    (1, "none", "none", "fp32"),
    (1, "cpu", "none", "fp32"),
    (1, "nvme", "none", "fp32"),
    (2, "none", "none", "fp32"),
    (2, "cpu", "none", "bf16"),
    (2, "nvme", "none", "fp32"),
    (3, "none", "none", "fp32"),
    (3, "cpu", "cpu", "fp32"),
    (3, "cpu", "none", "bf16"),
    (3, "nvme", "nvme", "fp32"),
]
RESHARD = [c for c in CASES if c[0] > 0 and c[3] == "fp32"]


def save_and_continue(rank, world, cases, root):
    out = {}
    for case in cases:
        engine = build(case, world, root)
        ckpt = os.path.join(root, f"ckpt{world}", case_id(case))
        first = train(engine, rank, world, 0, K)
        engine.save_checkpoint(ckpt, client_state={"resume_at": K})
        rest = train(engine, rank, world, K, K)
        engine.save_checkpoint(ckpt, tag="end", save_latest=False)
        engine.destroy()
        out[case] = (first, rest)
    return out


def load_and_continue(rank, world, cases, root, saved_world):
    out = {}
    for case in cases:
        engine = build(case, world, root, seed=1)  # other initial weights: all must be loaded
        ckpt = os.path.join(root, f"ckpt{saved_world}", case_id(case))
        path, client = engine.load_checkpoint(ckpt)
        assert client["resume_at"] == K and engine.global_steps == K, (path, client)
        rest = train(engine, rank, world, K, K)
        engine.save_checkpoint(ckpt, tag=f"resumed{world}", save_latest=False)
        engine.destroy()
        out[case] = rest
    return out


def fp32(ckpt: str, tag: str):
    from zerostream.checkpoint import get_fp32_state_dict_from_zero_checkpoint
    from zerostream.checkpoint.files import load_file

    if os.path.exists(os.path.join(ckpt, tag, "mp_rank_00_model_states.pt")) and not any(
        n.endswith("optim_states.pt") for n in os.listdir(os.path.join(ckpt, tag))
    ):  # stage 0: whole weights in the model file
        return load_file(os.path.join(ckpt, tag, "mp_rank_00_model_states.pt"))["module"]
    return get_fp32_state_dict_from_zero_checkpoint(ckpt, tag=tag)


class SavedRuns(dict):
    """The runs that saved checkpoints, by world size, each trained the first time a test asks
    for it (world 4 only in the slow tier)."""

    def __init__(self, root: str):
        super().__init__()
        self.root = root

    def __missing__(self, world: int):
        cases = CASES if world == 2 else RESHARD
        self[world] = run_ranks(save_and_continue, world, cases, self.root, timeout=600)[0]
        return self[world]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    runs = SavedRuns(str(tmp_path_factory.mktemp("resume")))
    return runs.root, runs[2], runs


def test_a_resumed_run_is_bitwise_the_uninterrupted_one(saved):
    root, two, _ = saved
    resumed = run_ranks(load_and_continue, 2, CASES, root, 2, timeout=600)[0]
    for case in CASES:
        assert resumed[case] == two[case][1], case
        ckpt = os.path.join(root, "ckpt2", case_id(case))
        want, got = fp32(ckpt, "end"), fp32(ckpt, "resumed2")
        assert want.keys() == got.keys()
        for name in want:
            assert torch.equal(want[name], got[name]), (case, name)


# Fewer and more ranks run in the default tier; world 4 is the slow tier's.
@pytest.mark.parametrize(
    "saved_world,world",
    [(2, 1)]
    + [pytest.param(*w, marks=pytest.mark.slow) for w in [(1, 2), (2, 4), (4, 2), (1, 4), (4, 1)]],
)
def test_a_checkpoint_loads_into_another_world_size(saved, saved_world, world):
    root, _, by_world = saved
    reference = by_world[saved_world]
    resumed = run_ranks(load_and_continue, world, RESHARD, root, saved_world, timeout=600)[0]
    for case in RESHARD:
        want = torch.tensor(reference[case][1])
        got = torch.tensor(resumed[case])
        # Only the order of the gradient sums differs between world sizes.
        assert torch.allclose(got, want, rtol=1e-4, atol=0), (case, got, want)
        ckpt = os.path.join(root, f"ckpt{saved_world}", case_id(case))
        ref, new = fp32(ckpt, "end"), fp32(ckpt, f"resumed{world}")
        for name in ref:
            assert torch.allclose(new[name], ref[name], rtol=1e-3, atol=1e-5), (case, name)


# A checkpoint of 2 ranks loaded at another ZeRO stage (and world size): the optimizer state
# is re-cut between the stage 1/2 and stage-3 layouts by parameter name (reshard.py).
ACROSS = {
    2: [
        ((2, "nvme", "none", "fp32"), (3, "none", "none", "fp32")),
        ((3, "none", "none", "fp32"), (1, "none", "none", "fp32")),
        ((0, "none", "none", "fp32"), (2, "none", "none", "fp32")),  # refused: stage 0
    ],
    1: [((3, "nvme", "nvme", "fp32"), (2, "cpu", "none", "fp32"))],
    4: [((1, "none", "none", "fp32"), (3, "cpu", "cpu", "fp32"))],
}


def load_across_stages(rank, world, pairs, root):
    out = {}
    for saved_case, case in pairs:
        engine = build(case, world, root, seed=1)
        ckpt = os.path.join(root, "ckpt2", case_id(saved_case))
        if saved_case[0] == 0:
            try:
                engine.load_checkpoint(ckpt)
                out[saved_case, case] = "loaded"
            except ValueError as exc:  # refused before anything was overwritten
                _, client = engine.load_checkpoint(ckpt, load_optimizer_states=False)
                out[saved_case, case] = (str(exc), engine.global_steps, client["resume_at"])
        else:
            _, client = engine.load_checkpoint(ckpt)
            assert client["resume_at"] == K and engine.global_steps == K, client
            out[saved_case, case] = train(engine, rank, world, K, K)
        engine.destroy()
    return out


@pytest.mark.parametrize(
    "world", [w if w < 4 else pytest.param(w, marks=pytest.mark.slow) for w in sorted(ACROSS)]
)
def test_a_checkpoint_loads_at_another_zero_stage(saved, world):
    root, two, _ = saved
    resumed = run_ranks(load_across_stages, world, ACROSS[world], root, timeout=600)[0]
    for saved_case, case in ACROSS[world]:
        got = resumed[saved_case, case]
        if saved_case[0] == 0:
            message, steps, resume_at = got
            assert "saved at ZeRO stage 0 and this run is stage 2" in message, message
            assert "load_optimizer_states=False" in message and (steps, resume_at) == (K, K)
            continue
        want = torch.tensor(two[saved_case][1])
        # Stages and world sizes differ only in the order of the gradient sums.
        assert torch.allclose(torch.tensor(got), want, rtol=1e-4, atol=0), (saved_case, got)
