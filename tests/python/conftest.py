"""Shared pytest fixtures: where the shared compatibility corpus lives."""

import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def compat_dir() -> pathlib.Path:
    path = SHARED / "compat" / "configs"
    if not (path / "MANIFEST.tsv").is_file():
        pytest.skip(
            f"compatibility corpus not found at {path} (it ships beside the project "
            f"checkout, not with zerostream)"
        )
    return path
