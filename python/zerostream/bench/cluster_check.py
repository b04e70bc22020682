"""The planner's collective model (links.py) against a real multi-node run on this machine:
`python -m zerostream.bench.cluster_check` starts NODES `zerostream run --num_nodes NODES
--node_rank i --nproc NPROC` agents here (each node swapping to its own folder), trains
bench/gpt.py's GPT under ZeRO (cluster_worker.py), and prints, per collective kind:
- the bytes per step the planner predicts beside those the runtime's telemetry counted (they
  must be equal);
- the seconds the planner predicts with the ring model (a latency per hop and a bandwidth)
  of this machine's links, measured in the same job twice: timed alone after training, and
  as the training loads them (fitted to the warm-up steps' own calls, which the check does
  not predict);
- the seconds measured: each call's transfer, from the last rank's issue to its completion
  on this rank (what the ring model predicts), apart from the wait for that last rank (a
  straggler's compute, not a link's time), both stamped per call by CallClock; and the
  seconds the runtime's telemetry counts as blocked in the collective.
The exit status is 1 when bytes differ or the loaded prediction misses the transfer by more
than --tolerance. benchmarks/estimate.md records the output.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import replace
from typing import List

from ..estimate.links import kind_seconds, link_bytes
from ..estimate.machine import Rate
from ..launcher.ports import free_port as _free_port
from .cluster_worker import training_rates, transfer_split
from .validate import gpt_shape, parse_option, predict_cpu_run

# Steps before the measured ones. Stage 3 records the module trace on the first step; the
# bench GPT's tied head reads the embedding's weight outside the embedding (an external
# param), found on the second step, which records the trace again; the third records it;
# from the fourth on every step follows the prefetch plan, as the planner assumes. The
# unplanned steps gather more (each module for its forward and again for its backward):
# the JSON's bytes_each_step shows them.
WARMUP = 3
SHAPES = {
    "tiny": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 512, "seq": 64},
    "small": {"layers": 4, "hidden": 256, "heads": 4, "vocab": 2048, "seq": 128},
}


def config(option, micro: int, accum: int) -> dict:
    zero: dict = {"stage": option.stage, "reduce_bucket_size": 200_000}
    if option.stage == 3:
        zero.update(stage3_param_persistence_threshold=1000, stage3_prefetch_bucket_size=100_000)
    nvme = {"nvme_path": "each node's own (cluster_worker.py)"}
    if option.optimizer != "none":
        zero["offload_optimizer"] = {"device": option.optimizer, **nvme}
    if option.param != "none":
        zero["offload_param"] = {"device": option.param, "max_in_cpu": 0, **nvme}
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": zero,
    }


def run_job(spec: dict, nodes: int, nproc: int, workdir: str) -> List[dict]:
    """Runs the worker on nodes x nproc ranks; every rank's result."""
    spec_path, out = os.path.join(workdir, "spec.json"), os.path.join(workdir, "out.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    port, agents = _free_port(), []
    for node in range(nodes):
        cmd = [sys.executable, "-m", "zerostream.launcher", "--nproc", str(nproc)]
        cmd += ["--num_nodes", str(nodes), "--node_rank", str(node), "--no_local_rank"]
        cmd += ["--master_addr", "127.0.0.1", "--master_port", str(port), "--module"]
        cmd += ["zerostream.bench.cluster_worker", spec_path, out]
        agents.append(subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True))
    errors = [(a.wait(), a.stderr.read()) for a in agents]
    for node, (code, err) in enumerate(errors):
        if code:
            raise RuntimeError(f"node {node} exited {code}:\n{err[-3000:]}")
    with open(out) as f:
        return json.load(f)


def check(
    shape_name: str, option_text: str, nodes: int, nproc: int, accum: int, steps: int, ranks=None
):
    """`ranks`: the workers' results of an earlier run of the same arguments (--ranks)."""
    option = parse_option(option_text)
    shape = SHAPES[shape_name]
    cfg = config(option, micro=2, accum=accum)
    if ranks is None:
        with tempfile.TemporaryDirectory(prefix="zs-cluster-") as tmp:
            spec = {"shape": shape, "config": cfg, "nvme_root": os.path.join(tmp, "nvme")}
            spec.update(steps=steps, warmup=WARMUP)
            ranks = run_job(spec, nodes, nproc, tmp)
    ring = ranks[0]["ring"]
    pred = predict_cpu_run(shape, cfg, option, nodes=nodes, nproc=nproc)

    stamped = "stamps" in ranks[0]  # results of a run before CallClock have none
    loaded = training_rates(ranks) if stamped else {}

    def measured_on(kind: str, rings=ring):  # the machine with this kind's measured links
        r, source = rings[kind], f"measured: {kind} on this job's ranks"
        rates = {"collective": r["gbps"], "net": r["gbps"]}
        rates.update(collective_latency_us=r["latency_us"], net_latency_us=r["latency_us"])
        mine = {k: Rate(v, pred.machine.rates[k].unit, source) for k, v in rates.items()}
        return replace(pred.machine, rates={**pred.machine.rates, **mine})

    split = transfer_split(ranks) if stamped else {}
    rows = []
    for kind in ("all_gather", "reduce_scatter", "all_reduce"):
        got = [r["bytes"].get(kind, 0) for r in ranks]
        want = pred.traffic.get(kind, 0.0)
        if not want and not any(got):
            continue
        k = {"bytes": want, "calls": pred.traffic.get(f"{kind}_calls", 0)}
        secs = [r["seconds"].get(kind, 0.0) for r in ranks]
        machine = measured_on(kind)
        rows.append(
            {
                "kind": kind,
                "bytes_predicted": want,
                "bytes_measured": got,
                "seconds_predicted": kind_seconds(kind, k, machine),
                "calls_predicted": k["calls"],
                "calls_measured": [r["calls"].get(kind, 0) for r in ranks],
                "seconds_measured": sum(secs) / len(secs),
            }
        )
        if kind in loaded:
            rows[-1]["seconds_predicted_loaded"] = kind_seconds(kind, k, measured_on(kind, loaded))
        if kind in split:
            each = split[kind]
            rows[-1]["transfer_measured"] = sum(each["transfer"]) / len(each["transfer"])
            rows[-1]["arrival_measured"] = sum(each["arrival"]) / len(each["arrival"])
    return {
        "shape": shape,
        "params": gpt_shape(shape).params,
        "option": option.label,
        "nodes": nodes,
        "nproc": nproc,
        "accum": accum,
        "ring": ring,
        "ring_loaded": loaded,
        "links": link_bytes(
            {r["kind"]: {"bytes": r["bytes_predicted"], "calls": 0} for r in rows}, nproc, nodes
        ),
        "rows": rows,
        "step_seconds": sum(r["step_seconds"] for r in ranks) / len(ranks),
        "ranks": ranks,
    }


