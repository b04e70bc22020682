"""Jobs over several hosts: the command printed for each node, and the nodes started over
ssh. The ssh test puts a stand-in `ssh` first on PATH that runs the node's command here
(this machine has no sshd), so two real node launchers meet through torch's static
rendezvous and their ranks all-reduce over Gloo."""

from __future__ import annotations

import shlex
import stat
import sys

import pytest
from launcher_run import HERE, launch, records

from zerostream import launcher
from zerostream.launcher.ports import free_port as _free_port

HOSTFILE = "# two GPU boxes\nworker-0 slots=4\nworker-1 slots=4\n"


def _node_lines(out: str):
    return [line for line in out.splitlines() if line.startswith("[node ")]


def _argv_of(line: str):
    """The node's program and arguments: what follows `cd DIR && VAR=... `."""
    words = shlex.split(line.split("] ", 1)[1])
    assert words[:2] == ["cd", words[1]] and words[2] == "&&"
    rest = words[3:]
    env = {}
    while "=" in rest[0] and not rest[0].startswith("/"):
        key, _, value = rest.pop(0).partition("=")
        env[key] = value
    return words[1], env, rest


def test_one_command_per_node_with_its_rank_and_the_first_host_as_master(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hf").write_text(HOSTFILE)
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("UNRELATED_SETTING", "x")
    argv = ["-H", "hf", "--include", "worker-0:0,2@worker-1", "--bind_cores_to_rank"]
    rc = launcher.main([*argv, "--no_local_rank", "train.py", "--lr", "1", "--num_nodes", "9"])
    assert rc == 0
    out = capsys.readouterr().out
    lines = _node_lines(out)
    assert len(lines) == 2
    for rank, (line, host, slots) in enumerate(zip(lines, ["worker-0", "worker-1"], [2, 4])):
        assert line.startswith(f"[node {rank}: {host}] ")
        cwd, env, words = _argv_of(line)
        assert cwd == str(tmp_path)
        assert env["NCCL_DEBUG"] == "INFO" and "UNRELATED_SETTING" not in env
        assert words[:4] == [sys.executable, "-u", "-m", "zerostream.launcher"]
        assert words[4:9] == [
            "--num_nodes=2",
            f"--node_rank={rank}",
            "--master_addr=worker-0",
            "--master_port=29500",
            f"--num_gpus={slots}",
        ]
        assert words[9:] == [
            "--bind_cores_to_rank",
            "--no_local_rank",
            "train.py",
            "--lr",
            "1",
            "--num_nodes",
            "9",
        ]
    # worker-0 runs on two of its four GPUs; worker-1 on all of them
    assert _argv_of(lines[0])[1]["CUDA_VISIBLE_DEVICES"] == "0,2"
    assert "CUDA_VISIBLE_DEVICES" not in _argv_of(lines[1])[1]
    assert "add --launcher ssh" in out


def test_master_address_and_port_given_are_used_by_every_node(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hf").write_text(HOSTFILE)
    argv = ["-H", "hf", "--master_addr", "10.0.0.5", "--master_port", "6000", "--num_gpus", "1"]
    assert launcher.main([*argv, "train.py"]) == 0
    for line in _node_lines(capsys.readouterr().out):
        words = _argv_of(line)[2]
        assert "--master_addr=10.0.0.5" in words and "--master_port=6000" in words
        assert "--num_gpus=1" in words


def test_ssh_launcher_without_ssh_says_so_before_starting_anything(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hf").write_text(HOSTFILE)
    monkeypatch.setenv("PATH", str(tmp_path))  # no ssh here
    assert launcher.main(["-H", "hf", "--launcher", "ssh", "train.py"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("zerostream run: --launcher ssh: no `ssh` program on PATH")
    assert _node_lines(captured.out) == []


FAKE_SSH = """#!{python}
# Stand-in for ssh: options skipped, the host logged, the command run here by sh.
import os, sys
args = sys.argv[1:]
while args[0].startswith("-"):
    if args.pop(0) in ("-o", "-p", "-i", "-l"):
        args.pop(0)
with open(os.environ["FAKE_SSH_LOG"], "a") as log:
    log.write(args[0] + "\\n")
os.execvp("sh", ["sh", "-c", " ".join(args[1:])])
"""


@pytest.mark.multirank
@pytest.mark.slow  # two agents forming one job: test_run_multinode.py's default-tier case
@pytest.mark.timeout(120)
def test_two_nodes_over_ssh_form_one_job(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ssh = bin_dir / "ssh"
    ssh.write_text(FAKE_SSH.format(python=sys.executable))
    ssh.chmod(ssh.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "hf").write_text("node-a slots=1\nnode-b slots=1\n")
    res = launch(
        [
            "-H",
            "hf",
            "--launcher",
            "ssh",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(_free_port()),
            str(HERE / "probe.py"),
            "--tag",
            "x y",
        ],
        tmp_path,
        PATH=f"{bin_dir}:/usr/bin:/bin",
        FAKE_SSH_LOG=str(tmp_path / "ssh.log"),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert sorted((tmp_path / "ssh.log").read_text().split()) == ["node-a", "node-b"]
    assert len(_node_lines(res.stdout)) == 2
    for rank, rec in enumerate(records(tmp_path, 2)):
        assert rec["sum"] == 3.0 and rec["world"] == 2
        env = rec["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["GROUP_RANK"]) == (str(rank), "0", str(rank))
        assert env["CROSS_RANK"] == str(rank) and env["CROSS_SIZE"] == "2"
        assert env["LOCAL_WORLD_SIZE"] == "1" and env["WORLD_SIZE"] == "2"
        assert rec["argv"][1:] == ["--local_rank=0", "--tag", "x y"]
