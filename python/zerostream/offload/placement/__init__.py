"""Memory placement: which of the device, host memory and NVMe holds each kind of training
state when a config says "auto" (docs/tiers.md is the tour). One owner for the decision:

- window.py: StepWindow, the measuring window (what a step needs above what it leaves),
  one per stage optimizer; closed after each optimizer step (Note [A step's excess]).
- placer.py: Placer, which owns the window and the order in which the "auto" host tiers
  (parameter shards, optimizer state) take host memory, talking to each through HostTier.
- budgets.py: the host and device budgets and their reserves, side by side.
- plans.py: the placement decisions, pure functions of sizes, read counts and budgets.
- predict.py: the step time and peak RSS expected once placed.
- device.py: the device tier of the sub-grouped optimizer (`build` for an element count or
  a ratio; DevicePlacement for "auto").

The tiers themselves keep their mechanics where they are: the optimizer state's NVMe
pipeline and host arena (offload/optimizer_swap.py), its device tier (offload/
device_tier.py), the parameter shards' reads (zero/stage3/param_swap.py).

Note [Optimizer tiers]
~~~~~~~~~~~~~~~~~~~~~~
A sub-group on NVMe costs its 12 bytes an element (fp32 master, exp_avg, exp_avg_sq) read
and written again every step: 24 bytes an element per step over the disk, the link that
bounds an NVMe-offloaded step. A sub-group in host memory costs 12 bytes an element of RAM
once and no disk traffic. So every element moved to the host tier takes 24 bytes per step
off the disk, whichever sub-group it is in; the tiers hold whole sub-groups (the unit the
step streams), and the host ones are spread evenly over the step order so that the disk
reads the next NVMe sub-group while the CPU updates host ones.

The host tier's size is `zerostream.optimizer_max_in_cpu` (elements per rank, like
DeepSpeed's offload_param.max_in_cpu; 0, the default, is DeepSpeed's all-on-NVMe), or
"auto". The placement changes no result: Adam is elementwise and every sub-group runs the
same kernel in the same order.

Note ["auto" is sized from a measured step]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Before a step has run, the memory a step needs on top of what it leaves behind (gathered
parameters, activations, staging, the allocator's slack) is a guess, and so are the pages of
buffers allocated but not yet touched (a gradient partition is resident only once written).
A guess too small fills RAM (the 3.17 B run of benchmarks/capacity.md peaked at 21.6 of 23.5
GiB and ran slower than all on NVMe); one too large gives the win away. So "auto" decides
after a measured step: everything starts on disk; when a step has run the stage-3 trace's
whole plan (the recording step has no prefetches and read-ahead, and a smaller peak; so has
a step whose plan was abandoned, and a budget measured on either had the same 3.17 B run
killed for memory), what this rank may still allocate (memory_preflight.usable_host_bytes,
MemAvailable or the cgroup's room, shared by the ranks of this host) less that step's
measured excess (its peak RSS less the RSS it left, over whole steps: Note [A step's
excess]) less a small reserve (budgets.AUTO_RESERVE_*) is the budget. The parameter shards take it
first (a byte of a shard saves more disk traffic than a byte of optimizer state, below),
unless the measured step says the optimizer's disk time costs more per byte (Note [Which
tier first]); the optimizer state's sub-groups wait for them (while a recorded trace waits for its
planned step too) and move into host memory at the next optimizer step, from what the
shards left free. Moving costs one read of what moves, once; the disk extents they leave
are freed.

Note [Every rank places the same tiers]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
Each rank reads its own free memory, its own step's peak and its own waits, and two ranks on
one host rarely read the same. A placement made from them differed between ranks, and it
shapes the collectives: a stage-3 prefetch whose shards all live in host memory issues its
all-gather at once, one with a shard on disk later, so two ranks that kept different shards
issued the gathers and reduce-scatters in between in different orders (Gloo aborted, NCCL
would hang). So every "auto" decision is made from agreed numbers, one all-reduce at the
point every rank places (comm.agree, handed in as `agree`): the smallest of the ranks'
budgets (host memory, device memory), the largest of their measured waits (which tier goes
first), and a device tier that could not be allocated on one rank is allocated on none. The
rest of a placement is a function of those and of sizes and read counts every rank shares.
`ZEROSTREAM_TEST_SKEW` skews the readings per rank in tests (memory_preflight.skewed).

Note [Predicting the placed step]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
When the optimizer's "auto" places its tier it logs the step time it expects. Two measured
parts, each scaled by what the placement changes:
- forward and backward: the time from the end of the last optimizer step to this one, less
  the parameter shards' one-time move into host memory if it happened in it (the shards'
  "auto" runs at a forward's start, before the optimizer's: that forward already runs with
  the shards where they will stay);
- the optimizer step: the last one's time, times the disk bytes the step will move over
  those it moved (optimizer state read and written, and the updated parameter shards it
  wrote to disk). Its pipeline overlaps the reads, the writes and the kernel, so a step
  whose state is mostly on disk takes as long as its slowest stream, which scales with the
  bytes, but never below the part of the last step that did not wait on the disk (the
  kernel, which still updates every element).
A prediction from the whole last interval less the optimizer's wait only was 1.5x off, as
that interval held the shards' move and the parameter writes the placement removed.
It also logs the placed steps' peak RSS it expects: the RSS it placed at (the shards placed
before it included), plus the bytes it placed, plus the measured step's excess (Note [A
step's excess]); and its ceiling, that RSS plus the excess plus the whole budget, which
leaves only the reserve free. `bench capacity` measures the placed steps' own peak against
both (without the prediction, the largest run of benchmarks/capacity.md peaked 2.5% over
the bench's formula with nothing to say whether "auto" or the formula was off).

Note [Parameter shards in host memory]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
offload_param.max_in_cpu keeps DeepSpeed's meaning (the first N elements of shards stay in
host memory) and also takes "auto": every shard goes to disk at first; once the stage-3
trace is recorded and the next step has run its plan, the shards read most often in it (a
tied embedding more often than a layer's weight) are read back into a page-locked arena
while they fit what this rank may still use, less a step's measured excess and the reserve
(Note ["auto" is sized from a measured step]). Per byte of RAM a 16-bit shard saves more
disk traffic than optimizer state (read in forward and backward, written after the step: 6
bytes a step for 2 held, against 24 for 12), so an optimizer tier that is also "auto" is
placed after them, unless the step says otherwise (Note [Which tier first]).

Note [Which tier first]
~~~~~~~~~~~~~~~~~~~~~~~
Bytes of traffic saved are not seconds saved. The shards are read ahead of the layer that
needs them, and the compute of the forward and backward hides those reads; the optimizer
step streams its sub-groups through the CPU kernel with little to hide them behind. On the
3.17 B fp32 run of benchmarks/capacity.md the shards, placed first by bytes, saved
nothing: the step waited 150 of 215 s on the optimizer stream. So when both tiers are
"auto", the measured step decides: each tier's unhidden wait in it (the time the host
waited on that tier's reads and writes) per byte that tier holds on disk is the step time a
byte of RAM buys back there. The optimizer goes first when its wait is significant
(placer.MIN_REORDER_WAIT_S: below that a reorder cannot pay for itself, and tiny test steps
stay in the default order whatever their timer noise) and at least REORDER_MARGIN times the
shards' per byte: the shards then see a budget less the optimizer's whole disk state
(which it takes at its next step), and take what is left.

Note [The device tier from a measured step]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
DeepSpeed sizes the device tier by hand (offload_optimizer.ratio, Note [The device tier]
in offload/device_tier.py). zerostream.optimizer_max_on_device sizes it in elements per rank
instead (the first whole sub-groups in step order that fit, placed when the optimizer is built,
exactly as a ratio would place them), or "auto": the device memory a real step leaves.

With "auto" every sub-group starts offloaded (host memory or NVMe, as without a device
tier). The first optimizer step starts a measured interval: that step, the next forward and
backward. At the start of the second optimizer step the accelerator says what the device can
still give this process (the driver's free memory plus the blocks the caching allocator
holds unused) and what the interval held above what is held now (gathered parameters,
activations, the step's transients: the next iteration needs them again). The budget is the
first less the second, less what the tier's own update needs (one gradient buffer as wide as
the widest sub-group, and the device Adam's fp32 temporaries), less a reserve
(budgets.DEVICE_RESERVE_*: the caching allocator's fragmentation, and what a later step may hold
more). Whole sub-groups move into it: those on
NVMe first (an element there costs 24 bytes of disk traffic a step and the CPU kernel's
update), in step order, then host-tier ones (the CPU kernel's update only; their host arena
is not given back). The move reads each from where it is and frees its disk extents; it
happens before the host tier's own "auto" when both place at the same step, so the host
budget goes to what the device did not take.

Their gradients land in the host partition and go up for the update (what
zerostream.device_tier_grads "host" does for a ratio): the reducer's landing and the pinned
gradient partitions were sized when the engine was built, and keeping a device tier's
gradients on the device means partitions without its elements (Note [Device-tier gradients
stay on the device]). An element count places at build time, so it follows
device_tier_grads like a ratio.

The interval's peak is the accelerator's (torch.cuda.max_memory_allocated on a GPU), so
"auto" resets the allocator's peak statistics at the first optimizer step: a script reading
max_memory_allocated across that step sees the peak since then.

If the device cannot allocate the chosen tier after all, nothing has moved yet: a warning,
and the state stays where it was. Where the device's memory is the host's (a run without a
GPU), "auto" places nothing and says so: a device tier there would only move state from one
part of host memory to another. On the simulated device (testing/sim_device.py) the memory
model's capacity stands for the GPU's, and holding more than it is reported as a violation.
"""

from .budgets import measured_budget_bytes
from .device import DevicePlacement
from .placer import HostTier, Placement, Placer
from .plans import DEVICE, HOST, NVME, STATE_BYTES, TierPlan, place, place_shards, plan
from .window import StepWindow

__all__ = [
    "DEVICE",
    "HOST",
    "NVME",
    "STATE_BYTES",
    "DevicePlacement",
    "HostTier",
    "Placement",
    "Placer",
    "StepWindow",
    "TierPlan",
    "measured_budget_bytes",
    "place",
    "place_shards",
    "plan",
]
