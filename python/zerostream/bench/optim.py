"""`zerostream bench optim`: the fused CPU optimizer step against this machine's memory
roofline and against torch's (and DeepSpeed's, when importable) CPU optimizers, measured in
the same run.

    zerostream bench optim --numel 2e8 --optimizer adamw --grad-dtype bf16 --param-copy bf16
    python -m zerostream.bench.optim --numel 5e7 --json
    zerostream bench optim --model gpt2-small     (the optimizer classes on a model's list:
                                                   bench/optim_model.py)

Peers run in interleaved rounds (one step of each per round) so that noise from other
processes on a shared machine hits them alike. Rates are per-peer medians; ratios are
paired: the median over rounds of the ratio within each round, so a drift of the machine's
memory bandwidth between rounds (seen here: 2x over an evening) cancels out.

Bytes-per-param model (stated in the output): the minimum traffic of one step, read grad +
params + states, write params + states + the optional 16-bit copy. Read-for-ownership of
written lines is not counted, so GB/s is "effective" (useful bytes per second).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional

import torch

from zerostream import _C
from zerostream.bench import deepspeed_unavailable, remember, stdout_to_stderr
from zerostream.bench.optim_model import MODELS, print_model_table, run_model
from zerostream.ops.adagrad import cpu_adagrad_step
from zerostream.ops.adam import cpu_adam_step
from zerostream.ops.lion import cpu_lion_step
from zerostream.ops.threads import optimizer_threads

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_STATES = {"adam": 2, "adamw": 2, "adagrad": 1, "lion": 1}
# Store modes of the roofline probe; the roofline is the best of them, so the kernel is
# compared with the fastest way this machine moves these bytes.
_PROBES = {"streaming stores": "on", "ordinary stores": "off", "streaming copy only": "copy"}


def _numel(text: str) -> int:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--numel: expected a number like 2e8; got {text!r}"
        ) from None
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"--numel: expected a positive integer; got {text!r}")
    return int(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--numel", type=_numel, default=int(2e8), help="parameters stepped per call (default 2e8)"
    )
    parser.add_argument(
        "--optimizer",
        choices=sorted(_STATES),
        default="adamw",
        help="torch peers: Adam(W)/Adagrad fused and foreach; Lion has none",
    )
    parser.add_argument("--grad-dtype", choices=sorted(_DTYPES), default="bf16")
    parser.add_argument(
        "--param-copy",
        choices=["none", "bf16", "fp16"],
        default="bf16",
        help="16-bit param copy written in the same pass (default bf16)",
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="threads for every peer (0: OpenMP/torch default)"
    )
    parser.add_argument(
        "--nontemporal",
        choices=["auto", "on", "off", "copy"],
        default="auto",
        help="streaming stores in the zerostream kernel: on (params and "
        "states), copy (16-bit copy only, whole lines), off; auto = copy",
    )
    parser.add_argument("--repeats", type=int, default=5, help="rounds (median is reported)")
    parser.add_argument("--no-torch", action="store_true", help="skip the torch peers")
    parser.add_argument(
        "--model",
        choices=sorted(MODELS),
        help="instead of one flat buffer: step() of the optimizer classes "
        "over this model's parameter list (fp32), vs torch and DeepSpeed",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--json-out", metavar="PATH", help="also write the JSON object to PATH")


def _bytes_per_param(optimizer: str, grad_bytes: int, copy_bytes: int) -> int:
    return grad_bytes + 8 + 8 * _STATES[optimizer] + copy_bytes


class _Peer:
    def __init__(self, name: str, fn: Callable[[int], None], bytes_per_param: int, note: str):
        self.name, self.fn, self.bytes_per_param, self.note = name, fn, bytes_per_param, note
        self.times: List[float] = []

    def params_per_s(self, numel: int) -> float:
        return numel / statistics.median(self.times)


class _Buffers:
    """The one set of buffers every peer steps (Note [One working set])."""

    def __init__(self, args, numel: int):
        self.p = torch.full((numel,), 0.5)
        self.m = torch.zeros(numel)
        self.v = torch.zeros(numel)
        self.g = torch.full((numel,), 1e-3, dtype=_DTYPES[args.grad_dtype])
        self.copy = (
            None
            if args.param_copy == "none"
            else torch.zeros(numel, dtype=_DTYPES[args.param_copy])
        )
        self.param = torch.nn.Parameter(self.p)  # shares p's storage
        self.param.grad = self.g if self.g.dtype == torch.float32 else torch.full((numel,), 1e-3)


# Note [One working set]
# Every peer steps the same p, m and v (torch's and DeepSpeed's optimizer states are made
# aliases of ours after their first step) and the same grads. The values only need to stay
# finite, and with 2e8 params a private set per peer would need ~16 GB: on a 24 GB machine
# that put the kernel's reclaim to work during the runs and cost every peer 20-30%.
# Sharing keeps the footprint at one set (~7 GB) and all peers touch the same memory.
def _alias_states(opt: torch.optim.Optimizer, param, states: Dict[str, torch.Tensor]) -> None:
    opt.step()  # creates the states
    for name, t in states.items():
        old = opt.state[param][name]
        if old.shape != t.shape:
            raise RuntimeError(
                f"bench optim: {type(opt).__name__} state {name!r} has shape "
                f"{tuple(old.shape)}, expected {tuple(t.shape)}"
            )
        opt.state[param][name] = t
    gc.collect()


def _ours(args, numel: int, buf: _Buffers) -> List[_Peer]:
    """The zerostream kernel and the roofline probes over the shared buffers."""
    p, m, v, g, copy = buf.p, buf.m, buf.v, buf.g, buf.copy
    run = dict(threads=args.threads or None, nontemporal=args.nontemporal)

    def step(i: int) -> None:
        if args.optimizer in ("adam", "adamw"):
            cpu_adam_step(
                p,
                g,
                m,
                v,
                lr=1e-3,
                weight_decay=0.01,
                step=i + 1,
                adamw_mode=args.optimizer == "adamw",
                param_copy=copy,
                **run,
            )
        elif args.optimizer == "adagrad":
            cpu_adagrad_step(p, g, m, lr=1e-3, weight_decay=0.01, param_copy=copy, **run)
        else:
            cpu_lion_step(p, g, m, lr=1e-4, weight_decay=0.01, param_copy=copy, **run)

    def probe(nontemporal: str) -> Callable[[int], None]:
        ptrs = (
            p.data_ptr(),
            m.data_ptr(),
            v.data_ptr(),
            g.data_ptr(),
            g.element_size(),
            0 if copy is None else copy.data_ptr(),
            numel,
        )
        return lambda i: _C.optim.roofline_pass(
            *ptrs, threads=optimizer_threads(args.threads or None), nontemporal=nontemporal
        )

    gb, cb = g.element_size(), 0 if copy is None else 2
    ours = _Peer(
        "zerostream",
        step,
        _bytes_per_param(args.optimizer, gb, cb),
        f"{args.optimizer}, grads {args.grad_dtype}, copy {args.param_copy}",
    )
    probe_bytes = _bytes_per_param("adam", gb, cb)
    probes = [
        _Peer(f"roofline ({name})", probe(mode), probe_bytes, "probe")
        for name, mode in _PROBES.items()
        if copy is not None or mode != "copy"
    ]
    return [ours] + probes


def _torch_peers(args, numel: int, buf: _Buffers) -> List[_Peer]:
    """torch's own CPU optimizers on fp32 params and grads (torch needs grad dtype == param
    dtype, and writes no 16-bit copy: their bytes model has neither)."""
    if args.optimizer == "lion":
        return []
    param = buf.param
    peers = []
    for mode in ("fused", "foreach"):
        if args.optimizer == "adagrad":
            opt = torch.optim.Adagrad([param], lr=1e-3, weight_decay=0.01, **{mode: True})
            _alias_states(opt, param, {"sum": buf.m})
        else:
            cls = torch.optim.AdamW if args.optimizer == "adamw" else torch.optim.Adam
            opt = cls([param], lr=1e-3, weight_decay=0.01, **{mode: True})
            _alias_states(opt, param, {"exp_avg": buf.m, "exp_avg_sq": buf.v})
        name = f"torch {type(opt).__name__}({mode}=True)"
        peers.append(
            _Peer(
                name,
                lambda i, o=opt: o.step(),
                _bytes_per_param(args.optimizer, 4, 0),
                "fp32 grads, no copy",
            )
        )
        if mode == "fused":
            equivalent = _torch_equivalent(args, param, opt, buf)
            if equivalent is not None:
                peers.append(equivalent)
    return peers


def _torch_equivalent(args, param, opt, buf: _Buffers) -> Optional[_Peer]:
    """torch fused doing the work of our configuration: cast the 16-bit grads to fp32 before
    the step and write the 16-bit param copy after it (what a ZeRO-Offload step with torch's
    optimizer must do). Same useful bytes as ours, so the same bytes model."""
    if args.grad_dtype == "fp32" and args.param_copy == "none":
        return None
    g16, copy = buf.g, buf.copy

    def step(i: int) -> None:
        param.grad.copy_(g16)
        opt.step()
        if copy is not None:
            copy.copy_(param.detach())

    cb = 0 if copy is None else 2
    return _Peer(
        f"torch {type(opt).__name__}(fused=True) + casts",
        step,
        _bytes_per_param(args.optimizer, g16.element_size(), cb),
        f"grads {args.grad_dtype} -> fp32, step, copy {args.param_copy}",
    )


def _deepspeed_peer(args, numel: int, buf: _Buffers) -> Optional[_Peer]:
    if args.optimizer not in ("adam", "adamw"):
        return None
    if deepspeed_unavailable() is not None:  # absent, or zerostream's compatibility package
        return None
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam  # type: ignore
    except Exception:  # not installed, or its op fails to build: reported as absent
        return None
    param = buf.param
    opt = DeepSpeedCPUAdam(
        [param], lr=1e-3, weight_decay=0.01, adamw_mode=args.optimizer == "adamw"
    )
    _alias_states(opt, param, {"exp_avg": buf.m, "exp_avg_sq": buf.v})
    return _Peer(
        "deepspeed DeepSpeedCPUAdam",
        lambda i: opt.step(),
        _bytes_per_param(args.optimizer, 4, 0),
        "fp32 grads, no copy",
    )


def _measure(peers: List[_Peer], repeats: int) -> None:
    for peer in peers:  # warm-up: first touch of pages, lazy state allocation
        peer.fn(0)
    for r in range(repeats):
        for peer in peers:
            t0 = time.perf_counter()
            peer.fn(r + 1)
            peer.times.append(time.perf_counter() - t0)


def _paired(ours: _Peer, other: Optional[_Peer]) -> Optional[float]:
    """Median over rounds of ours' speed / other's speed within the round."""
    if other is None:
        return None
    return statistics.median(t_other / t_ours for t_ours, t_other in zip(ours.times, other.times))


def _best_probe(probes: List[_Peer], r: int) -> float:
    """Bytes per second (per element of numel) of round r's fastest probe."""
    return max(p.bytes_per_param / p.times[r] for p in probes)


