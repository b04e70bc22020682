"""Version and dependency of the compatibility distribution, from zerostream's sources.

The version is DeepSpeed's API level with zerostream's version as the local part
(`0.19.8+zerostream.0.1.0`): Hugging Face and Accelerate compare it against DeepSpeed
releases, and `pip show deepspeed` says what it really is. The package requires exactly
that zerostream. Built in place from the zerostream repository (pip's default), with
setuptools' intermediate files in the repository's build/ folder, not beside the sources.
"""

import pathlib
import re
import shutil

from setuptools import setup

HERE = pathlib.Path(__file__).resolve().parent


def _read(path: pathlib.Path, name: str) -> str:
    match = re.search(rf'^{name}\s*=\s*"([^"]+)"', path.read_text(encoding="utf-8"), re.M)
    if match is None:
        raise RuntimeError(f'{path}: no {name} = "..." line')
    return match.group(1)


api = _read(HERE / "deepspeed" / "_api_version.py", "DEEPSPEED_API_VERSION")
zerostream = _read(HERE.parent / "zerostream" / "_version.py", "__version__")
# Emptied first: a file left from an earlier build (a module since removed) would be packed.
build = HERE.parent.parent / "build" / "deepspeed_compat"
shutil.rmtree(build, ignore_errors=True)
build.mkdir(parents=True)
setup(
    version=f"{api}+zerostream.{zerostream}",
    # pydantic: deepspeed.runtime.config_utils.DeepSpeedConfigModel is a pydantic model, as in
    # DeepSpeed (which requires pydantic 2 too).
    install_requires=[f"zerostream=={zerostream}", "pydantic>=2"],
    options={"build": {"build_base": str(build)}, "egg_info": {"egg_base": str(build)}},
)
