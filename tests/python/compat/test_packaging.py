"""Installing the compatibility package: what pip puts where, the console commands, and the
refusal to run beside the real DeepSpeed (both ship a top-level `deepspeed`)."""

import os
import shutil
import subprocess
import sys

import pytest
from compat_run import run_python


def _import_deepspeed(env, timeout=120):
    return subprocess.run(
        [sys.executable, "-c", "import deepspeed; print(deepspeed.__version__)"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_installs_one_package_its_metadata_and_two_commands(compat_site):
    names = sorted(os.listdir(compat_site))
    dist_info = [n for n in names if n.endswith(".dist-info")]
    assert len(dist_info) == 1 and dist_info[0].startswith("deepspeed-0.19.8+zerostream.")
    assert sorted(n for n in names if not n.endswith(".dist-info")) == ["bin", "deepspeed"]
    assert sorted(os.listdir(compat_site / "bin")) == ["deepspeed", "ds_report"]
    metadata = (compat_site / dist_info[0] / "METADATA").read_text()
    assert "Name: deepspeed" in metadata and "Requires-Dist: zerostream==" in metadata


def test_building_leaves_the_source_folder_as_it_was(compat_site):
    """setuptools' build/ and egg-info go to the repository's build/ folder: scripts/setup.sh
    hashes python/ to decide whether to rebuild zerostream."""
    project = compat_site.parent / "src" / "python" / "deepspeed_compat"
    assert sorted(os.listdir(project)) == [".gitignore", "deepspeed", "pyproject.toml", "setup.py"]
    assert (compat_site.parent / "src" / "build" / "deepspeed_compat").is_dir()


def test_ds_report_prints_the_package_and_zerostreams_report(compat_site, compat_env):
    done = run_python([str(compat_site / "bin" / "ds_report")], compat_env, timeout=120)
    first = done.stdout.splitlines()[0]
    assert first.startswith("deepspeed 0.19.8+zerostream.") and "compatibility package" in first
    assert "zerostream report" in done.stdout


def test_deepspeed_command_is_zerostreams_launcher(compat_site, compat_env):
    done = run_python([str(compat_site / "bin" / "deepspeed"), "--help"], compat_env, timeout=120)
    assert "usage" in done.stdout.lower()


def test_refuses_when_the_real_deepspeed_is_installed_beside_it(compat_env, tmp_path):
    """Another site folder on the path holds DeepSpeed's own distribution (a --user or
    --target install): importing fails, naming it and the fix."""
    other = tmp_path / "other_site"
    info = other / "deepspeed-0.19.8.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.19.8\n")
    env = dict(compat_env, PYTHONPATH=os.pathsep.join([compat_env["PYTHONPATH"], str(other)]))
    done = _import_deepspeed(env)
    assert done.returncode != 0
    assert "ImportError" in done.stderr and "the real DeepSpeed" in done.stderr
    assert "0.19.8 at " + str(info) in done.stderr and "pip uninstall deepspeed" in done.stderr


@pytest.mark.slow  # CI's 25 minutes; the guard's other refusal runs in the default tier
def test_refuses_when_the_real_deepspeeds_files_were_unpacked_over_it(
    compat_site, compat_env, tmp_path
):
    site = tmp_path / "site"
    shutil.copytree(compat_site, site)
    (site / "deepspeed" / "module_inject").mkdir()
    (site / "deepspeed" / "module_inject" / "__init__.py").write_text("")
    env = dict(compat_env)
    env["PYTHONPATH"] = env["PYTHONPATH"].replace(str(compat_site), str(site), 1)
    done = _import_deepspeed(env)
    assert done.returncode != 0
    assert "installed over each other" in done.stderr and "module_inject" in done.stderr
    # The unmodified copy imports (what the two refusals are measured against).
    (site / "deepspeed" / "module_inject" / "__init__.py").unlink()
    (site / "deepspeed" / "module_inject").rmdir()
    ok = _import_deepspeed(env)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.strip().startswith("0.19.8+zerostream.")