def _paired_roofline(ours: _Peer, probes: List[_Peer]) -> float:
    """Median over rounds of ours' GB/s / the best probe's GB/s within the round."""
    return statistics.median(
        ours.bytes_per_param / t / _best_probe(probes, r) for r, t in enumerate(ours.times)
    )


def _paired_ceiling(ours: _Peer, probes: List[_Peer], other: Optional[_Peer]) -> Optional[float]:
    """The most any kernel moving ours' bytes at the roofline could beat `other` by: median
    over rounds of (best probe's params/s at ours' bytes per param) / other's params/s."""
    if other is None:
        return None
    return statistics.median(
        _best_probe(probes, r) / ours.bytes_per_param * t_other
        for r, t_other in enumerate(other.times)
    )


def _results(args, numel: int, peers: List[_Peer]) -> Dict:
    by_name = {p.name: p for p in peers}
    ours = by_name["zerostream"]
    rates = {p.name: p.params_per_s(numel) for p in peers}
    gbps = {p.name: rates[p.name] * p.bytes_per_param / 1e9 for p in peers}
    roof_nt, roof_st = gbps["roofline (streaming stores)"], gbps["roofline (ordinary stores)"]
    roof_copy = gbps.get("roofline (streaming copy only)")
    roofline = max(x for x in (roof_nt, roof_st, roof_copy) if x is not None)
    probes = [p for p in peers if p.name.startswith("roofline")]
    fused_peer = next((p for p in peers if p.name.endswith("(fused=True)")), None)
    equiv_peer = next((p for p in peers if p.name.endswith("(fused=True) + casts")), None)
    foreach_peer = next((p for p in peers if "foreach" in p.name), None)
    ds_peer = by_name.get("deepspeed DeepSpeedCPUAdam")
    rate = lambda p: None if p is None else rates[p.name]  # noqa: E731
    fused, fused_equiv, foreach, ds = map(rate, (fused_peer, equiv_peer, foreach_peer, ds_peer))
    return {
        "config": {
            "numel": numel,
            "optimizer": args.optimizer,
            "grad_dtype": args.grad_dtype,
            "param_copy": args.param_copy,
            "threads": optimizer_threads(args.threads or None),
            "simd": _C.optim.simd_level(),
            "nontemporal": args.nontemporal,
            "repeats": args.repeats,
        },
        "bytes_per_param": ours.bytes_per_param,
        "params_per_s": rates["zerostream"],
        "gbps": gbps["zerostream"],
        "roofline_gbps": roofline,
        "roofline_streaming_gbps": roof_nt,
        "roofline_ordinary_gbps": roof_st,
        "roofline_streaming_copy_gbps": roof_copy,
        "roofline_bytes_per_param": by_name["roofline (streaming stores)"].bytes_per_param,
        "ratio_vs_roofline": _paired_roofline(ours, probes),
        "torch_fused_params_per_s": fused,
        "torch_foreach_params_per_s": foreach,
        "deepspeed_params_per_s": ds,
        "ratio_vs_torch_fused": _paired(ours, fused_peer),
        "roofline_vs_torch_fused": _paired_ceiling(ours, probes, fused_peer),
        "torch_fused_with_casts_params_per_s": fused_equiv,
        "ratio_vs_torch_fused_with_casts": _paired(ours, equiv_peer),
        "ratio_vs_torch_foreach": _paired(ours, foreach_peer),
        "ratio_vs_deepspeed": _paired(ours, ds_peer),
        "ratio_note": "paired: median over rounds of the ratio within each round",
        "peers": [
            {
                "name": p.name,
                "params_per_s": rates[p.name],
                "gbps": gbps[p.name],
                "bytes_per_param": p.bytes_per_param,
                "note": p.note,
            }
            for p in peers
        ],
    }


