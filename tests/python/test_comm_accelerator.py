"""comm (launcher environments, Gloo fallbacks, rank-prefixed errors), accelerator, zero API."""

import os
import subprocess
import sys

import pytest
import torch

from multirank import run_ranks


def _env_probe(env: dict) -> dict:
    """Runs _env_from_launchers over a clean copy of the environment plus `env` and gives
    os.environ back as it was (in-process: a child per probe cost 3 s of torch import)."""
    from zerostream.comm import _env_from_launchers

    saved = dict(os.environ)
    try:
        for k in list(os.environ):
            if k.startswith(
                ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "SLURM_", "OMPI_", "PMI_")
            ):
                del os.environ[k]
        os.environ.update(env)
        _env_from_launchers(29500)
        return {
            k: os.environ.get(k)
            for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
        }
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_launcher_environments_are_understood():
    # A plain single process rendezvous in-process (see the port test below): no MASTER_*.
    assert _env_probe({}) == {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": None,
        "MASTER_PORT": None,
    }
    ompi = _env_probe(
        {
            "OMPI_COMM_WORLD_RANK": "3",
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "MASTER_ADDR": "10.0.0.1",
        }
    )
    assert ompi == {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_RANK": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
    }
    slurm = _env_probe(
        {
            "SLURM_PROCID": "1",
            "SLURM_NTASKS": "2",
            "SLURM_LOCALID": "1",
            "SLURM_LAUNCH_NODE_IPADDR": "192.0.2.7",
        }
    )
    assert slurm["RANK"] == "1" and slurm["MASTER_ADDR"] == "192.0.2.7"
    torchrun = _env_probe(
        {
            "RANK": "1",
            "WORLD_SIZE": "2",
            "LOCAL_RANK": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "1234",
        }
    )
    assert torchrun["MASTER_PORT"] == "1234"


def collectives_worker(rank, world):
    from zerostream import comm

    comm.init_distributed()
    x = torch.arange(world * 3, dtype=torch.float32) * (rank + 1)
    out = torch.empty(3)
    comm.reduce_scatter_tensor(out, x.clone())
    gathered = torch.empty(world * 2)
    comm.all_gather_into_tensor(gathered, torch.full((2,), float(rank)))
    flat = torch.zeros(world * 2)  # in place: the input is this rank's chunk of the output
    flat[rank * 2 : (rank + 1) * 2] = rank + 10
    comm.all_gather_into_tensor(flat, flat[rank * 2 : (rank + 1) * 2])
    return out, gathered, flat, comm.get_backend(), comm.get_rank(), comm.get_world_size()


@pytest.mark.multirank
def test_gloo_fallbacks_compute_what_the_collectives_define():
    world = 3
    results = run_ranks(collectives_worker, world)
    total = sum(r + 1 for r in range(world))
    full = torch.arange(world * 3, dtype=torch.float32) * total
    for rank, (out, gathered, flat, backend, r, w) in enumerate(results):
        assert backend == "gloo" and r == rank and w == world
        torch.testing.assert_close(out, full[rank * 3 : (rank + 1) * 3])
        torch.testing.assert_close(gathered, torch.tensor([0.0, 0.0, 1.0, 1.0, 2.0, 2.0]))
        torch.testing.assert_close(flat, torch.tensor([10.0, 10.0, 11.0, 11.0, 12.0, 12.0]))


def test_accelerator_on_this_machine():
    from zerostream.accelerator import get_accelerator

    acc = get_accelerator()
    if torch.cuda.is_available():
        assert acc.device_name() == "cuda" and acc.communication_backend_name() == "nccl"
    else:
        assert acc.device_name() == "cpu" and acc.current_device_name() == "cpu"
        assert acc.device_name(1) == "cpu"  # DeepSpeed's CPU accelerator: no index
        # torch.cpu.current_device()'s answer: placing by it gives a host tensor (0 is CUDA 0).
        assert torch.tensor(1, device=acc.current_device()).device.type == "cpu"
        assert acc.supported_dtypes()[:2] == [torch.float32, torch.bfloat16]
        assert (torch.float16 in acc.supported_dtypes()) == acc.is_fp16_supported()
        state = acc.get_rng_state()  # saved and restored around a recomputation
        drawn = torch.rand(3)
        acc.set_rng_state(state)
        assert torch.equal(torch.rand(3), drawn) and acc.default_generator(0) is not None
        assert acc.communication_backend_name() == "gloo"
        assert acc.is_synchronized_device() and acc.is_bf16_supported()
        t = torch.ones(3)
        assert acc.pin_memory(t) is t
    assert acc.device_count() >= 1


