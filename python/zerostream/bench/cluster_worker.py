"""One rank of `python -m zerostream.bench.cluster_check`, started by `zerostream run` on
every "node": trains bench/gpt.py's GPT under the given ds_config (each node swaps to its
own folder, NVME_ROOT/node{GROUP_RANK}), then times the collectives alone, and rank 0
writes OUT: per-step bytes and seconds of each telemetry tier, the step time, and the
measured ring model of this machine's collectives (a latency per hop and a bandwidth).

    python -m zerostream.bench.cluster_worker SPEC.json OUT.json
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time

import torch


def _delta(after: dict, before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in after.items()}


class CallClock:
    """Each collective's issue and completion times on this rank (CLOCK_MONOTONIC, one clock
    for every process of this machine), so that rank 0 can split a call's measured seconds
    into the wait for the last rank to arrive (a straggler: compute skew, not a link's time)
    and the transfer after it, which is what the planner's ring model predicts. Wraps the
    module attributes the runtime calls through (`comm.all_gather_into_tensor`, ...); an
    asynchronous call's completion is stamped by its future's callback on the backend's
    thread, not when the runtime waits for it."""

    KINDS = {"all_gather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor"}

    def __init__(self):
        self.calls = {kind: [] for kind in self.KINDS}  # [issued, done, bytes, step] per call
        self.saved = {}
        self.step = 0  # the training step the calls belong to (the caller sets it)

    def __enter__(self):
        from zerostream import comm

        for kind, name in self.KINDS.items():
            self.saved[name] = original = getattr(comm, name)
            setattr(comm, name, self._wrap(self.calls[kind], original))
        return self

    def __exit__(self, *exc):
        from zerostream import comm

        for name, original in self.saved.items():
            setattr(comm, name, original)

    def _wrap(self, stamps, original):
        now = functools.partial(time.clock_gettime, time.CLOCK_MONOTONIC)

        def call(*args, **kwargs):
            payload = max(a.numel() * a.element_size() for a in args[:2])  # the full side
            stamp = [now(), None, payload, self.step]
            stamps.append(stamp)
            work = original(*args, **kwargs)
            if work is None:
                stamp[1] = now()
            else:
                work.get_future().add_done_callback(lambda _: stamp.__setitem__(1, now()))
            return work

        return call


def _aligned(ranks: list, kind: str):
    """Each call of `kind` as (bytes, step, [(arrival, transfer)] per rank): a call's i-th
    stamp on every rank is the same collective (each group issues its collectives in one
    order); the transfer runs from the last rank's issue to the call's end on that rank."""
    per_rank = [r["stamps"][kind] for r in ranks]
    n = {len(s) for s in per_rank}
    if len(n) != 1:
        raise RuntimeError(f"{kind}: the ranks issued {sorted(n)} calls; they must agree")
    for calls in zip(*per_rank):
        last = max(c[0] for c in calls)
        yield calls[0][2], calls[0][3], [(last - c[0], max(c[1] - last, 0.0)) for c in calls]


def transfer_split(ranks: list) -> dict:
    """Per kind, each rank's seconds per measured step (steps >= `warmup`) waiting for the
    last rank to issue a call ("arrival") and from then until the call completed on this
    rank ("transfer"), from the CallClock stamps every rank's result carries."""
    out = {}
    steps, first = ranks[0]["steps"], ranks[0]["warmup"]
    for kind in CallClock.KINDS:
        arrival, transfer, calls = [0.0] * len(ranks), [0.0] * len(ranks), 0
        for _, step, each in _aligned(ranks, kind):
            if step < first:
                continue
            calls += 1
            for r, (a, t) in enumerate(each):
                arrival[r] += a
                transfer[r] += t
        out[kind] = {
            "arrival": [a / steps for a in arrival],
            "transfer": [t / steps for t in transfer],
            "calls": calls / steps,
        }
    return out


def fit_rates(points) -> tuple:
    """(seconds of latency at zero bytes, seconds per byte): t = a + b * bytes, least
    squares over (bytes, seconds) points."""
    xs, ys = zip(*points)
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return max(my - b * mx, 0.0), b


def ring_of(a: float, b: float, world: int) -> dict:
    """The ring model's link rates from a fit t = a + b * bytes over `world` ranks."""
    ring = (world - 1) / world
    return {"gbps": ring / max(b, 1e-15) / 1e9, "latency_us": a / (world - 1) * 1e6}


def training_rates(ranks: list, first: int = 1) -> dict:
    """Per kind, the ring model's rates fitted to the warm-up steps' own calls (steps
    `first` .. warmup - 1; step 0 opens the connections): the links as the training loads
    them, measured before, and apart from, the steps the check predicts. Where the calls'
    sizes span less than 4x, a slope is not measurable: the bandwidth is the one timed alone
    (`ring`) and only the latency is fitted."""
    world, last = len(ranks), ranks[0]["warmup"]
    rates = {}
    for kind in CallClock.KINDS:
        points = [
            (nbytes, sum(t for _, t in each) / world)
            for nbytes, step, each in _aligned(ranks, kind)
            if first <= step < last
        ]
        if not points:
            continue
        sizes = [x for x, _ in points]
        if max(sizes) >= 4 * min(sizes):
            a, b = fit_rates(points)
        else:
            alone = ranks[0]["ring"][kind]
            b = (world - 1) / world / (alone["gbps"] * 1e9)
            a = max(sum(t - b * x for x, t in points) / len(points), 0.0)
        rates[kind] = {**ring_of(a, b, world), "calls": len(points)}
    return rates


# Payloads the ring model is fitted over, in fp32 elements (64 KiB to 8 MiB): they bracket
# the calls of cluster_check's jobs (the small GPT's gathers and buckets are ~1 MiB).
SIZES = (1 << 14, 1 << 17, 1 << 19, 1 << 21)


def ring_model(world: int, group=None, reps: int = 15) -> dict:
    """Per collective kind, a latency per ring hop and a bandwidth per rank (GB/s of
    (N - 1) / N of the payload) fitted to payloads of SIZES over this job's
    ranks, each kind timed through the calls the runtime makes (zerostream.comm: on Gloo
    its reduce-scatter is an all-reduce, Note [Gloo tensor collectives])."""
    import torch.distributed as dist

    from zerostream import comm

    def all_gather(numel):
        out = torch.empty(numel)
        return lambda send: comm.all_gather_into_tensor(out, send, group=group)

    def reduce_scatter(numel):
        out = torch.empty(numel // world)
        return lambda send: comm.reduce_scatter_tensor(out, send, group=group)

    model = {}
    for kind, make, part in (
        ("all_gather", all_gather, True),
        ("reduce_scatter", reduce_scatter, False),
    ):
        runs = {n: (make(n), torch.ones(n // world if part else n)) for n in SIZES}
        samples = {n: [] for n in SIZES}
        for i in range(reps + 1):  # the sizes interleaved: a drift of the machine hits each
            for numel, (run, send) in runs.items():
                dist.barrier(group)
                start = time.perf_counter()
                run(send)
                if i:  # the first round warms the buffers and connections
                    samples[numel].append(time.perf_counter() - start)
        times = {n * 4: statistics.median(t) for n, t in samples.items()}
        # t = a + b * bytes: a is (N - 1) hops of latency, b the ring's (N - 1) / N of a
        # byte over the bandwidth.
        model[kind] = {**ring_of(*fit_rates(times.items()), world), "samples": times}
    return model


def main(argv=None) -> int:
    import torch.distributed as dist

    import zerostream
    from zerostream.bench.gpt import GPT, GPTShape, batches

    spec_path, out_path = (argv or sys.argv[1:])[:2]
    with open(spec_path) as f:
        spec = json.load(f)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    node = int(os.environ["GROUP_RANK"])
    cfg = spec["config"]  # this process's own copy, read from the file
    nvme = os.path.join(spec["nvme_root"], f"node{node}")
    for key in ("offload_optimizer", "offload_param"):
        section = cfg["zero_optimization"].get(key)
        if section and section.get("device") == "nvme":
            section["nvme_path"] = nvme
    shape = GPTShape(**spec["shape"])
    torch.manual_seed(0)
    engine, *_ = zerostream.initialize(model=GPT(shape), config=cfg)
    data = batches(shape, cfg["train_micro_batch_size_per_gpu"], torch.device("cpu"), seed=rank)
    steps, warmup = spec["steps"], spec["warmup"]
    before, times, each, clock = None, [], [], CallClock().__enter__()
    for i in range(warmup + steps):
        clock.step = i
        if i == warmup:
            before = engine.telemetry.snapshot()
        last = engine.telemetry.snapshot()["bytes"]
        dist.barrier()
        start = time.perf_counter()
        for _ in range(engine.gradient_accumulation_steps()):
            x, y = next(data)
            engine.backward(engine(x, y))
            engine.step()
        if i >= warmup:
            times.append(time.perf_counter() - start)
        each.append(_delta(engine.telemetry.snapshot()["bytes"], last))
    after = engine.telemetry.snapshot()
    clock.__exit__(None, None, None)
    engine.destroy()
    ring = ring_model(world)
    result = {
        "rank": rank,
        "bytes": {k: v / steps for k, v in _delta(after["bytes"], before["bytes"]).items()},
        "seconds": {
            k: v / steps for k, v in _delta(after["tier_seconds"], before["tier_seconds"]).items()
        },
        "phases": {k: v / steps for k, v in _delta(after["seconds"], before["seconds"]).items()},
        "calls": {k: v / steps for k, v in _delta(after["calls"], before["calls"]).items()},
        "step_seconds": statistics.median(times),
        "bytes_each_step": each,  # warm-up steps included
        "ring": ring,
        "steps": steps,
        "warmup": warmup,
        "stamps": clock.calls,
    }
    everyone = [None] * world
    dist.all_gather_object(everyone, result)
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(everyone, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
