"""zerostream.config.load: inputs (dict, path, base64), the typed tree, and error messages."""

import base64
import dataclasses
import json
import pathlib

import pytest

from zerostream import _C, config, config_check

HERE = pathlib.Path(__file__).parent

BASE = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 2,
    "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}},
    "bf16": {"enabled": True},
}


def test_dict_path_and_base64_give_the_same_config(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(BASE))
    encoded = base64.urlsafe_b64encode(json.dumps(BASE).encode()).decode()
    loaded = [config.load(src, world_size=2) for src in (BASE, str(path), path, encoded)]
    assert all(c.resolved == loaded[0].resolved for c in loaded)
    assert loaded[0].train_batch_size == 8
    assert loaded[0].zero_optimization.offload_param.device == "cpu"
    assert loaded[0].precision == "bf16"


def test_files_may_have_comments_and_trailing_commas(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(
        '{\n // micro batch\n "train_micro_batch_size_per_gpu": 4, # per rank\n'
        ' "zero_optimization": {"stage": 1,},\n}\n'
    )
    cfg = config.load(str(path))
    assert cfg.train_micro_batch_size_per_gpu == 4 and cfg.zero_stage == 1


def test_a_file_hjson_dump_wrote_reads_as_the_dict(tmp_path):
    """DeepSpeed reads config files with hjson; hjson.dump leaves keys and strings
    unquoted and commas out."""
    import hjson  # pinned in requirements.txt

    path = tmp_path / "config.json"
    with open(path, "w") as f:
        hjson.dump(BASE, f)
    assert "{" in path.read_text() and '"train_batch_size"' not in path.read_text()
    assert config.load(str(path), world_size=2).resolved == config.load(BASE, world_size=2).resolved


def test_duplicate_keys_are_rejected_with_their_path(tmp_path):
    path = tmp_path / "dup.json"
    path.write_text('{"train_batch_size": 8, "fp16": {"enabled": true, "enabled": false}}')
    with pytest.raises(ValueError, match=r"fp16\.enabled: duplicate key \"enabled\""):
        config.load(str(path))


@pytest.mark.parametrize("bad", ["/no/such/ds_config.json", "not base64 !", 42])
def test_unreadable_input_gets_deepspeeds_message(bad):
    with pytest.raises(ValueError, match="Expected a string path to an existing deepspeed config"):
        config.load(bad)


BAD_CONFIGS = [
    (
        {
            "train_batch_size": 8,
            "zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}},
        },
        'zero_optimization.offload_param.device: expected one of "none", "cpu", "nvme"; got "gpu"',
    ),
    (
        {"train_batch_size": 8, "zero_optimization": {"stage": 5}},
        "zero_optimization.stage: expected one of 0, 1, 2, 3; got 5",
    ),
    (
        {"train_batch_size": 8, "zero_optimization": {"overlap_com": True}},
        'zero_optimization.overlap_com: unknown key; did you mean "overlap_comm"?',
    ),
    (
        {"train_batch_size": 8, "fp16": {"enabled": True}, "bf16": {"enabled": True}},
        "bfloat16 and fp16 modes cannot be simultaneously enabled",
    ),
    (
        {
            "train_batch_size": 8,
            "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme"}},
        },
        "zero_optimization.offload_optimizer.nvme_path: required when",
    ),
    (
        {"train_batch_size": 8, "prescale_gradients": True, "zero_optimization": {"stage": 2}},
        "prescale_gradients: must be false with zero_optimization.stage 2 and reduce_scatter true",
    ),
    ({"train_batch_size": 8, "gradient_clipping": -1}, "gradient_clipping: must be >= 0; got -1"),
    (
        {"train_batch_size": 8, "fp16": {"enabled": True, "min_loss_scale": 0.5}},
        "fp16.min_loss_scale: expected an integer; got 0.5",
    ),
    (
        {"train_batch_size": 8, "optimizer": {"type": "Adamm", "params": {}}},
        "optimizer.type: expected a DeepSpeed optimizer",
    ),
    (
        {"train_batch_size": 8, "scheduler": {"type": "WarmupCosineLR", "params": {}}},
        "scheduler.params.total_num_steps: required by WarmupCosineLR",
    ),
    (
        {
            "train_batch_size": 16,
            "train_micro_batch_size_per_gpu": 3,
            "gradient_accumulation_steps": 2,
        },
        "train_batch_size: 16 != train_micro_batch_size_per_gpu 3 * gradient_accumulation_steps 2 "
        "* data-parallel world size 2",
    ),
    (
        {"gradient_accumulation_steps": 2},
        "either train_batch_size or train_micro_batch_size_per_gpu needs to be provided",
    ),
    (
        {"train_batch_size": 8, "bf16": {"enabled": True, "loss_scale": 0}},
        'bf16.loss_scale: unknown key; "loss_scale" is a key of "fp16", not of "bf16"',
    ),
]


