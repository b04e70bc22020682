"""DeepSpeed's checkpoint engines (deepspeed.runtime.checkpoint_engine) on zerostream: the
create/save/commit/load protocol round-trips a state through torch.save (TorchCheckpointEngine)
and through each writer `checkpoint.writer.type` names (FastCheckpointEngine), the files are
byte for byte what torch.save writes in the serialization the config asks for, the engine a
config asks for is chosen by DeepSpeed's rule, and what zerostream does not build is refused
by name."""

from __future__ import annotations

import io

import pytest
import torch

from zerostream import config as zs_config
from zerostream.checkpoint.checkpoint_engines import (
    CheckpointCommitInfo,
    DataParallelWriterConfig,
    DataStatesCheckpointEngine,
    DecoupledCheckpointEngine,
    FastCheckpointEngine,
    NebulaCheckpointEngine,
    TorchCheckpointEngine,
    create_checkpoint_engine,
    writer_section,
)

ONE_WRITER = DataParallelWriterConfig(
    world_size=1, rank=0, global_rank=0, local_rank=0, pure_dp=True
)


def _cfg(writer=None, serialization=None, **top):
    ckpt: dict = {}
    if writer is not None:
        ckpt["writer"] = writer
    if serialization is not None:
        ckpt["checkpoint_serialization"] = serialization
    return zs_config.load({"checkpoint": ckpt, **top}, require_batch=False, log=False)


def _state():
    g = torch.Generator().manual_seed(2)
    w = torch.randn(40, 50, generator=g)
    return {"module": {"w": w, "w_view": w[3:7]}, "step": 11, "args": {"lr": 0.1}}


def _check_loaded(loaded, state):
    assert torch.equal(loaded["module"]["w"], state["module"]["w"])
    assert loaded["step"] == 11 and loaded["args"] == {"lr": 0.1}
    # One storage saved once: the view is still a view of the loaded tensor.
    w, v = loaded["module"]["w"], loaded["module"]["w_view"]
    assert v.untyped_storage().data_ptr() == w.untyped_storage().data_ptr()


# One state per module: torch's legacy format keys storages by their address, so a file is
# compared with torch.save of the same objects, not of equal ones.
STATE = None


def _state_once():
    global STATE
    if STATE is None:
        STATE = _state()
    return STATE


def _protocol(engine, tmp_path, name="mp_rank_00_model_states.pt"):
    info = CheckpointCommitInfo(tag="global_step3", save_dir=str(tmp_path), save_latest=True)
    engine.create(info)
    folder = tmp_path / info.tag
    engine.makedirs(str(folder), exist_ok=True)
    engine.makedirs(str(folder), exist_ok=True)  # exist_ok, as DeepSpeed's engine calls it
    path = str(folder / name)
    engine.save(_state_once(), path)
    assert engine.commit(info) is True
    assert not engine.is_decoupled() and engine.get_commit_info() is None
    assert engine.preserves_storage_sharing()
    return path


def _reference(zipfile: bool) -> bytes:
    buf = io.BytesIO()
    torch.save(_state_once(), buf, _use_new_zipfile_serialization=zipfile)
    return buf.getvalue()


def test_torch_engine_round_trip_in_the_serialization_asked_for(tmp_path):
    bare = TorchCheckpointEngine()  # DeepSpeed's: no config, legacy format
    assert bare.name == "TorchCheckpointEngine" and bare.zipfile_serialization is False
    path = _protocol(bare, tmp_path / "a")
    legacy_file = tmp_path / "legacy.pt"
    torch.save(_state_once(), legacy_file, _use_new_zipfile_serialization=False)
    assert open(path, "rb").read() == legacy_file.read_bytes()
    _check_loaded(bare.load(path), _state())

    zipped = TorchCheckpointEngine(_cfg())
    assert zipped.zipfile_serialization is True  # checkpoint_serialization's default
    path = _protocol(zipped, tmp_path / "b")
    _check_loaded(zipped.load(path, map_location="cpu"), _state())
    assert TorchCheckpointEngine(_cfg(serialization=False)).zipfile_serialization is False
    assert bare.is_data_parallel_writer(0) and not bare.is_data_parallel_writer(1)


@pytest.mark.parametrize("kind", ["python", "fast", "FAST"])
@pytest.mark.parametrize("serialization", [True, False])
def test_fast_engine_writes_torch_saves_bytes(tmp_path, kind, serialization):
    writer = {"type": kind, "io_buffer_size": 12288, "io_buffer_double": kind != "FAST"}
    engine = FastCheckpointEngine(_cfg(writer, serialization), ONE_WRITER, True)
    assert engine.name == "FastCheckpointEngine" and engine.is_data_parallel_writer(5)
    path = _protocol(engine, tmp_path)
    assert open(path, "rb").read() == _reference(serialization)
    _check_loaded(engine.load(path), _state())
    # The writer is made again for the next file (the staging and handle are reused).
    engine.save({"x": torch.arange(10)}, path)
    assert torch.equal(engine.load(path)["x"], torch.arange(10))


