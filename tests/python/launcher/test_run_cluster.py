"""`--launcher pdsh|openmpi|mpich|impi|slurm|mvapich`: the command line each cluster launcher
gets (cluster.py), what it refuses (each error names the host, slot or flag), and `zerostream
run` starting it. No cluster program exists here: the run tests put a stand-in first on PATH
that records its arguments; the pdsh one runs each node's command on this machine, so two
real agents meet through the world info and their ranks all-reduce over Gloo."""

from __future__ import annotations

import dataclasses
import json
import shlex
import stat
import sys

import pytest
from launcher_run import HERE, launch, records

from zerostream import launcher
from zerostream.launcher import cluster, resources
from zerostream.launcher.local import Program
from zerostream.launcher.ports import free_port as _free_port
from zerostream.launcher.resources import Node

TWO_BY_TWO = (Node("worker-0", (0, 1)), Node("worker-1", (0, 1)))
RANK_ARGV = ["/py", "-u", "train.py", "--lr", "0.1 0.2"]


def _job(**changes) -> cluster.ClusterJob:
    job = cluster.ClusterJob(
        nodes=TWO_BY_TWO,
        master_addr="10.0.0.1",
        master_port=29600,
        program=Program("train.py", ("--lr", "0.1 0.2"), "script", True),
        exports={"NCCL_DEBUG": "INFO"},
        cwd="/work dir",
        python="/py",
    )
    return dataclasses.replace(job, **changes)


def test_pdsh_runs_one_agent_per_node_which_finds_its_share_by_pdsh_node_rank():
    cmd = cluster.command("pdsh", _job(ssh_port=2222, venv_script="/env/bin/activate"), {})
    assert cmd.argv[:6] == ("pdsh", "-S", "-f", "1024", "-w", "worker-0,worker-1")
    assert len(cmd.argv) == 7
    source, rest = cmd.argv[6].split(" && ", 1)
    assert source == ". /env/bin/activate"
    words = shlex.split(rest)
    assert words[:8] == ["cd", "/work dir", "&&", "NCCL_DEBUG=INFO", "/py", "-u", "-m"] + [
        "zerostream.launcher"
    ]
    flag, _, world = words[8].partition("=")
    assert flag == "--world_info"
    assert words[9:] == [
        "--node_rank=%n",
        "--master_addr=10.0.0.1",
        "--master_port=29600",
        "train.py",
        "--lr",
        "0.1 0.2",
    ]
    assert resources.decode_world_info(world) == list(TWO_BY_TWO)
    assert cmd.env == {"PDSH_RCMD_TYPE": "ssh", "PDSH_SSH_ARGS_APPEND": "-p 2222"}
    # the stop command reaches the same hosts and matches this job's agents only
    assert cmd.stop_argv[:6] == cmd.argv[:6]
    assert cmd.stop_argv[6] == (
        f"pkill -f -- 'zerostream[.]launcher --world_info={world} --node_rank=[0-9]+ "
        f"--master_addr=10[.]0[.]0[.]1 --master_port=29600'"
    )


def test_pdsh_forwards_the_agent_flags_and_keeps_ssh_options_given():
    job = _job(
        bind_cores_to_rank=True,
        bind_core_list="0-7",
        max_restarts=2,
        rank_log_dir="logs",
        program=Program("pkg.train", (), "module", False),
    )
    cmd = cluster.command("pdsh", job, {"PDSH_SSH_ARGS_APPEND": "-i key"})
    words = shlex.split(cmd.argv[-1])
    assert words[-7:] == [
        "--bind_cores_to_rank",
        "--bind_core_list=0-7",
        "--enable_each_rank_log=logs",
        "--max_restarts=2",
        "--no_local_rank",
        "--module",
        "pkg.train",
    ]
    assert "PDSH_SSH_ARGS_APPEND" not in cmd.env  # no --ssh_port: the user's options stay
    cmd = cluster.command(
        "pdsh", dataclasses.replace(job, ssh_port=22), {"PDSH_SSH_ARGS_APPEND": "-i key"}
    )
    assert cmd.env["PDSH_SSH_ARGS_APPEND"] == "-i key -p 22"


