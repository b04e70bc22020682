"""DeepSpeed's ZeRO memory estimators under DeepSpeed's module paths
(`deepspeed.runtime.zero.stage_1_and_2` / `.stage3`, all_live on a module and all_cold on
counts) print the numbers of the formulas in reference/deepspeed_compat.md §4, computed
here independently, and are zerostream.estimate's functions (not copies)."""

import json
import pathlib
import re

import pytest
from compat_run import run_python

HERE = pathlib.Path(__file__).resolve().parent
ROW = re.compile(r"^\s*([\d.]+)GB \|\s*([\d.]+)GB \| (.*)$")
F = 1.5  # additional_buffer_factor

# estimators_worker.Tied: embedding 8000x1024 tied to the head (counted once), 1024->4096.
LIVE_P = 8000 * 1024 + 1024 * 4096 + 4096
LIVE_L = 8000 * 1024  # the embedding (and the head holding the same weight)


def zero2(P, g, n):
    """[(cpu, gpu)] for offload_optimizer cpu, none (§4, ZeRO-2)."""
    G = g * n
    return [(P * max(4 * G, 16) * F, 2 * P), (P * 4 * g * F, 2 * P + (18 * P) // G)]


def zero3(P, L, g, n):
    """[(cpu, gpu)] for (opt, param) = (cpu, cpu), (cpu, none), (none, none), each with
    zero_init 1 then 0 (§4, ZeRO-3)."""
    G, LL = g * n, 4 * L
    return [
        (P * 18 / n * F, LL),
        (P * max(4 * g, 18 / n) * F, LL),
        (P * 16 / n * F, LL + (2 * P) // G),
        (P * max(4 * g, 16 / n) * F, LL + (2 * P) // G),
        (L * 4 * g * F, LL + (18 * P) // G),
        (P * 4 * g * F, LL + (18 * P) // G),
    ]


def _gib(nbytes) -> str:
    return f"{nbytes / 2**30:.2f}"


def _rows(lines):
    return [ROW.match(line).groups()[:2] for line in lines if ROW.match(line)]


@pytest.fixture(scope="module")
def tables(compat_env):
    done = run_python([str(HERE / "workers" / "estimators_worker.py")], compat_env, timeout=300)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_deepspeed_paths_are_zerostreams_estimators(tables):
    assert tables["same_functions"] == [True, True, True, True]


@pytest.mark.parametrize(
    "key, expected",
    [
        ("zero2_live", zero2(LIVE_P, 4, 2)),
        ("zero2_cold", zero2(2851e6, 8, 1)),
        ("zero3_live", zero3(LIVE_P, LIVE_L, 4, 2)),
        ("zero3_cold", zero3(2851e6, 32e6, 8, 1)),
    ],
)
def test_printed_numbers_are_the_reference_formulas(tables, key, expected):
    assert _rows(tables[key]) == [(_gib(cpu), _gib(gpu)) for cpu, gpu in expected]


def test_headers_name_the_setup_and_the_counts(tables):
    assert "HW: Setup with 2 nodes, 4 GPUs per node." in tables["zero3_live"]
    assert (
        f"SW: Model with {LIVE_P // 10**6}M total params, 8M largest layer params."
        in (tables["zero3_live"])
    )
    # The worked t5-3b example of the reference (§4), row by row.
    assert [r[0] for r in _rows(tables["zero3_cold"])] == [
        "71.69",
        "127.45",
        "63.72",
        "127.45",
        "1.43",
        "127.45",
    ]
    assert _rows(tables["zero2_cold"]) == [("127.45", "5.31"), ("127.45", "11.28")]
