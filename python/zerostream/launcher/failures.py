"""The report `zerostream run` prints when ranks fail, built from torch elastic's
ChildFailedError (one ProcessFailure per failed rank: exit code, error file).

Note [First failure]
When one rank raises, its peers usually fail moments later with a collective error
("Connection closed by peer") that says nothing about the cause; elastic then stops the
rest. The report names the rank that failed first, with its error, before the others.
Elastic's own choice (`ChildFailedError.get_first_failure`) compares timestamps in whole
seconds, which ties for failures within a second and then picks the lowest rank, often a
bystander. Here the order is the modification time of each rank's error file (nanoseconds),
written as the exception leaves the user's code (see _child.py); a rank with no error file
(killed by a signal, or a --no_python program) counts from the second elastic noticed it.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import List

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError


@dataclass(frozen=True)
class RankFailure:
    rank: int
    local_rank: int
    exitcode: int  # negative: killed by that signal
    summary: str  # one line: "ValueError: boom" or what is known without an error file
    traceback: str  # the rank's Python traceback, "" when none was recorded
    when_ns: int  # see Note [First failure]

    @property
    def exit_status(self) -> int:
        """The launcher's exit status for this failure: the rank's code, or 128 + signal as a
        shell reports a process killed by one."""
        return self.exitcode if self.exitcode > 0 else 128 - self.exitcode

    def headline(self) -> str:
        if self.exitcode < 0:
            return f"rank {self.rank} failed (killed by {_signal_name(-self.exitcode)})"
        return f"rank {self.rank} failed (exit code {self.exitcode})"


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


# What elastic sends to stop the ranks still running once one failed (SIGKILL after
# TORCH_ELASTIC_SHUTDOWN_TIMEOUT); after the first failure these mean "stopped", not "failed".
_STOP_SIGNALS = (-signal.SIGTERM, -signal.SIGKILL)
# Sort rank: a Python error first, then a SIGKILL (the OOM killer's signal), then a SIGTERM.
_LATER = {-signal.SIGKILL: 1, -signal.SIGTERM: 2}


def _from_process_failure(rank: int, failure) -> RankFailure:
    recorded = os.path.isfile(str(failure.error_file))
    message = (failure.error_file_data or {}).get("message") if recorded else None
    traceback, summary = "", ""
    if isinstance(message, dict):  # torch's ErrorHandler layout (ours or the user's @record)
        summary = str(message.get("message", ""))
        traceback = str(message.get("extraInfo", {}).get("py_callstack", ""))
    elif isinstance(message, str):
        summary = message
    if not summary:
        if failure.exitcode == -signal.SIGKILL:
            summary = "no error recorded (out of memory? the kernel's OOM killer sends SIGKILL)"
        elif failure.exitcode < 0:
            summary = "no error recorded before the signal"
        else:
            summary = "no Python traceback recorded; see the rank's own output above"
    if recorded:
        when_ns = os.stat(failure.error_file).st_mtime_ns
    else:
        when_ns = int(failure.timestamp) * 1_000_000_000
    lines = summary.strip().splitlines() or [""]
    return RankFailure(
        rank=rank,
        local_rank=failure.local_rank,
        exitcode=failure.exitcode,
        summary=lines[0],
        traceback=traceback,
        when_ns=when_ns,
    )


def failures_in_order(error: ChildFailedError) -> List[RankFailure]:
    """The failed ranks, the one that failed first leading (Note [First failure])."""
    found = [_from_process_failure(rank, f) for rank, f in error.failures.items()]
    return sorted(found, key=lambda f: (_LATER.get(f.exitcode, 0), f.when_ns, f.rank))


def report(failures: List[RankFailure]) -> str:
    """Text for stderr: the first failure with its traceback, then one line per other failed
    rank, then the ranks the launcher stopped."""
    first, rest = failures[0], failures[1:]
    out = [f"zerostream run: {first.headline()}: {first.summary}"]
    out += ["  " + line for line in first.traceback.rstrip().splitlines()]
    stopped = [f.rank for f in rest if f.exitcode in _STOP_SIGNALS]
    for other in rest:
        if other.exitcode not in _STOP_SIGNALS:
            out.append(f"zerostream run: then {other.headline()}: {other.summary}")
    if stopped:
        ranks = ", ".join(str(r) for r in stopped)
        out.append(f"zerostream run: stopped by the launcher after that: rank(s) {ranks}")
    return "\n".join(out)