def test_mock_writer_and_a_rank_that_writes_nothing(tmp_path, capsys):
    mock = FastCheckpointEngine(_cfg({"type": "mock", "show_statistics": True}), ONE_WRITER, False)
    path = _protocol(mock, tmp_path / "m")
    assert open(path, "rb").read() == b""  # the file exists, empty
    shown = capsys.readouterr().out
    assert f"'bytes': {len(_reference(True))}" in shown and path in shown

    silent = FastCheckpointEngine(_cfg({"type": "python"}), None, False)
    assert not silent.is_data_parallel_writer(0)
    silent.save(_state(), str(tmp_path / "nothing.pt"))
    assert not (tmp_path / "nothing.pt").exists()


def test_create_checkpoint_engine_follows_deepspeeds_choice(tmp_path):
    none = create_checkpoint_engine(None, None, 0, False, True)
    assert isinstance(none, TorchCheckpointEngine) and not none.zipfile_serialization
    plain = create_checkpoint_engine(_cfg(), None, 2, False, True)
    assert isinstance(plain, TorchCheckpointEngine) and plain.zipfile_serialization
    fast = create_checkpoint_engine(_cfg({"type": "python"}), None, 0, False, True)
    assert isinstance(fast, FastCheckpointEngine) and fast.is_data_parallel_writer(0)
    # A ds_config dict is read as the engine reads it.
    from_dict = create_checkpoint_engine({"checkpoint": {"writer": {}}}, None, 1, False, False)
    assert isinstance(from_dict, FastCheckpointEngine)
    _check_loaded(from_dict.load(_protocol(from_dict, tmp_path)), _state())


def test_what_is_not_built_is_refused_by_name():
    refusals = [
        (lambda: DecoupledCheckpointEngine(_cfg(), ONE_WRITER, True), "background process"),
        (lambda: NebulaCheckpointEngine(None), "torch_nebula"),
        (lambda: DataStatesCheckpointEngine(_cfg(), 0), "DataStates-LLM"),
        (lambda: create_checkpoint_engine(_cfg({"decoupled": True}), None, 1, False, True),
         r"checkpoint.writer.decoupled: true"),
        (lambda: create_checkpoint_engine(_cfg(nebula={"enabled": True}), None, 1, False, True),
         "the nebula section"),
        (lambda: create_checkpoint_engine(_cfg(datastates={"enabled": True}), None, 1, False,
                                          True), "the datastates section"),
        (lambda: create_checkpoint_engine(_cfg({"data_parallel": "socket"}), None, 1, False,
                                          True), "checkpoint.writer.data_parallel='SOCKET'"),
        (lambda: create_checkpoint_engine(_cfg({}), None, 1, True, True), "MoE"),
        (lambda: FastCheckpointEngine(_cfg({}), DataParallelWriterConfig(2, 1, 1, 1, True), True),
         "2 data-parallel writers"),
        (lambda: FastCheckpointEngine(_cfg({}, aio={"use_gds": True}), ONE_WRITER, False),
         "aio.use_gds"),
    ]  # fmt: skip
    for build, words in refusals:
        with pytest.raises(NotImplementedError, match=words):
            build()
    # Several writers without optimize_dp_state each write whole files: allowed.
    FastCheckpointEngine(_cfg({}), DataParallelWriterConfig(2, 1, 1, 1, True), False)
    with pytest.raises(ValueError, match="checkpoint.writer.bogus: unknown key"):
        writer_section({"bogus": 1})
    with pytest.raises(ValueError, match="expected a DeepSpeedConfig"):
        TorchCheckpointEngine("ds_config.json")


def test_the_engine_has_deepspeeds_checkpoint_engine_for_its_synchronous_saves(tmp_path):
    """engine.checkpoint_engine: what scripts ask after save_checkpoint (nothing in flight)
    and a loader of the files it wrote; it cannot be replaced (save_checkpoint does not go
    through it)."""
    import zerostream

    config = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "zero_optimization": {"stage": 1},
        "checkpoint": {"checkpoint_serialization": False},
    }
    engine, *_ = zerostream.initialize(model=torch.nn.Linear(4, 3), config=config)
    ce = engine.checkpoint_engine
    assert isinstance(ce, TorchCheckpointEngine) and ce is engine.checkpoint_engine
    assert ce.zipfile_serialization is False
    engine.save_checkpoint(str(tmp_path), tag="t1")
    assert not ce.is_decoupled() and ce.get_commit_info() is None
    ce.cleanup()
    states = ce.load(str(tmp_path / "t1" / "mp_rank_00_model_states.pt"), map_location="cpu")
    assert torch.equal(states["module"]["weight"], engine.module.weight.detach())
    with pytest.raises(AttributeError):
        engine.checkpoint_engine = TorchCheckpointEngine()
    engine.destroy()
