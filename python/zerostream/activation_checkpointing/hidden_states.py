"""The hidden states a checkpointed layer saves, parked in host memory (DeepSpeed's
`runtime.activation_checkpointing.offload_activations`: `CheckpointHiddenStatesOffload`).

Note [Parked hidden states]
  With Hugging Face's gradient checkpointing each decoder layer (a
  `transformers.GradientCheckpointingLayer`) runs under torch's non-reentrant checkpoint,
  which saves the layer's input, the hidden states, for the recomputation in backward: one
  activation of batch x sequence x hidden per layer stays on the device through the forward.
  Inside this context those inputs are parked in page-locked host memory instead, over the
  same parking as `activation_checkpointing.cpu_checkpointing` (Note [Parked activations] in
  offload/saved_activations.py: a download on the copy stage's d2h lane after the compute
  stream's work so far, the device tensor released at once and kept alive for the copy by
  record_stream; brought back in backward on the h2d lane, the compute stream waiting for
  that upload only, the next one fetched ahead).

  Which saved tensors: only marked ones. While a context is open, `GradientCheckpointingLayer.
  __call__` marks its first positional argument (the hidden states) when the layer trains
  with gradient checkpointing; `mark(t)` marks any tensor by hand. A saved tensor is parked
  when it is marked (each mark lets one save through), on the device (on the CPU there is
  nothing to spare: counted as skipped, as DeepSpeed skips there), at least
  `min_offload_bytes`, not a parameter or buffer, and not an overlapping view (a stride of
  0). The newest `keep_last_count` marked tensors stay on the device (backward needs the last
  layer's first, before its download could finish); each newer one sends the oldest kept to
  the parking. Everything else a layer saves passes through untouched. A marked tensor
  changed in place after it was saved is refused (when it is parked, or fetched while kept;
  the parking checks it from there on), as autograd refuses it for a tensor no hook packs.

  The patch on `GradientCheckpointingLayer.__call__` is installed by the first context
  entered (any thread) and removed when the last one exits, also on an exception; the
  contexts opened on one thread form a stack whose top marks. One instance is not
  re-entrant.

  DeepSpeed's other arguments, and how they read here: `use_streams` (the copies always
  cross on the copy stage's lanes, off the compute stream), `max_fwd_stash_count` (DeepSpeed
  keeps the newest offloaded tensors' device memory too, to skip their upload; the parking
  releases it once the download is queued, as DeepSpeed's stash of 0),
  `max_cpu_buffer_pool_count` (the parking's pool reuses page-locked chunks of 64 MiB, not
  per-tensor buffers). `use_pin_memory=False` (pageable host buffers, synchronous copies) is
  refused by name. A retained graph's second backward fetches a parked tensor again from its
  host buffer (DeepSpeed keeps each restored tensor on the device until the context exits).
"""

from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any, Dict, List, Optional

import torch

from ..offload import saved_activations


@dataclasses.dataclass
class CheckpointActivationOffloadStats:
    saved_tensors_seen: int = 0
    marked_tensors: int = 0
    offloaded_tensors: int = 0
    restored_tensors: int = 0
    skipped_marked_tensors: int = 0
    kept_last_tensors: int = 0
    offloaded_bytes: int = 0
    restored_bytes: int = 0


class _Saved:
    """What the pack hook returned for a marked tensor: the tensor itself while it is one of
    the newest kept on the device, then its parking."""

    __slots__ = ("ident", "kept", "parked", "counted", "version", "shape", "__weakref__")

    def __init__(self, ident: int, tensor: torch.Tensor):
        self.ident = ident
        # autograd checks a saved tensor's version only when no hook packs it: done here
        self.version, self.shape = tensor._version, tuple(tensor.shape)
        self.kept: Optional[torch.Tensor] = tensor
        self.parked: Optional[saved_activations.Parked] = None
        self.counted = False  # restored (or handed back kept) once: the stats count it once


_LOCAL = threading.local()  # .stack: the contexts open on this thread, innermost last
_PATCH_LOCK = threading.Lock()
_PATCH: Dict[str, Any] = {"users": 0, "wrapper": None, "owned": None}


def _stack() -> List["CheckpointHiddenStatesOffload"]:
    stack = getattr(_LOCAL, "stack", None)
    if stack is None:
        stack = _LOCAL.stack = []
    return stack