def test_openmpi_lists_hosts_with_their_slots_and_exports_where_rank_0_is():
    nodes = (Node("worker-0", (0, 1, 2)), Node("worker-1", (0,)))  # Open MPI takes unequal counts
    cmd = cluster.command("openmpi", _job(nodes=nodes), {})
    assert list(cmd.argv) == [
        "mpirun",
        "-n",
        "4",
        "-H",
        "worker-0:3,worker-1:1",
        "--mca",
        "btl",
        "^openib",
        "--mca",
        "btl_tcp_if_include",
        "eth0",
        "-x",
        "UCX_TLS=tcp",
        "-x",
        "NCCL_DEBUG=INFO",
        "-x",
        "MASTER_ADDR=10.0.0.1",
        "-x",
        "MASTER_PORT=29600",
        *RANK_ARGV,
    ]
    assert cmd.env == {} and cmd.stop_argv is None


@pytest.mark.parametrize("flag", ["-mca", "--mca"])
def test_openmpi_interface_given_replaces_the_default(flag):
    job = _job(launcher_args=f"{flag} btl_tcp_if_include eth1", exports={"UCX_TLS": "rc"})
    argv = cluster.command("openmpi", job, {}).argv
    assert "eth0" not in argv
    assert argv[8:11] == (flag, "btl_tcp_if_include", "eth1")
    assert "UCX_TLS=rc" in argv and "UCX_TLS=tcp" not in argv  # an export wins over a default


def test_mpich_and_mvapich_place_the_same_ranks_per_node_with_hydra_variables():
    hydra_env = ["-genv", "NCCL_DEBUG", "INFO", "-genv", "MASTER_ADDR", "10.0.0.1"]
    hydra_env += ["-genv", "MASTER_PORT", "29600", "-genv", "WORLD_SIZE", "4"]
    hydra_env += ["-genv", "LOCAL_SIZE", "2"]
    mpich = cluster.command("mpich", _job(launcher_args="-bootstrap ssh"), {})
    assert list(mpich.argv) == [
        "mpirun",
        "-n",
        "4",
        "-ppn",
        "2",
        "-hosts",
        "worker-0,worker-1",
        "-bootstrap",
        "ssh",
        *hydra_env,
        *RANK_ARGV,
    ]
    mvapich = list(cluster.command("mvapich", _job(cuda=True), {}).argv)
    assert mvapich[:7] == ["mpirun", "-np", "4", "-ppn", "2", "-hosts", "worker-0,worker-1"]
    settings = [a for a in mvapich if a.startswith("MV2_")]
    assert settings == [
        "MV2_SMP_USE_CMA",
        "MV2_DEBUG_SHOW_BACKTRACE",
        "MV2_SUPPORT_DL",
        "MV2_ENABLE_AFFINITY",
        "MV2_INTER_ALLGATHER_TUNING",
        "MV2_CUDA_USE_NAIVE",
        "MV2_USE_CUDA",
    ]
    assert mvapich[-len(hydra_env) - len(RANK_ARGV) :] == hydra_env + RANK_ARGV


def test_slurm_names_the_nodes_and_exports_through_srun():
    cmd = cluster.command("slurm", _job(slurm_comment="nightly", launcher_args="-p gpu"), {})
    assert list(cmd.argv) == [
        "srun",
        "-n",
        "4",
        "--nodes",
        "2",
        "--nodelist",
        "worker-0,worker-1",
        "--ntasks-per-node",
        "2",
        "-p",
        "gpu",
        "--comment",
        "nightly",
        "--export=ALL,NCCL_DEBUG=INFO,MASTER_ADDR=10.0.0.1,MASTER_PORT=29600",
        *RANK_ARGV,
    ]
    with pytest.raises(ValueError, match=r"--launcher slurm: NCCL_IB_HCA='mlx5_0,mlx5_1' holds"):
        cluster.command("slurm", _job(exports={"NCCL_IB_HCA": "mlx5_0,mlx5_1"}), {})


