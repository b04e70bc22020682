"""`zerostream estimate` as a subcommand (built through add_parser, as cli.py wires it): the
70B report says which offloads are needed and why, --json and --write-config work, rates
say where they came from, and bad input exits 2 with a message naming the flag or key."""

import argparse
import json

import pytest
from hf_configs import LLAMA2_70B as LLAMA

from zerostream.estimate import add_parser

CASE = ["--gpus", "8", "--gpu-mem", "40GB", "--nodes", "1", "--cpu-mem", "1TB", "--nvme", "4TB"]


def _cli(argv, capsys):
    parser = argparse.ArgumentParser(prog="zerostream")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["estimate", "--no-cache", *argv])
    rc = args.func(args)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.fixture()
def llama(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA))
    return str(path)


def test_70b_report_says_which_offloads_and_why(llama, capsys):
    rc, out, _ = _cli(["--model-config", llama, *CASE, "--seq", "4096"], capsys)
    assert rc == 0
    assert "68.98 B params" in out
    assert "16-bit params 138 GB" in out and "17.2 GB per GPU -> they fit only with stage 3" in out
    # Offloaded gradients are 16-bit (bf16, no accumulation): 14 B/param on the host, 990 GB
    # with the processes, over the 950 GB a 1 TB node may plan on.
    assert "16-bit gradients): 966 GB of states per node" in out
    assert "990 GB vs 950 GB usable of 1000 GB -> does not fit, so NVMe" in out
    # All on NVMe the step moves 828 GB of optimizer state each way (303 s); the planner's
    # tiers keep what the node's free RAM holds (test_estimate_plan checks the bytes).
    rows = [
        r.split() for r in out.splitlines() if r.startswith("stage 3, optimizer nvme, params none ")
    ]
    assert ["303", "nvme"] in [r[-2:] for r in rows]
    # Recommended: the GPUs' spare memory takes the first optimizer sub-groups (a ratio), the
    # host RAM the rest of the state, so nothing is left on disk (test_estimate_plan: bytes).
    assert "recommended: stage 3, optimizer gpu+cpu, params none: step >= " in out
    assert "offload_optimizer.ratio 0.9138: the first sub-groups are stepped there" in out
    assert "[default: one PCIe 4.0 NVMe SSD" in out  # rates say where they came from
    assert "SW: Model with 68976M total params, 262M largest layer params." in out


def test_params_only_with_an_assumed_shape(capsys):
    rc, out, _ = _cli(["--params", "70B", *CASE], capsys)
    assert rc == 0 and "assumption: shape assumed from the parameter count" in out
    assert "recommended: stage 3, optimizer gpu+" in out


def test_json_and_written_config(llama, tmp_path, capsys):
    out_cfg = tmp_path / "ds.json"
    rc, out, _ = _cli(
        ["--model-config", llama, *CASE, "--json", "--write-config", str(out_cfg)], capsys
    )
    assert rc == 0
    res = json.loads(out)
    assert len(res["options"]) == 11  # the 9 options and 2 with memory tiers
    assert res["recommended"]["label"] == "stage 3, optimizer gpu+cpu, params none"
    assert res["written"]["ok"] and res["written"]["path"] == str(out_cfg)
    cfg = json.loads(out_cfg.read_text())  # plain JSON without --with-comment
    # The GPUs' spare memory and host RAM hold the optimizer state: "cpu" with a ratio.
    assert cfg["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert 0 < cfg["zero_optimization"]["offload_optimizer"]["ratio"] < 1


def test_measured_rates_are_used_and_named(llama, tmp_path, capsys):
    io = tmp_path / "io.json"
    io.write_text(json.dumps({"read_gbps": 2.0, "write_gbps": 1.0, "backend": "io_uring"}))
    rc, out, _ = _cli(["--model-config", llama, *CASE, "--measured", str(io), "--json"], capsys)
    rates = json.loads(out)["machine"]["rates"]
    assert rc == 0 and rates["nvme_read"]["value"] == 2.0
    assert rates["nvme_write"]["source"] == f"measured: {io}"
    rc, out, _ = _cli(
        ["--model-config", llama, *CASE, "--measured", str(io), "--nvme-read-gbps", "7", "--json"],
        capsys,
    )
    assert json.loads(out)["machine"]["rates"]["nvme_read"] == {
        "value": 7.0,
        "unit": "GB/s per node",
        "source": "flag",
    }


def test_the_copy_lanes_of_a_gpu_bench_step_are_the_pcie_rate(llama, tmp_path, capsys):
    """bench step's h2d/d2h links (timed on the copy stage's lanes) give the PCIe rate, the
    slower direction, only when measured on a GPU: on the CPU they are memcpy."""

    def step_json(device):
        links = {"h2d": {"gb_per_s": 21.5}, "d2h": {"gb_per_s": 18.25}}
        path = tmp_path / f"step_{device}.json"
        path.write_text(json.dumps({"peers": {"zerostream": {"device": device, "links": links}}}))
        return str(path)

    rc, out, _ = _cli(["--model-config", llama, *CASE, "--measured", step_json("cuda"), "--json"],
                      capsys)  # fmt: skip
    assert rc == 0 and json.loads(out)["machine"]["rates"]["pcie"]["value"] == 18.25
    rc, out, err = _cli(["--model-config", llama, *CASE, "--measured", step_json("cpu"), "--json"],
                        capsys)  # fmt: skip
    assert rc != 0 and "holds no rate the planner uses" in err


def test_cpu_only_plan_of_a_gpt(tmp_path, capsys):
    gpt = tmp_path / "gpt.json"
    gpt.write_text(json.dumps({"n_embd": 256, "n_layer": 4, "n_head": 4, "vocab_size": 2048,
                               "n_positions": 128}))  # fmt: skip
    rc, out, _ = _cli(
        ["--model-config", str(gpt), "--cpu-only", "--cpu-mem", "16GB", "--nvme", "0", "--json"],
        capsys,
    )
    res = json.loads(out)
    assert rc == 0 and res["run"]["precision"] == "fp32" and res["run"]["seq"] == 128
    assert res["recommended"]["offload_optimizer"] == "none"  # it fits: nothing to offload
    nvme = [o for o in res["options"] if o["offload_optimizer"] == "nvme"]
    assert all(not o["fits"] and "NVMe" in o["problems"][0] for o in nvme)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--params", "70X"], "--params: expected a count like 70B"),
        ([], "give the model: --params"),
        (["--params", "7B", "--gpu-mem", "40XB"], "--gpu-mem: expected a size"),
        (["--params", "7B", "--gpus", "0"], "--gpus"),
        (["--params", "7B", "--micro-batch", "0"], "--micro-batch"),
        (["--params", "7B", "--pcie-gbps", "fast"], "--pcie-gbps: expected a positive number"),
        (["--params", "7B", "--measured", "/nonexistent.json"], "--measured: cannot read"),
        (["--model-config", "/nonexistent.json"], "--model-config: cannot read"),
    ],
)
def test_bad_input_exits_2_naming_the_flag(argv, message, capsys):
    rc, _, err = _cli(argv, capsys)
    assert rc == 2 and message in err and err.startswith("zerostream estimate: error:")


