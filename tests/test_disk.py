"""Full disks and unwritable output (issue 16, item 4), and a run folder whose `steps.jsonl`
is a folder. Real processes and real files.

A full disk is simulated by tests/helpers/diskfull.py, which runs the real CLI with its
Python-level writes under one folder made to fail with ENOSPC part-way through a chosen write
(a steps row, the summary, the manifest, a checkpoint file) or with EACCES (a read-only
folder); those tests always run. A real small tmpfs, which also fails the native writes
(safetensors writes its files in Rust), and a real read-only folder are tried where this
process may mount (root) or chmod stops it (not root); elsewhere they skip.

Each failure must be one line naming the file, exit status 2, no traceback, nothing
half-written (every JSONL file ends in a complete row, every JSON file parses, every
checkpoint verifies, no temporary file or folder is left), and `--resume` once space is back
must finish with the same logged values as an uninterrupted run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.cli import run_cli
from helpers.kill import stable
from rlbatch.backends.builtin import checkpoint as ck
from rlbatch.core.errors import OutputError
from rlbatch.core.runlog import (
    STEP_REQUIRED,
    RunWriter,
    atomic_write_json,
    read_jsonl,
    read_run,
    truncate_jsonl_after_step,
)

HELPERS = Path(__file__).resolve().parent / "helpers"
sys.path.insert(0, str(HELPERS))
import diskfull  # a test helper beside this file

# every trained test here holds wherever a run lands (tests/README.md)
pytestmark = pytest.mark.landing_free

# 4 steps of 32 sequences; evaluations at steps 0, 2 and 4; checkpoints at steps 2 and 4
SETS = ["batch.prompts_per_step=4", "budget.max_samples=128", "eval.every_samples=64",
        "eval.prompts=16", "checkpoint.every_samples=64"]
SKIP = ("time/", "train_s", "rollout/tokens_per_s")  # wall-clock values differ between runs
ENV = dict(os.environ, PYTHONUNBUFFERED="1", RLBATCH_THREADS="1")


def _train(out: Path, *extra: str, disk: tuple[Path, str] | None = None):
    args = ["train", "--preset", "grpo-tiny", *[x for s in SETS for x in ("--set", s)],
            "--out", str(out), *extra]
    head = [sys.executable, str(HELPERS / "diskfull.py"), str(disk[0]), disk[1]] if disk \
        else [sys.executable, "-m", "rlbatch.cli.main"]
    return subprocess.run(head + args, env=ENV, capture_output=True, text=True, timeout=600,
                          check=False)


def _error_line(proc, *parts: str) -> str:
    """The failed process's one error line (the last on stderr), with every part in it."""
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: "), line
    for part in parts:
        assert part in line, (part, line)
    return line


def _strict(text: str | bytes):
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def _only_run(root: Path) -> Path:
    runs = [p for p in root.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def _assert_nothing_half_written(run: Path) -> None:
    stray = sorted(str(p.relative_to(run)) for p in run.rglob(".*"))
    assert stray == [], stray  # no .summary.json.tmp*, checkpoints/.tmp-*, .trash-*
    for name in ("steps.jsonl", "evals.jsonl", "reward_errors.jsonl"):
        if (run / name).exists():
            data = (run / name).read_bytes()
            assert data == b"" or data.endswith(b"\n"), (name, data[-80:])
            for line in data.splitlines():
                _strict(line)
    for name in ("summary.json", "manifest.json"):
        if (run / name).exists():
            _strict((run / name).read_text())
    for path in ck.list_checkpoints(run):
        ck._verify_files(path, ["model.safetensors", "state.pt", "counters.json"])


def _stable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(SKIP)} for r in rows]


def _assert_same_as(reference, run_dir: Path) -> None:
    run = read_run(run_dir)
    assert len(run.steps) == len(reference.steps) == 4
    assert _stable(run.steps) == _stable(reference.steps)
    assert _stable(run.evals) == _stable(reference.evals)
    assert run.summary["status"] == reference.summary["status"]
    # the crossing's own training seconds are wall-clock, as `train_s` in the rows is
    assert stable(run.summary["target"]) == stable(reference.summary["target"])


