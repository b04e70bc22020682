"""Collective fingerprints: whether every rank issues the same collectives, in the same order,
with the same shapes and dtypes, and where they differ.

Note [Ranks that issue different collectives]
  Collectives match by order, not by name: when one rank issues an all-reduce the others do
  not (a parameter without a gradient on one rank, a placement sized from one rank's free
  memory), NCCL hangs, or reduces one rank's bytes into another's tensor when the sizes
  happen to agree; Gloo aborts on a size mismatch, or hangs too. None of these names the
  line that issued the odd call. So every collective that goes through zerostream.comm is
  fingerprinted before it is issued: the operation, the group (its global ranks), each
  tensor's shape and dtype, the reduce op and root, and the Python frame that called it.
  Fingerprints are compared, never frames (two ranks may issue the same call from two
  lines); the frames name the calls in the error.

  ZEROSTREAM_CHECK_COLLECTIVES (read when the process group is made) turns the check on:
    step  every rank keeps this step's fingerprints and, when the optimizer step ends,
          hands their digest to the default group's store; rank 0 compares them and leaves
          a verdict every rank reads, so a step whose collectives differed raises on every
          rank, naming the first call that differs. Costs a few store round trips a step
          and no collective, no device synchronisation.
    each  every collective is compared before it is issued, through the store, among the
          members of its group: a mismatch raises before the call can hang or mix data,
          and a rank that does not arrive within ZEROSTREAM_CHECK_TIMEOUT seconds (default
          300) is named with the last collective it did issue. A store round trip per
          collective and member: for finding a hang, not for production runs.
  torch's own TORCH_DISTRIBUTED_DEBUG=DETAIL compares collectives too (shapes and op
  types, for calls made directly on torch.distributed as well) but names no frame and
  keeps no history; it combines with this check.
  ZEROSTREAM_COLLECTIVE_LOG=<dir> writes each fingerprint as one JSON line to
  <dir>/rank<R>-<port>.<attempt>.jsonl as it is issued (line-buffered, so a rank that
  aborts leaves its log): the test harness compares the ranks' logs of every job after
  every test with first_difference() (tests/python/multirank.py for run_ranks, conftest.py
  for ranks a test starts itself, through the launcher or as subprocesses).
  Point-to-point calls (send, recv) differ between ranks by design and are logged but
  never compared.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import pickle
import sys
import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

MODE_ENV = "ZEROSTREAM_CHECK_COLLECTIVES"
LOG_ENV = "ZEROSTREAM_COLLECTIVE_LOG"
TIMEOUT_ENV = "ZEROSTREAM_CHECK_TIMEOUT"
MODES = ("off", "step", "each")
UNCOMPARED = frozenset({"send", "recv", "isend", "irecv"})
# The frames a fingerprint skips: this module, comm's wrappers and the stdlib's decorators.
_SKIP_FILES = (
    os.sep + os.path.join("zerostream", "comm", "collective_check.py"),
    os.sep + os.path.join("zerostream", "comm", "__init__.py"),
    os.sep + "functools.py",
    os.sep + "contextlib.py",
)


class CollectiveMismatchError(RuntimeError):
    """Ranks issued different collectives (Note [Ranks that issue different collectives])."""


def _describe(value) -> Optional[str]:
    if isinstance(value, torch.Tensor):
        return f"{list(value.shape)}:{str(value.dtype).replace('torch.', '')}"
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        return "[" + ",".join(_describe(v) for v in value) + "]"
    return None


def _frame(depth: int = 3) -> str:
    """The innermost `depth` callers outside comm/__init__.py and this file, innermost first:
    'path:line in function < path:line in function ...'."""
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.endswith(_SKIP_FILES):
        f = f.f_back
    out = []
    while f is not None and len(out) < depth:
        path = f.f_code.co_filename
        at = path.rfind("/zerostream/")
        if at >= 0:
            path = path[at + 1 :]
        out.append(f"{path}:{f.f_lineno} in {f.f_code.co_name}")
        f = f.f_back
    return " < ".join(out) or "?"


def _group_ranks(group) -> Tuple[int, ...]:
    if group is None or group is dist.group.WORLD:
        return tuple(range(dist.get_world_size()))
    return tuple(dist.get_process_group_ranks(group))


def fingerprint(op: str, args: tuple, kwargs: dict) -> dict:
    """What must agree across the members of the call's group, and the frame that called."""
    tensors = [d for d in (_describe(a) for a in args) if d is not None]
    tensors += [d for k, v in kwargs.items() if k != "group" for d in [_describe(v)] if d]
    extra = []
    for key in ("op", "src", "dst"):
        if key in kwargs and kwargs[key] is not None:
            extra.append(f"{key}={getattr(kwargs[key], 'name', kwargs[key])}")
    if op in ("all_gather_object", "broadcast_object_list"):
        tensors = []  # the objects' sizes differ between ranks by design
    return {
        "op": op,
        "group": list(_group_ranks(kwargs.get("group"))),
        "tensors": tensors,
        "extra": extra,
        "frame": _frame(),
    }