def test_deepspeeds_accelerator_classes_select_zerostreams():
    from deepspeed.accelerator import get_accelerator, set_accelerator
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

    before = get_accelerator()
    try:
        set_accelerator(CPU_Accelerator())
        acc = get_accelerator()
        assert isinstance(acc, CPU_Accelerator) and acc.device_name() == "cpu"
        assert acc.communication_backend_name() == "gloo"
        cuda = CUDA_Accelerator()  # made without a GPU too; used only where one is
        assert cuda.device_name() == "cuda" and cuda.communication_backend_name() == "nccl"
    finally:
        set_accelerator(before)


def test_bad_accelerator_override_names_the_choices():
    code = "import zerostream; zerostream.get_accelerator()"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "DS_ACCELERATOR": "tpu"},
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0
    assert 'expected one of "cpu", "cuda"; got \'tpu\'' in proc.stderr


def test_zero_api_on_params_that_are_not_partitioned():
    import zerostream

    with zerostream.zero.Init(enabled=False):
        model = torch.nn.Linear(2, 2)
    with zerostream.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
        model.weight.data.fill_(1.0)  # plain params: a no-op context, edits stay
    assert float(model.weight.detach().sum()) == 4.0
    with pytest.raises(NotImplementedError, match="not supported"):
        zerostream.zero.Init(no_such_argument=1)
    zerostream.zero.register_external_parameter(model, model.weight)
    with pytest.raises(RuntimeError, match="torch.nn.Parameter"):
        zerostream.zero.register_external_parameter(model, torch.ones(1))


_GLOO_THREADS_AFTER_EXIT_HOOK = """
import os, torch
from zerostream import comm

def gloo_threads():
    names = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as f:
            names.append(f.read().strip())
    return sum(n.startswith("pt_gloo") for n in names)

comm.init_distributed()
assert comm.get_backend() == "gloo"
before = gloo_threads()
torch.optim.Adam(torch.nn.Linear(2, 2).parameters())  # imports torch._dynamo, as a run does
comm.all_reduce(torch.ones(2))
comm._destroy_at_exit()
print(before, gloo_threads())
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc")
def test_group_destroyed_at_exit_takes_its_backend_threads_with_it():
    # Note [A process group that outlives its destruction]: Gloo threads still running at
    # interpreter finalization could abort a finished run (SIGABRT, exit 134).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE"))}
    env.pop("MASTER_PORT", None)
    out = subprocess.run(
        [sys.executable, "-c", _GLOO_THREADS_AFTER_EXIT_HOOK],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    before, after = map(int, out.stdout.split())
    assert before > 0  # the check sees Gloo's threads at all
    assert after == 0


def test_a_single_process_with_only_one_master_variable_set_still_starts():
    # A MASTER_PORT (or MASTER_ADDR) left in a shell is no rendezvous request: torch's env://
    # would stop at the missing other one; the process rendezvous in-process instead.
    code = (
        "from zerostream import comm\n"
        "comm.init_distributed()\n"
        "print(comm.get_rank(), comm.get_world_size())\n"
    )
    for leftover in (
        {"MASTER_PORT": "1"},
        {"MASTER_ADDR": "192.0.2.1"},
        {"RANK": "0", "WORLD_SIZE": "1", "MASTER_PORT": "1"},  # a one-process world
    ):
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_"))
        }
        env.update(leftover)
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, (leftover, out.stderr[-2000:])
        assert out.stdout.split() == ["0", "1"]
