"""Who stopped answering: the records each rank leaves in the default group's store (which
process it is, and when its Python exits, why) and the lookup comm's collectives make when
they fail, so the error names the rank that died (Note [Naming the rank that stopped
answering])."""

from __future__ import annotations

import atexit
import datetime
import functools
import json
import logging
import os
import socket
import sys
import time
from typing import Optional, Tuple

import torch.distributed as dist

logger = logging.getLogger("zerostream")

# Note [Naming the rank that stopped answering]
#   A collective that fails because a peer died says only "Connection closed by peer
#   [addr]:port" (Gloo) or that it timed out; the rank behind the address is not named. So
#   each rank leaves in the default group's store, at init, which process it is (pid, host,
#   start time, pid namespace) and, when its Python exits, that it exited and why (an uncaught
#   exception, or its program ended). On a failure the survivor reads those records and names
#   the ranks that left one, or whose process is gone where it shares this machine's pid
#   namespace (/proc: no such pid, a zombie, or the pid reused by a later process): a rank
#   killed by a signal leaves no exit record, its process is the evidence. A rank that is
#   alive but stopped (SIGSTOP, a debugger: state T in /proc) is named too, when the
#   collective times out waiting for it. A rank that is alive and not stopped but never
#   reaches the collective (a deadlock, an endless loop, a hung read: issue 32 item 4) is
#   named by elimination: each rank whose collective failed leaves a "failed" record, and
#   when nothing else explains the failure, a peer that left none within _HUNG_SETTLE_S of
#   this rank's failure, while its process is alive, is named with its state and pid (a
#   stack dumper finds where it is). Ranks on other machines without an exit record stay
#   unnamed. The lookups run under a short store timeout,
#   so a dead store costs seconds, not the collectives' timeout; a dead store means the
#   process hosting it is gone (rank 0's, unless the launcher's agent hosts it). Nothing here
#   holds the store or the group in a global (Note [A process group that outlives its
#   destruction]).

_PEER_KEY = "zerostream/peer/{}"
_EXIT_KEY = "zerostream/exit/{}"
_FAILED_KEY = "zerostream/failed/{}"  # this rank's collective failed (Note above)
_STORE_PROBE_TIMEOUT = datetime.timedelta(seconds=5)
_SETTLE_S = 0.5  # a peer whose sockets just closed may take a moment to become a zombie
_HUNG_SETTLE_S = 2.0  # the other ranks' collectives time out too, each from its own entry
_STATES = {"R": "running", "S": "sleeping", "D": "in uninterruptible I/O"}
_uncaught: Optional[str] = None  # what this rank's excepthook last reported


def _proc_stat(pid) -> Optional[Tuple[str, str]]:
    """(state, start time in clock ticks since boot) of /proc/<pid>/stat, None if absent."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # from field 3 on; the name may hold spaces
    return fields[0], fields[19]


def _pid_namespace() -> Optional[str]:
    """Which pid namespace of which boot this process lives in: processes with the same value
    see each other's pids. None where /proc cannot tell."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return None


def _default_store():
    return dist.distributed_c10d._get_default_store()


def register() -> None:
    """Leaves this rank's identity in the default store and arranges for its exit to be
    recorded there (Note [Naming the rank that stopped answering])."""
    if dist.get_world_size() == 1:
        return
    stat = _proc_stat("self")
    identity = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "pidns": _pid_namespace(),
        "start": stat[1] if stat else None,
    }
    try:
        _default_store().set(_PEER_KEY.format(dist.get_rank()), json.dumps(identity))
    except Exception as exc:  # a store that cannot set: failures just stay unnamed
        logger.debug("zerostream: rank identity not stored: %s", exc)
        return
    hook = sys.excepthook
    if not (isinstance(hook, functools.partial) and hook.func is _remember_uncaught):
        sys.excepthook = functools.partial(_remember_uncaught, hook)
    atexit.register(_record_exit, dist.get_rank())


def _remember_uncaught(previous, kind, value, tb) -> None:
    # Python calls the hook for an uncaught exception, and so do launchers that catch the
    # script's exception to report it (zerostream's, torchrun's error handler).
    global _uncaught
    _uncaught = f"uncaught {kind.__name__}: {value}"
    previous(kind, value, tb)


