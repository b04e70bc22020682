"""`zerostream run`'s command line: what goes to the launcher and what to the script, the
flag combinations refused (each error names its flags), and where a run goes, without
starting any rank."""

from __future__ import annotations

import argparse
import re
import socket

import pytest

from zerostream import launcher
from zerostream.launcher import plan
from zerostream.launcher.local import NodeRun


def _parse(argv):
    parser = argparse.ArgumentParser(prog="zerostream")
    sub = parser.add_subparsers(dest="command", required=True)
    launcher.add_parser(sub)
    return parser.parse_args(["run", *argv])


def test_flags_after_the_script_are_the_scripts():
    args = _parse(["--nproc", "3", "-H", "hf", "train.py", "--nproc", "5", "--local_rank=7", "-H"])
    assert args.num_gpus == 3 and args.hostfile == "hf"
    assert args.user_script == "train.py"
    assert args.user_args == ["--nproc", "5", "--local_rank=7", "-H"]
    assert args.func is launcher.run


@pytest.mark.parametrize(
    "alias", ["--num_gpus", "--num_accelerators", "--nproc", "--nproc_per_node"]
)
def test_process_count_aliases(alias):
    assert _parse([alias, "4", "t.py"]).num_gpus == 4


def test_launcher_flags_are_not_abbreviated():
    with pytest.raises(SystemExit):
        _parse(["--master", "x", "t.py"])


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-i", "localhost:0", "-e", "localhost:1"], "--include and --exclude are mutually"),
        (["--include", "localhost:0", "--num_gpus", "1"], "--include cannot be combined with"),
        (["--exclude", "localhost:0", "--num_nodes", "1"], "--exclude cannot be combined with"),
        (["--module", "--no_python"], "--module and --no_python cannot be used together"),
        (["--num_gpus", "0"], "--num_gpus 0: expected a positive count"),
        (["--master_port", "70000"], "--master_port 70000: expected a TCP port"),
        (["--no_ssh"], "--no_ssh runs one node's share: give its --node_rank"),
        (["--launcher", "ssh", "--node_rank", "0"], "--launcher ssh starts every node from"),
        (["--bind_core_list", "0-3"], "--bind_core_list needs --bind_cores_to_rank"),
        (["--launcher", "mpi"], "--launcher mpi: expected one of local, ssh, pdsh, openmpi,"),
        (["--launcher", "OpenMPI", "--node_rank", "0"], "--launcher openmpi starts every node"),
        (["--world_info", "e30="], "--world_info lists the job's nodes: give this node's"),
        (["--world_info", "e30=", "--node_rank", "0", "--num_gpus", "2"], "--world_info already"),
        (["--num_nodes", "2"], "--num_nodes 2 without --hostfile: give this node's --node_rank"),
        (["--hostfile", "missing_hostfile"], "--hostfile missing_hostfile: no such file"),
        (["--include", "localhost:99"], "--include: host 'localhost' has no slot 99"),
        (["--include", "worker-0"], "--include: host 'worker-0' is not among the hosts"),
        ([], "user script 'no_such_script.py': no such file"),
    ],
)
def test_refused_before_anything_starts(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert launcher.main([*argv, "no_such_script.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"zerostream run: {message}"), err


def _plan(tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    return plan.plan(_parse([*argv, "train.py"]))


def test_default_is_one_rank_per_gpu_or_two_on_a_free_port(tmp_path, monkeypatch):
    import torch

    node, program = _plan(tmp_path, monkeypatch, [])
    assert node.nproc == (torch.cuda.device_count() or 2)
    assert (node.nnodes, node.node_rank, node.master_port) == (1, 0, None)
    assert program.kind == "script" and program.local_rank_arg


def test_hostfile_of_this_machine_runs_here(tmp_path, monkeypatch):
    for name in ("localhost", socket.gethostname()):
        (tmp_path / "hf").write_text(f"# only me\n{name} slots=3\n")
        node, _ = _plan(tmp_path, monkeypatch, ["-H", "hf", "--exclude", f"{name}:1"])
        assert isinstance(node, NodeRun)
        assert (node.nnodes, node.nproc, node.master_addr) == (1, 2, "127.0.0.1")


def test_node_rank_with_a_hostfile_runs_that_nodes_share(tmp_path, monkeypatch):
    (tmp_path / "hf").write_text("worker-0 slots=2\nworker-1 slots=4\n")
    node, _ = _plan(tmp_path, monkeypatch, ["-H", "hf", "--node_rank", "1"])
    assert (node.nnodes, node.node_rank, node.nproc) == (2, 1, 4)
    assert (node.master_addr, node.master_port) == ("worker-0", 29500)
    with pytest.raises(ValueError, match=r"--node_rank 2: hf gives 2 node\(s\)"):
        _plan(tmp_path, monkeypatch, ["-H", "hf", "--node_rank", "2"])


def test_included_gpus_become_the_ranks_visible_devices(tmp_path, monkeypatch):
    # A 4-GPU machine whose GPUs 4-7 are the visible ones: slot i is the i-th visible GPU.
    monkeypatch.setattr(plan, "_gpu_count", lambda: 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    node, _ = _plan(tmp_path, monkeypatch, ["--include", "localhost:0,2"])
    assert node.nproc == 2 and node.env == {"CUDA_VISIBLE_DEVICES": "4,6"}
    node, _ = _plan(tmp_path, monkeypatch, ["--exclude", "localhost:0"])
    assert node.nproc == 3 and node.env == {"CUDA_VISIBLE_DEVICES": "5,6,7"}
    node, _ = _plan(tmp_path, monkeypatch, [])  # all of them: left as they are
    assert node.nproc == 4 and node.env is None


def test_elastic_membership_flags_are_refused_by_name_and_restarts_checked():
    from zerostream.launcher import command

    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    for flags, want in (
        (["--elastic_training"], "--elastic_training: a job whose node count changes"),
        (["--min_elastic_nodes", "1"], "--min_elastic_nodes: a job whose node count changes"),
        (["--max_restarts", "-1"], "--max_restarts -1: expected 0 or more"),
    ):
        args = parser.parse_args([*flags, "train.py"])
        with pytest.raises((ValueError, NotImplementedError), match=re.escape(want)):
            plan.check_flags(args)
    args = parser.parse_args(["--max_restarts", "3", "train.py"])
    plan.check_flags(args)
    assert "--max_restarts=3" in plan.forwarded_flags(args)  # each node's command keeps it
