"""The `comms_logger` section and DeepSpeed's `CommsLogger`: each collective that comm.py
issues (one wrapper, `comm._named`, the one collective_check fingerprints through) is timed
while the logger is on, and recorded by its name and message size with its latency and
bandwidths; `comm.log_summary()` prints DeepSpeed's table on rank 0.

What is timed: with `prof_all` every collective; otherwise those named in `prof_ops` (the
op's name, or the `log_name=` a DeepSpeed caller passes), or called with `prof=True`. The
latency runs from the call until the collective has finished: an asynchronous one is waited
for, and the accelerator synchronized, as DeepSpeed makes a logged op blocking. The message
size is the bytes of the op's input, as DeepSpeed counts them (a list: their sum).

Unlike StepTelemetry (per-engine bytes and seconds of each traffic tier, for the step
report), these are per-call records of the whole process, since DeepSpeed's logger is one
per process (`deepspeed.comm.comms_logger`)."""

from __future__ import annotations

import datetime
import logging
import math
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

logger = logging.getLogger("zerostream")


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


# The keyword arguments DeepSpeed's collectives take for the logger (never passed on).
OPTIONS = ("prof", "log_name", "debug")

# Which argument holds the bytes a collective is charged with (DeepSpeed counts its input).
PAYLOAD = {
    "all_reduce": "tensor",
    "inference_all_reduce": "tensor",
    "reduce": "tensor",
    "broadcast": "tensor",
    "all_gather": "tensor",
    "gather": "tensor",
    "scatter": "tensor",
    "send": "tensor",
    "recv": "tensor",
    "isend": "tensor",
    "irecv": "tensor",
    "all_gather_into_tensor": "input_tensor",
    "reduce_scatter_tensor": "input",
    "reduce_scatter": "input_list",
    "all_to_all_single": "input",
    "all_to_all": "input_tensor_list",
    "all_reduce_coalesced": "tensors",
}

_GATHERS = ("all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor")
_ALL_REDUCES = ("all_reduce", "all_reduce_coalesced", "inference_all_reduce")
_ALL_TO_ALLS = ("all_to_all_single", "all_to_all")


def convert_size(size_bytes: int) -> str:
    """Bytes in binary units with two decimals ("1.5 KB"), as the summary prints them."""
    if size_bytes == 0:
        return "0B"
    units = ("B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB")
    i = min(int(math.floor(math.log(size_bytes, 1024))), len(units) - 1)
    return f"{round(size_bytes / 1024**i, 2)} {units[i]}"


def calc_bw_log(comm_op: str, size: int, duration: float, world: Optional[int] = None):
    """(algorithm bandwidth, bus bandwidth) in Gbps of `size` bytes moved in `duration` ms by
    `comm_op` over `world` ranks (default: the world), by nccl-tests' rules: a gather or
    reduce-scatter moves `world` times its input, an all-reduce twice, and the bus carries
    (n-1)/n of an all-to-all or gather, 2(n-1)/n of an all-reduce; point-to-point, broadcast,
    reduce and the rest move their input once."""
    n = max(int(_world() if world is None else world), 1)
    if duration <= 0:
        return 0.0, 0.0
    if comm_op in _ALL_TO_ALLS:
        algbw = size / duration
        busbw = algbw * (n - 1) / n
    elif comm_op in _GATHERS:
        algbw = size * n / duration
        busbw = algbw * (n - 1) / n
    elif comm_op in _ALL_REDUCES:
        algbw = size * 2 / duration
        busbw = (size / duration) * (2 * (n - 1) / n)
    else:
        algbw = busbw = size / duration
    # bytes per ms to gigabits per second
    return algbw * 8 / 1e6, busbw * 8 / 1e6


def trim_mean(data, trim_percent: float) -> float:
    """The mean of `data` without round(len * trim_percent) values at each end, `data` left
    as it is (0 for no data)."""
    if not 0.0 <= trim_percent <= 1.0:
        raise ValueError(f"trim_mean: trim_percent must be in [0, 1]; got {trim_percent}")
    if len(data) == 0:
        return 0
    ordered = sorted(data)
    k = int(round(len(ordered) * trim_percent))
    kept = ordered[k : len(ordered) - k] or ordered
    return statistics.mean(kept)


def _payload_bytes(op: str, named: Dict[str, Any]) -> int:
    arg = named.get(PAYLOAD.get(op, ""))
    if isinstance(arg, (list, tuple)):
        return sum(t.element_size() * t.nelement() for t in arg if torch.is_tensor(t))
    if torch.is_tensor(arg):
        return arg.element_size() * arg.nelement()
    return 0