def _record_exit(rank: int) -> None:
    """atexit: tells the peers that this rank's Python is exiting, and why."""
    if not dist.is_initialized():
        return  # the script destroyed the group itself; peers fall back to the pid
    try:
        store = _default_store()
        store.set_timeout(_STORE_PROBE_TIMEOUT)
        store.set(_EXIT_KEY.format(rank), (_uncaught or "its program ended")[:300])
    except Exception:  # the store may be gone already (its host exited first)
        pass


def _peer_fate(store, rank: int, here: Optional[str]) -> Optional[str]:
    """'rank 1 (pid 7 on host h) has exited (...)' when the store or /proc shows the rank is
    gone, else None (alive, or elsewhere without an exit record)."""
    peer = None
    if store.check([_PEER_KEY.format(rank)]):
        peer = json.loads(store.get(_PEER_KEY.format(rank)))
    who = f"rank {rank}" + (f" (pid {peer['pid']} on host {peer['host']})" if peer else "")
    if store.check([_EXIT_KEY.format(rank)]):
        return f"{who} has exited ({store.get(_EXIT_KEY.format(rank)).decode(errors='replace')})"
    if peer is None or here is None or peer["pidns"] != here:
        return None
    stat = _proc_stat(peer["pid"])
    if stat is None or stat[0] in ("Z", "X") or stat[1] != peer["start"]:
        return f"{who} is gone: its process ended without exiting Python (killed, or crashed)"
    if stat[0] in ("T", "t"):
        # Alive but not running: SIGSTOP (Ctrl-Z, a job-control stop) or a debugger's hold.
        return f"{who} is stopped (SIGSTOP, or held by a debugger), so it cannot answer"
    return None


def _absent_but_alive(store, me: int, world: int, here: Optional[str]) -> list:
    """Peers alive on this machine that left no failed record within _HUNG_SETTLE_S: they
    never reached the collective the others are failing in."""
    deadline = time.monotonic() + _HUNG_SETTLE_S
    while True:
        missing = [r for r in range(world) if r != me and not store.check([_FAILED_KEY.format(r)])]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    out = []
    for rank in missing:
        if not store.check([_PEER_KEY.format(rank)]):
            continue
        peer = json.loads(store.get(_PEER_KEY.format(rank)))
        stat = _proc_stat(peer["pid"]) if peer["pidns"] == here and here else None
        if stat is None or stat[1] != peer["start"] or stat[0] not in _STATES:
            continue
        out.append(
            f"rank {rank} (pid {peer['pid']} on host {peer['host']}) is alive "
            f"({_STATES[stat[0]]}) but has not reached this collective: it is busy or hung "
            f"elsewhere (`py-spy dump --pid {peer['pid']}` shows where)"
        )
    return out


def _store_address(store) -> str:
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return f" at {store.host}:{store.port}" if isinstance(store, dist.TCPStore) else ""


def who_stopped_answering() -> str:
    """What the store and /proc say about peers that are gone, as clauses ending in '; ', or
    '' when nothing is known (Note [Naming the rank that stopped answering])."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return ""
    me, world, here = dist.get_rank(), dist.get_world_size(), _pid_namespace()
    try:
        store = _default_store()
        saved = store.timeout
    except Exception:
        return ""
    deadline = time.monotonic() + _SETTLE_S
    try:
        store.set_timeout(_STORE_PROBE_TIMEOUT)
        store.set(_FAILED_KEY.format(me), "1")
        while True:
            gone = [f for r in range(world) if r != me and (f := _peer_fate(store, r, here))]
            if gone or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if not gone:
            gone = _absent_but_alive(store, me, world, here)
        return "".join(f"{g}; " for g in gone)
    except Exception as exc:
        agent = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
        return (
            f"the process group's store{_store_address(store)} is unreachable "
            f"({type(exc).__name__}), so its host, "
            f"{'the launcher agent' if agent else 'rank 0'}, has likely exited; "
        )
    finally:
        try:
            store.set_timeout(saved)
        except Exception:
            pass
