"""The writers one by one, from their config sections: the CSV layout DeepSpeed writes, the
Comet sampling interval and calls, wandb's calls (the compatibility package's config classes:
tests/python/compat/test_monitor_surface.py)."""

import sys
import types

from tb_reader import csv_rows, require_tensorboard, tensorboard_scalars


def _sections(**given):
    from zerostream import config

    return config.load(given, require_batch=False, log=False).monitor_config


def test_csv_layout_one_file_per_event_name(tmp_path, one_rank_process_group):
    from zerostream.monitor import CsvMonitor

    cfg = _sections(csv_monitor={"enabled": True, "output_path": str(tmp_path), "job_name": "j"})
    writer = CsvMonitor(cfg.csv_monitor)
    writer.write_events([("Train/Samples/lr", 0.5, 4), ("Eval loss", 2, 4)])
    writer.write_events([("Train/Samples/lr", 0.25, 8)])
    assert sorted(p.name for p in (tmp_path / "j").iterdir()) == [
        "Eval_loss.csv",
        "Train_Samples_lr.csv",
    ]
    assert csv_rows(tmp_path / "j" / "Train_Samples_lr.csv") == [
        ["step", "lr"],
        ["4", "0.5"],
        ["8", "0.25"],
    ]
    assert csv_rows(tmp_path / "j" / "Eval_loss.csv") == [["step", "Eval loss"], ["4", "2"]]


def test_tensorboard_writer_scalars_read_back(tmp_path, one_rank_process_group):
    require_tensorboard()
    from zerostream.monitor import TensorBoardMonitor

    cfg = _sections(tensorboard={"enabled": True, "output_path": str(tmp_path), "job_name": "j"})
    writer = TensorBoardMonitor(cfg.tensorboard)
    writer.write_events([("a/b", 1.5, 3), ("a/b", -2.0, 7), ("c", 4.0, 7)])
    writer.close()
    assert tensorboard_scalars(tmp_path / "j") == {"a/b": [(3, 1.5), (7, -2.0)], "c": [(7, 4.0)]}


def test_comet_interval_and_calls(one_rank_process_group, monkeypatch):
    from zerostream.monitor import CometMonitor

    calls = []

    class Experiment:
        def set_name(self, name):
            calls.append(("set_name", name))

        def log_metric(self, name, value, step=None):
            calls.append(("log_metric", name, value, step))

    def start(**kwargs):
        calls.append(("start", kwargs))
        return Experiment()

    monkeypatch.setitem(sys.modules, "comet_ml", types.SimpleNamespace(start=start))
    cfg = _sections(
        comet={"enabled": True, "samples_log_interval": 10, "project": "p", "online": False,
               "experiment_name": "n"}
    )  # fmt: skip
    writer = CometMonitor(cfg.comet)
    for samples in (0, 5, 10, 12, 25):
        writer.write_events([("loss", samples / 10, samples), ("lr", 0.1, samples + 3)])
    start_kwargs = dict(api_key=None, project="p", workspace=None, experiment_key=None,
                        mode=None, online=False)  # fmt: skip
    assert calls[:2] == [("start", start_kwargs), ("set_name", "n")]
    logged = [(c[1], c[3]) for c in calls[2:]]
    # Each name: its first event, then the next at least 10 samples after the last logged.
    assert logged == [("loss", 0), ("lr", 3), ("loss", 10), ("lr", 13), ("loss", 25), ("lr", 28)]


def test_wandb_calls(one_rank_process_group, monkeypatch):
    from zerostream.monitor import WandbMonitor

    calls = []
    fake = types.SimpleNamespace(
        init=lambda **kw: calls.append(("init", kw)),
        log=lambda data, step=None, commit=None: calls.append(("log", data, step)),
    )
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = _sections(wandb={"enabled": True, "group": "g", "team": "t"})
    WandbMonitor(cfg.wandb).write_events([("x", 1.0, 4), ("y", 2.0, 4)])
    assert calls == [
        ("init", {"project": "deepspeed", "group": "g", "entity": "t"}),
        ("log", {"x": 1.0}, 4),
        ("log", {"y": 2.0}, 4),
    ]
