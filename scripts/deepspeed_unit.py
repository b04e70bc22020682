"""DeepSpeed's own unit tests against zerostream's `deepspeed` package: run, classify, count.

Run through scripts/deepspeed-unit.sh, which makes the environment. The files run are
FILES below: the tests of what zerostream offers as DeepSpeed (ZeRO stages 0-3 and their
contexts, offload, checkpoints, the config, the optimizers and schedulers, comm,
activation checkpointing, bf16). DeepSpeed features zerostream does not have (pipeline
and tensor parallelism, MoE, DeepCompile, ZenFlow, sparse and 1-bit gradients, inference,
fp8, data efficiency, ...) are not run; docs/compat.md lists them.

Each failing or erroring test is matched against CAUSES (deepspeed_unit_causes.py), and
every test lands in one class:

- passed
- skipped: the test skipped itself (DeepSpeed's own reasons: no fp16 on CPU, a world size
  above the CPU accelerator's device count, a CUDA-only op)
- cuda: fails on the CPU for every package (a GPU tensor, a CUDA op, a DDP reference built
  with `device_ids` on a CPU module); DeepSpeed's own CPU run fails these too
- internal: reads a private DeepSpeed name (the cause names it)
- failed: everything else, the package's fault, with its cause or "unexplained"

The pass rate is passed / (passed + failed): the tests that exercise DeepSpeed's public API
and can pass on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from deepspeed_unit_causes import CAUSES  # noqa: E402

FILES = [
    # The NVMe I/O handle (aio_handle: 1 KiB blocks, descriptors, offsets)
    "unit/v1/nvme/test_aio.py",
    # Pinned memory: the pin_memory op, the shared locked-tensor manager, the native backend
    "unit/v1/nvme/test_pinned_manager.py",
    "unit/v1/pin_memory/test_pin_memory_op.py",
    "unit/v1/pin_memory/test_pin_memory.py",
    "unit/v1/pin_memory/test_destroy_unpin.py",
    "unit/utils/test_pin_memory_tracker.py",
    # deepspeed.io's FastFileWriter (skips itself without CUDA; it must import)
    "unit/v1/nvme/test_fast_file_writer_fd_close.py",
    # The launcher: the runners' command lines, resource filters, arguments
    "unit/launcher/test_run.py",
    "unit/launcher/test_multinode_runner.py",
    "unit/launcher/test_ds_arguments.py",
    # ZeRO stages, contexts and engines
    "unit/v1/zero/test_zero.py",
    "unit/v1/zero/test_zero_user_backward.py",
    "unit/v1/zero/test_zero2_offload_multi_backward.py",
    "unit/v1/zero/test_zero_cpu_offload_grad_accum.py",
    "unit/v1/zero/test_zero_coalesce_grad_reduction.py",
    "unit/v1/zero/test_zero_hook_count_regression.py",
    "unit/v1/zero/test_zero_init_pg_contradiction.py",
    "unit/v1/zero/test_zero_autocast.py",
    "unit/v1/zero/test_zero_activation_checkpoint_lifecycle.py",
    "unit/v1/zero/test_zero_functorch_linear.py",
    "unit/v1/zero/test_zero_torch_func.py",
    "unit/runtime/zero/test_zero_config.py",
    "unit/runtime/zero/test_zero_context.py",
    "unit/runtime/zero/test_zero_context_ancestry.py",
    "unit/runtime/zero/test_zero_context_return.py",
    "unit/runtime/zero/test_zero_dynamic_class.py",
    "unit/runtime/zero/test_zero_grad_clip.py",
    "unit/runtime/zero/test_zero_hook_attribute_delegation.py",
    "unit/runtime/zero/test_zero_late_module_attach.py",
    "unit/runtime/zero/test_zero_leaf_module.py",
    "unit/runtime/zero/test_zero_linear_direct_init.py",
    "unit/runtime/zero/test_zero_nesting_init.py",
    "unit/runtime/zero/test_zero_tensor_fragment.py",
    "unit/runtime/zero/test_zero_tiled.py",
    "unit/runtime/zero/test_ignore_unused_parameters.py",
    "unit/runtime/zero/test_nvme_checkpointing.py",
    "unit/runtime/zero/test_unwrap_model.py",
    "unit/runtime/zero/test_zero_allreduce_fetch_params.py",
    "unit/runtime/zero/test_zero_autocast_mixed_dtype.py",
    # the engine, the config, schedulers
    "unit/runtime/test_ds_config_dict.py",
    "unit/runtime/test_ds_config_model.py",
    "unit/runtime/test_ds_initialize.py",
    "unit/runtime/test_lr_schedulers.py",
    "unit/runtime/test_multi_output_model.py",
    "unit/runtime/test_multiple_models.py",
    "unit/runtime/test_no_sync_ctxt.py",
    "unit/runtime/test_runtime_utils.py",
    "unit/runtime/test_autocast.py",
    "unit/v1/test_engine_log_level.py",
    # precision
    "unit/v1/half_precision/test_bf16.py",
    "unit/v1/half_precision/test_gradient_clipping_default.py",
    "unit/v1/half_precision/test_mixed_precision_dtype.py",
    "unit/runtime/half_precision/test_dynamic_loss_scale.py",
    "unit/runtime/half_precision/test_zero_optim_overflow.py",
    "unit/runtime/test_precision_config_dynamic_scale.py",
    "unit/runtime/test_data.py",
    "unit/runtime/test_precision_config_loss_scale.py",
    # activation checkpointing
    "unit/runtime/activation_checkpointing/test_activation_checkpointing.py",
    "unit/runtime/activation_checkpointing/test_activation_checkpointing_non_reentrant.py",
    # checkpoints
    "unit/checkpoint/test_latest_checkpoint.py",
    "unit/checkpoint/test_lr_scheduler.py",
    "unit/checkpoint/test_other_optimizer.py",
    "unit/checkpoint/test_zero_optimizer.py",
    "unit/checkpoint/test_tag_validation.py",
    "unit/checkpoint/test_shared_weights.py",
    "unit/utils/test_get_optim_files.py",
    # optimizers
    "unit/ops/adam/test_cpu_adam.py",
    "unit/ops/adam/test_adamw.py",
    "unit/ops/adam/test_hybrid_adam.py",
    # comm, accelerator, utils, monitors
    "unit/comm/test_dist.py",
    "unit/comm/test_comms_logger.py",
    "unit/monitor/test_monitor.py",
    "unit/elasticity/test_elastic.py",
    "unit/v1/accelerator/test_accelerator.py",
    "unit/utils/test_init_on_device.py",
    "unit/utils/test_partition_balanced.py",
    # last: 128 variants of one test (a partial run still covers every other file)
    "unit/v1/zero/test_offload_states.py",
]

# DeepSpeed's pytest.ini addopts, kept: the marked tiers it leaves out by default.
ADDOPTS = (
    "not sequential and not nightly and not inference and not seq_inference and not "
    "inference_ops and not inference_v2 and not inference_v2_ops and not stable_diffusion "
    "and not evaluation"
)


def run(checkout: Path, files: list[str], workdir: Path, timeout: int, chunk: int) -> list[Path]:
    """Runs `files` (paths under tests/) in a copy of the checkout's tests/, `chunk` files to
    a pytest process, each writing its own junit XML (a run stopped part way keeps the
    chunks it finished); returns the XML files."""
    tests = workdir / "tests"
    if tests.exists():
        shutil.rmtree(tests)
    shutil.copytree(checkout / "tests", tests)
    missing = [f for f in files if not (tests / f.split("::")[0]).is_file()]  # or node ids
    if missing:
        sys.exit(f"deepspeed-unit: {checkout}/tests lacks {', '.join(missing)}")
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "LOCAL_SIZE": os.environ.get("LOCAL_SIZE", "2"),
        "DS_UNITTEST_TIMEOUT": str(timeout),
        "TOKENIZERS_PARALLELISM": "false",
    }
    xmls = []
    for first in range(0, len(files), chunk):
        part = files[first : first + chunk]
        xml = workdir / f"results-{first // chunk:02d}.xml"
        cmd = [
            sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly",
            "-m", ADDOPTS, "-o", "addopts=", "--continue-on-collection-errors",
            f"--junitxml={xml}", "-q", "--no-header", "-rN", f"--timeout={timeout * 2}", *part,
        ]  # fmt: skip
        print(f"[deepspeed-unit] files {first + 1}-{first + len(part)} of {len(files)}", flush=True)
        subprocess.run(cmd, cwd=tests, env=env, check=False)
        if not xml.is_file():
            sys.exit(f"deepspeed-unit: pytest wrote no {xml}")
        xmls.append(xml)
    return xmls


def outcomes(xmls: list[Path]) -> list[dict]:
    """One dict per test case: id, outcome (passed/skipped/failed), message. Reports given
    later replace earlier ones (a rerun after a fix): a test's later record replaces its
    earlier one, and any later record of a module replaces that module's earlier import
    failure (`::unit.x.test_y`)."""
    merged: dict = {}
    for xml in xmls:
        run = _outcomes_of(xml)
        owners = {c["id"].split("::", 1)[0] for c in run}  # module, or module.Class
        for ident in [i for i in merged if i.startswith("::")]:
            module = ident[2:]
            if any(o == module or o.startswith(module + ".") for o in owners):
                del merged[ident]
        for case in run:
            merged.pop(case["id"], None)  # re-inserted last: the later record's place
            merged[case["id"]] = case
    return list(merged.values())


def _outcomes_of(xml: Path) -> list[dict]:
    cases: list[dict] = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        module = case.get("classname", "")
        ident = f"{module}::{case.get('name')}"
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = "skipped" if tag == "skipped" else "failed"
                message = (node.get("message") or "") + "\n" + (node.text or "")
                break
        if outcome == "passed" and cases and cases[-1]["id"] == ident:
            continue  # a teardown error after a pass is its own record
        cases.append({"id": ident, "outcome": outcome, "message": message})
    return cases


def classify(cases: list[dict]) -> None:
    """Sets each case's `class` and `cause` from CAUSES (first match: id regex, message
    regex)."""
    for case in cases:
        case["class"], case["cause"] = case["outcome"], ""
        if case["outcome"] != "failed":
            continue
        for klass, id_re, msg_re, why in CAUSES:
            if re.search(id_re, case["id"]) and re.search(msg_re, case["message"], re.S):
                case["class"], case["cause"] = klass, why
                break
        else:
            case["cause"] = "unexplained: " + _first_error_line(case["message"])


def _first_error_line(message: str) -> str:
    for line in message.splitlines():
        line = line.strip()
        if re.match(r"^(E\s+)?\w*(Error|Exception|Interrupt)\b", line) or line.startswith("E "):
            return line[:200]
    return message.strip().splitlines()[0][:200] if message.strip() else "(no message)"


def report(cases: list[dict], seconds: float) -> dict:
    counts = Counter(c["class"] for c in cases)
    public = counts["passed"] + counts["failed"]
    summary = {
        "tests": len(cases),
        **{k: counts[k] for k in ("passed", "failed", "skipped", "cuda", "internal")},
        "pass_rate": round(counts["passed"] / public, 4) if public else None,
        "seconds": round(seconds),
    }
    by_cause = defaultdict(list)
    for c in cases:
        if c["class"] in ("failed", "cuda", "internal"):
            by_cause[(c["class"], c["cause"])].append(c["id"])
    print(f"\n== DeepSpeed unit tests on zerostream ({summary['seconds']} s)")
    for klass, cause in sorted(by_cause, key=lambda k: (k[0], -len(by_cause[k]))):
        ids = by_cause[(klass, cause)]
        print(f"\n[{klass}] {len(ids)}: {cause}")
        for ident in ids[:40]:
            print(f"    {ident}")
        if len(ids) > 40:
            print(f"    ... and {len(ids) - 40} more")
    print(
        f"\n{summary['tests']} tests: {summary['passed']} passed, {summary['failed']} failed, "
        f"{summary['skipped']} skipped by DeepSpeed, {summary['cuda']} need CUDA, "
        f"{summary['internal']} read DeepSpeed internals"
    )
    if public:
        rate = f"{summary['passed']}/{public} = {summary['pass_rate']:.1%}"
        print(f"pass rate (public API, CPU): {rate}")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("checkout", type=Path, help="a DeepSpeed checkout (its tests/ is read)")
    ap.add_argument("--files", nargs="+", help="files under tests/ (default: the manifest)")
    ap.add_argument("--json", type=Path, help="write the summary and every case here")
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it")
    ap.add_argument("--xml", type=Path, nargs="+", help="classify earlier junit XMLs, run nothing")
    ap.add_argument("--chunk", type=int, default=8, help="files to a pytest process")
    ap.add_argument("--timeout", type=int, default=300, help="seconds a distributed test may take")
    args = ap.parse_args()
    start = time.monotonic()
    if args.xml:
        xmls = args.xml
    else:
        if not (args.checkout / "tests" / "unit" / "common.py").is_file():
            sys.exit(
                f"deepspeed-unit: {args.checkout} is not a DeepSpeed checkout "
                "(no tests/unit/common.py)"
            )
        workdir = args.keep or Path(tempfile.mkdtemp(prefix="ds-unit-"))
        workdir.mkdir(parents=True, exist_ok=True)
        xmls = run(args.checkout, args.files or FILES, workdir, args.timeout, args.chunk)
    cases = outcomes(xmls)
    classify(cases)
    summary = report(cases, time.monotonic() - start)
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "cases": cases}, indent=1))
    if not args.keep and not args.xml:
        shutil.rmtree(xmls[0].parent, ignore_errors=True)


if __name__ == "__main__":
    main()