@pytest.fixture(scope="module")
def reference(tiny_model_dir, tmp_path_factory):
    """The uninterrupted run every resumed one must equal."""
    out = tmp_path_factory.mktemp("reference")
    proc = _train(out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return read_run(_only_run(out))


# ---------------------------------------------------------------- injected ENOSPC, whole runs

def test_disk_full_in_a_step_row_then_resume_matches_uninterrupted(reference, tmp_path):
    """The disk fills 20 bytes into the third steps row: the row is cut off again, the run
    stops with one line naming steps.jsonl, and --resume (space back) finishes it."""
    out = tmp_path / "out"
    proc = _train(out, disk=(tmp_path, "full:steps.jsonl:3:20"))
    run = _only_run(out)
    _error_line(proc, str(run / "steps.jsonl"), "no space left on device (errno 28)",
                "rerun with --resume")
    _assert_nothing_half_written(run)
    assert [r["step"] for r in read_jsonl(run / "steps.jsonl")[0]] == [1, 2]
    # writing `failed` hit the full disk too: the summary keeps its last content
    assert _strict((run / "summary.json").read_text())["status"] == "running"
    assert [p.name for p in ck.list_checkpoints(run)] == ["step-00000002"]
    proc = _train(out, "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_nothing_half_written(run)
    _assert_same_as(reference, run)


@pytest.mark.slow
def test_disk_full_in_a_checkpoint_then_resume_matches_uninterrupted(reference, tmp_path):
    """The second (final) checkpoint, at step 4, fails while writing counters.json: its
    temporary folder is removed, the first checkpoint stays. A resume in a folder that is
    read-only by then changes nothing; once writable, --resume continues from step 2."""
    out = tmp_path / "out"
    proc = _train(out, disk=(tmp_path, "full:counters.json:2:10"))
    run = _only_run(out)
    _error_line(proc, str(run / "checkpoints" / "step-00000004"), "(errno 28)", "--resume")
    _assert_nothing_half_written(run)
    assert [p.name for p in ck.list_checkpoints(run)] == ["step-00000002"]
    before = {p: p.read_bytes() for p in run.iterdir() if p.is_file()}
    proc = _train(out, "--resume", disk=(tmp_path, "readonly"))  # the folder is read-only now
    _error_line(proc, str(run / "steps.jsonl"), "permission denied (errno 13)",
                "make it writable and rerun with --resume")
    assert {p: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    proc = _train(out, "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_nothing_half_written(run)
    _assert_same_as(reference, run)


@pytest.mark.slow
def test_disk_full_in_the_final_summary_then_resume_finishes(reference, tmp_path):
    """The final summary.json write fails after the last checkpoint: the old summary stays
    whole (`running`), no temporary file is left, and --resume only writes the summary."""
    out = tmp_path / "out"
    proc = _train(out, disk=(tmp_path, "full:summary.json:2:10"))
    run = _only_run(out)
    _error_line(proc, str(run / "summary.json"), "(errno 28)", "--resume")
    _assert_nothing_half_written(run)
    assert _strict((run / "summary.json").read_text())["status"] == "running"
    assert len(read_jsonl(run / "steps.jsonl")[0]) == 4
    proc = _train(out, "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _assert_nothing_half_written(run)
    _assert_same_as(reference, run)


def test_disk_full_in_the_manifest_leaves_no_run_folder(tiny_model_dir, tmp_path):
    """A new run that cannot write its manifest removes the folder it made: nothing
    half-written stays for a later run to mistake for an interrupted one."""
    out = tmp_path / "out"
    proc = _train(out, disk=(tmp_path, "full:manifest.json:1:10"))
    _error_line(proc, "manifest.json: no space left on device (errno 28)", str(out))
    assert list(out.iterdir()) == []


# ---------------------------------------------------------------- unwritable output

def test_read_only_output_folder_injected(tiny_model_dir, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    proc = _train(ro / "out", disk=(ro, "readonly"))
    _error_line(proc, str(ro / "out"), "permission denied (errno 13)")
    assert list(ro.iterdir()) == []


def _mount(where: Path, options: str) -> None:
    where.mkdir(exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                          capture_output=True, text=True, check=False) \
        if os.geteuid() == 0 and shutil.which("mount") else None
    if done is None or done.returncode != 0:
        pytest.skip("mounting a tmpfs is not permitted here")


def _umount(where: Path) -> None:
    subprocess.run(["umount", str(where)], capture_output=True, check=False)


@pytest.mark.slow
def test_read_only_output_folder_real(tiny_model_dir, tmp_path):
    """A real read-only folder: chmod 555 when not root, else a read-only tmpfs."""
    ro = tmp_path / "ro"
    if os.geteuid() != 0:
        ro.mkdir()
        ro.chmod(0o555)
    else:
        _mount(ro, "ro,size=64k")
    try:
        proc = _train(ro / "out")
        _error_line(proc, str(ro / "out"), "errno 13" if os.geteuid() else "errno 30")
        assert list(ro.iterdir()) == []
    finally:
        if os.geteuid() == 0:
            _umount(ro)
        else:
            ro.chmod(0o755)


def test_out_naming_a_file_is_one_line(tiny_model_dir, tmp_path, capsys):
    """`--out` (train) and `-o` (report) naming an existing file: one line naming it, exit 2,
    the file untouched."""
    f = tmp_path / "results.txt"
    f.write_text("keep me\n")
    proc = _train(f)
    _error_line(proc, str(f), "is a file, not a folder (errno 20)")
    code, _, err = run_cli(["report", str(_tiny_run(tmp_path / "run")), "-o", str(f / "r.html"),
                            "--target", "eval/accuracy=0.9"],
                           capsys)
    assert code == 2 and err.count("\n") == 1 and str(f) in err and "errno" in err, err
    assert f.read_text() == "keep me\n"


# ---------------------------------------------------------------- real ENOSPC on a tmpfs

@pytest.mark.slow
def test_real_tmpfs_full_then_resume_matches_uninterrupted(reference, tmp_path):
    """A 200 KiB tmpfs: the first checkpoint (9.5 MB, written by safetensors' native code)
    does not fit. One line naming it; then the tmpfs grows ("space is back") and --resume
    finishes with the reference's values."""
    mnt = tmp_path / "mnt"
    _mount(mnt, "size=200k")
    try:
        out = mnt / "out"
        proc = _train(out)
        run = _only_run(out)
        _error_line(proc, str(run / "checkpoints" / "step-00000002"), "(errno 28)",
                    "--resume")
        _assert_nothing_half_written(run)
        assert ck.list_checkpoints(run) == []
        subprocess.run(["mount", "-o", "remount,size=64m", str(mnt)], check=True)
        proc = _train(out, "--resume")
        assert proc.returncode == 0, proc.stderr[-3000:]
        _assert_nothing_half_written(run)
        _assert_same_as(reference, run)
    finally:
        _umount(mnt)


# ---------------------------------------------------------------- the writers in-process

def _row(step: int) -> dict:
    return {**{k: 0.5 for k in STEP_REQUIRED}, "step": step, "samples": 32 * step}


def test_writers_on_a_full_disk_leave_whole_files(tmp_path, monkeypatch):
    """An append cut by a full disk is taken back; an atomic write that fails keeps the old
    file and removes its temporary file; a resume's cut of the logs needs no free space."""
    w = RunWriter(tmp_path)
    w.log_step(_row(1))
    atomic_write_json(tmp_path / "summary.json", {"status": "running", "steps": 1})
    for obj, name, value in diskfull.hooks(tmp_path, "full:steps.jsonl:1:25"):
        monkeypatch.setattr(obj, name, value)
    with pytest.raises(OutputError, match=r"steps\.jsonl: no space left on device \(errno 28\)"):
        w.log_step(_row(2))
    with pytest.raises(OutputError, match=r"summary\.json: no space left"):
        atomic_write_json(tmp_path / "summary.json", {"status": "failed"})
    assert [r["step"] for r in read_jsonl(tmp_path / "steps.jsonl")[0]] == [1]
    assert (tmp_path / "steps.jsonl").read_bytes().endswith(b"}\n")
    assert _strict((tmp_path / "summary.json").read_text())["status"] == "running"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    # a killed process's cut row, then a resume while the disk is still full
    monkeypatch.undo()
    with open(tmp_path / "evals.jsonl", "ab") as fh:
        fh.write(b'{"step": 0, "samples": 0, "train_s": 0}\n{"step": 2, "sam')
    for obj, name, value in diskfull.hooks(tmp_path, "full:nothing:1:0"):
        monkeypatch.setattr(obj, name, value)
    diskfull._state["full"] = True
    truncate_jsonl_after_step(tmp_path / "evals.jsonl", 1)
    assert (tmp_path / "evals.jsonl").read_bytes() == b'{"step": 0, "samples": 0, "train_s": 0}\n'
    w.close()


def test_checkpoint_on_a_full_disk_keeps_the_previous_one(small_llama, tmp_path, monkeypatch):
    """torch.save's failed write (torch turns it into a RuntimeError) and safetensors' native
    `(os error 28)` both become one OutputError naming the checkpoint; the temporary folder
    goes, and the previous checkpoint still loads."""
    opt = torch.optim.AdamW(small_llama.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)

    def save(step):
        return ck.save_checkpoint(tmp_path, model=small_llama, optimizer=opt, generator=gen,
                                  counters={"step": step, "consumed": step})

    save(1)
    for obj, name, value in diskfull.hooks(tmp_path, "full:state.pt:1:100"):
        monkeypatch.setattr(obj, name, value)
    with pytest.raises(OutputError) as info:
        save(2)
    monkeypatch.undo()
    assert str(info.value).startswith(f"{tmp_path / 'checkpoints' / 'step-00000002'}: no space")

    def native_full(*args, **kwargs):
        raise RuntimeError("Error while serializing: I/O error: No space left on device "
                           "(os error 28)")

    monkeypatch.setattr(ck, "save_model", native_full)
    with pytest.raises(OutputError, match=r"step-00000002: no space left on device"):
        save(2)
    monkeypatch.undo()
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step-00000001"]
    counters, _ = ck.load_checkpoint(tmp_path, model=small_llama, optimizer=opt, generator=gen)
    assert counters["step"] == 1


# ---------------------------------------------------------------- a folder named steps.jsonl

def _tiny_run(run: Path) -> Path:
    with RunWriter(run) as w:
        w.write_config({"algorithm": "grpo", "seed": 0})
        w.write_manifest({"run_id": "r", "seed": 0})
        for s in (1, 2):
            w.log_step(_row(s))
        w.log_eval({"step": 2, "samples": 64, "train_s": 1.0, "eval/accuracy": 0.5})
        w.write_summary({"status": "budget_exhausted"})
    return run


@pytest.mark.parametrize("name", ["steps.jsonl", "evals.jsonl", "summary.json", "config.yaml"])
def test_a_log_file_that_is_a_folder_is_one_line(tmp_path, capsys, name):
    run = _tiny_run(tmp_path / "run")
    (run / name).unlink()
    (run / name).mkdir()
    for args in (["analyze", str(run)], ["report", str(run), "-o", str(tmp_path / "r.html")]):
        code, _, err = run_cli(args, capsys)
        assert code == 2, err
        assert err == f"error: {run / name}: is a folder, not a file\n", err
    assert not (tmp_path / "r.html").exists()