@pytest.mark.parametrize("cfg,message", BAD_CONFIGS, ids=[m[:40] for _, m in BAD_CONFIGS])
def test_bad_configs_name_the_key_the_value_and_the_choices(cfg, message):
    with pytest.raises(ValueError) as info:
        config.load(cfg, world_size=2)
    assert message in str(info.value)
    assert isinstance(info.value, AssertionError)  # the type DeepSpeed's asserts raise
    assert str(info.value).startswith("invalid DeepSpeed config <dict>:")


def test_every_error_of_a_file_is_reported_at_once():
    cfg = {
        "train_batch_size": 8,
        "fp16": {"enabled": "yes please"},
        "zero_optimization": {"stage": 7, "typo_key": 1},
    }
    with pytest.raises(ValueError) as info:
        config.load(cfg)
    lines = str(info.value).splitlines()[1:]
    assert len(lines) == 3, lines
    assert sorted(line.strip().split(":")[0] for line in lines) == [
        "fp16.enabled",
        "zero_optimization.stage",
        "zero_optimization.typo_key",
    ]


# The batch rule (reference §1.3): (given, world size) -> (train, micro, gas).
TRIAD = [
    (
        {
            "train_batch_size": 32,
            "train_micro_batch_size_per_gpu": 4,
            "gradient_accumulation_steps": 2,
        },
        4,
        (32, 4, 2),
    ),
    ({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4}, 4, (32, 4, 2)),
    ({"train_batch_size": 32, "gradient_accumulation_steps": 2}, 4, (32, 4, 2)),
    ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, 4, (32, 4, 2)),
    ({"train_batch_size": 32}, 4, (32, 8, 1)),
    ({"train_micro_batch_size_per_gpu": 4}, 4, (16, 4, 1)),
    (
        {"train_batch_size": 33, "train_micro_batch_size_per_gpu": 4},
        4,
        "33 != train_micro_batch_size_per_gpu 4 * gradient_accumulation_steps 2",
    ),
    (
        {"train_batch_size": 2, "train_micro_batch_size_per_gpu": 4},
        1,
        "gradient_accumulation_steps: has to be greater than 0",
    ),
    ({"train_batch_size": -4}, 1, "train_batch_size: must be > 0; got -4"),
    (
        {"gradient_accumulation_steps": 4},
        1,
        "either train_batch_size or train_micro_batch_size_per_gpu",
    ),
    ({}, 1, "either train_batch_size or train_micro_batch_size_per_gpu"),
]


@pytest.mark.parametrize("given,world,want", TRIAD)
def test_batch_triad(given, world, want):
    if isinstance(want, str):
        with pytest.raises(ValueError, match=want.replace("*", r"\*")):
            config.load(given, world_size=world)
        return
    cfg = config.load(given, world_size=world)
    assert (
        cfg.train_batch_size,
        cfg.train_micro_batch_size_per_gpu,
        cfg.gradient_accumulation_steps,
    ) == want
    assert cfg.data_parallel_size == world


