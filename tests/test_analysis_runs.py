"""Loading runs into tidy frames; configuration ids; analysis imports no torch."""

import subprocess
import sys

import pytest

from rlbatch.analysis.runs import config_id, configuration, load_runs
from rlbatch.core.errors import DataError
from rlbatch.core.runlog import RunWriter

CFG = {"algorithm": "grpo", "seed": 0, "output_dir": "runs",
       "batch": {"prompts_per_step": 16, "samples_per_prompt": 8},
       "optimizer": {"reference_sequences": 128, "lr_scaling": "sqrt"},
       "derived": {"sequences_per_step": 128, "actor_lr": 1e-4}}


def test_config_id_ignores_seed_and_output_dir_only():
    other_seed = {**CFG, "seed": 7, "output_dir": "elsewhere"}
    assert config_id(CFG) == config_id(other_seed)
    assert configuration(other_seed) == {k: v for k, v in CFG.items()
                                         if k not in ("seed", "output_dir")}
    assert config_id(CFG).startswith("grpo-B128-lr0.0001-")
    changed = {**CFG, "optimizer": {**CFG["optimizer"], "lr_scaling": "none"}}
    assert config_id(changed) != config_id(CFG)


def write(d, cfg, seed):
    with RunWriter(d) as w:
        w.write_config({**cfg, "seed": seed})
        w.write_manifest({"run_id": d.name, "seed": seed})
        w.log_eval({"step": 0, "samples": 0, "train_s": 0.0, "eval/accuracy": 0.25})


def test_load_runs_tidy_frames_and_grouping(tmp_path):
    write(tmp_path / "sweep" / "a" / "s0", CFG, 0)   # two levels below the sweep directory
    write(tmp_path / "sweep" / "s1", CFG, 1)         # one level below
    big = {**CFG, "derived": {"sequences_per_step": 256, "actor_lr": 1.414e-4}}
    write(tmp_path / "sweep" / "big", big, 0)
    frames = load_runs([tmp_path / "sweep", tmp_path / "sweep" / "s1"])  # s1 given twice
    runs = frames.runs.sort_values("run")
    assert len(runs) == 3
    assert runs["config"].nunique() == 2
    assert sorted(runs["seed"].tolist()) == [0, 0, 1]
    assert sorted(runs["sequences_per_step"].tolist()) == [128, 128, 256]
    assert all(type(b) is int for b in runs["sequences_per_step"])
    assert set(frames.evals["run"]) == set(runs["run"])
    assert len(frames.configs) == 2


def test_load_runs_bad_paths(tmp_path):
    with pytest.raises(DataError, match="path not found"):
        load_runs([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no run directories"):
        load_runs([tmp_path / "empty"])
    with pytest.raises(DataError, match="no run"):
        load_runs([])


def test_analysis_imports_no_torch():
    code = (
        "import sys\n"
        "import rlbatch.analysis, rlbatch.analysis.analyze, rlbatch.analysis.crossing\n"
        "import rlbatch.analysis.invariance, rlbatch.analysis.noise, rlbatch.analysis.runs\n"
        "import rlbatch.analysis.selection, rlbatch.analysis.stats\n"
        "assert 'torch' not in sys.modules, 'analysis imported torch'\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"