def test_impi_without_binding_is_one_segment_and_with_it_one_per_rank_behind_numactl():
    plain = list(cluster.command("impi", _job(), {}).argv)
    assert plain[:5] == ["mpirun", "-ppn", "2", "-hosts", "worker-0,worker-1"]
    assert plain[-10:] == ["-genv", "I_MPI_PIN", "0", "-n", "4", *RANK_ARGV]
    assert "numactl" not in plain
    job = _job(bind_cores_to_rank=True, bind_core_list="8-15", numa_nodes={0: range(8, 12)})
    bound = list(cluster.command("impi", job, {}).argv)
    assert bound[bound.index("OMP_NUM_THREADS") + 1] == "4"
    segments = " ".join(bound[bound.index("OMP_NUM_THREADS") + 2 :]).split(" : ")
    rank_line = " ".join(RANK_ARGV)
    assert segments == [
        f"-n 1 -env RANK 0 -env LOCAL_RANK 0 numactl -m 0 -C 8-11 {rank_line}",
        f"-n 1 -env RANK 1 -env LOCAL_RANK 1 numactl -C 12-15 {rank_line}",  # outside node 0
        f"-n 1 -env RANK 2 -env LOCAL_RANK 0 numactl -m 0 -C 8-11 {rank_line}",
        f"-n 1 -env RANK 3 -env LOCAL_RANK 1 numactl -C 12-15 {rank_line}",
    ]
    with pytest.raises(ValueError, match=r"KMP_AFFINITY='compact' is set"):
        cluster.command("impi", job, {"KMP_AFFINITY": "compact"})


def test_a_module_or_a_program_is_what_each_rank_runs():
    module = _job(program=Program("pkg.train", ("-x",), "module", True))
    assert cluster.command("openmpi", module, {}).argv[-5:] == (
        "/py",
        "-u",
        "-m",
        "pkg.train",
        "-x",
    )
    program = _job(program=Program("./train.sh", ("-x",), "exec", True))
    assert cluster.command("mpich", program, {}).argv[-4:] == (
        "LOCAL_SIZE",
        "2",
        "./train.sh",
        "-x",
    )


@pytest.mark.parametrize("launcher", ["openmpi", "mpich", "impi", "slurm", "mvapich"])
def test_ranks_started_by_the_launcher_need_each_nodes_first_slots(launcher):
    nodes = (Node("worker-0", (0, 1)), Node("worker-1", (1, 3)))
    with pytest.raises(ValueError) as err:
        cluster.command(launcher, _job(nodes=nodes), {})
    assert str(err.value).startswith(
        f"--launcher {launcher}: host 'worker-1' would run slots 1,3; {launcher} gives"
    )


@pytest.mark.parametrize("launcher", ["mpich", "impi", "slurm", "mvapich"])
def test_hydra_and_srun_need_the_same_rank_count_on_every_node(launcher):
    nodes = (Node("worker-0", (0, 1)), Node("worker-1", (0,)))
    with pytest.raises(ValueError, match=r"different slot counts \(worker-0: 2, worker-1: 1\)"):
        cluster.command(launcher, _job(nodes=nodes), {})


@pytest.mark.parametrize(
    "change, flag",
    [
        ({"max_restarts": 3}, "--max_restarts 3"),
        ({"rank_log_dir": "logs"}, "--enable_each_rank_log logs"),
        ({"bind_cores_to_rank": True}, "--bind_cores_to_rank"),
    ],
)
def test_what_only_zerostreams_agent_does_is_refused_where_the_mpi_starts_the_ranks(change, flag):
    with pytest.raises(NotImplementedError) as err:
        cluster.command("openmpi", _job(**change), {})
    assert str(err.value).startswith(f"{flag} with --launcher openmpi: openmpi starts the ranks")
    cluster.command("pdsh", _job(**change), {})  # pdsh's agents do it


def test_unknown_launcher_names_the_choices():
    with pytest.raises(ValueError, match=r"--launcher mpi: expected one of pdsh, openmpi, mpich"):
        cluster.command("mpi", _job(), {})