def transfer_error(row: dict, key: str = "seconds_predicted_loaded") -> float:
    """(predicted - measured transfer) / measured, for the prediction `key` (by default the
    one from the links as training loads them); 0 for results without stamps."""
    transfer, pred = row.get("transfer_measured"), row.get(key)
    return (pred - transfer) / transfer if transfer and pred is not None else 0.0


def markdown(res: dict) -> List[str]:
    s = res["shape"]

    def rates(rings):
        return "; ".join(
            f"{kind} {r['gbps']:.2f} GB/s per rank, {r['latency_us']:.0f} us per hop"
            for kind, r in rings.items()
        )

    lines = [
        f"GPT {s['layers']} layers, hidden {s['hidden']}, vocab {s['vocab']}, seq {s['seq']} "
        f"({res['params'] / 1e6:.2f} M params), {res['option']}, {res['nodes']} nodes x "
        f"{res['nproc']} ranks, gradient accumulation {res['accum']}.",
        f"Links timed alone after training: {rates(res['ring'])}.",
        f"Links as training loads them (warm-up calls): {rates(res.get('ring_loaded', {}))}.",
        "",
        "| collective | bytes/step predicted | measured (every rank) | seconds/step predicted: "
        "links alone | links loaded | measured transfer | arrival wait | runtime's wait |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]

    def ms(v):
        return f"{v * 1e3:.1f} ms" if v is not None else "-"

    for r in res["rows"]:
        got = sorted(set(r["bytes_measured"]))
        same = "equal" if got == [r["bytes_predicted"]] else "DIFFERENT"
        alone, loaded = r["seconds_predicted"], r.get("seconds_predicted_loaded")
        measured = r.get("transfer_measured")
        lines.append(
            f"| {r['kind']} | {r['bytes_predicted']:.0f} | {', '.join(f'{g:.0f}' for g in got)} "
            f"({same}) | {ms(alone)}"
            + (f" ({100 * transfer_error(r, 'seconds_predicted'):+.0f}%)" if measured else "")
            + f" | {ms(loaded)}"
            + (f" ({100 * transfer_error(r):+.0f}%)" if measured and loaded else "")
            + f" | {ms(measured)} | {ms(r.get('arrival_measured'))} | "
            f"{ms(r['seconds_measured'])} |"
        )
    links = res["links"]
    lines += [
        "",
        f"Per step: {links['intra'] / 2**20:.2f} MiB on each rank's intra-node link, "
        f"{links['net'] / 2**20:.2f} MiB on each node's network link; step "
        f"{res['step_seconds'] * 1e3:.0f} ms measured.",
    ]
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m zerostream.bench.cluster_check")
    p.add_argument("--size", choices=sorted(SHAPES), default="small")
    p.add_argument("--option", default="3/nvme/nvme", help="STAGE/OPTIMIZER/PARAMS")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument(
        "--tolerance", type=float, default=0.25, help="largest |error| of the transfer seconds"
    )
    p.add_argument("--json", action="store_true")
    p.add_argument("--ranks", help='the "ranks" of an earlier --json output: no new run')
    args = p.parse_args(argv)
    ranks = None
    if args.ranks:
        with open(args.ranks) as f:
            ranks = json.load(f)["ranks"]
    res = check(args.size, args.option, args.nodes, args.nproc, args.accum, args.steps, ranks)
    print(json.dumps(res, indent=1) if args.json else "\n".join(markdown(res)))
    exact = all(sorted(set(r["bytes_measured"])) == [r["bytes_predicted"]] for r in res["rows"])
    off = [r["kind"] for r in res["rows"] if abs(transfer_error(r)) > args.tolerance]
    if off:
        print(f"seconds off by more than {args.tolerance:.0%}: {', '.join(off)}", file=sys.stderr)
    return 0 if exact and not off else 1


if __name__ == "__main__":
    raise SystemExit(main())
