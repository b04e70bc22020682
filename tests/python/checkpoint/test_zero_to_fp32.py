"""zero_to_fp32 (issue 13): the whole fp32 weights of a ZeRO checkpoint, compared with the
weights the engine held when it saved (gathered on rank 0); the output loads into the plain
model with strict=True; the `zerostream zero-to-fp32` command writes .bin, .safetensors and
sharded outputs; the copy of the script left next to the checkpoint runs where zerostream
cannot be imported; and DeepSpeed's own zero_to_fp32 reads zerostream's checkpoint into the
same tensors (where DeepSpeed is installed, in scripts/bench.sh's environment).
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from ckpt_run import build, train  # also puts tests/python/zero on sys.path

from equal import same_tensors
from multirank import run_ranks
from prerequisites import require_deepspeed_python
from tiny_gpt import TinyGPT

REPO = pathlib.Path(__file__).resolve().parents[3]
CASES = [(2, "cpu", "none", "fp32"), (3, "none", "none", "fp32"), (3, "nvme", "nvme", "fp32")]
FROZEN = ("pos.weight",)


def save(rank, world, case, root):
    import zerostream

    engine = build(case, world, root, freeze=FROZEN)
    train(engine, rank, world, 0, 2)
    engine.save_checkpoint(os.path.join(root, "ckpt"))
    params = [p for _, p in engine.module.named_parameters()]
    with zerostream.zero.GatheredParameters(params):
        whole = {k: v.detach().clone().float() for k, v in engine.module.state_dict().items()}
    engine.destroy()
    return whole


def plain_model() -> torch.nn.Module:
    return TinyGPT()


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for case in CASES:
        root = str(tmp_path_factory.mktemp("z2f"))
        out[case] = os.path.join(root, "ckpt"), run_ranks(save, 2, case, root, timeout=300)[0]
    return out


@pytest.fixture(scope="module")
def checkpoint(checkpoints):
    """The stage-3 one, for the tests of the command line tools."""
    return checkpoints[CASES[1]]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_the_fp32_weights_are_the_ones_the_engine_held(checkpoints, case):
    from zerostream.checkpoint import get_fp32_state_dict_from_zero_checkpoint

    ckpt, whole = checkpoints[case]
    state = get_fp32_state_dict_from_zero_checkpoint(ckpt)
    assert set(state) == set(whole)  # tied head included, frozen params included
    for name, value in whole.items():
        assert torch.equal(state[name], value), name
    assert state["head.weight"].data_ptr() == state["tok.weight"].data_ptr()
    model = plain_model()
    model.load_state_dict(state, strict=True)
    without = get_fp32_state_dict_from_zero_checkpoint(ckpt, exclude_frozen_parameters=True)
    assert set(state) - set(without) == set(FROZEN)


@pytest.mark.slow  # CI's 25 minutes: the weights themselves are checked in the default tier
def test_the_command_writes_bin_safetensors_and_shards(checkpoint, tmp_path):
    from safetensors.torch import load_file

    ckpt, whole = checkpoint
    cli = [sys.executable, "-m", "zerostream.cli", "zero-to-fp32", ckpt]
    subprocess.run(cli + [str(tmp_path / "bin")], check=True, capture_output=True)
    state = torch.load(tmp_path / "bin" / "pytorch_model.bin", weights_only=True)
    plain_model().load_state_dict(state, strict=True)
    subprocess.run(cli + [str(tmp_path / "st"), "--safetensors"], check=True, capture_output=True)
    st = load_file(str(tmp_path / "st" / "model.safetensors"))
    assert same_tensors(st, whole)
    subprocess.run(
        cli + [str(tmp_path / "sh"), "--max-shard-size", "20KB"], check=True, capture_output=True
    )
    index = json.loads((tmp_path / "sh" / "pytorch_model.bin.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and set(index["weight_map"]) == set(whole)
    merged = {}
    for name in shards:
        merged.update(torch.load(tmp_path / "sh" / name, weights_only=True))
    assert same_tensors(merged, whole)
    bad = subprocess.run(cli[:-1] + [str(tmp_path / "nope"), "x"], capture_output=True, text=True)
    assert bad.returncode == 2 and "does not exist" in bad.stderr


def test_the_script_left_beside_the_checkpoint_needs_no_zerostream(checkpoint, tmp_path):
    ckpt, whole = checkpoint
    script = os.path.join(ckpt, "zero_to_fp32.py")
    blocked = (
        "import runpy, sys; sys.modules['zerostream'] = None; "
        f"sys.argv = ['zero_to_fp32.py', {ckpt!r}, {str(tmp_path)!r}]; "
        f"runpy.run_path({script!r}, run_name='__main__')"
    )
    subprocess.run([sys.executable, "-c", blocked], check=True, capture_output=True)
    state = torch.load(tmp_path / "pytorch_model.bin", weights_only=True)
    assert same_tensors(state, whole)


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_deepspeeds_zero_to_fp32_reads_a_zerostream_checkpoint(checkpoints, case, tmp_path):
    python = require_deepspeed_python()
    ckpt, whole = checkpoints[case]
    code = (
        "import sys, torch; from deepspeed.utils.zero_to_fp32 import "
        "get_fp32_state_dict_from_zero_checkpoint as f; "
        f"torch.save(dict(f({ckpt!r})), {str(tmp_path / 'ds.pt')!r})"
    )
    run = subprocess.run([python, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    state = torch.load(tmp_path / "ds.pt", weights_only=True)
    assert set(state) == set(whole)
    for name, value in whole.items():
        assert torch.equal(state[name].float(), value), name
