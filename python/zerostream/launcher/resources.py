"""Which hosts and slots a run uses: DeepSpeed's hostfile and its --include/--exclude filters.

A hostfile has one `HOST slots=N` line per host; `#` starts a comment (a whole line or the
end of one), blank lines are skipped. A slot is one process (on a GPU host, one GPU: slot i
is the i-th visible device).
Filters are `NODE[:SLOT[,SLOT...]][@NODE...]` (DeepSpeed's `parse_resource_filter`):

- `--include worker-0:0,2@worker-1` keeps slots 0 and 2 of worker-0 and every slot of
  worker-1, and only those hosts;
- `--exclude worker-1:0` keeps everything but slot 0 of worker-1; a bare host drops it whole.

Hosts keep the hostfile's order (the node ranks follow it) and slots are sorted. The chosen
hosts and slots travel to the nodes as DeepSpeed's world info (Note [World info]). Everything
here is pure: no process is started and only the hostfile is read.
"""

from __future__ import annotations

import base64
import collections
import json
import re
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

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


def _slots_text(slots: Sequence[int]) -> str:
    if list(slots) == list(range(len(slots))):
        return f"0-{len(slots) - 1}"
    return ",".join(str(s) for s in slots)


def _check_against(
    pool: Mapping[str, Sequence[int]],
    selection: Dict[str, List[int]],
    flag: str,
    origins: Optional[Mapping[str, Host]] = None,
) -> None:
    for name, slots in selection.items():
        if name not in pool:
            known = ", ".join(pool)
            raise ValueError(f"{flag}: host {name!r} is not among the hosts ({known})")
        for slot in slots:
            if slot not in pool[name]:
                where = ""
                if origins and name in origins:
                    where = f" (slots={origins[name].slots} at {origins[name].origin})"
                raise ValueError(
                    f"{flag}: host {name!r} has no slot {slot}; it has slots "
                    f"{_slots_text(pool[name])}{where}"
                )


def filter_slots(
    pool: Mapping[str, Sequence[int]],
    include: str = "",
    exclude: str = "",
    origins: Optional[Mapping[str, Host]] = None,
) -> "collections.OrderedDict[str, List[int]]":
    """{host: slots} after one of --include/--exclude (DeepSpeed's `parse_resource_filter`),
    in the pool's host order. The result may be empty: whether a run can have no slot is the
    caller's question. `origins` only adds where a host's slot count was said to errors."""
    if include and exclude:
        raise ValueError("--include and --exclude are mutually exclusive; give one of them")
    if not include and not exclude:
        return collections.OrderedDict((name, list(slots)) for name, slots in pool.items())
    flag, spec = ("--include", include) if include else ("--exclude", exclude)
    selection = parse_filter(spec, flag)
    _check_against(pool, selection, flag, origins)
    out: "collections.OrderedDict[str, List[int]]" = collections.OrderedDict()
    for name, slots in pool.items():
        if include:
            if name in selection:
                out[name] = selection[name] or list(slots)
            continue
        dropped = selection.get(name)
        kept = (
            list(slots) if dropped is None else [s for s in slots if dropped and s not in dropped]
        )
        if kept:
            out[name] = kept
    return out


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
    pool = filter_slots(pool, include, exclude, origins=hosts)
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


# Note [World info]
# DeepSpeed hands each node the job's hosts and slots as one command-line word: the JSON of
# {host: [slot, ...]} in URL-safe base64 (its launcher's --world_info). A node finds its own
# share by its node rank, the index of its host in that (ordered) mapping, which is why pdsh's
# per-node `%n` is enough to start every node from one command line.
def encode_world_info(world: Mapping[str, Union[int, Sequence[int]]]) -> str:
    """{host: slots} (a list, or a count as in a hostfile) as DeepSpeed's --world_info word."""
    text = json.dumps({h: s if isinstance(s, int) else list(s) for h, s in world.items()})
    return base64.urlsafe_b64encode(text.encode("utf-8")).decode("ascii")


def decode_world_info(word: str) -> List[Node]:
    """The nodes of a --world_info word, in node-rank order (see Note [World info])."""
    try:
        world = json.loads(base64.urlsafe_b64decode(word.encode("ascii")).decode("utf-8"))
    except (ValueError, UnicodeError) as exc:
        raise ValueError(f"--world_info {word!r}: not base64 JSON ({exc})") from exc
    if not isinstance(world, dict) or not world:
        raise ValueError(f"--world_info: expected a non-empty {{host: [slots]}}; got {world!r}")
    nodes = []
    for host, slots in world.items():
        if isinstance(slots, int) and not isinstance(slots, bool):
            slots = list(range(slots))
        ok = isinstance(slots, list) and slots
        if not ok or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in slots
        ):
            raise ValueError(
                f"--world_info: host {host!r} has slots {slots!r}; expected a non-empty list of "
                f"device indexes"
            )
        nodes.append(Node(host, tuple(slots)))
    return nodes