def _print_table(res: Dict) -> None:
    c = res["config"]
    print(
        f"zerostream bench optim: {c['optimizer']}, numel {c['numel']:.3g}, grads "
        f"{c['grad_dtype']}, param copy {c['param_copy']}, threads {c['threads']}, "
        f"simd {c['simd']}, stores {c['nontemporal']}, median of {c['repeats']}"
    )
    print(
        f"bytes/param model: read grad + p + states, write p + states + 16-bit copy; "
        f"read-for-ownership not counted (zerostream: {res['bytes_per_param']} B)"
    )
    print(f"{'peer':34s} {'Gparam/s':>9s} {'GB/s':>7s} {'B/param':>8s}  note")
    for p in res["peers"]:
        print(
            f"{p['name']:34s} {p['params_per_s'] / 1e9:9.3f} {p['gbps']:7.1f} "
            f"{p['bytes_per_param']:8d}  {p['note']}"
        )

    def fmt(x):
        return "n/a" if x is None else f"{x:.2f}"

    print(
        f"ratios (median of per-round ratios): vs roofline {fmt(res['ratio_vs_roofline'])} "
        f"(roofline = best probe, {res['roofline_gbps']:.1f} GB/s); "
        f"vs torch fused {fmt(res['ratio_vs_torch_fused'])} "
        f"(with casts {fmt(res['ratio_vs_torch_fused_with_casts'])}); "
        f"vs torch foreach {fmt(res['ratio_vs_torch_foreach'])}; "
        f"vs DeepSpeed {fmt(res['ratio_vs_deepspeed'])}"
    )
    if res["roofline_vs_torch_fused"] is not None:
        print(
            f"ceiling: a kernel at the roofline would be "
            f"{fmt(res['roofline_vs_torch_fused'])}x torch fused in this run"
        )


def run(args) -> int:
    if args.repeats < 1:
        raise ValueError(f"--repeats: expected >= 1; got {args.repeats}")
    if args.threads < 0:
        raise ValueError(f"--threads: expected >= 0; got {args.threads}")
    numel = args.numel
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.model:
        with stdout_to_stderr(args.json):
            res = run_model(args)
        _emit(args, res, print_model_table)
        return 0
    with stdout_to_stderr(args.json):  # peers (DeepSpeed) log to stdout
        buf = _Buffers(args, numel)
        peers = _ours(args, numel, buf)
        if not args.no_torch:
            peers += _torch_peers(args, numel, buf)
        ds = _deepspeed_peer(args, numel, buf)
        if ds is not None:
            peers.append(ds)
        _measure(peers, args.repeats)
        res = _results(args, numel, peers)
    del peers, buf
    gc.collect()
    _emit(args, res, _print_table)
    return 0


def _emit(args, res: Dict, print_table: Callable[[Dict], None]) -> None:
    if "params_per_s" in res:  # this machine's CPU Adam rate for `zerostream estimate`
        remember("optim", res)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_table(res)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(res, f, indent=2)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="zerostream bench optim",
        description="Fused CPU optimizer step vs the memory roofline and torch, in one run.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