def _caller() -> str:
    """The function that called the collective: the first frame outside zerostream's comm
    layer and the compatibility package's."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        inside = name.startswith(_COMM_DIR) or name.endswith(("comm.py", "functools.py"))
        if not inside:
            return frame.f_code.co_name
        frame = frame.f_back
    return "<unknown>"


# zerostream's comm package (this file's folder); "comm.py" is deepspeed.comm's.
_COMM_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class _Timing:
    __slots__ = ("op", "name", "size", "start")

    def __init__(self, op: str, name: str, size: int):
        self.op, self.name, self.size = op, name, size
        self.start = time.perf_counter()


class CommsLogger:
    """DeepSpeed's record: `comms_dict[name][msg_size] = [count, [latency ms], [algbw Gbps],
    [busbw Gbps]]`, one entry of each list per call."""

    def __init__(self):
        self.comms_dict: Dict[str, Dict[int, list]] = {}
        self.enabled = False
        self.verbose = False
        self.debug = False
        self.prof_all = True
        self.prof_ops: List[str] = []
        self.paused = 0  # > 0: inside a logged collective (part of it), or a summary

    def configure(self, comms_config) -> None:
        """From the `comms_logger` section (zerostream's CommsLoggerConfig, or an object with
        DeepSpeed's `comms_logger_enabled` and `comms_logger`)."""
        if hasattr(comms_config, "comms_logger_enabled"):
            self.enabled = bool(comms_config.comms_logger_enabled)
            comms_config = comms_config.comms_logger if self.enabled else None
        else:
            self.enabled = bool(comms_config.enabled)
        if self.enabled and comms_config is not None:
            self.verbose = comms_config.verbose
            self.debug = comms_config.debug
            self.prof_ops = list(comms_config.prof_ops)
            self.prof_all = comms_config.prof_all

    # --- what is profiled -------------------------------------------------------------------
    def start_profiling_comms(self) -> None:
        self.prof_all = True

    def stop_profiling_comms(self) -> None:
        self.prof_all = False

    def start_profiling_op(self, op_name_list) -> None:
        self.prof_ops = sorted(set(self.prof_ops) | set(op_name_list))

    def stop_profiling_op(self, op_name_list) -> None:
        self.prof_ops = [op for op in self.prof_ops if op not in op_name_list]

    # --- the wrapper's two calls ------------------------------------------------------------
    def begin(self, op: str, named: Dict[str, Any], options: Dict[str, Any]) -> Optional[_Timing]:
        """A timing to `finish` when this call of `op` is to be logged, else None."""
        if not self.enabled or self.paused > 0:
            return None
        name = options.get("log_name") or op
        if not (options.get("prof") or self.prof_all or name in self.prof_ops):
            return None
        if options.get("debug", self.debug):
            name = f"{name} | [Caller Func: {_caller()}]"
        self.paused += 1
        return _Timing(op, name, _payload_bytes(op, named))

    def finish(self, timing: _Timing, work, succeeded: bool) -> None:
        """Ends `timing` once the collective has finished (`work`: an async op's handle)."""
        self.paused -= 1
        if not succeeded:
            return
        if work is not None and hasattr(work, "wait"):
            work.wait()
        from ..accelerator import get_accelerator

        get_accelerator().synchronize()
        latency_ms = (time.perf_counter() - timing.start) * 1000.0
        self.append(timing.op, timing.name, latency_ms, timing.size)

    # --- records ----------------------------------------------------------------------------
    def append(self, raw_name: str, record_name: str, latency: float, msg_size: int) -> None:
        algbw, busbw = calc_bw_log(raw_name, msg_size, latency)
        record = self.comms_dict.setdefault(record_name, {}).setdefault(msg_size, [0, [], [], []])
        record[0] += 1
        record[1].append(latency)
        record[2].append(algbw)
        record[3].append(busbw)
        if self.verbose:
            if _rank() == 0:
                logger.info(
                    "comm op: %s | time (ms): %.2f | msg size: %s | algbw (Gbps): %.2f | "
                    "busbw (Gbps): %.2f",
                    record_name, latency, convert_size(msg_size), algbw, busbw,
                )  # fmt: skip

    def get_raw_data(self) -> dict:
        return self.comms_dict.copy()

    def has_data(self) -> bool:
        return bool(self.comms_dict)

    def reset_data(self) -> None:
        self.comms_dict.clear()

    def get_operation_names(self) -> list:
        return list(self.comms_dict)

    def get_total_operations(self) -> int:
        return sum(rec[0] for sizes in self.comms_dict.values() for rec in sizes.values())

    def get_operation_summary(self, operation_name: str) -> Optional[dict]:
        sizes = self.comms_dict.get(operation_name)
        if sizes is None:
            return None
        return {size: _summary(size, rec) for size, rec in dict(sizes).items()}

    def log_all(self, print_log=True, show_straggler=False, return_dict=False, reduce_min=None):
        """Prints DeepSpeed's table (op, message size, count, total and trimmed-mean latency,
        algorithm and bus bandwidth) and, with `show_straggler`, each size's latency minimum
        over the ranks and the time this rank waited beyond it: `reduce_min(tensor)`, an
        in-place all-reduce MIN per size on every rank (comm.log_summary passes zerostream's;
        call it on all ranks). Returns the same as a dict with `return_dict`."""
        records = {name: dict(sizes) for name, sizes in self.comms_dict.items()}
        result = {
            "summary": {name: {} for name in records},
            "straggler_analysis": None,
            "metadata": {
                "world_size": _world(),
                "rank": _rank(),
                "timestamp": datetime.datetime.now().isoformat(),
            },
        }
        lines = [_row("Comm. Op", "Message Size", "Count", "Total Latency(ms)",
                      "Avg Latency(ms)", "tput_avg (Gbps)", "busbw_avg (Gbps)")]  # fmt: skip
        for name, sizes in records.items():
            lines.append(name)
            for size, rec in sorted(sizes.items()):
                s = result["summary"][name][size] = _summary(size, rec)
                cells = ("total_latency_ms", "avg_latency_ms", "tput_avg_gbps", "busbw_avg_gbps")
                lines.append(_row("", s["msg_size_str"], s["count"], *(s[c] for c in cells)))
        if show_straggler:
            self.paused += 1  # its all-reduces are not records
            try:
                result["straggler_analysis"] = _stragglers(records, lines, reduce_min)
            finally:
                self.paused -= 1
        if print_log:
            print("\n".join(lines), flush=True)
        return result if return_dict else None


def _summary(size: int, rec: list) -> dict:
    count, latencies, algbws, busbws = rec
    return {
        "count": count,
        "total_latency_ms": sum(latencies),
        "avg_latency_ms": trim_mean(latencies, 0.1),
        "tput_avg_gbps": trim_mean(algbws, 0.1),
        "busbw_avg_gbps": trim_mean(busbws, 0.1),
        "msg_size_bytes": size,
        "msg_size_str": convert_size(size),
    }


def _row(*cells) -> str:
    return "".join(f"{c: <20.2f}" if isinstance(c, float) else f"{c!s: <20}" for c in cells)


def _stragglers(records: dict, lines: list, reduce_min) -> dict:
    from ..accelerator import get_accelerator

    if reduce_min is None:

        def reduce_min(t):
            if _world() > 1:
                dist.all_reduce(t, op=dist.ReduceOp.MIN)

    device = get_accelerator().current_device_name()
    lines += ["_______________________________", "Breakdown with straggler effect",
              "-------------------------------",
              _row("Comm. Op", "Message Size", "Count", "Total comm lat(ms)",
                   "Total straggler(ms)", "Avg comm lat(ms)", "Avg straggler(ms)")]  # fmt: skip
    out: Dict[str, dict] = {}
    for name, sizes in records.items():
        lines.append(name)
        out[name] = {}
        for size, rec in sorted(sizes.items()):
            lats = torch.tensor(rec[1], dtype=torch.float64, device=device)
            mins = lats.clone()
            reduce_min(mins)
            waited = (lats - mins).tolist()
            s = out[name][size] = {
                "count": rec[0],
                "total_comm_lat_ms": float(mins.sum()),
                "total_straggler_ms": float(sum(waited)),
                "avg_comm_lat_ms": trim_mean(mins.tolist(), 0.1),
                "avg_straggler_ms": trim_mean(waited, 0.1),
                "msg_size_bytes": size,
                "msg_size_str": convert_size(size),
            }
            cells = (
                "total_comm_lat_ms",
                "total_straggler_ms",
                "avg_comm_lat_ms",
                "avg_straggler_ms",
            )
            lines.append(_row("", s["msg_size_str"], s["count"], *(s[c] for c in cells)))
    return out