def _layer_class():
    try:
        from transformers import GradientCheckpointingLayer
    except ImportError:  # transformers absent or older than 4.52: nothing to mark
        return None
    return GradientCheckpointingLayer


def _install_marker() -> None:
    """Wraps GradientCheckpointingLayer.__call__ (under _PATCH_LOCK) so that a layer that
    trains with gradient checkpointing marks its hidden states for the innermost context."""
    cls = _layer_class()
    if cls is None or _PATCH["wrapper"] is not None:
        return
    owned = cls.__dict__.get("__call__")  # None: nn.Module's, through the MRO
    call = cls.__call__

    def marking_call(self, *args, **kwargs):
        stack = _stack()
        manager = stack[-1] if stack else None
        hidden = args[0] if args else None
        marked = (
            manager is not None
            and torch.is_tensor(hidden)
            and self.training
            and torch.is_grad_enabled()
            and getattr(self, "gradient_checkpointing", False)
        )
        if marked:
            manager.mark(hidden)
        try:
            return call(self, *args, **kwargs)
        finally:
            # A mark the checkpoint did not use (its input was another tensor: a hook
            # replaced the argument) must not outlive the call; it counts as skipped.
            if marked and manager._consume_mark(hidden):
                manager.stats.skipped_marked_tensors += 1

    cls.__call__ = marking_call
    _PATCH.update(wrapper=marking_call, owned=owned)


def _remove_marker() -> None:
    cls = _layer_class()
    wrapper, owned = _PATCH["wrapper"], _PATCH["owned"]
    _PATCH.update(wrapper=None, owned=None)
    if cls is None or wrapper is None or cls.__dict__.get("__call__") is not wrapper:
        return  # someone else replaced it since: theirs stays
    if owned is None:
        del cls.__call__
    else:
        cls.__call__ = owned


def _check_unchanged(saved: _Saved, tensor: torch.Tensor) -> None:
    """A marked tensor changed in place after it was saved is refused, as autograd refuses
    it without the context (the download would have read either value)."""
    if tensor._version != saved.version:
        raise RuntimeError(
            f"CheckpointHiddenStatesOffload: a hidden state saved for backward (shape "
            f"{saved.shape}) was modified by an in-place operation after it was saved "
            f"(version {saved.version} -> {tensor._version}); autograd refuses this without "
            f"the context too. Use an out-of-place operation"
        )


