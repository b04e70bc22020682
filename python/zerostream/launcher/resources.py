"""Which hosts and slots a run uses: DeepSpeed's hostfile and its --include/--exclude filters.

A hostfile has one `HOST slots=N` line per host; `#` starts a comment (a whole line or the
end of one), blank lines are skipped. A slot is one process (on a GPU host, one GPU: slot i
is the i-th visible device).
Filters are `NODE[:SLOT[,SLOT...]][@NODE...]` (DeepSpeed's `parse_resource_filter`):

- `--include worker-0:0,2@worker-1` keeps slots 0 and 2 of worker-0 and every slot of
  worker-1, and only those hosts;
- `--exclude worker-1:0` keeps everything but slot 0 of worker-1; a bare host drops it whole.

Hosts keep the hostfile's order (the node ranks follow it) and slots are sorted. Everything
here is pure: no process is started and only the hostfile is read.
"""

from __future__ import annotations

import collections
import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

# One host and its slot count, optionally followed by other MPI-style keys DeepSpeed ignores
# too (`max_slots=`): `worker-0 slots=8`.
_LINE = re.compile(r"^(\S+)\s+slots=(\d+)(\s+\S+=\S+)*$")


@dataclass(frozen=True)
class Host:
    """A host the run may use, with the slots it offers and where that was said."""

    name: str
    slots: int
    origin: str  # "hostfile:3" (file and line) or a description of this machine


@dataclass(frozen=True)
class Node:
    """A host after filtering: the slots this run starts one process on, in order."""

    name: str
    slots: Tuple[int, ...]


def parse_hostfile_text(text: str, path: str) -> "collections.OrderedDict[str, Host]":
    """Hosts in file order; ValueError naming the file and line for a bad or repeated one."""
    hosts: "collections.OrderedDict[str, Host]" = collections.OrderedDict()
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()  # host names never contain '#'
        if not line:
            continue
        match = _LINE.match(line)
        if match is None:
            raise ValueError(
                f"{path}:{lineno}: expected 'HOST slots=N' (N a whole number); got {line!r}"
            )
        name, slots = match.group(1), int(match.group(2))
        if name in hosts:
            raise ValueError(
                f"{path}:{lineno}: host {name!r} is listed twice (first at "
                f"{hosts[name].origin}); give each host one line with its total slots"
            )
        if slots < 1:
            raise ValueError(f"{path}:{lineno}: host {name!r} has slots=0; it needs at least 1")
        hosts[name] = Host(name, slots, f"{path}:{lineno}")
    if not hosts:
        raise ValueError(f"{path}: no 'HOST slots=N' line (empty or only comments)")
    return hosts


def parse_hostfile(path: str) -> "collections.OrderedDict[str, Host]":
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ValueError(f"--hostfile {path}: cannot read it ({exc.strerror})") from exc
    return parse_hostfile_text(text, path)


def parse_filter(spec: str, flag: str) -> "collections.OrderedDict[str, List[int]]":
    """`NODE[:SLOT,...][@NODE...]` as {host: [slots]}; [] means the whole host. A host named
    twice has its slot lists merged (as DeepSpeed does)."""
    out: "collections.OrderedDict[str, List[int]]" = collections.OrderedDict()
    for part in spec.split("@"):
        name, colon, slot_text = part.partition(":")
        if not name:
            raise ValueError(f"{flag} {spec}: empty host name in {part!r} (format NODE[:SLOT,...])")
        slots: List[int] = []
        if colon:
            for item in slot_text.split(","):
                if not item.strip().isdigit():
                    raise ValueError(
                        f"{flag} {spec}: slot {item!r} of host {name!r} is not a whole number "
                        f"(format NODE[:SLOT,SLOT...][@NODE...])"
                    )
                slots.append(int(item))
        if name not in out:
            out[name] = sorted(set(slots))
        elif out[name] and slots:
            out[name] = sorted(set(out[name] + slots))
        else:
            out[name] = []  # the whole host and some of its slots: the whole host
    return out


def _check_against(
    hosts: "collections.OrderedDict[str, Host]", selection: Dict[str, List[int]], flag: str
) -> None:
    for name, slots in selection.items():
        if name not in hosts:
            known = ", ".join(hosts)
            raise ValueError(f"{flag}: host {name!r} is not among the hosts ({known})")
        host = hosts[name]
        for slot in slots:
            if slot >= host.slots:
                raise ValueError(
                    f"{flag}: host {name!r} has no slot {slot}; it has slots 0-{host.slots - 1} "
                    f"(slots={host.slots} at {host.origin})"
                )


def select_nodes(
    hosts: "collections.OrderedDict[str, Host]",
    include: str = "",
    exclude: str = "",
    num_nodes: Optional[int] = None,
    num_gpus: Optional[int] = None,
) -> List[Node]:
    """The nodes of the run: include/exclude applied, then the first --num_nodes hosts, then
    --num_gpus slots on each (DeepSpeed's order). The flag combinations are checked by the
    caller; a filter or count that leaves nothing, or asks for more than there is, raises."""
    pool = collections.OrderedDict((h.name, list(range(h.slots))) for h in hosts.values())
    if include:
        selection = parse_filter(include, "--include")
        _check_against(hosts, selection, "--include")
        pool = collections.OrderedDict(
            (name, selection[name] or slots) for name, slots in pool.items() if name in selection
        )
    elif exclude:
        selection = parse_filter(exclude, "--exclude")
        _check_against(hosts, selection, "--exclude")
        for name, slots in selection.items():
            pool[name] = [s for s in pool[name] if slots and s not in slots]
        pool = collections.OrderedDict((n, s) for n, s in pool.items() if s)
        if not pool:
            raise ValueError(f"--exclude {exclude}: leaves no slot on any host")
    if num_nodes is not None:
        if num_nodes > len(pool):
            raise ValueError(
                f"--num_nodes {num_nodes}: only {len(pool)} host(s) available ({', '.join(pool)})"
            )
        pool = collections.OrderedDict(list(pool.items())[:num_nodes])
    if num_gpus is not None:
        for name in pool:
            if num_gpus > hosts[name].slots:
                raise ValueError(
                    f"--num_gpus {num_gpus}: host {name!r} has {hosts[name].slots} slot(s) "
                    f"({hosts[name].origin})"
                )
            pool[name] = list(range(num_gpus))
    return [Node(name, tuple(slots)) for name, slots in pool.items()]
