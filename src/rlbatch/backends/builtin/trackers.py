"""Optional metric sinks of the built-in trainer: TensorBoard, MLflow, Weights & Biases.

The run log (steps.jsonl, evals.jsonl) stays the record; a tracker receives a copy of every
step and evaluation row as it is written, with **`samples` as the step axis** (docs/design.md:
the x-axis is samples), so runs with different B line up in the tracker's UI too. Only
finite numbers are sent (null/NaN, strings and booleans are skipped).

- `tensorboard`: event files in `<run_dir>/tensorboard/` (torch.utils.tensorboard
  SummaryWriter; the `tensorboard` package), scalar step = samples.
- `mlflow`: a local file store `file:<run_dir>/mlruns`, experiment = the config name, one
  MLflow run tagged `rlbatch_run_id` (reused on resume), the resolved config as params,
  metric step = samples. MLflow 3 keeps the file store only on opt-in, so
  MLFLOW_ALLOW_FILE_STORE defaults to true in this process (`mlflow-skinny` suffices).
- `wandb`: `wandb.init(mode=$WANDB_MODE or "offline", dir=<run_dir>)`, `samples` defined as
  the step metric of every key (`define_metric("*", step_metric="samples")`).

The packages are optional and imported lazily; a tracker whose package is missing is a
one-line ConfigError naming `trackers`, raised before the run directory is created.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import time
from pathlib import Path

TRACKERS = ("tensorboard", "mlflow", "wandb")
MLFLOW_BATCH = 100  # MLflow's log_batch limit on params / metrics per call


def require_trackers(names) -> None:
    """ConfigError naming `trackers` when a tracker's package is not installed."""
    from rlbatch.core.errors import ConfigError

    for name in names:
        if name not in TRACKERS:
            raise ConfigError(f"trackers: unknown tracker '{name}'; use {', '.join(TRACKERS)}")
        if importlib.util.find_spec(name) is None:
            raise ConfigError(f"trackers: '{name}' needs the {name} package: pip install {name} "
                              "(or pip install 'rlbatch[trackers]')")


def numeric_metrics(row: dict) -> dict[str, float]:
    """The row's finite numeric values, without the step axis (`samples`)."""
    out = {}
    for k, v in row.items():
        if k == "samples" or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if math.isfinite(v):
            out[str(k)] = float(v)
    return out


def flatten(d: dict, prefix: str = "") -> dict[str, str]:
    """Nested config -> {"a.b": "value"} (MLflow params)."""
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = str(v)
    return out


class TensorBoardSink:
    def __init__(self, run_dir: Path, run_id: str, config: dict):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, metrics: dict[str, float], samples: int) -> None:
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, global_step=samples)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class MlflowSink:
    def __init__(self, run_dir: Path, run_id: str, config: dict):
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        # MLflow >= 3.x refuses the file store unless opted in; a local file store is the point
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=(run_dir / "mlruns").resolve().as_uri())
        name = str(config.get("name") or "rlbatch")
        exp = self.client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(name)
        found = self.client.search_runs([exp_id], f"tags.rlbatch_run_id = '{run_id}'")
        if found:  # a resumed run continues its MLflow run
            self.run_id = found[0].info.run_id
            return
        run = self.client.create_run(exp_id, run_name=run_id, tags={"rlbatch_run_id": run_id})
        self.run_id = run.info.run_id
        params = [Param(k, v[:6000]) for k, v in flatten(config).items()]
        for i in range(0, len(params), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, params=params[i:i + MLFLOW_BATCH])

    def log(self, metrics: dict[str, float], samples: int) -> None:
        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        batch = [Metric(k, v, ts, samples) for k, v in metrics.items()]
        for i in range(0, len(batch), MLFLOW_BATCH):
            self.client.log_batch(self.run_id, metrics=batch[i:i + MLFLOW_BATCH])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


class WandbSink:
    def __init__(self, run_dir: Path, run_id: str, config: dict):
        import wandb

        self.run = wandb.init(project=str(config.get("name") or "rlbatch"), name=run_id,
                              id=re.sub(r"[^A-Za-z0-9_-]", "_", run_id), dir=str(run_dir),
                              config=config, mode=os.environ.get("WANDB_MODE", "offline"),
                              resume="allow")
        self.run.define_metric("samples")
        self.run.define_metric("*", step_metric="samples")

    def log(self, metrics: dict[str, float], samples: int) -> None:
        self.run.log({"samples": samples, **metrics})

    def close(self) -> None:
        self.run.finish()


SINKS = {"tensorboard": TensorBoardSink, "mlflow": MlflowSink, "wandb": WandbSink}


class Trackers:
    """The configured sinks; with none configured every call is a no-op."""

    def __init__(self, sinks: list):
        self.sinks = sinks

    def log(self, row: dict) -> None:
        if not self.sinks:
            return
        metrics, samples = numeric_metrics(row), int(row["samples"])
        for sink in self.sinks:
            sink.log(metrics, samples)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
        self.sinks = []


def open_trackers(names, run_dir: str | Path, config: dict) -> Trackers:
    """Open one sink per tracker name (duplicates once) for the run in `run_dir`."""
    require_trackers(names)
    run_dir = Path(run_dir)
    return Trackers([SINKS[n](run_dir, run_dir.name, config) for n in dict.fromkeys(names)])
