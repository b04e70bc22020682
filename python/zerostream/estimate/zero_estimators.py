"""DeepSpeed's ZeRO model-states memory estimators, same names, signatures and results
(reference: deepspeed_compat.md section 4; DeepSpeed keeps them in
runtime/zero/stage_1_and_2.py and runtime/zero/stage3.py).

They count only parameters, gradients and optimizer states (no activations, buffers or
runtime), with DeepSpeed's byte counts: 16-bit params 2 B, and per partitioned element 18 B
(16-bit gradient 2, fp32 gradient 4, fp32 master 4, Adam moments 8). The CPU column is per
node and multiplied by `additional_buffer_factor`. Tables print bytes / 2^30 labelled "GB"
with two decimals, as DeepSpeed prints them.

Two deliberate differences in what is printed, not in the numbers: the option column says
`cpu ` where DeepSpeed >= 0.14 on Python >= 3.11 prints `OffloadDeviceEnum.cpu` (an enum's
str() changed; DeepSpeed's documentation shows `cpu`); and the ZeRO-2 "no offload" GPU
figure is the current formula 2P + 18P/G (DeepSpeed's memory.rst still shows the older
4P + 16P/G, e.g. 15.93 GB instead of 11.28 GB for t5-3b on 8 GPUs).
"""

from __future__ import annotations

from typing import Tuple

_CPU = "cpu "  # DeepSpeed pads the device name to 4 characters in the zero-3 table


def model_to_params(model) -> Tuple[int, int]:
    """(total_params, largest_layer_params) of a torch module: parameters counted once per
    storage (tied weights once, by data_ptr()), and the largest sum of one module's own
    (non-recursive) parameters."""
    seen = {}
    for p in model.parameters():
        seen.setdefault(p.data_ptr(), p.numel())
    total = sum(seen.values())
    largest = 0
    for m in model.modules():
        largest = max(largest, sum(p.numel() for p in m.parameters(recurse=False)))
    return total, largest


def _gib(nbytes: float) -> float:
    return nbytes / 2**30


def _header(total_params, num_gpus_per_node, num_nodes, largest_layer_params=None) -> str:
    nodes = "nodes" if num_nodes > 1 else "node"
    gpus = "GPUs" if num_gpus_per_node > 1 else "GPU"
    sw = f"SW: Model with {int(total_params / 1e6)}M total params"
    if largest_layer_params is not None:
        sw += f", {int(largest_layer_params / 1e6)}M largest layer params"
    return (
        "Estimated memory needed for params, optim states and gradients for a:\n"
        f"HW: Setup with {num_nodes} {nodes}, {num_gpus_per_node} {gpus} per node.\n"
        f"{sw}.\n"
        "  per CPU  |  per GPU |   Options"
    )


def _row(cpu_bytes, gpu_bytes, options: str) -> str:
    return f" {_gib(cpu_bytes):7.2f}GB | {_gib(gpu_bytes):6.2f}GB | {options}"


# --- ZeRO-2 -----------------------------------------------------------------------------------


def estimate_zero2_model_states_mem_needs(
    total_params,
    num_gpus_per_node=1,
    num_nodes=1,
    cpu_offload=True,
    additional_buffer_factor=1.5,
):
    """(cpu_bytes per node, gpu_bytes per GPU) of ZeRO-2 model states."""
    total_gpus = num_nodes * num_gpus_per_node
    if cpu_offload:
        gpu_mem = 2 * total_params
        cpu_mem = total_params * max(4 * total_gpus, 16) * additional_buffer_factor
    else:
        gpu_mem = 2 * total_params + int(18 * total_params / total_gpus)
        cpu_mem = total_params * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem)


def estimate_zero2_model_states_mem_needs_all_cold(
    total_params, num_gpus_per_node=1, num_nodes=1, additional_buffer_factor=1.5
):
    """Prints the ZeRO-2 table for a parameter count (no model needed)."""
    print(_header(total_params, num_gpus_per_node, num_nodes))
    for cpu_offload in (True, False):
        cpu, gpu = estimate_zero2_model_states_mem_needs(
            total_params, num_gpus_per_node, num_nodes, cpu_offload, additional_buffer_factor
        )
        print(_row(cpu, gpu, f"offload_optimizer={'cpu' if cpu_offload else 'none'}"))