def test_bad_model_config_exits_2_naming_the_key(tmp_path, capsys):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({k: v for k, v in LLAMA.items() if k != "intermediate_size"}))
    rc, _, err = _cli(["--model-config", str(path)], capsys)
    assert rc == 2 and "missing key 'intermediate_size'" in err and "c.json" in err
    gpt = tmp_path / "gpt.json"
    gpt.write_text(json.dumps({"n_embd": 64, "n_layer": 2, "n_head": 2, "vocab_size": 100,
                               "n_positions": 128}))  # fmt: skip
    rc, _, err = _cli(["--model-config", str(gpt), "--seq", "4096"], capsys)
    assert rc == 2 and "--seq 4096 exceeds the model's 128 learned positions" in err


def test_bad_ds_config_exits_2_naming_the_key(tmp_path, capsys):
    path = tmp_path / "ds.json"
    path.write_text(
        json.dumps({"zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}})
    )
    rc, _, err = _cli(["--params", "7B", "--ds-config", str(path)], capsys)
    assert rc == 2 and "zero_optimization.offload_param.device" in err


def test_write_config_when_nothing_fits(tmp_path, capsys):
    rc, _, err = _cli(
        ["--params", "70B", "--gpus", "1", "--gpu-mem", "8GB", "--cpu-mem", "64GB", "--nvme",
         "0", "--write-config", str(tmp_path / "x.json")],
        capsys,
    )  # fmt: skip
    assert rc == 2 and "no option fits" in err


def test_argparse_rejects_a_non_integer_count(capsys):
    with pytest.raises(SystemExit) as exc:
        _cli(["--params", "7B", "--gpus", "eight"], capsys)
    assert exc.value.code == 2


def test_the_recipe_read_back_predicts_what_the_planner_planned(llama, tmp_path, capsys):
    """--ds-config of the written recipe (cpu with the GPU tier's ratio) is predicted as the
    option the planner recommended: same label, same step bound."""
    out_cfg = tmp_path / "ds.json"
    rc, out, _ = _cli(
        ["--model-config", llama, *CASE, "--json", "--write-config", str(out_cfg)], capsys
    )
    planned = json.loads(out)["recommended"]
    rc, out, _ = _cli(
        ["--model-config", llama, *CASE, "--json", "--ds-config", str(out_cfg)], capsys
    )
    assert rc == 0
    (read_back,) = json.loads(out)["options"]
    assert read_back["label"] == planned["label"] == "stage 3, optimizer gpu+cpu, params none"
    assert read_back["step_seconds_lower_bound"] == pytest.approx(
        planned["step_seconds_lower_bound"], rel=1e-9
    )
    assert read_back["device_bytes"] == planned["device_bytes"]
