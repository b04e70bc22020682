"""Runs first on `import deepspeed`: refuses to load beside the real DeepSpeed.

Both distributions are named `deepspeed` and both ship a top-level `deepspeed` package, so
pip replaces one with the other in one site-packages. They still meet when they sit in two
directories of the same sys.path (a --user or --target install, PYTHONPATH, a conda base
beneath a venv) or when one was unpacked over the other without pip: which code runs then
depends on path order and on which files were overwritten. Either case is refused here,
with what was found and how to fix it.
"""

from __future__ import annotations

import importlib.metadata
import os
import warnings

# Marker of this package's distributions (their version's local part).
LOCAL_TAG = "+zerostream."

# Files or folders that only DeepSpeed's own `deepspeed` package contains; this package never
# ships them, so finding one beside this file means the two were mixed in one folder.
REAL_ONLY_PATHS = (
    "git_version_info_installed.py",  # its setup.py writes it (this package: git_version_info)
    "module_inject",
    "inference",
    "autotuning",
    os.path.join("ops", "op_builder"),
    os.path.join("ops", "csrc"),
)

FIX = (
    "Keep one `deepspeed` per environment: to train on zerostream, `pip uninstall deepspeed` "
    "(repeat until `pip show deepspeed` finds none, or only a version with '+zerostream.'), "
    "then `pip install --no-build-isolation ./python/deepspeed_compat` from the zerostream "
    "repository; to use DeepSpeed, uninstall this package and use another environment for "
    "zerostream. Without this package, scripts can `import zerostream as deepspeed`."
)


def _where(dist: importlib.metadata.Distribution) -> str:
    path = getattr(dist, "_path", None)
    return str(path) if path is not None else "unknown location"


def foreign_distributions() -> list:
    """'<version> at <dist-info path>' for each installed `deepspeed` that is not ours."""
    found = []
    for dist in importlib.metadata.distributions(name="deepspeed"):
        version = dist.version or ""
        if LOCAL_TAG not in version:
            found.append(f"{version or '(no version)'} at {_where(dist)}")
    return found


def foreign_files(package_dir: str) -> list:
    """Paths in this package folder that only DeepSpeed's own package has."""
    return [
        os.path.join(package_dir, rel)
        for rel in REAL_ONLY_PATHS
        if os.path.exists(os.path.join(package_dir, rel))
    ]


def check_environment(package_dir: str) -> None:
    foreign = foreign_distributions()
    if foreign:
        raise ImportError(
            "deepspeed (zerostream's compatibility package) refuses to load: the real DeepSpeed "
            f"is installed in this environment too ({'; '.join(foreign)}). " + FIX
        )
    mixed = foreign_files(package_dir)
    if mixed:
        raise ImportError(
            "deepspeed (zerostream's compatibility package) refuses to load: its folder "
            f"{package_dir} also holds files of the real DeepSpeed ({', '.join(mixed)}), so "
            "the two were installed over each other. " + FIX
        )


def warn_if_stale(zerostream_version: str) -> None:
    """Warns when the installed metadata was built for another zerostream than the one
    imported (the repository moved on; reinstall the package)."""
    try:
        installed = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        return  # imported from a source tree: nothing installed to disagree with
    built_for = installed.partition(LOCAL_TAG)[2]
    if built_for and built_for != zerostream_version:
        warnings.warn(
            f"deepspeed {installed} was installed for zerostream {built_for}, but zerostream "
            f"{zerostream_version} is imported; reinstall it: pip install "
            "--no-build-isolation ./python/deepspeed_compat",
            stacklevel=3,
        )


check_environment(os.path.dirname(os.path.abspath(__file__)))