def signature(fp: dict) -> tuple:
    """The part of a fingerprint that must be equal on every member of the group."""
    return (fp["op"], tuple(fp["group"]), tuple(fp["tensors"]), tuple(fp["extra"]))


def describe(fp: dict) -> str:
    shapes = " ".join(fp["tensors"])
    extra = " ".join(fp["extra"])
    return " ".join(x for x in (fp["op"], shapes, extra) if x) + f" (at {fp['frame']})"


def first_difference(logs: Dict[int, List[dict]]) -> Optional[str]:
    """The first collective on which members of one group disagree, in words, or None.
    `logs[rank]` is that rank's fingerprints in issue order (point-to-point calls are
    skipped). Each group's calls are compared among its own members."""
    per_group: Dict[tuple, Dict[int, List[Tuple[int, dict]]]] = {}
    for rank, log in logs.items():
        for i, fp in enumerate(log):
            if fp["op"] in UNCOMPARED:
                continue
            per_group.setdefault(tuple(fp["group"]), {}).setdefault(rank, []).append((i, fp))
    found = []
    for group, by_rank in per_group.items():
        members = [r for r in group if r in logs]
        if len(members) < 2:
            continue
        seqs = {r: by_rank.get(r, []) for r in members}
        first = members[0]
        for other in members[1:]:
            a, b = seqs[first], seqs[other]
            for k in range(max(len(a), len(b))):
                if k < len(a) and k < len(b) and signature(a[k][1]) == signature(b[k][1]):
                    continue
                what_a = describe(a[k][1]) if k < len(a) else "nothing more"
                what_b = describe(b[k][1]) if k < len(b) else "nothing more"
                scope = "the world group" if len(group) == len(logs) else f"group {list(group)}"
                where = min(x[k][0] for x in (a, b) if k < len(x))
                found.append(
                    (
                        where,
                        f"collective #{k} on {scope}: rank {first} issued {what_a}; "
                        f"rank {other} issued {what_b}",
                    )
                )
                break
    if not found:
        return None
    return min(found)[1]


def _world_key() -> str:
    """Which job's log a rank writes: its rendezvous port and restart attempt, so that jobs
    run one after another into one directory (a test that trains, then resumes on another
    world; a rank restarted by the launcher) are compared each on its own."""
    port = os.environ.get("MASTER_PORT", "local")
    return f"{port}.{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def read_worlds(directory: str) -> Dict[str, Dict[int, List[dict]]]:
    """The logs ZEROSTREAM_COLLECTIVE_LOG wrote, by job, then rank (a torn last line, from
    a rank killed while writing it, is skipped)."""
    worlds: Dict[str, Dict[int, List[dict]]] = {}
    if not os.path.isdir(directory):
        return worlds
    for name in os.listdir(directory):
        if not (name.startswith("rank") and name.endswith(".jsonl")):
            continue
        rank, _, key = name[4:-6].partition("-")
        entries = []
        with open(os.path.join(directory, name)) as f:
            for line in f:
                try:
                    entries.append(json.loads(line))
                except ValueError:
                    break
        worlds.setdefault(key, {})[int(rank)] = entries
    return worlds


def read_logs(directory: str) -> Dict[int, List[dict]]:
    """The per-rank logs of the one job that wrote into `directory`."""
    worlds = read_worlds(directory)
    if len(worlds) > 1:
        raise ValueError(f"{directory} holds the logs of {len(worlds)} jobs; use read_worlds")
    return next(iter(worlds.values()), {})