class CheckpointHiddenStatesOffload(torch.autograd.graph.saved_tensors_hooks):
    """A context in which the hidden states checkpointed layers save are parked in host
    memory (Note [Parked hidden states])."""

    def __init__(
        self,
        use_pin_memory: bool = True,
        use_streams: bool = True,
        min_offload_bytes: int = 1024,
        max_fwd_stash_count: int = 2,
        max_cpu_buffer_pool_count: int = 64,
        keep_last_count: int = 1,
    ):
        for name, value in (
            ("keep_last_count", keep_last_count),
            ("max_fwd_stash_count", max_fwd_stash_count),
            ("max_cpu_buffer_pool_count", max_cpu_buffer_pool_count),
            ("min_offload_bytes", min_offload_bytes),
        ):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value}")
        if not use_pin_memory:
            raise NotImplementedError(
                "CheckpointHiddenStatesOffload(use_pin_memory=False): zerostream parks the "
                "hidden states in page-locked host memory only (pageable buffers would make "
                "every copy synchronous)"
            )
        self.use_pin_memory = use_pin_memory
        self.use_streams = use_streams
        self.min_offload_bytes = min_offload_bytes
        self.max_fwd_stash_count = max_fwd_stash_count
        self.max_cpu_buffer_pool_count = max_cpu_buffer_pool_count
        self.keep_last_count = keep_last_count
        self.stats = CheckpointActivationOffloadStats()
        self._next_id = 0
        self._allowed: Dict[int, int] = {}  # id(tensor) -> marks not yet used by a save
        self._keep_last: Dict[int, torch.Tensor] = {}  # newest first kept, oldest first
        self._saved: "weakref.WeakValueDictionary[int, _Saved]" = weakref.WeakValueDictionary()
        super().__init__(self._pack, self._unpack)

    # --- marks ---------------------------------------------------------------------------
    def mark(self, tensor: torch.Tensor) -> None:
        """Lets the next save of `tensor` in this context be parked."""
        self._allowed[id(tensor)] = self._allowed.get(id(tensor), 0) + 1
        self.stats.marked_tensors += 1

    def _consume_mark(self, tensor: torch.Tensor) -> bool:
        left = self._allowed.get(id(tensor), 0)
        if left <= 0:
            return False
        if left == 1:
            del self._allowed[id(tensor)]
        else:
            self._allowed[id(tensor)] = left - 1
        return True

    # --- the hooks -----------------------------------------------------------------------
    def _skips(self, t: torch.Tensor) -> bool:
        return (
            not saved_activations.moves_to_host(t.device)
            or t.numel() * t.element_size() < self.min_offload_bytes
            or isinstance(t, (torch.nn.Parameter, torch.nn.Buffer))
            or (t.numel() > 1 and 0 in t.stride())
        )

    def _pack(self, t: torch.Tensor):
        self.stats.saved_tensors_seen += 1
        if not self._consume_mark(t):
            return t
        if self._skips(t):
            self.stats.skipped_marked_tensors += 1
            return t
        self._next_id += 1
        saved = _Saved(self._next_id, t)
        self._saved[saved.ident] = saved
        self._keep_last[saved.ident] = t
        while len(self._keep_last) > self.keep_last_count:
            oldest = next(iter(self._keep_last))
            tensor = self._keep_last.pop(oldest)
            self._park(self._saved.get(oldest), tensor)
        return saved

    def _park(self, saved: Optional[_Saved], tensor: torch.Tensor) -> None:
        if saved is None:  # its graph is gone already: nothing will fetch it
            return
        _check_unchanged(saved, tensor)
        saved.parked = saved_activations.parking_for(tensor.device).park(tensor)
        saved.kept = None
        self.stats.offloaded_tensors += 1
        self.stats.offloaded_bytes += tensor.numel() * tensor.element_size()

    def _unpack(self, packed):
        if not isinstance(packed, _Saved):
            return packed
        if packed.kept is not None:
            _check_unchanged(packed, packed.kept)
            if self._keep_last.get(packed.ident) is packed.kept:  # not a later entry's
                del self._keep_last[packed.ident]
            if not packed.counted:
                packed.counted = True
                self.stats.kept_last_tensors += 1
            return packed.kept
        parked = packed.parked
        assert parked is not None  # not kept: parked when it left the kept ones
        back = saved_activations.parking_for(parked.device).fetch(parked)
        if not packed.counted:
            packed.counted = True
            self.stats.restored_tensors += 1
            self.stats.restored_bytes += back.numel() * back.element_size()
        return back

    # --- the context ---------------------------------------------------------------------
    def reset(self) -> None:
        """Fresh statistics and no marks or kept tensors (done at each entry)."""
        self.stats = CheckpointActivationOffloadStats()
        self._next_id = 0
        self._allowed.clear()
        self._keep_last.clear()

    def __enter__(self):
        stack = _stack()
        if self in stack:
            raise RuntimeError(
                "CheckpointHiddenStatesOffload is not re-entrant: use another instance for a "
                "nested context"
            )
        with _PATCH_LOCK:
            _install_marker()
            _PATCH["users"] += 1
        self.reset()
        stack.append(self)
        try:
            return super().__enter__()
        except BaseException:
            self._leave()
            raise

    def __exit__(self, *exc):
        try:
            # Marks and kept tensors end with the context; what was parked stays fetchable by
            # the graph that holds it (a backward after the exit still finds its inputs).
            self._allowed.clear()
            self._keep_last.clear()
            self._leave()
        finally:
            result = super().__exit__(*exc)
        return result

    def _leave(self) -> None:
        stack = _stack()
        if self in stack:
            stack.remove(self)
        with _PATCH_LOCK:
            _PATCH["users"] = max(0, _PATCH["users"] - 1)
            if _PATCH["users"] == 0:
                _remove_marker()


def get_checkpoint_hidden_states_offloading_ctx_manager(
    *args, **kwargs
) -> CheckpointHiddenStatesOffload:
    """DeepSpeed's factory of the context: CheckpointHiddenStatesOffload(*args, **kwargs)."""
    return CheckpointHiddenStatesOffload(*args, **kwargs)
