#!/usr/bin/env python3
"""Deletes, one at a time, each wait, fence, drain, keep_alive/record_stream and device
binding of the GPU path (and each fix of the GPU-proof issue, and each decision the ranks
must agree on), runs the tests that must catch it on the simulated device or on ranks that
differ, and prints which test caught which deletion.

    scripts/dev-build.sh                    # the tests import the working tree
    scripts/sync-mutations.py [--only ID,...] [--markdown FILE]

Every mutation is applied to the working tree and reverted before the next (also on
Ctrl-C). A mutation that no test catches is a hole in the simulated device or its tests;
the script exits 1 then.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
PY = ROOT / "python/zerostream"
ENGINE = "tests/python/zero/test_device_engine.py"
GPU_PATH = "tests/python/zero/test_gpu_path.py"
SIM = "tests/python/offload/test_sim_device.py"
AUDIT = "tests/python/zero/test_device_audit.py"
REDUCE_OVERLAP = "tests/python/zero/test_reduce_overlap.py"
RANKS_DIFFER = "tests/python/zero/test_ranks_differ.py"
OVERLAP = "tests/python/zero/test_overlap_step.py"
SPECULATE = "tests/python/zero/test_speculative_step.py"
OVERLAP_NVME = "tests/python/zero/test_overlap_step_nvme.py"

# (id, file, text to delete or replace, replacement, tests that must fail)
MUTATIONS = [
    (
        "lane-waits-for-compute",
        "offload/lanes.py",
        "        lane.wait_stream(self.cuda.current_stream())\n        with self.cuda.use(lane):\n",
        "        with self.cuda.use(lane):\n",
        [ENGINE],
    ),
    (
        "keep-alive-device-side",
        "offload/lanes.py",
        "        self.cuda.keep_alive(device_side, lane)",
        "        pass",
        [ENGINE],
    ),
    (
        "slot-reuse-waits-for-its-copy",
        "offload/copy_stage.py",
        "                if not self.lanes.ready(f.event):\n"
        "                    if count is not None:\n"
        '                        count["host_waits"] += 1\n'
        "                    self.lanes.host_wait(f.event)\n",
        "                pass\n",
        [ENGINE],
    ),
    (
        "drain-waits-for-last-download",
        "offload/copy_stage.py",
        "        if last_down is not None and not self.lanes.ready(last_down):",
        "        if False:",
        [ENGINE],
    ),
    (
        "drain-waits-for-last-upload",
        "offload/copy_stage.py",
        "        if last is not None and not self.lanes.ready(last):\n"
        '            self.stats["host_waits"] += 1\n'
        "            self.lanes.host_wait(last)\n",
        "        if False:\n            pass\n",
        [ENGINE],
    ),
    (
        "fence-after-update",
        "zero/sharded.py",
        "                self.copy_stage.fence()\n",
        "                pass\n",
        [ENGINE],
    ),
    (
        "release-sources-stage1",
        "zero/grad_reduce.py",
        "                self.stage.release_sources()",
        "                pass",
        [ENGINE],
    ),
    (
        "landing-drain",
        "zero/grad_reduce.py",
        "        if self.stage is not None:\n            self.stage.drain()\n        self.finish()",
        "        self.finish()",
        [ENGINE],
    ),
    (
        "update-drains-first",
        "zero/sharded.py",
        "            self.copy_stage.drain()\n        partitions = self._sinks",
        "            pass\n        partitions = self._sinks",
        [GPU_PATH + "::test_a_step_without_backward_waits_for_the_last_uploads"],
    ),
    (
        "gather-waits-for-its-uploads",
        "zero/stage3/partitioner.py",
        "            part.uploads.wait_mark(self.mark)",
        "            pass",
        [ENGINE],
    ),
    (
        "collective-after-uploads",
        "offload/lanes.py",
        "        self.up.wait_stream(self.cuda.current_stream())\n"
        "        with self.cuda.use(self.up):",
        "        with self.cuda.use(self.up):",
        [ENGINE],
    ),
    (
        "settle-uploads-before-update",
        "zero/stage3/optimizer.py",
        "        self.part.settle_uploads()  # the update rewrites host shards the uploads read",
        "        pass",
        [ENGINE],
    ),
    (
        "settle-uploads-before-shard-write",
        "zero/stage3/partitioner.py",
        "        self.settle_uploads()\n        values = zp.shard_values(full)",
        "        values = zp.shard_values(full)",
        [GPU_PATH + "::test_weights_modified_in_gathered_parameters_wait_for_the_uploads"],
    ),
    (
        "stage-holds-upload-sources",
        "offload/copy_stage.py",
        "        self._held.append((event, src))",
        "        pass",
        [ENGINE, GPU_PATH],
    ),
    (
        "held-source-released-after-wait",
        "offload/copy_stage.py",
        "            self.lanes.host_wait(self._held[0][0])\n            self._held.popleft()",
        "            self.lanes.host_wait(self._held.popleft()[0])",
        [SIM],
    ),
    (
        "swapper-waits-for-held-uploads",
        "zero/stage3/param_swap.py",
        "            elif uploads is None or not uploads.release_held(wait=True):",
        "            elif True:",
        [GPU_PATH + "::test_nvme_staging_smaller_than_the_read_ahead_waits_for_held_uploads"],
    ),
    (
        "consumer-thread-binds-device",
        "offload/copy_stage.py",
        "        self.lanes.bind_thread()  # its event waits are CUDA calls: on this rank's device",
        "        pass",
        [ENGINE],
    ),
    (
        "engine-binds-device",
        "accelerator.py",
        "    acc.set_device(local_rank)  # a no-op on the CPU (recorded by the simulated device)",
        "    pass",
        [ENGINE],
    ),
    (
        "blocking-events",
        "offload/lanes.py",
        "            event = self.cuda.new_event(timing=True, blocking=True)",
        "            event = self.cuda.new_event(timing=True)",
        [ENGINE],
    ),
    (
        "gradient-parts-summed",
        "zero/grad_reduce.py",
        "            fresh, seen = self._covered.claim(g, at, at + n)",
        "            fresh, seen = self._covered.claim(g, at, at + n)\n            fresh += seen\n"
        "            seen = []",
        ["tests/python/zero/test_grad_parts.py"],
    ),
    (
        "overlap-comm-lands-early",
        "zero/grad_reduce.py",
        "        self._pending.append((work, finish))\n        self._land_finished()",
        "        self._pending.append((work, finish))",
        [
            GPU_PATH
            + "::test_overlap_comm_keeps_two_buckets_in_flight_and_lands_the_rest_in_backward"
        ],
    ),
    (
        "bucket-landed-after-its-wait",
        "zero/grad_reduce.py",
        "            work, finish = pending.pop(0)\n            work.wait()\n            finish()",
        "            work, finish = pending.pop(0)\n            finish()\n            work.wait()",
        [REDUCE_OVERLAP],
    ),
    (
        "stage3-reduce-scatter-in-flight",
        "zero/stage3/reduce.py",
        "                async_op=self.overlap,",
        "                async_op=False,",
        [REDUCE_OVERLAP],
    ),
    (
        "offload-states-empties-the-cache",
        "zero/state_offload.py",
        "    get_accelerator().empty_cache()\n",
        "",
        [ENGINE + "::test_parked_states_are_readable_when_offload_states_returns"],
    ),
    (
        "late-gradient-parts-reduced-again",
        "zero/grad_reduce.py",
        "            issue(order.take_late(b))",
        "            order.take_late(b)",
        ["tests/python/zero/test_grad_parts.py"],
    ),
    (
        "auto-tiers-from-the-smallest-budget",
        "offload/placement/budgets.py",
        "        budget = smallest\n",
        "",
        [RANKS_DIFFER],
    ),
    (
        "device-auto-from-the-smallest-budget",
        "offload/placement/device.py",
        '            budget = int(self.agree([budget], "min")[0])\n',
        "            pass\n",
        [
            "tests/python/offload/test_device_auto.py::test_ranks_whose_devices_have_different_room_place_the_same_sub_groups"
        ],
    ),
    (
        "late-flags-agreed-on-the-host",
        "zero/grad_reduce.py",
        "            host = comm.host_group(self.group)\n",
        "            host = None\n",
        [GPU_PATH + "::test_steps_after_the_first_stay_within_the_hosts_budget"],
    ),
    (
        "stage3-rounds-agreed-on-the-host",
        "zero/stage3/coordinator.py",
        "        host = comm.host_group(self.part.group)\n",
        "        host = None\n",
        [GPU_PATH + "::test_steps_after_the_first_stay_within_the_hosts_budget"],
    ),
    (
        "overlap-gather-waits-for-its-pieces",
        "zero/stage3/partitioner.py",
        "        if self.before_shard_access is not None:\n            self.before_shard_access(zps)\n",
        "",
        [OVERLAP],
    ),
    (
        "nvme-overlap-gather-waits-for-its-pieces",
        "zero/stage3/partitioner.py",
        "        if self.before_shard_access is not None:\n"
        "            self.before_shard_access(zps)\n",
        "",
        [
            OVERLAP_NVME
            + "::test_persistent_ranges_go_first_and_the_forward_gathers_beside_the_rest"
        ],
    ),
    (
        "nvme-overlap-early-ranges-filled",
        "offload/optimizer_swap.py",
        "                early.fill(s, staged)",
        "                pass",
        [OVERLAP_NVME + "::test_the_overlapped_nvme_step_is_the_serial_step_bit_for_bit"],
    ),
    (
        "nvme-overlap-keeps-the-steps-lr",
        "zero/overlap.py",
        "opt.copy_stage, hyper, early, report)",
        "opt.copy_stage, None, early, report)",
        [OVERLAP_NVME + "::test_the_overlapped_nvme_step_is_the_serial_step_bit_for_bit"],
    ),
    (
        "shard-reads-wait-for-writes-in-flight",
        "zero/stage3/param_swap.py",
        "        self.flush_writes()\n        ahead, later = [], []",
        "        ahead, later = [], []",
        ["tests/python/zero/test_shard_writes.py"],
    ),
    (
        "overlap-gather-waits-for-its-uploads",
        "zero/stage3/optimizer.py",
        "            self.copy_stage.wait_mark(mark)",
        "            pass",
        [ENGINE],
    ),
    (
        "overlap-thread-binds-the-device",
        "zero/overlap.py",
        "                    self._bind()",
        "                    pass",
        [ENGINE],
    ),
    (
        "overlap-settled-update-fenced",
        "zero/sharded.py",
        '        uploads (the forward\'s gathers waited for their own pieces only)."""\n'
        "        self.copy_stage.fence()",
        '        uploads (the forward\'s gathers waited for their own pieces only)."""\n'
        "        pass",
        [ENGINE],
    ),
    (
        "overlap-update-keeps-the-steps-lr",
        "zero/overlap.py",
        "piece_done, hyper=hyper, stepped",
        "piece_done, stepped",
        [OVERLAP + "::test_the_overlapped_step_is_the_serial_step_bit_for_bit"],
    ),
    (
        "speculation-waits-for-the-gradients-downloads",
        "zero/speculate.py",
        "            if lanes is not None and not lanes.ready(mark):\n"
        "                lanes.host_wait(mark)\n",
        "            pass\n",
        [SPECULATE + "::test_on_the_simulated_device_the_speculation_is_the_serial_step"],
    ),
    (
        "speculation-thread-binds-the-device",
        "zero/speculate.py",
        "            stage.bind_thread()  # its host waits",
        "            pass  # its host waits",
        [SPECULATE + "::test_on_the_simulated_device_the_speculation_is_the_serial_step"],
    ),
    (
        "speculation-put-back-when-proved-wrong",
        "zero/speculate.py",
        "        self.restore(opt, [p for p in self.backups if p not in kept])",
        "        pass",
        [SPECULATE + "::test_the_step_started_during_the_backward_is_the_serial_step_bit_for_bit"],
    ),
    (
        "speculation-late-part-makes-its-piece-dirty",
        "zero/speculate.py",
        "                        self._dirty.add(self._pieces[i])",
        "                        pass",
        [SPECULATE + "::test_a_piece_that_gets_more_gradient_after_its_update_is_updated_again"],
    ),
    (
        "speculation-stage2-kept-pieces-handed-on",
        "zero/sharded.py",
        "            fused = (gi, lo, hi) not in kept",
        "            fused = True",
        [SPECULATE + "::test_the_step_started_during_the_backward_is_the_serial_step_bit_for_bit"],
    ),
    (
        "speculation-hyperparameters-by-value",
        "zero/speculate.py",
        '    return [{k: _value(v) for k, v in g.items() if k != "params"} for g in groups]',
        '    return [{k: v for k, v in g.items() if k != "params"} for g in groups]',
        [
            SPECULATE + "::test_a_hyperparameter_changed_in_place_after_the_backward_puts_the_"
            "speculation_back"
        ],  # fmt: skip
    ),
    (
        "speculation-kept-pieces-handed-on",
        "zero/overlap.py",
        "                sinks.hand_on(partitions[gi], lo, hi, master, fused=False, stable=True)",
        "                pass",
        [SPECULATE + "::test_the_step_started_during_the_backward_is_the_serial_step_bit_for_bit"],
    ),
    (
        "overlap-persistent-params-gathered-again",
        "zero/stage3/optimizer.py",
        "        self.part.release_all(persistent=self.behind is not None)",
        "        self.part.release_all()",
        [OVERLAP + "::test_the_overlapped_step_is_the_serial_step_bit_for_bit"],
    ),
    (
        "stage3-buckets-in-the-gather-sequence",
        "zero/stage3/optimizer.py",
        "            self.reducer.sequencer = self.coord\n",
        "",
        [RANKS_DIFFER],
    ),
    (
        "fp32-weight-writes-wait-for-the-uploads",
        "zero/param_access.py",
        "        if stage is not None:\n            # The last update's uploads may still read",
        "        if False:\n            # The last update's uploads may still read",
        [GPU_PATH + "::test_fp32_weights_set_after_a_step_wait_for_its_uploads"],
    ),
    (
        "device-tier-slices-down-on-the-lane",
        "offload/device_tier.py",
        "        if stage is not None and self._downloaded:\n            stage.drain()",
        "        if False:\n            stage.drain()",
        [GPU_PATH + "::test_device_tier_slices_go_down_to_host_params_on_the_lane"],
    ),
    (
        "device-auto-waits-for-a-planned-step",
        "offload/placement/device.py",
        " or (self.step_planned is not None and not self.step_planned())",
        "",
        [
            "tests/python/offload/test_device_auto.py::test_auto_sizes_the_device_tier_from_a_step_that_ran_the_plan"
        ],
    ),
    (
        "parked-input-checked-at-the-next-park",
        "offload/saved_activations.py",
        "            if q is not None:\n                q.check_source()",
        "            if q is not None:\n                pass",
        [
            "tests/python/engine/test_checkpoint_in_cpu.py::test_an_input_changed_in_place_then_dropped_is_refused_too"
        ],
    ),
    (
        "stage3-units-the-same-on-every-rank",
        "zero/stage3/coordinator.py",
        "            if zp.ds_id not in unit and key != DONE:",
        "            if False:",
        ["tests/python/zero/test_stage3_api.py", "tests/python/zero/test_stage3_parity.py"],
    ),
    (
        "stage3-plan-pins-its-live-params",
        "zero/stage3/coordinator.py",
        "        if zp.ds_id in self.pinned:\n            self.deferred.add(zp.ds_id)\n"
        "        else:",
        "        if False:\n            pass\n        else:",
        ["tests/python/zero/test_stage3_parity.py", "tests/python/offload/test_param_tiers.py"],
    ),
    (
        "nvme-read-ahead-launched-early",
        "zero/stage3/coordinator.py",
        "            self.part.launch_reads(set(trace.events[self.pos][1]))",
        "            pass",
        [GPU_PATH + "::test_nvme_reads_ahead_are_uploaded_and_gathered_one_module_early"],
    ),
    (
        "host-params-land-on-the-lane",
        "zero/sharded.py",
        '        if self.offload_device != "none" or host_partitions:',
        '        if self.offload_device != "none":',
        [GPU_PATH + "::test_host_params_with_a_device_optimizer_land_gradients_on_the_lane"],
    ),
    (
        "staging-pooled",
        "zero/stage3/param_swap.py",
        "register=True, pooled=True)",
        "register=True)",
        [GPU_PATH + "::test_host_memory_is_registered_once_and_not_at_all_without_pin_memory"],
    ),
    (
        "pin-memory-false-registers-nothing",
        "offload/host_buffers.py",
        "        self.registers = bool(lock and register)",
        "        self.registers = bool(register)",
        [GPU_PATH + "::test_host_memory_is_registered_once_and_not_at_all_without_pin_memory"],
    ),
    (
        "offload-states-waits-for-its-downloads",
        "zero/state_offload.py",
        "        lanes.host_wait(last)  # a lane completes its copies in order",
        "        pass",
        [ENGINE + "::test_parked_states_are_readable_when_offload_states_returns"],
    ),
    (
        "reload-states-waits-for-its-uploads",
        "zero/state_offload.py",
        "        lanes.device_wait(last)  # the compute stream reads them next\n"
        "        lanes.host_wait(last)  # the host sources are released with `parked`",
        "        pass",
        [ENGINE + "::test_parked_states_are_readable_when_offload_states_returns"],
    ),
]