class Checker:
    """This process's fingerprints: logged, and compared across ranks in "step" or "each"
    mode (Note [Ranks that issue different collectives])."""

    def __init__(self, mode: str, log_dir: Optional[str], timeout_s: float):
        if mode not in MODES:
            raise ValueError(f"{MODE_ENV}: expected one of {', '.join(MODES)}; got {mode!r}")
        self.mode = mode
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.step_log: List[dict] = []
        self.steps = 0
        self.issued = 0
        self.depth = 0  # a named collective that calls another is fingerprinted once
        self._store = None
        self._seq: Dict[tuple, int] = {}
        self._log = None
        if log_dir:
            os.makedirs(log_dir, exist_ok=True)
            name = f"rank{self.rank}-{_world_key()}.jsonl"
            self._log = open(os.path.join(log_dir, name), "a", buffering=1)

    @property
    def store(self):
        if self._store is None:
            base = dist.distributed_c10d._get_default_store()
            self._store = dist.PrefixStore("zerostream/collectives", base)
        return self._store

    def before(self, op: str, args: tuple, kwargs: dict) -> None:
        fp = fingerprint(op, args, kwargs)
        self.issued += 1
        if self._log is not None:
            self._log.write(json.dumps(fp) + "\n")
        if op in UNCOMPARED:
            return
        if self.mode == "step":
            self.step_log.append(fp)
        elif self.mode == "each":
            self._compare_now(fp)

    # --- "each" ----------------------------------------------------------------------------
    def _compare_now(self, fp: dict) -> None:
        group = tuple(fp["group"])
        if len(group) < 2:
            return
        seq = self._seq.get(group, 0)
        self._seq[group] = seq + 1
        tag = "-".join(map(str, group)) if len(group) < self.world else "world"
        key = f"each/{tag}/{seq}/"
        store = self.store
        store.set(key + str(self.rank), pickle.dumps(fp))
        store.set(f"each/{tag}/last/{self.rank}", pickle.dumps((seq, fp)))
        others = [r for r in group if r != self.rank]
        try:
            store.wait([key + str(r) for r in others], self.timeout)
        except Exception:
            raise CollectiveMismatchError(self._absent(tag, seq, fp, others)) from None
        mine = signature(fp)
        for r in others:
            theirs = pickle.loads(store.get(key + str(r)))
            if signature(theirs) != mine:
                raise CollectiveMismatchError(
                    f"[rank {self.rank}] collectives differ between ranks at collective "
                    f"#{seq} of group {list(group)}: rank {self.rank} issued {describe(fp)}; "
                    f"rank {r} issued {describe(theirs)}"
                )
        if seq >= 2:  # every member has read seq - 2 once they all wrote seq - 1
            store.delete_key(f"each/{tag}/{seq - 2}/{self.rank}")

    def _absent(self, tag: str, seq: int, fp: dict, others: Sequence[int]) -> str:
        store = self.store
        late = [r for r in others if not store.check([f"each/{tag}/{seq}/{r}"])]
        said = []
        for r in late:
            last_key = f"each/{tag}/last/{r}"
            if store.check([last_key]):
                last_seq, last_fp = pickle.loads(store.get(last_key))
                said.append(f"rank {r} last issued #{last_seq}: {describe(last_fp)}")
            else:
                said.append(f"rank {r} has issued none on it")
        return (
            f"[rank {self.rank}] ranks {late} did not reach collective #{seq} "
            f"({describe(fp)} on this rank) within {self.timeout.total_seconds():.0f} s; "
            + "; ".join(said)
        )

    # --- "step" ----------------------------------------------------------------------------
    def step_ended(self) -> None:
        """Compares this step's collectives across the world group (every rank calls it
        once per optimizer step)."""
        if self.mode != "step" or self.world < 2:
            self.step_log.clear()
            return
        log, self.step_log = self.step_log, []
        step, self.steps = self.steps, self.steps + 1
        digest = hashlib.sha1(repr([signature(fp) for fp in log]).encode()).hexdigest()
        store = self.store
        store.set(f"step/{step}/{self.rank}", f"{len(log)}:{digest}")
        verdict_key = f"step/{step}/verdict"
        if self.rank == 0:
            keys = [f"step/{step}/{r}" for r in range(self.world)]
            store.wait(keys, self.timeout)
            values = [store.get(k).decode() for k in keys]
            odd = [r for r, v in enumerate(values) if v != values[0]]
            store.set(verdict_key, json.dumps(odd))
            for r in range(1, self.world):
                store.delete_key(f"step/{step}/{r}")
        else:
            store.wait([verdict_key], self.timeout)
            odd = json.loads(store.get(verdict_key))
        if not odd:
            return
        # Every rank builds the same message from rank 0's log and the first odd rank's.
        other = odd[0]
        if self.rank in (0, other):
            store.set(f"step/{step}/log/{self.rank}", pickle.dumps(log))
        store.wait([f"step/{step}/log/0", f"step/{step}/log/{other}"], self.timeout)
        logs = {r: pickle.loads(store.get(f"step/{step}/log/{r}")) for r in (0, other)}
        found = first_difference(logs) or "the same calls, in another order of groups"
        raise CollectiveMismatchError(
            f"[rank {self.rank}] the ranks issued different collectives in optimizer step "
            f"{step} (ranks {odd} differ from rank 0): {found}"
        )


_checker: Optional[Checker] = None
# The default group _checker was made for, held weakly: a reference here would keep the
# group, and its backend's threads, alive past its destruction (Note [A process group that
# outlives its destruction] in comm/__init__.py).
_for_group: Optional[weakref.ref] = None


def active() -> Optional[Checker]:
    """This process's checker, made on the first call after the default group exists (a
    group destroyed and made again gets a new one), or None when the switches are off."""
    global _checker, _for_group
    world = dist.group.WORLD if dist.is_initialized() else None
    if (_for_group() if _for_group is not None else None) is world:
        return _checker
    if _checker is not None and _checker._log is not None:
        _checker._log.close()
    _checker, _for_group = None, (weakref.ref(world) if world is not None else None)
    if world is None:
        return None
    mode = os.environ.get(MODE_ENV, "off").strip().lower() or "off"
    log_dir = os.environ.get(LOG_ENV) or None
    if mode == "off" and log_dir is None:
        return None
    text = os.environ.get(TIMEOUT_ENV, "300")
    try:
        timeout = float(text)
    except ValueError:
        timeout = -1.0
    if not timeout > 0:
        raise ValueError(f"{TIMEOUT_ENV}: expected a positive number of seconds; got {text!r}")
    _checker = Checker(mode, log_dir, timeout)
    return _checker


def step_ended() -> None:
    """The engine's optimizer step ended: the "step" mode's comparison point."""
    checker = active()
    if checker is not None:
        checker.step_ended()