FAKE_LAUNCHER = """#!{python}
# Stand-in for {name}: records its arguments and the variables given to it, exits with 3.
import json, os, sys
with open(os.environ["FAKE_LOG"], "w") as log:
    json.dump({{"argv": sys.argv[1:], "rcmd": os.environ.get("PDSH_RCMD_TYPE")}}, log)
sys.exit(3)
"""


def _stand_in(bin_dir, name: str, text: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_run_starts_the_launcher_and_returns_its_status(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hf").write_text("worker-0 slots=4\nworker-1 slots=4\n")
    _stand_in(
        tmp_path / "bin", "mpirun", FAKE_LAUNCHER.format(python=sys.executable, name="mpirun")
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "log.json"))
    monkeypatch.setenv("PYTHON_EXEC", "/py")
    argv = ["-H", "hf", "--launcher", "OpenMPI", "--num_gpus", "2", "train.py", "--lr", "1"]
    assert launcher.main(argv) == 3
    ran = json.loads((tmp_path / "log.json").read_text())["argv"]
    assert ran[:4] == ["-n", "4", "-H", "worker-0:2,worker-1:2"]
    assert ran[-9:] == ["-x", "MASTER_ADDR=worker-0", "-x", "MASTER_PORT=29500"] + [
        "/py",
        "-u",
        "train.py",
        "--lr",
        "1",
    ]
    assert capsys.readouterr().out.startswith("zerostream run: mpirun -n 4 -H worker-0:2,")


def test_run_without_the_launcher_program_says_so_before_starting(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "hf").write_text("worker-0 slots=2\nworker-1 slots=2\n")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert launcher.main(["-H", "hf", "--launcher", "slurm", "train.py"]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("zerostream run: --launcher slurm: no `srun` on PATH")
    assert captured.out == ""


FAKE_PDSH = """#!{python}
# Stand-in for pdsh: -w's hosts, each node's command run here by sh with %n its index.
import os, subprocess, sys
args = sys.argv[1:]
hosts = args[args.index("-w") + 1].split(",")
line = args[-1]
with open(os.environ["FAKE_LOG"], "w") as log:
    log.write(os.environ["PDSH_RCMD_TYPE"] + " " + ",".join(hosts))
nodes = [subprocess.Popen(["sh", "-c", line.replace("%n", str(i))]) for i in range(len(hosts))]
sys.exit(max(p.wait() for p in nodes))
"""


@pytest.mark.multirank
@pytest.mark.slow  # two agents forming one job, as test_run_nodes.py's ssh case
@pytest.mark.timeout(120)
def test_two_nodes_over_pdsh_form_one_job_from_the_world_info(tmp_path):
    bin_dir = tmp_path / "bin"
    _stand_in(bin_dir, "pdsh", FAKE_PDSH.format(python=sys.executable))
    (tmp_path / "hf").write_text("node-a slots=2\nnode-b slots=3\n")
    port = str(_free_port())
    res = launch(
        ["-H", "hf", "--launcher", "pdsh", "--include", "node-a:0@node-b:0"]
        + ["--master_addr", "127.0.0.1", "--master_port", port]
        + [str(HERE / "probe.py"), "--tag", "x y"],
        tmp_path,
        PATH=f"{bin_dir}:/usr/bin:/bin",
        FAKE_LOG=str(tmp_path / "pdsh.log"),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert (tmp_path / "pdsh.log").read_text() == "ssh node-a,node-b"
    for rank, rec in enumerate(records(tmp_path, 2)):
        assert rec["sum"] == 3.0 and rec["world"] == 2
        env = rec["env"]
        assert (env["RANK"], env["LOCAL_RANK"], env["GROUP_RANK"]) == (str(rank), "0", str(rank))
        assert env["LOCAL_WORLD_SIZE"] == "1" and env["WORLD_SIZE"] == "2"
        assert rec["argv"][1:] == ["--local_rank=0", "--tag", "x y"]
