"""A job over several nodes, end to end on this machine (issue 32 item 1): two `zerostream run
--num_nodes 2 --node_rank {0,1} --nproc 2` processes (each "node" with its own swap folder
and temporary folder, as on separate hosts; the checkpoint folder is the job's shared one)
train ZeRO-3 with parameters and optimizer on NVMe, save, and go on (the uninterrupted run).
The checkpoint then resumes on 1 node x 2 ranks and on 2 nodes x 1 rank, whose losses must
continue the uninterrupted run's (test_resume.py's resharding tolerance). Every agent exits 0
without a traceback, also the one whose store host (node 0) leaves first.

The same job checks `zerostream estimate`'s collectives (issue 32 item 5): the bytes per
step of each kind the planner predicts for this model, config and 2 x 2 layout (links.py)
must be those every rank's telemetry counted once the prefetch plan is followed
(python -m zerostream.bench.cluster_check compares the seconds too:
benchmarks/estimate.md)."""

import json
import pathlib
import subprocess
import sys

import multinode_train
import pytest
import torch
from launcher_run import LAUNCH_TIMEOUT_S, clean_env

from zerostream.bench import cluster_check
from zerostream.bench.validate import predict_cpu_run
from zerostream.estimate.plan import Option
from zerostream.launcher.ports import free_port as _free_port

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = str(HERE / "multinode_train.py")


def _job(tmp_path: pathlib.Path, nodes: int, nproc: int, mode: str) -> list:
    """Runs one job of `nodes` agents to the end; the agents' (returncode, stderr)."""
    port, agents = _free_port(), []
    for node in range(nodes):
        home = tmp_path / f"{mode}-{nodes}x{nproc}-node{node}"
        (home / "tmp").mkdir(parents=True)
        args = ["--nproc", str(nproc), "--no_local_rank"]
        if nodes > 1:
            args += ["--num_nodes", str(nodes), "--node_rank", str(node)]
            args += ["--master_addr", "127.0.0.1", "--master_port", str(port)]
        script = [SCRIPT, str(tmp_path), str(home / "nvme"), str(tmp_path / "ckpt"), mode]
        agents.append(
            subprocess.Popen(
                [sys.executable, "-m", "zerostream.launcher", *args, *script],
                cwd=str(home),
                env=clean_env(TMPDIR=str(home / "tmp")),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    results = []
    try:
        for agent in agents:
            _, err = agent.communicate(timeout=LAUNCH_TIMEOUT_S)
            results.append((agent.returncode, err))
    finally:  # a hung node: the others must not outlive the test
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.communicate()
    for node, (code, err) in enumerate(results):
        assert code == 0, f"node {node}: {err[-3000:]}"
        assert "Traceback" not in err, f"node {node} logged a traceback:\n{err[-3000:]}"
    return results


def _records(tmp_path: pathlib.Path, mode: str, world: int) -> list:
    return [json.loads((tmp_path / f"{mode}-rank{r}.json").read_text()) for r in range(world)]


@pytest.mark.multirank
@pytest.mark.timeout(300)
def test_two_nodes_train_save_and_resume_on_other_shapes(tmp_path):
    _job(tmp_path, nodes=2, nproc=2, mode="first")
    first = _records(tmp_path, "first", 4)
    # Each rank knows its node, and swapped to its node's own folder: its optimizer state
    # and its param shards are bytes allocated on that disk, and no other node's are there.
    assert [r["node"] for r in first] == [0, 0, 1, 1]
    for rank, rec in enumerate(first):
        node = rank // 2
        mine = {path: size for path, size in rec["swap"] if f"/rank{rank}/" in path}
        for kind in ("optimizer", "params"):
            assert sum(v for p, v in mine.items() if f"/{kind}/swap_" in p) > 0, (rank, mine)
        others = {p for p, _ in rec["swap"]} - set(mine)
        assert all(f"/rank{2 * node + 1 - rank % 2}/" in p for p in others), (rank, others)
    want = torch.tensor(first[0]["losses"][len(first[0]["losses"]) // 2 :])

    # The planner's collective bytes are the telemetry's, on every rank, from the step on
    # which the prefetch plan is followed (cluster_check.WARMUP); before it, more.
    pred = predict_cpu_run(
        multinode_train.SHAPE,
        multinode_train.job_config(4, "-"),
        Option(3, "nvme", "nvme"),
        nodes=2,
        nproc=2,
    )
    for rank, rec in enumerate(first):
        planned = rec["collectives"][cluster_check.WARMUP :]
        for kind in ("all_gather", "reduce_scatter"):
            assert {s[kind] for s in planned} == {pred.traffic[kind]}, (rank, kind, planned)
        assert rec["collectives"][0]["all_gather"] > pred.traffic["all_gather"]

    for nodes, nproc in ((1, 2), (2, 1)):
        mode = "resume"
        _job(tmp_path, nodes=nodes, nproc=nproc, mode=mode)
        got = _records(tmp_path, mode, nodes * nproc)
        assert [r["world"] for r in got] == [nodes * nproc] * len(got)
        assert [r["node"] for r in got] == [r // nproc for r in range(nodes * nproc)]
        resumed = torch.tensor(got[0]["losses"])
        assert torch.allclose(resumed, want, rtol=1e-4, atol=0), (nodes, nproc, resumed, want)
        for path in tmp_path.glob("resume-rank*.json"):
            path.unlink()


def test_the_exit_barrier_losing_the_store_is_not_logged_but_a_timeout_is(caplog):
    """The race of Note [The store's host leaves first], without waiting for it to happen."""
    import logging

    import torch.distributed as dist

    from zerostream.launcher import local

    log = logging.getLogger("torch.distributed.elastic.agent.server.api")
    caplog.set_level(logging.ERROR, logger=log.name)
    with local._store_host_may_leave_first():
        for exc in (dist.DistNetworkError("Failed to recv"), dist.DistStoreError("timeout")):
            try:
                raise exc
            except dist.DistError:
                log.exception("Error waiting on exit barrier. Elapsed: %s seconds", 0.1)
    assert [r.exc_info[0] for r in caplog.records] == [dist.DistStoreError]
    log.exception("Error waiting on exit barrier")  # outside the launch: not filtered
    assert len(caplog.records) == 2


def test_the_store_port_is_free_and_outside_the_range_connections_take_ports_from():
    """A port the kernel may give to any outgoing connection could be taken between the pick
    and the store's bind ("address already in use" on one run in many)."""
    import socket

    from zerostream.launcher import ports

    low = ports._ephemeral_low()
    for _ in range(20):
        port = _free_port()
        assert 1024 <= port < low, (port, low)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free: binding it works