def test_typed_tree_is_frozen_and_typed():
    cfg = config.load(BASE, world_size=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.zero_optimization.stage = 1
    z = cfg.zero_optimization
    assert isinstance(z, config.ZeroConfig) and isinstance(
        z.offload_param, config.OffloadParamConfig
    )
    assert z.offload_optimizer is None and z.offload_optimizer_device == "none"
    assert z.offload_param_device == "cpu"
    assert z.overlap_comm is True  # DeepSpeed: on by default for stage 3
    assert cfg.resolved["zero_optimization.overlap_comm"]["source"] == "derived"
    assert cfg.resolved["train_batch_size"] == {"value": 8, "source": "derived"}
    assert cfg.zero_stage == 3 and cfg.data_parallel_size == 2
    # Nested sections are built from the resolved tree with every schema default filled.
    assert cfg.zero_optimization.offload_param.buffer_count == 5
    assert isinstance(cfg.aio, config.AioConfig) and cfg.aio.queue_depth == 8


def test_auto_values_are_resolved_from_the_run_and_logged(caplog):
    raw = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "bf16": {"enabled": "auto"},
        "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
    }
    import logging

    logger = logging.getLogger("zerostream")
    logger.addHandler(caplog.handler)  # zerostream's logger does not propagate to the root
    try:
        with caplog.at_level("INFO", logger="zerostream"):
            cfg = config.load(
                raw,
                world_size=2,
                micro_batch_size=4,
                gradient_accumulation_steps=1,
                hidden_size=256,
                model_dtype="bf16",
                lr=2e-4,
            )
    finally:
        logger.removeHandler(caplog.handler)
    assert cfg.train_batch_size == 8
    assert cfg.bf16.enabled is True
    assert cfg.zero_optimization.reduce_bucket_size == 256 * 256
    assert cfg.optimizer.params["lr"] == 2e-4
    assert (
        'zero_optimization.reduce_bucket_size: "auto" -> 65536 (from hidden size 256)'
        in caplog.text
    )


