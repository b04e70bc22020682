"""`deepspeed.io`, `deepspeed.runtime.checkpoint_engine` and
`deepspeed.runtime.model_checkpointing` in the installed compatibility package: every module
of DeepSpeed's packages imports, each name is zerostream's object (the behaviour is tested in
tests/python/checkpoint/test_file_writers.py and test_checkpoint_engines.py), and a save
through the `deepspeed` names round-trips."""

import json

from compat_run import run_python

# DeepSpeed's modules and, per module, names it defines there (DeepSpeed edaa722).
SURFACE = {
    "deepspeed.io": ["PyFileWriter", "FastFileWriter", "FastFileWriterConfig", "MockFileWriter"],
    "deepspeed.io.base_file_writer": ["BaseFileWriter", "BASE_STAT_KEYS", "WRITE_BYTES_KEY"],
    "deepspeed.io.py_file_writer": ["PyFileWriter"],
    "deepspeed.io.mock_file_writer": ["MockFileWriter"],
    "deepspeed.io.fast_file_writer": ["FastFileWriter", "FastFileWriterConfig", "FASTIO_STAT_KEYS"],
    "deepspeed.io.base_io_buffer": ["Base_IO_Buffer"],
    "deepspeed.io.single_io_buffer": ["Single_IO_Buffer"],
    "deepspeed.io.double_io_buffer": ["Double_IO_Buffer", "NUM_BUFFERS", "INVALID_BUFFER_INDEX"],
    "deepspeed.io.constants": ["INVALID_FD", "AIO_WRITE_BYTES_KEY", "STORAGE_OBJ_SIZE", "RANK_KEY"],
    "deepspeed.io.utils": ["serialize_details", "tensor_to_bytes", "bytes_to_tensor",
                           "required_minimum_torch_version", "obj_serialization_details"],
    "deepspeed.runtime.checkpoint_engine": [
        "FastCheckpointEngine", "TorchCheckpointEngine", "DecoupledCheckpointEngine",
        "CheckpointCommitInfo", "DataStatesCheckpointEngine", "create_checkpoint_engine"],
    "deepspeed.runtime.checkpoint_engine.checkpoint_engine": [
        "CheckpointEngine", "CheckpointCommitInfo"],
    "deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine": [
        "TorchCheckpointEngine", "ENGINE_NAME"],
    "deepspeed.runtime.checkpoint_engine.fast_checkpoint_engine": ["FastCheckpointEngine"],
    "deepspeed.runtime.checkpoint_engine.decoupled_checkpoint_engine": [
        "DecoupledCheckpointEngine", "ENGINE_NAME"],
    "deepspeed.runtime.checkpoint_engine.nebula_checkpoint_engine": ["NebulaCheckpointEngine"],
    "deepspeed.runtime.checkpoint_engine.datastates_checkpoint_engine": [
        "DataStatesCheckpointEngine"],
    "deepspeed.runtime.checkpoint_engine.utils": ["create_checkpoint_engine"],
    "deepspeed.runtime.model_checkpointing": [
        "CHECKPOINT_WRITER", "CheckpointWriterType", "CHECKPOINT_IO_BUFFER_SIZE_DEFAULT"],
    "deepspeed.runtime.model_checkpointing.data_parallel_writer_factory": [
        "DataParallelWriterConfig"],
}  # fmt: skip

SCRIPT = r"""
import importlib, io, json, sys, tempfile, os
import torch
surface = json.loads(sys.argv[1])
missing = [f"{m}.{n}" for m, names in surface.items()
           for n in names if not hasattr(importlib.import_module(m), n)]
import deepspeed.io as dio
import deepspeed.runtime.checkpoint_engine as ce
import zerostream.checkpoint.file_writer as zfw
import zerostream.checkpoint.checkpoint_engines as zce
import zerostream.checkpoint.io_buffer as zio
same = [dio.PyFileWriter is zfw.PyFileWriter, dio.MockFileWriter is zfw.MockFileWriter,
        ce.TorchCheckpointEngine is zce.TorchCheckpointEngine,
        importlib.import_module("deepspeed.io.double_io_buffer").Double_IO_Buffer
        is zio.DoubleIOBuffer]
d = tempfile.mkdtemp()
state = {"w": torch.arange(12.0).reshape(3, 4)}
w = dio.PyFileWriter(os.path.join(d, "a.pt"))
torch.save(state, w)
w.close()
ref = io.BytesIO()
torch.save(state, ref)
engine = ce.TorchCheckpointEngine()
engine.save(state, os.path.join(d, "b.pt"))
print(json.dumps({
    "missing": missing, "same": same,
    "py_bytes_equal": open(os.path.join(d, "a.pt"), "rb").read() == ref.getvalue(),
    "engine_load": engine.load(os.path.join(d, "b.pt"))["w"].tolist(),
}))
"""


def test_deepspeed_checkpoint_io_modules_are_zerostreams(compat_env):
    done = run_python(["-c", SCRIPT, json.dumps(SURFACE)], compat_env, timeout=300)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["missing"] == []
    assert got["same"] == [True] * 4
    assert got["py_bytes_equal"]
    assert got["engine_load"] == [[0.0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
