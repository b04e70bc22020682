"""The compatibility package, installed for these tests: built from this checkout into a
throwaway folder (pip --target, offline, no build isolation), so the tests exercise what
`pip install ./python/deepspeed_compat` produces (metadata, console scripts) for the current
sources. Code that must see it (transformers and accelerate decide at import whether
DeepSpeed is there) runs in subprocesses with that folder first on PYTHONPATH."""

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import zerostream

REPO = pathlib.Path(__file__).resolve().parents[3]
COMPAT_SRC = REPO / "python" / "deepspeed_compat"
# The zerostream this test run imported (installed under scripts/test.sh): a clean clone's
# python/zerostream has no built _C, so the checkout must not shadow it in subprocesses.
ZS_SITE = pathlib.Path(zerostream.__file__).resolve().parents[1]


def _copy_sources(dest: pathlib.Path) -> pathlib.Path:
    """The compat project and the zerostream version file it reads, in the repository's
    layout: pip's in-tree build writes build/ and *.egg-info there, not into the checkout."""
    project = dest / "python" / "deepspeed_compat"
    shutil.copytree(
        COMPAT_SRC, project, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    (dest / "python" / "zerostream").mkdir(parents=True)
    shutil.copy(REPO / "python" / "zerostream" / "_version.py", dest / "python" / "zerostream")
    return project


@pytest.fixture(scope="session")
def compat_site(tmp_path_factory) -> pathlib.Path:
    """A folder holding the installed `deepspeed` package, its dist-info and bin/."""
    root = tmp_path_factory.mktemp("deepspeed_compat")
    project = _copy_sources(root / "src")
    site = root / "site"
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    cmd += ["--no-build-isolation", "--target", str(site), str(project)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        pytest.fail(f"pip install of the compat package failed:\n{done.stdout}\n{done.stderr}")
    return site


@pytest.fixture(scope="session")
def compat_env(compat_site) -> dict:
    """Environment for a subprocess that imports the installed `deepspeed` and the zerostream
    this test run imported."""
    env = dict(os.environ)
    paths = [str(compat_site), str(ZS_SITE), str(REPO / "tests" / "python")]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.setdefault("OMP_NUM_THREADS", "1")
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["HF_HUB_OFFLINE"] = "1"
    env["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    return env
