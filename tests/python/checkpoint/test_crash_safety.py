"""Crash safety and bad files (issue 13, shared/TESTING.md recipes).

- A rank SIGKILLed at each point of a save (ZEROSTREAM_TEST_KILL_AT): the other rank fails
  instead of committing, and the previous checkpoint and `latest` are byte for byte what
  they were; a save that replaces a tag in place is no different.
- A truncated or corrupted file, a missing rank file and a checkpoint of another model each
  give an error naming the file or the parameter; no `latest` gives (None, None).
- A full disk (a loop-mounted 16 MiB ext4) fails the save with the path and ENOSPC, and
  the previous checkpoint still loads.
"""

import errno
import filecmp
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from ckpt_run import build, train

from multirank import run_ranks
from tiny_gpt import make_batches
from zerostream.checkpoint import writer_lock

CASE = (2, "cpu", "none", "fp32")


def save_then_die(rank, world, root, point, tag):
    engine = build(CASE, world, root)
    ckpt = os.path.join(root, "ckpt")
    train(engine, rank, world, 0, 2)
    engine.save_checkpoint(ckpt, tag="good")
    if rank == 0:
        shutil.copytree(os.path.join(ckpt, "good"), os.path.join(root, "copy"))
    train(engine, rank, world, 2, 1)
    os.environ["ZEROSTREAM_TEST_KILL_AT"] = point
    engine.save_checkpoint(ckpt, tag=tag)
    return "saved"


# The default tier kills a writer mid-file, the non-writer mid-file and the writer just
# before the commit, and replaces a tag in place; the other points are the slow tier's.
_slow = pytest.mark.slow
KILLS = [
    pytest.param("before_model_states@1", "next", marks=_slow),
    ("during_optim_states@1", "next"),
    pytest.param("after_optim_states@0", "next", marks=_slow),
    pytest.param("before_commit@0", "next", marks=_slow),
    pytest.param("before_latest@0", "next", marks=_slow),
    ("during_optim_states@0", "good"),  # replacing the tag in place
    pytest.param("before_commit@0", "good", marks=_slow),
]


@pytest.mark.parametrize("point,tag", KILLS)
def test_a_rank_killed_during_save_leaves_the_previous_checkpoint(tmp_path, point, tag):
    from zerostream.checkpoint import get_fp32_state_dict_from_zero_checkpoint

    results = run_ranks(
        save_then_die, 2, str(tmp_path), point, tag, timeout=120, expect_failure=True
    )
    killed = int(point.split("@")[1])
    assert results[killed][0] == "missing", results  # it really died
    assert results[1 - killed][0] != "ok", results  # the survivor did not report success
    ckpt = tmp_path / "ckpt"
    assert (ckpt / "latest").read_text() == "good"
    match, mismatch, errors = filecmp.cmpfiles(
        ckpt / "good", tmp_path / "copy", os.listdir(tmp_path / "copy"), shallow=False
    )
    assert not mismatch and not errors, (mismatch, errors)
    state = get_fp32_state_dict_from_zero_checkpoint(str(ckpt))
    assert "tok.weight" in state
    if point.startswith("before_latest"):  # committed, only `latest` was not moved yet
        assert (
            get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag="next").keys() == state.keys()
        )


