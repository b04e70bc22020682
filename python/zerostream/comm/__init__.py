"""Collectives over torch.distributed, as `deepspeed.comm` offers them.

One place for: process-group setup from launcher environments (torchrun, the zerostream and
deepspeed launchers, SLURM, Open MPI), Gloo fallbacks for the tensor collectives it lacks, and
errors that start with the rank and name the rank that stopped answering (a peer that died
shows up here first; the records behind that live in peers.py), from synchronous calls and
from the work handles of asynchronous ones.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import inspect
import json
import logging
import math
import os
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp  # noqa: F401  (re-exported, as deepspeed.comm does)

from ..accelerator import get_accelerator
from . import collective_check, comms_logging, host_agreement, peers
from .host_agreement import host_group

if dist.is_available():
    try:  # before any group exists: see Note [A process group that outlives its destruction]
        import torch.distributed.nn.functional  # noqa: F401
    except ImportError:
        pass

logger = logging.getLogger("zerostream")

# The process's comms logger (DeepSpeed's `deepspeed.comm.comms_logger`): off until the
# `comms_logger` section or configure() turns it on (comms_logging.py).
comms_logger = comms_logging.CommsLogger()


def default_timeout() -> datetime.timedelta:
    """The collectives' timeout: DEEPSPEED_TIMEOUT minutes (as DeepSpeed reads it), else 10.
    Read when a process group is made, so a bad value cannot break `import zerostream`."""
    text = os.environ.get("DEEPSPEED_TIMEOUT")
    if text is None:
        return datetime.timedelta(minutes=10)
    try:
        minutes = float(text)
    except ValueError:
        minutes = math.nan
    if not (math.isfinite(minutes) and minutes > 0):
        raise ValueError(
            f"DEEPSPEED_TIMEOUT: expected a positive number of minutes (such as 30 or 0.5); "
            f"got {text!r}"
        )
    return datetime.timedelta(minutes=minutes)


# --- setup --------------------------------------------------------------------------------------


def _env_from_launchers(distributed_port: int) -> bool:
    """Fills RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* from SLURM or Open MPI when torchrun did not.
    True when no launcher is there: a plain `python train.py`, one process."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return False
    for rank_key, size_key, local_key in (
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
        ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
        ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ):
        if rank_key in env and size_key in env:
            env["RANK"], env["WORLD_SIZE"] = env[rank_key], env[size_key]
            env.setdefault("LOCAL_RANK", env.get(local_key, "0"))
            if "MASTER_ADDR" not in env:
                nodes = env.get("SLURM_LAUNCH_NODE_IPADDR") or env.get("SLURM_STEP_NODELIST")
                if env["WORLD_SIZE"] != "1" and not nodes:
                    raise RuntimeError(
                        f"{rank_key}/{size_key} are set but MASTER_ADDR is not: set MASTER_ADDR "
                        f"to the address of rank 0 (and MASTER_PORT, default {distributed_port})"
                    )
                env["MASTER_ADDR"] = (nodes or "127.0.0.1").split(",")[0]
            env.setdefault("MASTER_PORT", str(distributed_port))
            logger.info("zerostream: ranks from %s/%s", rank_key, size_key)
            return False
    # A plain `python train.py`: one process. DeepSpeed would try mpi4py and fail here.
    env.update({"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
    return True


# Note [A restarted rank's store]
#   Under torch's elastic agent (zerostream run, torchrun) the ranks share the agent's
#   TCPStore, and torch adds no per-attempt prefix to it, on the belief that each restart gets
#   a new store. It does not: after `--max_restarts` restarted the ranks, the new ranks read
#   the previous attempt's keys (the dead ranks' Gloo addresses) and failed to connect
#   ("Connection refused"; pytorch issue 167288 reports the same with NCCL). So zerostream
#   opens the agent's store itself and keys this attempt's group under
#   /zerostream/attempt_<TORCHELASTIC_RESTART_COUNT>.
def _elastic_attempt_store(timeout: datetime.timedelta):
    """The agent's store under this attempt's prefix, or None outside an elastic agent."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    try:
        addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        world = int(os.environ["WORLD_SIZE"])
        int(os.environ["RANK"])
    except (KeyError, ValueError):
        return None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.TCPStore(addr, port, world_size=world, is_master=False, timeout=timeout)
    return dist.PrefixStore(f"/zerostream/attempt_{attempt}", store)


def init_distributed(
    dist_backend: Optional[str] = None,
    auto_mpi_discovery: bool = True,
    distributed_port: int = 29500,
    verbose: bool = True,
    timeout: Optional[datetime.timedelta] = None,
    init_method: Optional[str] = None,
    dist_init_required: Optional[bool] = None,
    config=None,
    rank: int = -1,
    world_size: int = -1,
) -> None:
    """Creates the default process group unless one exists (then it is used as is)."""
    if dist.is_initialized():
        return
    if dist_init_required is False:
        raise RuntimeError(
            "dist_init_required=False, but torch.distributed is not initialized: "
            "call torch.distributed.init_process_group first"
        )
    single = (rank < 0 or world_size < 0) and _env_from_launchers(distributed_port)
    # RANK=0 WORLD_SIZE=1 without a rendezvous address (left in a shell, or set by a script
    # that expects one process) is one process too.
    single = single or (
        (rank < 0 or world_size < 0)
        and os.environ.get("WORLD_SIZE") == "1"
        and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True"
    )
    backend = dist_backend or get_accelerator().communication_backend_name()
    kwargs = dict(backend=backend, timeout=timeout or default_timeout())
    if init_method is not None:
        kwargs["init_method"] = init_method
    if rank >= 0 and world_size > 0:
        kwargs.update(rank=rank, world_size=world_size)
    elif (
        single
        and init_method is None
        and not ("MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ)
    ):
        # One process needs no rendezvous: an in-process store, so two single-process runs
        # on one machine never fight over a port (DeepSpeed's 29500 would collide). Both
        # MASTER_* set is a request for a TCP rendezvous and is honoured; one alone (a
        # MASTER_PORT left in a shell) would make torch's env:// fail on the other.
        kwargs.update(store=dist.HashStore(), rank=0, world_size=1)
        logger.info("zerostream: no launcher environment found; running as a single process")
    elif "store" not in kwargs and init_method is None:
        store = _elastic_attempt_store(kwargs["timeout"])
        if store is not None:
            kwargs.update(
                store=store,
                rank=int(os.environ["RANK"]),
                world_size=int(os.environ["WORLD_SIZE"]),
            )
    if backend == "nccl":
        get_accelerator().set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(**kwargs)
    # Scripts written for DeepSpeed rarely destroy the group; one left to interpreter
    # teardown can abort the process after training finished, so the group zerostream made
    # goes first (Note [A process group that outlives its destruction]).
    atexit.register(_destroy_at_exit)
    # Registered after, so it runs before the group (and its store) goes.
    peers.register()
    if verbose:
        logger.info(
            "zerostream: process group ready: backend=%s rank=%d world_size=%d",
            backend,
            dist.get_rank(),
            dist.get_world_size(),
        )


# Note [A process group that outlives its destruction]
#   A Gloo group's worker threads drop each finished collective's work, and with it the last
#   reference to tensors that have Python objects: that decref takes the GIL. If the process
#   reaches interpreter finalization first (a script whose last collective is a few
#   milliseconds before its end), the worker's take_gil() calls pthread_exit, whose forced
#   unwind crosses the work's noexcept destructor: std::terminate, "terminate called without
#   an active exception", SIGABRT after training finished (about 1 run in 30 of a two-rank
#   stage-2 script; upstream: pytorch/pytorch#179291, #190489). Destroying the group at exit
#   joins those threads while Python is whole, but only if nothing else holds the group:
#   torch.distributed.nn.functional evaluates `group=group.WORLD` defaults when imported,
#   and torch imports it lazily (building any torch optimizer imports torch._dynamo, which
#   imports it). Imported after init_process_group, its defaults hold the default group for
#   good and destroy_process_group leaves the threads running into finalization. So comm
#   imports it first, while group.WORLD is still None.


def _destroy_at_exit() -> None:
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # teardown is best effort; the run's results are already out
            pass


def first_failed_rank(failed: bool, *, group, world: int, device) -> int:
    """The highest global rank of `group` for which `failed` is true, or -1. Every rank calls
    it at the same point, so a check that fails on one rank (a preflight, a health check)
    stops them all together instead of leaving the others waiting in the next collective."""
    mine = get_rank() if failed else -1
    if world <= 1:
        return mine
    flag = torch.tensor([mine + 1], dtype=torch.int64, device=device)
    all_reduce(flag, op=ReduceOp.MAX, group=group)
    return _host_int(flag) - 1


def _host_int(t: torch.Tensor) -> int:
    """first_failed_rank's one device-to-host read (the device audit test counts it)."""
    return int(t.item())


def store_broadcast(key: str, value, group=None):
    """`value` (JSON-able) of the group's rank 0, handed to every member through the default
    group's store: no collective, nothing on the device. Every member calls it with the
    same key once (a key is written once; members read it within the group's timeout)."""
    store = dist.PrefixStore("zerostream/broadcast", dist.distributed_c10d._get_default_store())
    if get_rank(group) == 0:
        store.set(key, json.dumps(value))
        return value
    store.wait([key])
    return json.loads(store.get(key))


def agree(values, op: str = "min", group=None, device=None) -> List[float]:
    """Every member's `values` combined elementwise ("min" or "max"): the same list on every
    rank. A decision made from per-rank readings (free memory, a measured peak or wait)
    that shapes the collectives, or the placement the ranks should share, is made from the
    agreed numbers (Note [Ranks that issue different collectives] in collective_check.py).
    One all-reduce: on the host where the group has a host twin (Note [Agreements on the
    host] in host_agreement.py), else on `device` and read back."""
    values = [float(v) for v in values]
    if get_world_size(group) <= 1 or not values:
        return values
    reduce_op = {"min": ReduceOp.MIN, "max": ReduceOp.MAX}[op]
    host = host_group(group) if device is None else None
    if host is not None:
        group, device = host, "cpu"
    elif device is None:
        device = get_accelerator().current_device_name() if get_backend(group) == "nccl" else "cpu"
    t = torch.tensor(values, dtype=torch.float64, device=device)
    all_reduce(t, op=reduce_op, group=group)
    return t.tolist()


def prepare_host_group(group=None):
    """Every member of `group` calls it at the same point (the engine's build): the group's
    host twin, made where it needs one and every member made it (Note [Agreements on the
    host]); None: agreements go through the device."""

    def everyone(made: bool) -> bool:
        device = get_accelerator().current_device_name() if get_backend(group) == "nccl" else "cpu"
        return agree([1.0 if made else 0.0], "min", group, device=device)[0] > 0

    return host_agreement.prepare(group, everyone)


def agreement(group=None, device=None):
    """`agree` bound to a group and a device: what the memory tiers take (offload/ knows no
    group)."""
    return functools.partial(agree, group=group, device=device)


# --- queries ------------------------------------------------------------------------------------


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def get_rank(group=None) -> int:
    return dist.get_rank(group) if is_initialized() else 0


def get_world_size(group=None) -> int:
    return dist.get_world_size(group) if is_initialized() else 1


def get_local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


# The launchers' "ranks on this host": torchrun's, DeepSpeed's launcher's, Open MPI's.
LOCAL_SIZE_VARS = ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE")


def local_ranks() -> Tuple[int, str]:
    """(ranks of this job on this host, the variable that said so; "" when none did)."""
    for name in LOCAL_SIZE_VARS:
        text = os.environ.get(name)
        if text:
            value = int(text) if text.strip().isdigit() else 0
            if value < 1:
                raise ValueError(f"{name}: expected a positive integer (ranks); got {text!r}")
            return value, name
    return 1, ""


def ranks_on_this_host() -> int:
    """How many ranks of this job run on this host, and so write to one nvme_path's disk and
    share its memory (the swap stores' and the host-memory preflight's arithmetic)."""
    return local_ranks()[0]


def get_global_rank(group=None, group_rank: int = 0) -> int:
    return dist.get_global_rank(group, group_rank) if group is not None else group_rank


def get_world_group():
    return dist.group.WORLD


def is_available() -> bool:
    return dist.is_available()


def get_all_ranks_from_group(group=None) -> List[int]:
    """The global ranks of `group`'s members, in group-rank order."""
    return [get_global_rank(group, r) for r in range(get_world_size(group))]


def new_group(ranks: Optional[List[int]] = None, **kwargs):
    return dist.new_group(ranks, **kwargs)


def destroy_process_group(group=None) -> None:
    if is_initialized():
        dist.destroy_process_group(group)


def get_backend(group=None) -> str:
    return dist.get_backend(group)


# --- collectives with rank-prefixed errors ------------------------------------------------------


def _failure(op: str, exc: BaseException) -> RuntimeError:
    # A ValueError is a bad argument, checked before anything was sent: no peer to look for.
    gone = "" if isinstance(exc, ValueError) else peers.who_stopped_answering()
    return RuntimeError(f"[rank {get_rank()}] {op} failed: {gone}{exc}")


class NamedWork:
    """The handle of an asynchronous collective (torch's Work), whose wait() fails the way the
    synchronous call would: with this rank, the collective and the rank that stopped answering
    in front. Everything else (is_completed, get_future, ...) is the Work's own; a future's
    wait() raises torch's error unchanged (its callbacks run on the backend's threads)."""

    __slots__ = ("work", "op")

    def __init__(self, work, op: str):
        self.work, self.op = work, op

    def wait(self, timeout: Optional[datetime.timedelta] = None) -> bool:
        try:
            return self.work.wait() if timeout is None else self.work.wait(timeout)
        except (RuntimeError, ValueError) as exc:
            raise _failure(self.op, exc) from exc

    def __getattr__(self, name):
        return getattr(self.work, name)

    def __repr__(self) -> str:
        return f"NamedWork({self.op}, {self.work!r})"


def _named(op):
    """Re-raises a collective's failure with the rank, the operation and the rank that stopped
    answering in front; an asynchronous call's handle does the same from wait()."""

    params = list(inspect.signature(op).parameters)

    @functools.wraps(op)
    def call(*args, **kwargs):
        # DeepSpeed's logger keywords (prof, log_name, debug) are the logger's, not the op's.
        options = {k: kwargs.pop(k) for k in comms_logging.OPTIONS if k in kwargs}
        checker = collective_check.active()
        if checker is not None and checker.depth == 0:
            # Arguments by name, so the fingerprint reads group/op/src/dst wherever passed.
            named = dict(zip(params, args), **kwargs)
            checker.before(op.__name__, (), named)
        if checker is not None:
            checker.depth += 1
        timing = None
        if comms_logger.enabled:
            timing = comms_logger.begin(op.__name__, dict(zip(params, args), **kwargs), options)
        result = failed = None
        try:
            result = op(*args, **kwargs)
        except (RuntimeError, ValueError) as exc:
            failed = exc
            raise _failure(op.__name__, exc) from exc
        except BaseException as exc:
            failed = exc
            raise
        finally:
            if checker is not None:
                checker.depth -= 1
            if timing is not None:
                comms_logger.finish(timing, result, succeeded=failed is None)
        if isinstance(result, (dist.Work, _ThenCopy)):
            return NamedWork(result, op.__name__)
        return result

    return call


@_named
def barrier(group=None, async_op=False):
    return dist.barrier(group=group, async_op=async_op)


@_named
def monitored_barrier(group=None, timeout=None, wait_all_ranks=False):
    return dist.monitored_barrier(group=group, timeout=timeout, wait_all_ranks=wait_all_ranks)


@_named
def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    return dist.all_reduce(tensor, op=op, group=group, async_op=async_op)


def inference_all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False, **kwargs):
    """DeepSpeed's all-reduce for inference kernels (a shared-memory path on its CPU
    accelerator); here the same in-place all-reduce, synchronous like DeepSpeed's (which
    ignores async_op too). Returns the tensor."""
    all_reduce(tensor, op=op, group=group)
    return tensor


@_named
def reduce(tensor, dst, op=ReduceOp.SUM, group=None, async_op=False):
    return dist.reduce(tensor, dst, op=op, group=group, async_op=async_op)


@_named
def broadcast(tensor, src, group=None, async_op=False):
    return dist.broadcast(tensor, src, group=group, async_op=async_op)


@_named
def broadcast_object_list(object_list, src=0, group=None, device=None):
    return dist.broadcast_object_list(object_list, src=src, group=group, device=device)


@_named
def all_gather(tensor_list, tensor, group=None, async_op=False):
    return dist.all_gather(tensor_list, tensor, group=group, async_op=async_op)


@_named
def all_gather_object(object_list, obj, group=None):
    return dist.all_gather_object(object_list, obj, group=group)


@_named
def gather(tensor, gather_list=None, dst=0, group=None, async_op=False):
    return dist.gather(tensor, gather_list, dst=dst, group=group, async_op=async_op)


@_named
def scatter(tensor, scatter_list=None, src=0, group=None, async_op=False):
    return dist.scatter(tensor, scatter_list, src=src, group=group, async_op=async_op)


@_named
def all_to_all_single(
    output, input, output_split_sizes=None, input_split_sizes=None, group=None, async_op=False
):
    return dist.all_to_all_single(
        output, input, output_split_sizes, input_split_sizes, group=group, async_op=async_op
    )


@_named
def send(tensor, dst, group=None, tag=0):
    return dist.send(tensor, dst, group=group, tag=tag)


@_named
def recv(tensor, src=None, group=None, tag=0):
    return dist.recv(tensor, src, group=group, tag=tag)


@_named
def isend(tensor, dst, group=None, tag=0):
    return dist.isend(tensor, dst, group=group, tag=tag)


@_named
def irecv(tensor, src=None, group=None, tag=0):
    return dist.irecv(tensor, src, group=group, tag=tag)


# Note [Gloo tensor collectives]: Gloo has no native reduce-scatter and, in some torch
# builds, no all_gather_into_tensor. The fallbacks keep one code path in the ZeRO stages:
# reduce-scatter becomes an all-reduce of the whole buffer (2x the traffic of a real
# reduce-scatter, the price torch's own Gloo emulation pays too), and all-gather into a
# flat tensor becomes a list all-gather into views of it.


def _backend_is_gloo(group) -> bool:
    return dist.get_backend(group) == "gloo"


@_named
def all_gather_into_tensor(output_tensor, input_tensor, group=None, async_op=False):
    if not _backend_is_gloo(group):
        return dist.all_gather_into_tensor(
            output_tensor, input_tensor, group=group, async_op=async_op
        )
    world = get_world_size(group)
    # Each rank's piece has the input's shape (a 0-d input gathers into a 1-d output).
    chunks = [c.view(input_tensor.shape) for c in output_tensor.view(world, -1).unbind(0)]
    source = input_tensor
    if input_tensor.data_ptr() == chunks[get_rank(group)].data_ptr():
        source = input_tensor.clone()  # gloo may write the output before reading the input
    return dist.all_gather(chunks, source, group=group, async_op=async_op)


@_named
def reduce_scatter_tensor(output, input, op=ReduceOp.SUM, group=None, async_op=False):
    if not _backend_is_gloo(group):
        return dist.reduce_scatter_tensor(output, input, op=op, group=group, async_op=async_op)
    world = get_world_size(group)
    # Gloo has no reduce-scatter: an all-reduce in place, so on Gloo `input` is left holding
    # the full reduction (NCCL leaves it as it was). The engine's callers pass scratch buckets;
    # a copy here would double the largest bucket's memory on the CPU path.
    mine = input.view(world, -1)[get_rank(group)].view_as(output)
    work = dist.all_reduce(input, op=op, group=group, async_op=async_op)
    if not async_op:
        output.copy_(mine)
        return None
    return _ThenCopy(work, output, mine)


class _ThenCopy:
    """An emulated reduce-scatter in flight (Gloo): wait() finishes the all-reduce, then
    copies this rank's piece into the output, so the output is right once waited for, as
    NCCL's is (and read before that, it is not)."""

    def __init__(self, work, output: torch.Tensor, piece: torch.Tensor):
        self.work, self.output, self.piece = work, output, piece
        self.done = False

    def wait(self, timeout: Optional[datetime.timedelta] = None) -> bool:
        if not self.done:
            self.work.wait() if timeout is None else self.work.wait(timeout)
            self.output.copy_(self.piece)
            self.done = True
        return True

    def is_completed(self) -> bool:
        return self.done or self.work.is_completed()

    def get_future(self):
        return self.work.get_future()


allgather_fn = all_gather_into_tensor
reduce_scatter_fn = reduce_scatter_tensor


@_named
def reduce_scatter(output, input_list, op=ReduceOp.SUM, group=None, async_op=False):
    """List form: `output` gets the reduction of every rank's input_list[this rank]."""
    if not _backend_is_gloo(group):
        return dist.reduce_scatter(output, input_list, op=op, group=group, async_op=async_op)
    flat = torch.cat([t.reshape(-1) for t in input_list])
    reduce_scatter_tensor(output.view(-1), flat, op=op, group=group)
    return None


@_named
def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
    return dist.all_to_all(output_tensor_list, input_tensor_list, group=group, async_op=async_op)


class _CoalescedWork:
    """The handle of an asynchronous all_reduce_coalesced: wait() waits for every dtype's
    collective and copies the results back into the caller's tensors."""

    def __init__(self, parts):
        self.parts = parts  # (work, flat, tensors) per dtype
        self.done = False

    def wait(self, timeout: Optional[datetime.timedelta] = None) -> bool:
        if not self.done:
            for work, flat, tensors in self.parts:
                if work is not None:
                    work.wait() if timeout is None else work.wait(timeout)
                _scatter_back(flat, tensors)
            self.done = True
        return True

    def is_completed(self) -> bool:
        return self.done or all(w is None or w.is_completed() for w, _, _ in self.parts)


def _scatter_back(flat: torch.Tensor, tensors: List[torch.Tensor]) -> None:
    offset = 0
    for t in tensors:
        t.view(-1).copy_(flat[offset : offset + t.numel()])
        offset += t.numel()


def all_reduce_coalesced(tensors, op=ReduceOp.SUM, group=None, async_op=False):
    """All-reduces several tensors with one collective per dtype (one flat buffer each, so
    no tensor is promoted to another's dtype). With async_op, returns a handle whose wait()
    finishes the collectives and writes the results back."""
    by_dtype: dict = {}
    for t in tensors:
        by_dtype.setdefault((t.dtype, t.device), []).append(t)
    parts = []
    for group_tensors in by_dtype.values():
        flat = torch.cat([t.reshape(-1) for t in group_tensors])
        work = all_reduce(flat, op=op, group=group, async_op=async_op)
        parts.append((work, flat, group_tensors))
    handle = _CoalescedWork(parts)
    if not async_op:
        handle.wait()
        return None
    return handle


def configure(
    deepspeed_config=None, enabled=None, prof_all=None, prof_ops=None, verbose=None, debug=None
) -> None:
    """Sets the comms logger from a config's `comms_logger` section, then from the keywords
    given (DeepSpeed's deepspeed.comm.configure)."""
    # A config without the section leaves the logger as it is (configure() may have set it).
    if deepspeed_config is not None and "comms_logger" in getattr(deepspeed_config, "raw", {}):
        comms_logger.configure(deepspeed_config.comms_logger)
    elif deepspeed_config is not None and hasattr(deepspeed_config, "comms_logger_enabled"):
        comms_logger.configure(deepspeed_config)  # DeepSpeed's DeepSpeedCommsConfig
    for name, value in (("enabled", enabled), ("prof_all", prof_all), ("verbose", verbose),
                        ("debug", debug)):  # fmt: skip
        if value is not None:
            setattr(comms_logger, name, bool(value))
    if prof_ops is not None:
        comms_logger.prof_ops = list(prof_ops)


def log_summary(show_straggler: bool = False, return_dict: bool = False):
    """Prints the comms logger's table on rank 0 (DeepSpeed's format), between two barriers
    that it does not record; `show_straggler` adds each size's wait beyond the fastest rank
    (a collective per size). Every rank returns its own dict with `return_dict`."""
    grouped = is_initialized()
    comms_logger.paused += 1  # the summary's own collectives are not in it
    try:
        if grouped:
            barrier()
        result = comms_logger.log_all(
            get_rank() == 0, show_straggler, return_dict, lambda t: all_reduce(t, ReduceOp.MIN)
        )
        if grouped:
            barrier()
    finally:
        comms_logger.paused -= 1
    return result


def reset_log() -> None:
    """Clears the comms logger's records (per-epoch summaries)."""
    comms_logger.reset_data()