def estimate_zero2_model_states_mem_needs_all_live(
    model, num_gpus_per_node=1, num_nodes=1, additional_buffer_factor=1.5
):
    """Prints the ZeRO-2 table for a live torch module."""
    total_params, _ = model_to_params(model)
    estimate_zero2_model_states_mem_needs_all_cold(
        total_params, num_gpus_per_node, num_nodes, additional_buffer_factor
    )


# --- ZeRO-3 -----------------------------------------------------------------------------------


def estimate_zero3_model_states_mem_needs(
    total_params,
    largest_layer_params,
    num_gpus_per_node=1,
    num_nodes=1,
    cpu_offload=True,
    cpu_offload_params=True,
    zero_init=True,
    additional_buffer_factor=1.5,
):
    """(cpu_bytes per node, gpu_bytes per GPU, largest_layer_memory) of ZeRO-3 model
    states. The largest layer is held gathered as 4 B per parameter; without zero_init each
    of the node's processes first builds the whole fp32 model on CPU (4 B per parameter per
    process), which is the max(4 g, ...) term."""
    total_gpus = num_nodes * num_gpus_per_node
    per_node = 1 / num_nodes
    largest_layer_memory = 4 * largest_layer_params
    if cpu_offload:
        if cpu_offload_params:
            gpu_mem = largest_layer_memory
            state = 18  # fp32 master, grads, moments on CPU, plus the 16-bit params
        else:
            gpu_mem = largest_layer_memory + int(2 * total_params / total_gpus)
            state = 16
        if zero_init:
            cpu_mem = total_params * state * per_node * additional_buffer_factor
        else:
            cpu_mem = (
                total_params
                * max(4 * num_gpus_per_node, state * per_node)
                * additional_buffer_factor
            )
    else:
        gpu_mem = largest_layer_memory + int(18 * total_params / total_gpus)
        built = largest_layer_params if zero_init else total_params
        cpu_mem = built * 4 * num_gpus_per_node * additional_buffer_factor
    return int(cpu_mem), int(gpu_mem), largest_layer_memory


def estimate_zero3_model_states_mem_needs_all_cold(
    total_params,
    largest_layer_params,
    num_gpus_per_node=1,
    num_nodes=1,
    additional_buffer_factor=1.5,
):
    """Prints the ZeRO-3 table for parameter counts (no model needed): rows (optimizer,
    params) offloaded to (cpu, cpu), (cpu, none), (none, none), each with zero_init 1, 0."""
    print(_header(total_params, num_gpus_per_node, num_nodes, largest_layer_params))
    for cpu_offload in (True, False):
        for cpu_offload_params in (True, False):
            if cpu_offload_params and not cpu_offload:
                continue
            for zero_init in (True, False):
                cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
                    total_params,
                    largest_layer_params,
                    num_gpus_per_node,
                    num_nodes,
                    cpu_offload,
                    cpu_offload_params,
                    zero_init,
                    additional_buffer_factor,
                )
                options = (
                    f"offload_param={_CPU if cpu_offload_params else 'none'}, "
                    f"offload_optimizer={_CPU if cpu_offload else 'none'}, "
                    f"zero_init={1 if zero_init else 0}"
                )
                print(_row(cpu, gpu, options))


def estimate_zero3_model_states_mem_needs_all_live(
    model, num_gpus_per_node=1, num_nodes=1, additional_buffer_factor=1.5
):
    """Prints the ZeRO-3 table for a live torch module."""
    total_params, largest_layer_params = model_to_params(model)
    estimate_zero3_model_states_mem_needs_all_cold(
        total_params, largest_layer_params, num_gpus_per_node, num_nodes, additional_buffer_factor
    )
