"""Tracker sinks of the built-in trainer (backends/builtin/trackers.py): TensorBoard, MLflow
and W&B runs that their own readers can read back, with samples as the step axis; the
`trackers:` config field; a missing package as a one-line error naming `trackers`."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

from rlbatch.backends.builtin import trackers
from rlbatch.cli.main import main
from rlbatch.core.config import Config
from rlbatch.core.errors import ConfigError
from rlbatch.core.loading import validate_config

# every trained test here holds wherever a run lands (tests/README.md)
pytestmark = pytest.mark.landing_free

CONFIG = {"name": "trk", "batch": {"prompts_per_step": 8}, "seed": 0}
ROWS = [  # two steps and two evaluations, as the trainer writes them
    {"step": 0, "samples": 0, "train_s": 0.0, "eval/accuracy": 0.25},
    {"step": 1, "samples": 64, "train_s": 0.5, "reward/mean": 0.5, "actor/loss": None,
     "rollout/concurrency": 64, "note": "text is skipped", "flag": True},
    {"step": 2, "samples": 128, "train_s": 1.0, "reward/mean": 0.75, "actor/loss": 0.125},
    {"step": 2, "samples": 128, "train_s": 1.0, "eval/accuracy": 0.5},
]


def _log_all(names, run_dir):
    t = trackers.open_trackers(names, run_dir, CONFIG)
    for row in ROWS:
        t.log(row)
    t.close()


def test_numeric_metrics_skip_the_axis_nulls_text_and_booleans():
    assert trackers.numeric_metrics(ROWS[1]) == {"step": 1.0, "train_s": 0.5, "reward/mean": 0.5,
                                                 "rollout/concurrency": 64.0}
    assert trackers.numeric_metrics({"samples": 1, "x": float("nan"), "y": float("inf")}) == {}
    assert trackers.flatten({"a": {"b": 1, "c": [1, 2]}, "d": None}) == {
        "a.b": "1", "a.c": "[1, 2]", "d": "None"}


def test_config_field_and_run_ids():
    assert Config().trackers == []
    assert "trackers" not in Config().resolved_dict()  # no trackers: run ids as before
    cfg = validate_config({"trackers": ["tensorboard", "mlflow"]})
    assert cfg.resolved_dict()["trackers"] == ["tensorboard", "mlflow"]
    with pytest.raises(ConfigError, match="trackers"):
        validate_config({"trackers": ["neptune"]})


def _missing(name):
    real = importlib.util.find_spec

    def find_spec(mod, *a, **k):
        return None if mod == name else real(mod, *a, **k)
    return find_spec


def test_missing_package_is_a_one_line_error_before_the_run_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", _missing("mlflow"))
    with pytest.raises(ConfigError, match=r"^trackers: 'mlflow' needs the mlflow package"):
        trackers.require_trackers(["tensorboard", "mlflow"])
    with pytest.raises(SystemExit) as exc:
        main(["train", "--preset", "grpo-tiny", "--out", str(tmp_path / "runs"),
              "--set", "trackers=[mlflow]"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "trackers" in err[0], err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def _tb_scalars(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir))
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_events_read_back_with_samples_as_step(tmp_path):
    _log_all(["tensorboard"], tmp_path)
    got = _tb_scalars(tmp_path / "tensorboard")
    assert got["eval/accuracy"] == [(0, 0.25), (128, 0.5)]
    assert got["reward/mean"] == [(64, 0.5), (128, 0.75)]
    assert got["actor/loss"] == [(128, 0.125)]  # the null of step 1 is not sent
    assert "samples" not in got and "note" not in got and "flag" not in got


def test_mlflow_file_store_reads_back_and_resume_reuses_the_run(tmp_path, monkeypatch):
    pytest.importorskip("mlflow", reason="mlflow is optional (pip install mlflow)")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # the sink opts in itself
    from mlflow.tracking import MlflowClient

    _log_all(["mlflow"], tmp_path)
    t = trackers.open_trackers(["mlflow"], tmp_path, CONFIG)  # a resumed run: same MLflow run
    t.log({"step": 3, "samples": 192, "reward/mean": 1.0})
    t.close()
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    exp = client.get_experiment_by_name("trk")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.run_name == tmp_path.name and run.data.tags["rlbatch_run_id"] == tmp_path.name
    assert run.data.params["batch.prompts_per_step"] == "8"
    hist = client.get_metric_history(run.info.run_id, "reward/mean")
    assert sorted((m.step, m.value) for m in hist) == [(64, 0.5), (128, 0.75), (192, 1.0)]
    acc = client.get_metric_history(run.info.run_id, "eval/accuracy")
    assert sorted((m.step, m.value) for m in acc) == [(0, 0.25), (128, 0.5)]


def test_wandb_offline_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is optional (pip install wandb)")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    _log_all(["wandb"], tmp_path)
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_trainer_sends_steps_and_evals(tiny_model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit) as ok:  # typer exits 0 when the command returns
        main(["train", "--preset", "grpo-tiny", "--out", str(tmp_path), "--json",
              "--set", "trackers=[tensorboard]", "--set", "batch.prompts_per_step=8",
              "--set", "budget.max_samples=256", "--set", "eval.every_samples=128",
              "--set", "eval.prompts=32"])
    assert ok.value.code in (0, None), capsys.readouterr().err
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    got = _tb_scalars(f"{summary['run_dir']}/tensorboard")
    assert [s for s, _ in got["eval/accuracy"]] == [0, 128, 256]
    assert [s for s, _ in got["reward/mean"]] == [64, 128, 192, 256]
    assert [s for s, _ in got["time/rollout"]] == [64, 128, 192, 256]
