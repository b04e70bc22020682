"""What DeepSpeed 0.19.x resolves for the ZeRO, offload, precision and batch keys of a config,
computed independently of zerostream from the facts in shared/reference/deepspeed_compat.md
(§1.3 batch rule, §1.7 precision, §1.8 zero_optimization, §1.9 offload). Pydantic sections
drop "auto" (= default); the batch keys' "auto" is left to the caller (HF Trainer).
"""


def _drop_auto(d):
    return {k: v for k, v in d.items() if v != "auto"}


def _first(d, *names, default=None):
    for n in names:
        if n in d:
            return d[n]
    return default


def _offload(section, legacy_flag, buffer_count):
    if section is None and not legacy_flag:
        return None
    section = _drop_auto(section or {"device": "cpu"})
    out = {
        "device": section.get("device", "none"),
        "pin_memory": section.get("pin_memory", True),
        "buffer_count": section.get("buffer_count", buffer_count),
        "nvme_path": section.get("nvme_path"),
    }
    return out


def expected_values(raw: dict, world_size: int = 1) -> dict:
    """Flat {key path: value} for the keys a ZeRO run depends on."""
    z = raw.get("zero_optimization", {})
    if isinstance(z, bool):
        z = {"stage": 1 if z else 0}
    z = _drop_auto(z)
    stage = z.get("stage", 0)
    e = {
        "zero_optimization.stage": stage,
        "zero_optimization.overlap_comm": z["overlap_comm"]
        if z.get("overlap_comm") is not None
        else stage == 3,
        "zero_optimization.contiguous_gradients": z.get("contiguous_gradients", True),
        "zero_optimization.reduce_scatter": z.get("reduce_scatter", True),
        "zero_optimization.reduce_bucket_size": int(z.get("reduce_bucket_size", 5e8)),
        "zero_optimization.allgather_bucket_size": int(z.get("allgather_bucket_size", 5e8)),
        "zero_optimization.allgather_partitions": z.get("allgather_partitions", True),
        "zero_optimization.round_robin_gradients": z.get("round_robin_gradients", False),
        "zero_optimization.sub_group_size": int(z.get("sub_group_size", 1e9)),
        "zero_optimization.stage3_prefetch_bucket_size": int(
            _first(z, "stage3_prefetch_bucket_size", "prefetch_bucket_size", default=5e7)
        ),
        "zero_optimization.stage3_param_persistence_threshold": int(
            _first(
                z, "stage3_param_persistence_threshold", "param_persistence_threshold", default=1e5
            )
        ),
        "zero_optimization.stage3_max_live_parameters": int(
            _first(z, "stage3_max_live_parameters", "max_live_parameters", default=1e9)
        ),
        "zero_optimization.stage3_max_reuse_distance": int(
            _first(z, "stage3_max_reuse_distance", "max_reuse_distance", default=1e9)
        ),
        "zero_optimization.stage3_gather_16bit_weights_on_model_save": _first(
            z,
            "stage3_gather_16bit_weights_on_model_save",
            "gather_16bit_weights_on_model_save",
            "stage3_gather_fp16_weights_on_model_save",
            default=False,
        ),
    }
    for name, legacy, count in (
        ("offload_optimizer", "cpu_offload", 4),
        ("offload_param", "cpu_offload_param", 5),
    ):
        off = _offload(z.get(name), z.get(legacy, False), count)
        if off is None:
            e[f"zero_optimization.{name}"] = None
        else:
            for k, v in off.items():
                e[f"zero_optimization.{name}.{k}"] = v

    fp16 = _drop_auto(raw.get("fp16", {}))
    e.update(
        {
            "fp16.enabled": fp16.get("enabled", False),
            "fp16.loss_scale": float(fp16.get("loss_scale", 0.0)),
            "fp16.initial_scale_power": fp16.get("initial_scale_power", 16),
            "fp16.loss_scale_window": fp16.get("loss_scale_window", 1000),
            "fp16.hysteresis": fp16.get("hysteresis", 2),
            "fp16.min_loss_scale": fp16.get("min_loss_scale", 1),
        }
    )
    bf16 = _drop_auto(raw.get("bf16", raw.get("bfloat16", {})))
    e["bf16.enabled"] = bf16.get("enabled", False)
    e["bf16.check_grad_overflow"] = bf16.get("check_grad_overflow", True)

    clip = raw.get("gradient_clipping", 1.0)
    e["gradient_clipping"] = 1.0 if clip == "auto" else float(clip)

    batch = {
        k: raw.get(k)
        for k in (
            "train_batch_size",
            "train_micro_batch_size_per_gpu",
            "gradient_accumulation_steps",
        )
    }
    if not any(v == "auto" for v in batch.values()):
        tb, mb, gas = batch.values()
        w = world_size // raw.get("sequence_parallel_size", 1)
        if tb and mb and not gas:
            gas = tb // mb // w
        elif tb and gas and not mb:
            mb = tb // w // gas
        elif mb and gas and not tb:
            tb = mb * gas * w
        elif tb and not mb and not gas:
            gas, mb = 1, tb // w
        elif mb and not tb and not gas:
            gas, tb = 1, mb * w
        if tb and mb and gas:
            e.update(
                {
                    "train_batch_size": tb,
                    "train_micro_batch_size_per_gpu": mb,
                    "gradient_accumulation_steps": gas,
                }
            )
    return e
