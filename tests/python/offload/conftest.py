"""Fixtures of the offload tests: real filesystems that misbehave (TESTING.md)."""

from __future__ import annotations

import os
import subprocess
import tempfile

import pytest


def _mount(args: list[str], target: str) -> str | None:
    """Runs mount; returns None on success, else the reason (for pytest.skip)."""
    try:
        r = subprocess.run(["mount", *args, target], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"mount unavailable: {e}"
    if r.returncode != 0:
        return f"mount {' '.join(args)} refused: {r.stderr.strip() or r.returncode}"
    return None


def _umount(target: str) -> None:
    subprocess.run(["umount", "-l", target], capture_output=True, timeout=30)


@pytest.fixture
def full_disk(tmp_path):
    """A 16 MiB ext4 image loop-mounted at a directory; skipped where mounting is refused."""
    img = tmp_path / "disk.img"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(16 << 20)
    r = subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"mkfs.ext4 unavailable: {r.stderr.strip()}")
    reason = _mount(["-o", "loop", str(img)], str(mnt))
    if reason:
        pytest.skip(reason)
    try:
        yield str(mnt)
    finally:
        _umount(str(mnt))


def _refuses_direct(path: str) -> bool:
    probe = os.path.join(path, ".odirect_probe")
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o644)
    except OSError:
        return True
    os.close(fd)
    os.unlink(probe)
    return False


@pytest.fixture
def tmpfs_dir():
    """A fresh tmpfs mount (falls back to a directory under /dev/shm)."""
    d = tempfile.mkdtemp(prefix="zs_tmpfs_")
    mounted = _mount(["-t", "tmpfs", "-o", "size=64m", "tmpfs"], d) is None
    if not mounted:
        os.rmdir(d)
        d = tempfile.mkdtemp(prefix="zs_tmpfs_", dir="/dev/shm")
    try:
        yield d
    finally:
        if mounted:
            _umount(d)
        subprocess.run(["rm", "-rf", d])


@pytest.fixture
def no_direct_dir(tmpfs_dir):
    """A directory on a filesystem whose open(O_DIRECT) fails with EINVAL.

    tmpfs did until Linux 6.6; on newer kernels it accepts O_DIRECT, so ramfs (which still
    refuses) stands in. Skipped where neither can be had.
    """
    if _refuses_direct(tmpfs_dir):
        yield tmpfs_dir
        return
    d = tempfile.mkdtemp(prefix="zs_ramfs_")
    reason = _mount(["-t", "ramfs", "ramfs"], d)
    if reason:
        os.rmdir(d)
        pytest.skip(f"tmpfs accepts O_DIRECT on this kernel and {reason}")
    try:
        if not _refuses_direct(d):
            pytest.skip("no filesystem refusing O_DIRECT available")
        yield d
    finally:
        _umount(d)
        os.rmdir(d)
