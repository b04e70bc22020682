"""The `zerostream` command: --version, report, config check."""

import json
import os
import pathlib
import subprocess
import sys

from zerostream import _C, __version__, cli

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_console_script_and_module_report_the_version():
    out = subprocess.run(
        [sys.executable, "-m", "zerostream.cli", "--version"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == f"zerostream {__version__}"
    assert _C.__version__ == __version__


def test_config_check_reads_json_without_importing_torch(tmp_path):
    """Issue 31 item 6: a check that only reads the config does not import torch (about
    3 s); one with an optimizer section builds it, as initialize() would, with torch."""
    probe = (
        "import sys; from zerostream import cli; rc = cli.main(sys.argv[1:]); "
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', rc)"
    )
    bare, with_opt = tmp_path / "bare.json", tmp_path / "opt.json"
    bare.write_text(json.dumps({"train_batch_size": 8, "zero_optimization": {"stage": 2}}))
    with_opt.write_text(
        json.dumps({"train_batch_size": 8, "optimizer": {"type": "AdamW", "params": {"lr": 1}}})
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    seen = {}
    for path in (bare, with_opt):
        out = subprocess.run(
            [sys.executable, "-c", probe, "config", "check", str(path)],
            capture_output=True, text=True, env=env, check=True,
        ).stdout  # fmt: skip
        seen[path.name] = out.strip().splitlines()[-1]
    assert seen == {"bare.json": "NO-TORCH 0", "opt.json": "TORCH 0"}


def test_config_check_prints_every_key_with_its_source(capsys):
    assert (
        cli.main(
            [
                "config",
                "check",
                str(REPO / "configs" / "zero3_offload_nvme.json"),
                "--world-size",
                "4",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "zero_optimization.offload_param.device" in out and '"nvme"' in out
    assert "zero_optimization.overlap_comm" in out and "[derived]" in out
    assert "train_batch_size" in out and "64" in out
    assert "[default]" in out and "[file]" in out


def test_config_check_fails_with_the_message_on_a_bad_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(
        '{"train_batch_size": 8, "zero_optimization": {"stage": 3, '
        '"offload_param": {"device": "gpu"}}}'
    )
    assert cli.main(["config", "check", str(bad)]) == 1
    err = capsys.readouterr().err
    assert (
        'zero_optimization.offload_param.device: expected one of "none", "cpu", "nvme"; got "gpu"'
        in err
    )
    assert cli.main(["config", "check", str(bad), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and len(out["errors"]) == 1


def test_config_check_resolves_auto_from_flags(tmp_path, capsys):
    f = tmp_path / "auto.json"
    f.write_text(
        json.dumps(
            {
                "train_micro_batch_size_per_gpu": "auto",
                "train_batch_size": "auto",
                "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"},
            }
        )
    )
    assert (
        cli.main(
            [
                "config",
                "check",
                str(f),
                "--json",
                "--world-size",
                "2",
                "--micro-batch-size",
                "3",
                "--hidden-size",
                "100",
            ]
        )
        == 0
    )
    resolved = json.loads(capsys.readouterr().out)["resolved"]
    assert resolved["train_batch_size"] == {"value": 6, "source": "auto"}
    assert resolved["zero_optimization.reduce_bucket_size"] == {"value": 10000, "source": "auto"}


def test_report_states_what_the_machine_can_do(tmp_path, capsys):
    assert cli.main(["report", "--json", "--path", str(tmp_path)]) == 0
    facts = json.loads(capsys.readouterr().out)
    for key in (
        "zerostream",
        "torch",
        "python",
        "compiler",
        "simd_level",
        "openmp_threads",
        "io_uring",
        "o_direct",
        "locked_memory_limit",
        "cuda_build",
        "gpus_visible",
        "torch_distributed_backends",
    ):
        assert key in facts, key
    # The report says what the probes found, not a fixed text.
    assert (facts["io_uring"] == "works") == (_C.probe_io_uring() == "")
    assert facts["simd_level"] == _C.cpu_info()["simd_level"]
    assert "gloo" in facts["torch_distributed_backends"]
    assert facts["o_direct"].startswith(str(tmp_path))
    assert facts["openmp_threads"] >= 1


def test_report_o_direct_probe_names_a_missing_directory(capsys):
    assert cli.main(["report", "--json", "--path", "/no/such/dir"]) == 0
    assert json.loads(capsys.readouterr().out)["o_direct"] == "/no/such/dir: no such directory"


def test_simd_level_can_be_capped_for_tests():
    env = dict(os.environ, ZS_SIMD="scalar")
    out = subprocess.run(
        [sys.executable, "-c", "import zerostream._C as C; print(C.cpu_info()['simd_level'])"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout
    assert out.strip() == "scalar"
