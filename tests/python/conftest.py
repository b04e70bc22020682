"""Shared pytest fixtures: where the shared compatibility corpus lives.

ZS_LOAD_C_FROM=<path of a _C*.so> makes the whole session use that build of zerostream._C,
loaded after torch, as a process that imports torch first does. scripts/test.sh runs the
config error tests this way against a _C linked with -static-libstdc++ (a toolchain that
links it statically once crashed there: see tests/python/test_module_exports.py).
"""

import importlib.util
import os
import pathlib
import sys
import tempfile

import pytest

from prerequisites import missing

REPO = pathlib.Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"


def _load_c_variant(path: str) -> None:
    import torch  # noqa: F401  (torch's C++ runtime first, as in the crash this guards)

    spec = importlib.util.spec_from_file_location("zerostream._C", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["zerostream._C"] = module  # `from . import _C` in zerostream finds it here
    spec.loader.exec_module(module)


# Benchmarks run by tests leave their results here (inherited by spawned ranks and
# subprocesses), not in the user's ~/.cache/zerostream that `zerostream estimate` reads.
os.environ.setdefault("ZEROSTREAM_CACHE_DIR", tempfile.mkdtemp(prefix="zs-test-cache-"))

if os.environ.get("ZS_LOAD_C_FROM"):
    _load_c_variant(os.environ["ZS_LOAD_C_FROM"])


@pytest.fixture(autouse=True)
def same_collectives_on_every_rank(request, tmp_path_factory, monkeypatch):
    """Every test's ranks, however they are started (run_ranks checks its own; the launcher
    and subprocess tests start theirs), log their collectives' fingerprints
    (Note [Ranks that issue different collectives] in zerostream/comm/collective_check.py), and
    the test fails naming the first call on which two ranks of one job differ. Compared up
    to the shortest rank's log: some tests kill a rank on purpose."""
    from multirank import collective_mismatch

    log_dir = tmp_path_factory.mktemp("collectives")
    monkeypatch.setenv("ZEROSTREAM_COLLECTIVE_LOG", str(log_dir))
    yield
    found = collective_mismatch(str(log_dir), prefix_only=True)
    if found:
        pytest.fail(f"the ranks issued different collectives: {found}", pytrace=False)


@pytest.fixture(scope="session")
def compat_dir() -> pathlib.Path:
    path = SHARED / "compat" / "configs"
    if not (path / "MANIFEST.tsv").is_file():
        missing(
            f"compatibility corpus not found at {path} (it ships beside the project "
            f"checkout, not with zerostream)"
        )
    return path


@pytest.fixture(scope="module")
def one_rank_process_group():
    """A one-rank Gloo group in this process for in-process engine tests (a free port, so
    parallel runs on one machine do not collide); destroyed after the module, and the
    launcher variables put back, so subprocesses of later tests do not inherit its port."""
    import torch

    from multirank import free_port

    env = {
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
        "WORLD_SIZE": "1", "LOCAL_RANK": "0",
    }  # fmt: skip
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