def run_tests(tests, env) -> tuple:
    start = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    lines = [line[1:].strip() for line in done.stdout.splitlines() if line.startswith("E ")]
    lines = [
        line
        for line in lines
        if "--- rank" not in line and not line.startswith(("Traceback", "File ", "raise "))
    ]
    # The line that says why: what the device saw first, then a value, then any error.
    for keys in (("device saw",), ("bit-equal", "off by"), ("Error", "assert")):
        telling = [line for line in lines if any(k in line for k in keys)]
        if telling:
            return done.returncode, time.monotonic() - start, telling[0][:160]
    return done.returncode, time.monotonic() - start, (lines[:1] or [""])[0][:160]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="", help="comma-separated mutation ids")
    parser.add_argument("--markdown", help="also write the table here")
    args = parser.parse_args()
    only = {m for m in args.only.split(",") if m}
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'python'}:{ROOT / 'tests/python'}"}
    rows, holes = [], []
    for ident, rel, old, new, tests in MUTATIONS:
        if only and ident not in only:
            continue
        path = PY / rel
        original = path.read_text()
        if original.count(old) != 1:
            print(f"{ident}: the text to mutate is not in {rel} exactly once", file=sys.stderr)
            return 2
        try:
            path.write_text(original.replace(old, new))
            rc, seconds, why = run_tests(tests, env)
        finally:
            path.write_text(original)
        caught = rc != 0
        if not caught:
            holes.append(ident)
        rows.append((ident, rel, " ".join(t.split("/")[-1] for t in tests), caught, why))
        print(
            f"{ident:38s} {'caught' if caught else 'NOT CAUGHT'} ({seconds:.0f} s) {why}",
            flush=True,
        )
    table = ["| deletion | file | test | caught | first failure |", "|---|---|---|---|---|"]
    for ident, rel, tests, caught, why in rows:
        why = why.replace("|", "/")
        table.append(f"| {ident} | {rel} | {tests} | {'yes' if caught else '**no**'} | {why} |")
    if args.markdown:
        pathlib.Path(args.markdown).write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return 1 if holes else 0


if __name__ == "__main__":
    sys.exit(main())
