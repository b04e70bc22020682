"""`zerostream run` on this machine, end to end: real launcher, real ranks through torch's
elastic agent, Gloo on loopback. Each test is one launch (seconds on 2 shared cores)."""

from __future__ import annotations

import os
import shutil
import stat
import time

import pytest
from launcher_run import HERE, launch, pid_alive, records

pytestmark = pytest.mark.multirank


@pytest.mark.timeout(120)
def test_two_ranks_all_reduce_and_get_deepspeed_argv_and_env(tmp_path):
    # Flags after the script are the script's, even ones the launcher also has, and
    # arguments reach it verbatim (elastic would turn "$$" into "$" and fill ${local_rank}).
    user_args = ["--master_port", "1", "--lr=0.1", "a$$b${local_rank}"]
    res = launch(["--nproc", "2", str(HERE / "probe.py"), *user_args], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    ranks = records(tmp_path, 2)
    ports = {r["env"]["MASTER_PORT"] for r in ranks}
    assert len(ports) == 1 and ports != {"29500"}  # one free port for the job, not a fixed one
    for rank, rec in enumerate(ranks):
        assert rec["sum"] == 3.0 and rec["world"] == 2 and rec["rank"] == rank
        assert rec["argv"] == [str(HERE / "probe.py"), f"--local_rank={rank}", *user_args]
        env = rec["env"]
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == env["LOCAL_SIZE"] == "2"
        assert env["CROSS_RANK"] == "0" and env["CROSS_SIZE"] == "1"
        assert env["MASTER_ADDR"]
        assert env["OMP_NUM_THREADS"] is None  # left alone: the CPU optimizer sizes itself
        assert rec["path0"] == str(HERE)  # as `python probe.py` would have it


@pytest.mark.slow  # CI's 25 minutes
@pytest.mark.timeout(120)
def test_module_without_local_rank_and_cores_bound_per_rank(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip(f"needs 2 usable cores to bind 2 ranks; this process may use {cores}")
    shutil.copy(HERE / "probe.py", tmp_path / "zs_launcher_probe.py")
    res = launch(
        [
            "--nproc=2",
            "--bind_cores_to_rank",
            "--no_local_rank",
            "--module",
            "zs_launcher_probe",
            "--flag",
        ],
        tmp_path,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    ranks = records(tmp_path, 2)
    per_rank = len(cores) // 2
    sets = [set(r["cores"]) for r in ranks]
    assert sets[0].isdisjoint(sets[1])
    assert [len(s) for s in sets] == [per_rank, per_rank]
    assert set().union(*sets) <= set(cores)
    for rec in ranks:
        assert rec["env"]["OMP_NUM_THREADS"] == str(per_rank)
        assert rec["argv"][1:] == ["--flag"]  # no --local_rank
        assert rec["argv"][0].endswith("zs_launcher_probe.py")
        assert rec["sum"] == 3.0


@pytest.mark.timeout(120)
def test_rank_that_raises_is_reported_first_and_the_other_is_stopped(tmp_path):
    start = time.monotonic()
    res = launch(["--nproc", "2", str(HERE / "fail_probe.py")], tmp_path)
    elapsed = time.monotonic() - start
    assert res.returncode == 1, res.stdout + res.stderr
    ours = [line for line in res.stderr.splitlines() if line.startswith("zerostream run:")]
    assert ours[0] == "zerostream run: rank 1 failed (exit code 1): ValueError: boom-rank-1", (
        res.stderr
    )
    report = res.stderr[res.stderr.index(ours[0]) :].splitlines()
    assert report[1].strip() == "Traceback (most recent call last):"
    assert 'fail_probe.py", line' in report[2]  # the user's frame, not the launcher's
    assert report[4].strip() == "ValueError: boom-rank-1"
    assert "_child.py" not in res.stderr and "runpy" not in res.stderr
    # rank 0 was asleep for ten minutes: the launcher stopped it
    assert ours[-1] == "zerostream run: stopped by the launcher after that: rank(s) 0"
    assert not pid_alive(int((tmp_path / "pid0").read_text()))
    assert elapsed < 100


@pytest.mark.timeout(120)
def test_program_with_no_python_gets_local_rank_and_its_exit_code_is_the_jobs(tmp_path):
    # DeepSpeed appends --local_rank=N for --no_python programs too (torchrun would only with
    # its legacy --use-env off, and as --local-rank).
    program = tmp_path / "rank.sh"
    program.write_text(
        "#!/bin/sh\n"
        'echo "$@" > "$PROBE_OUT/argv$LOCAL_RANK"\n'
        'echo $$ > "$PROBE_OUT/pid$LOCAL_RANK.tmp" && mv "$PROBE_OUT/pid$LOCAL_RANK.tmp" '
        '"$PROBE_OUT/pid$LOCAL_RANK"\n'
        'if [ "$LOCAL_RANK" = 1 ]; then\n'
        '  while [ ! -f "$PROBE_OUT/pid0" ]; do sleep 0.1; done\n'
        "  exit 3\n"
        "fi\n"
        "exec sleep 600\n"
    )
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    res = launch(["--nproc", "2", "--no_python", str(program), "x", "--y"], tmp_path)
    assert res.returncode == 3, res.stdout + res.stderr
    ours = [line for line in res.stderr.splitlines() if line.startswith("zerostream run:")]
    assert ours[0].startswith("zerostream run: rank 1 failed (exit code 3): "), res.stderr
    for rank in (0, 1):
        argv = (tmp_path / f"argv{rank}").read_text().split()
        assert argv == [f"--local_rank={rank}", "x", "--y"]
    assert not pid_alive(int((tmp_path / "pid0").read_text()))


@pytest.mark.timeout(180)
def test_unchanged_deepspeed_script_trains_on_two_ranks(tmp_path):
    # The script of tests/python/zero: argparse with --local_rank, zerostream.initialize.
    cfg = tmp_path / "ds_config.json"
    cfg.write_text(
        '{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,'
        ' "optimizer": {"type": "Adam", "params": {"lr": 0.01}},'
        ' "zero_optimization": {"stage": 2}}'
    )
    script = HERE.parent / "engine" / "ds_style_script.py"
    args = ["--deepspeed", "--deepspeed_config", str(cfg), "--out", str(tmp_path / "out")]
    res = launch([str(script), *args], tmp_path, OMP_NUM_THREADS="1")
    assert res.returncode == 0, res.stdout + res.stderr
    lines = [(tmp_path / f"out.{r}").read_text().split() for r in (0, 1)]
    assert [line[4] for line in lines] == ["0", "1"]  # each rank's own --local_rank
    assert lines[0][3] == lines[1][3]  # the same trained weights on both ranks
    assert int(lines[0][0]) == 4 and float(lines[0][2]) < float(lines[0][1])