def bad_files(rank, world, root):
    from zerostream.checkpoint.files import MANIFEST

    engine = build(CASE, world, root)
    ckpt = os.path.join(root, "ckpt")
    messages = {"none": engine.load_checkpoint(os.path.join(root, "empty"))}
    train(engine, rank, world, 0, 1)
    engine.save_checkpoint(ckpt, tag="t")
    tag = os.path.join(ckpt, "t")
    optim = os.path.join(tag, "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    original = open(optim, "rb").read()

    def attempt(key, **kwargs):
        try:
            engine.load_checkpoint(ckpt, **kwargs)
            messages[key] = "loaded"
        except (ValueError, OSError, RuntimeError) as exc:
            messages[key] = f"{type(exc).__name__}: {exc}"

    with open(optim, "r+b") as f:
        f.truncate(len(original) // 2)
    attempt("truncated")
    with open(optim, "wb") as f:
        f.write(original[:-200] + bytes(b ^ 0xFF for b in original[-200:-100]) + original[-100:])
    attempt("corrupted")
    # One flipped byte inside the largest tensor's bytes (a payload range of the manifest).
    with open(os.path.join(tag, MANIFEST)) as f:
        ranges = json.load(f)["files"][os.path.basename(optim)]["ranges"]
    start, end, _, _ = max((r for r in ranges if r[3]), key=lambda r: r[1] - r[0])
    damaged = bytearray(original)
    damaged[(start + end) // 2] ^= 0x01
    with open(optim, "wb") as f:
        f.write(damaged)
    attempt("corrupted_payload")
    os.rename(os.path.join(tag, MANIFEST), os.path.join(tag, MANIFEST + ".away"))
    with open(optim, "r+b") as f:
        f.truncate(len(original) // 2)
    attempt("truncated_unchecked")
    os.remove(optim)
    attempt("missing")
    with open(optim, "wb") as f:
        f.write(original)
    os.rename(os.path.join(tag, MANIFEST + ".away"), os.path.join(tag, MANIFEST))
    attempt("restored")
    engine.destroy()
    other = build(CASE, world, root, d=48)
    try:
        other.load_checkpoint(ckpt)
        messages["other_model"] = "loaded"
    except ValueError as exc:
        messages["other_model"] = str(exc)
    return messages, optim


def test_bad_files_are_named(tmp_path):
    messages, optim = run_ranks(bad_files, 1, str(tmp_path), timeout=120)[0]
    assert messages["none"] == (None, None)
    assert optim in messages["truncated"] and "truncated" in messages["truncated"]
    assert optim in messages["corrupted"] and "CRC32C" in messages["corrupted"]
    assert optim in messages["corrupted_payload"] and "CRC32C" in messages["corrupted_payload"]
    assert (
        optim in messages["truncated_unchecked"]
        and "cannot be read" in messages["truncated_unchecked"]
    )
    assert (
        "FileNotFoundError" in messages["missing"] and "data-parallel rank 0" in messages["missing"]
    )
    assert messages["restored"] == "loaded"
    assert "'tok.weight'" in messages["other_model"] and "(64, 48)" in messages["other_model"]


def fail_part_way(rank, world, root):
    """Rank 1's optimizer file has one flipped byte inside its largest payload, which the
    load finds only after copying most of it into the engine (a lazy read)."""
    import torch.distributed as dist

    from zerostream.checkpoint.files import MANIFEST

    ckpt = os.path.join(root, "ckpt")
    engine = build(CASE, world, root, d=160)  # partitions over 1 MiB: read lazily
    train(engine, rank, world, 0, 2)
    engine.save_checkpoint(ckpt, tag="good")
    after_save = train(engine, rank, world, 2, 2)
    optim = os.path.join(ckpt, "good", "zero_pp_rank_1_mp_rank_00_optim_states.pt")
    if rank == 1:
        with open(os.path.join(ckpt, "good", MANIFEST)) as f:
            ranges = json.load(f)["files"][os.path.basename(optim)]["ranges"]
        start, end, _, _ = max((r for r in ranges if r[3]), key=lambda r: r[1] - r[0])
        assert end - start >= 1 << 20, (start, end)
        with open(optim, "r+b") as f:
            f.seek(end - 1)
            last = f.read(1)
            f.seek(end - 1)
            f.write(bytes([last[0] ^ 0x01]))
    dist.barrier()
    out = {}
    try:
        engine.load_checkpoint(ckpt)
        out["load"] = "loaded"
    except (ValueError, RuntimeError) as exc:
        out["load"] = f"{type(exc).__name__}: {exc}"
    for what in ("step", "forward", "save", "optimizer.backward"):
        try:
            if what == "step":
                engine.step()
            elif what == "forward":
                train(engine, rank, world, 2, 1)
            elif what == "save":
                engine.save_checkpoint(ckpt, tag="half")
            else:  # DeepSpeed's optimizer-level backward is fenced too
                xs, ys = make_batches(1, 2)
                engine.optimizer.backward(engine.module(xs[0], ys[0]))
            out[what] = "ran"
        except RuntimeError as exc:
            out[what] = str(exc)
    if rank == 1:
        with open(optim, "r+b") as f:  # repaired: the same load now succeeds
            f.seek(end - 1)
            f.write(last)
    dist.barrier()
    engine.load_checkpoint(ckpt)
    out["resumed"] = train(engine, rank, world, 2, 2)
    out["uninterrupted"] = after_save
    out["listing"] = sorted(os.listdir(ckpt))
    return out, optim


def test_a_load_that_fails_part_way_names_the_rank_and_fences_the_engine(tmp_path):
    results = run_ranks(fail_part_way, 2, str(tmp_path), timeout=150)
    (first, optim), (second, _) = results
    assert optim in second["load"] and "CRC32C" in second["load"], second["load"]
    # rank 0 loaded its own part, hears of rank 1 instead of waiting in the all-gather
    assert first["load"].startswith("RuntimeError") and "rank(s) [1]" in first["load"], first
    for out in (first, second):
        for what in ("step", "forward", "save", "optimizer.backward"):
            assert (
                "failed on rank(s) [1]" in out[what] and "load a checkpoint again" in out[what]
            ), (what, out[what])
        assert "half" not in out["listing"] and ".half.partial" not in out["listing"]
        # once repaired, the load succeeds and the run continues exactly
        assert out["resumed"] == out["uninterrupted"], out


def disagree_on_tag(rank, world, root, mode):
    import logging

    from ckpt_run import config

    import zerostream
    from tiny_gpt import TinyGPT

    cfg = config(CASE, world, root)
    cfg["checkpoint"] = {"tag_validation": mode}
    engine, *_ = zerostream.initialize(model=TinyGPT(), config=cfg)
    train(engine, rank, world, 0, 1)
    ckpt = os.path.join(root, "ckpt")
    engine.save_checkpoint(ckpt, tag="same")  # agreeing ranks pass under any mode
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("zerostream").addHandler(handler)
    outcome = "passed"
    try:
        if mode == "Fail":
            engine.save_checkpoint(ckpt, tag=f"mine{rank}")
        else:  # Warn: the check alone (saving on would write two half checkpoints)
            from zerostream.checkpoint.save import _validate_tag

            _validate_tag(engine._checkpoint_target(), f"mine{rank}")
    except ValueError as exc:
        outcome = str(exc) + (" [AssertionError]" if isinstance(exc, AssertionError) else "")
    warnings = [r.getMessage() for r in records if "disagree" in r.getMessage()]
    return outcome, warnings, sorted(os.listdir(ckpt))


@pytest.mark.parametrize("mode", ["Fail", "Warn"])
def test_ranks_saving_under_different_tags(tmp_path, mode):
    results = run_ranks(disagree_on_tag, 2, str(tmp_path), mode, timeout=120)
    for outcome, warnings, listing in results:
        assert "same" in listing and not any(n.startswith(("mine", ".mine")) for n in listing)
        if mode == "Fail":
            assert "ranks disagree on the checkpoint tag" in outcome, outcome
            assert "rank 0: 'mine0'" in outcome and "rank 1: 'mine1'" in outcome
            assert "tag_validation is Fail" in outcome and not warnings
            assert "[AssertionError]" in outcome  # the type DeepSpeed's callers catch
        else:
            assert outcome == "passed" and len(warnings) == 1, warnings
            assert "rank 0: 'mine0', rank 1: 'mine1'" in warnings[0]


def bad_save_dirs(rank, world, root):
    engine = build(CASE, world, root)
    train(engine, rank, world, 0, 1)
    blocker = os.path.join(root, "a_file")
    if rank == 0:
        open(blocker, "w").close()
    outcomes = {}
    for key, save_dir in (("none", None), ("empty", ""), ("under_a_file", blocker + "/ckpt")):
        try:
            engine.save_checkpoint(save_dir)
            outcomes[key] = "saved"
        except (ValueError, OSError, RuntimeError) as exc:
            outcomes[key] = f"{type(exc).__name__}: {exc}"
    engine.save_checkpoint(os.path.join(root, "ckpt"))  # and the engine still saves
    return outcomes


def test_a_save_dir_rank_0_cannot_create_fails_every_rank_instead_of_hanging(tmp_path):
    # Rank 0 creates the folder; the others used to wait for it at a barrier forever.
    for outcomes in run_ranks(bad_save_dirs, 2, str(tmp_path), timeout=120):
        assert (
            outcomes["none"]
            == "ValueError: save_checkpoint: save_dir must be a non-empty path, got None"
        )
        assert outcomes["empty"].startswith("ValueError: save_checkpoint: save_dir must be")
        under = outcomes["under_a_file"]
        assert "cannot create the checkpoint folder" in under or "rank 0 could not" in under, under
        assert str(tmp_path / "a_file" / "ckpt") in under
    assert (tmp_path / "ckpt" / "latest").read_text() == "global_step1"


def save_beside_a_live_writer(rank, world, root):
    engine = build(CASE, world, root)
    train(engine, rank, world, 0, 1)
    ckpt = os.path.join(root, "ckpt")
    outcomes = []
    for _ in range(2):  # the holder is alive, then it is gone
        try:
            engine.save_checkpoint(ckpt)
            outcomes.append("saved")
        except (OSError, RuntimeError) as exc:
            outcomes.append(f"{type(exc).__name__}: {exc}")
        if rank == 0 and not outcomes[-1] == "saved":
            with open(os.path.join(root, "holder.pid")) as f:
                os.kill(int(f.read()), signal.SIGKILL)  # the other job dies
            time.sleep(0.5)
        torch.distributed.barrier()
    return outcomes


def test_a_folder_another_live_job_writes_is_refused_by_name(tmp_path):
    # Another live job (a process holding the folder: Note [Checkpoint folder ownership]).
    (tmp_path / "ckpt").mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            # writer_lock.py by its path: the standard library only, no torch to import
            "import importlib.util as u, os, sys, time; "
            "spec = u.spec_from_file_location('writer_lock', sys.argv[3]); "
            "lock = u.module_from_spec(spec); spec.loader.exec_module(lock); "
            "lock.claim(sys.argv[1]); "
            "open(sys.argv[2], 'w').write(str(os.getpid())); time.sleep(120)",
            str(tmp_path / "ckpt"),
            str(tmp_path / "holder.pid.tmp"),
            writer_lock.__file__,
        ]
    )
    try:
        for _ in range(600):
            if (tmp_path / "holder.pid.tmp").exists() and (tmp_path / "holder.pid.tmp").read_text():
                break
            time.sleep(0.05)
        os.rename(tmp_path / "holder.pid.tmp", tmp_path / "holder.pid")
        results = run_ranks(save_beside_a_live_writer, 2, str(tmp_path), timeout=120)
    finally:
        holder.kill()
        holder.wait()
    (first0, then0), (first1, then1) = results
    assert first0.startswith("OSError: [Errno 16] save_checkpoint: the checkpoint folder "), first0
    assert f"is being written by another live job (pid {holder.pid} on host " in first0, first0
    assert first1.startswith("RuntimeError: save_checkpoint: rank 0 could not"), first1
    # Once that job is gone the lock is the kernel's to drop: this job saves.
    assert then0 == then1 == "saved"
    assert (tmp_path / "ckpt" / "latest").read_text() == "global_step1"


@pytest.fixture
def small_disk(tmp_path):
    image, mnt = tmp_path / "disk.img", tmp_path / "mnt"
    mnt.mkdir()
    try:
        subprocess.run(["truncate", "-s", "16M", str(image)], check=True)
        subprocess.run(["mkfs.ext4", "-q", str(image)], check=True, capture_output=True)
        mount = subprocess.run(
            ["mount", "-o", "loop", str(image), str(mnt)], capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot make a loop-mounted ext4 here: {exc}")
    if mount.returncode != 0:
        pytest.skip(f"mount -o loop refused: {mount.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", str(mnt)], check=False)


def fill_the_disk(rank, world, root, disk):
    engine = build(CASE, world, root)
    ckpt = os.path.join(disk, "ckpt")
    train(engine, rank, world, 0, 2)
    engine.save_checkpoint(ckpt, tag="good")
    filler = os.path.join(disk, "filler")
    with open(filler, "wb", buffering=0) as f:  # fill the disk, in smaller and smaller writes
        for size in (1 << 20, 64 << 10, 4 << 10):
            try:
                while True:
                    f.write(b"\0" * size)
                    os.fsync(f.fileno())
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    os.truncate(filler, max(0, os.path.getsize(filler) - (16 << 10)))
    os.sync()
    free = os.statvfs(disk).f_bfree * os.statvfs(disk).f_frsize
    train(engine, rank, world, 2, 1)
    try:
        engine.save_checkpoint(ckpt, tag="next")
        error = None
    except OSError as exc:
        error = (exc.errno, str(exc))
    engine.destroy()
    fresh = build(CASE, world, root, seed=1)
    path, _ = fresh.load_checkpoint(ckpt)
    return error, path, fresh.global_steps, sorted(os.listdir(ckpt)), free


def test_a_full_disk_fails_the_save_and_keeps_the_previous_checkpoint(tmp_path, small_disk):
    error, path, steps, listing, free = run_ranks(
        fill_the_disk, 1, str(tmp_path), str(small_disk), timeout=120
    )[0]
    assert error is not None and error[0] == errno.ENOSPC, (error, free, listing)
    assert str(small_disk) in error[1] and "No space left" in error[1]
    assert path.endswith(os.path.join("good", "mp_rank_00_model_states.pt")) and steps == 2
    assert "next" not in listing and (small_disk / "ckpt" / "latest").read_text() == "good"


def save_node_local(rank, world, root):
    import torch
    from ckpt_run import config

    import zerostream
    from tiny_gpt import TinyGPT

    torch.manual_seed(0)
    model = TinyGPT()
    cfg = config(CASE, world, os.path.join(root, "nvme"))
    cfg["checkpoint"] = {"use_node_local_storage": True}
    engine, *_ = zerostream.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    train(engine, rank, world, 0, 1)
    try:
        engine.save_checkpoint(os.path.join(root, "ckpt"))
        outcome = "saved"
    except NotImplementedError as exc:
        outcome = str(exc)
    engine.destroy()
    return outcome


@pytest.mark.parametrize("per_host", [2, 1])
def test_node_local_storage_saves_on_one_host_and_is_refused_across_hosts(tmp_path, per_host):
    """HF's save_on_each_node sets checkpoint.use_node_local_storage. On one host rank 0 is
    the host's writer anyway; across hosts (here: the launcher saying 1 rank per host) the
    save is refused up front, naming the key, before anything is written."""
    got = run_ranks(save_node_local, 2, str(tmp_path), env={"LOCAL_WORLD_SIZE": str(per_host)})
    ckpt = tmp_path / "ckpt"
    if per_host == 2:
        assert got == ["saved", "saved"]
        assert (ckpt / "latest").read_text() == "global_step1"
        assert (ckpt / "global_step1" / "mp_rank_00_model_states.pt").is_file()
    else:
        for message in got:
            assert "checkpoint.use_node_local_storage" in message, message
            assert "2 ranks, 1 on this one by LOCAL_WORLD_SIZE" in message, message
        assert not ckpt.exists() or not any(ckpt.iterdir())