def test_python_dataclasses_cover_every_schema_key():
    """Each resolved section's keys are exactly its dataclass's fields (nothing dropped)."""
    tree = config_check.check(
        {
            "train_batch_size": 1,
            "zero_optimization": {
                "offload_param": {"device": "cpu"},
                "offload_optimizer": {"device": "cpu"},
            },
            "optimizer": {"type": "AdamW", "params": {}},
            "scheduler": {"type": "WarmupLR", "params": {}},
        }
    )["tree"]

    def compare(cls, section, path):
        fields = {
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        keys = set(section) - {"bfloat16"}
        assert keys == fields, (
            f"{path}: only in schema {keys - fields}, only in dataclass {fields - keys}"
        )

    compare(config.DeepSpeedConfig, tree, "(top level)")
    compare(config.ZeroConfig, tree["zero_optimization"], "zero_optimization")
    compare(config.OffloadParamConfig, tree["zero_optimization"]["offload_param"], "offload_param")
    compare(
        config.OffloadOptimizerConfig,
        tree["zero_optimization"]["offload_optimizer"],
        "offload_optimizer",
    )
    for name, cls in (
        ("fp16", config.FP16Config),
        ("bf16", config.BF16Config),
        ("aio", config.AioConfig),
        ("checkpoint", config.CheckpointConfig),
        ("data_types", config.DataTypesConfig),
        ("wandb", config.WandbConfig),
        ("activation_checkpointing", config.ActivationCheckpointingConfig),
        ("flops_profiler", config.FlopsProfilerConfig),
        ("tensorboard", config.MonitorConfig),
        ("csv_monitor", config.MonitorConfig),
        ("comet", config.CometConfig),
        ("comms_logger", config.CommsLoggerConfig),
        ("zerostream", config.ZeroStreamExtConfig),
    ):
        compare(cls, tree[name], name)


def test_accepted_key_paths_are_pinned():
    """Adding or removing an accepted key is deliberate: update accepted_key_paths.txt too."""
    pinned = (HERE / "accepted_key_paths.txt").read_text().split()
    assert sorted(_C.accepted_key_paths()) == sorted(pinned)


def test_parameter_alignment_is_accepted_with_a_warning_saying_what_it_means():
    """DeepSpeed 0.19's zero_optimization.parameter_alignment (16-byte padding of each
    parameter in its stage 1/2 flat buffer): a DeepSpeed user's config keeps working, and the
    warning says zerostream's layout does not change (its checkpoints reshard by name)."""
    cfg = config.load(
        {"train_batch_size": 2, "zero_optimization": {"stage": 2, "parameter_alignment": True}},
        world_size=1,
        log=False,
    )
    (warning,) = [w for w in cfg.warnings if "parameter_alignment" in w]
    assert "zero_optimization.parameter_alignment: accepted" in warning
    off = config.load(
        {"train_batch_size": 2, "zero_optimization": {"stage": 2, "parameter_alignment": False}},
        world_size=1,
        log=False,
    )
    assert off.warnings == ()


def _writer(section):
    return {"train_batch_size": 2, "checkpoint": {"writer": section}}


def test_checkpoint_writer_is_checked_and_said_to_change_nothing_naming_mock_and_decoupled():
    """DeepSpeed's checkpoint engines (checkpoint.writer): zerostream writes with its own
    writer, so the section is validated by DeepSpeed's rules and a warning says it has no
    effect, naming the two settings a script may rely on (mock writes nothing in DeepSpeed,
    decoupled returns before the files are written)."""
    cfg = config.load(_writer({"type": "FAST", "io_buffer_size": 64e6}), world_size=1, log=False)
    (warning,) = [w for w in cfg.warnings if w.startswith("checkpoint.writer")]
    assert "own writer" in warning and "have no effect" in warning
    assert "mock" not in warning and "decoupled" not in warning
    cfg = config.load(_writer({"type": "mock", "decoupled": True}), world_size=1, log=False)
    (warning,) = [w for w in cfg.warnings if w.startswith("checkpoint.writer")]
    assert 'type "mock" writes nothing in DeepSpeed, here the checkpoint is written' in warning
    assert "decoupled: save_checkpoint returns once the files are written" in warning
    assert config.load({"train_batch_size": 2}, world_size=1, log=False).warnings == ()


@pytest.mark.parametrize(
    "section,message",
    [
        ({"type": "nvme"}, 'checkpoint.writer.type: expected one of "mock", "python", "fast"'),
        ({"decoupled": "yes"}, "checkpoint.writer.decoupled: expected true or false"),
        ({"io_buffer_size": 0}, "checkpoint.writer.io_buffer_size: expected a positive number"),
        ({"data_parallel": "rack"}, "checkpoint.writer.data_parallel: expected null or one of"),
        ({"buffer": 1}, "checkpoint.writer.buffer: unknown key"),
        ("fast", "checkpoint.writer: expected an object"),
    ],
)
def test_a_bad_checkpoint_writer_names_the_key(section, message):
    with pytest.raises(config.ConfigError) as err:
        config.load(_writer(section), world_size=1, log=False)
    assert message in str(err.value)


def test_a_loaded_config_deep_copies_and_pickles_and_stays_read_only():
    """Clients deep-copy the engine's config (Accelerate, Lightning): the copy equals it, and
    its mappings are still read-only."""
    import copy
    import pickle

    cfg = config.load(
        {
            "train_micro_batch_size_per_gpu": 2,
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95]}},
            "zero_optimization": {"stage": 2},
        }
    )
    for twin in (copy.deepcopy(cfg), pickle.loads(pickle.dumps(cfg))):
        assert twin == cfg and twin.raw == cfg.raw and twin.resolved == cfg.resolved
        assert twin.optimizer.params == cfg.optimizer.params
        with pytest.raises(TypeError):
            twin.raw["optimizer"] = None
        with pytest.raises(TypeError):
            twin.optimizer.params["lr"] = 1.0
