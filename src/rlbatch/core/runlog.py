"""The run log: the contract between trainers, ingest and analysis (docs/design.md "The run log").

A run is a directory `<root>/<run_id>/` holding `config.yaml`, `manifest.json`,
`steps.jsonl` (one row per rollout step), `evals.jsonl` (one row per evaluation) and
`summary.json`. JSON files are written atomically (temp file + rename); JSONL rows are
appended and flushed as they happen, so a killed run loses at most the row in flight. The
reader tolerates a last line cut mid-write and reports it in `Run.warnings`.

Output that cannot be written (full disk, quota, read-only folder, a file where a folder must
be) raises `OutputError` naming the file and leaves nothing half-written: a failed atomic write
removes its temporary file (the old file stays), a failed append cuts the file back to its last
complete row. A log file that cannot be read (e.g. a folder) is a `DataError` naming it.

This module imports no torch: analysis and ingest use it too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import platform
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlbatch.core.errors import DataError, missing, writing

STEP_REQUIRED = (
    "step", "samples", "prompts", "tokens", "train_s",
    "time/rollout", "time/reward", "time/actor_update", "time/critic_update", "time/other",
    "reward/mean", "actor/lr", "actor/grad_norm", "actor/loss",
)
EVAL_REQUIRED = ("step", "samples", "train_s")
STATUSES = ("running", "target_reached", "budget_exhausted", "stopped", "diverged", "failed")


# libyaml's parser and emitter when PyYAML has them (the same documents, several times
# faster): for the config.yaml files that programs write and read back, and user configs
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def yaml_text(obj: Any) -> str:
    """`yaml.safe_dump(obj, sort_keys=False)`, with libyaml when available."""
    return yaml.dump(obj, Dumper=_DUMPER, sort_keys=False)


def yaml_data(text: str) -> Any:
    """`yaml.safe_load(text)`, with libyaml when available."""
    return yaml.load(text, Loader=YAML_LOADER)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _clean(obj: Any) -> Any:
    """NaN/inf are not JSON: store them as null (the key stays, so absence != non-finite),
    at any depth of dicts, lists and tuples; numpy/torch scalars become Python numbers."""
    if hasattr(obj, "item") and not isinstance(obj, (dict, list, tuple)):
        try:
            obj = obj.item()
        except (TypeError, ValueError):  # a multi-element array: left to the encoder
            return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def dumps_strict(obj: Any, **kwargs) -> str:
    """Strict JSON (RFC 8259): non-finite floats become null first; `allow_nan=False` then
    catches anything that slipped past the cleaning instead of writing a bare NaN."""
    return json.dumps(_clean(obj), allow_nan=False, default=_json_default, **kwargs)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]  # a short write is followed by the rest or an error


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path` (`.<name>.tmp<pid>`), fsync it, rename it
    over `path`. On any error the temporary file is removed and `path` keeps its old content."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with writing(path):
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, path)
    except Exception:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, dumps_strict(obj, indent=2) + "\n")


def stable_hash(obj: Any, length: int = 10) -> str:
    blob = json.dumps(obj, sort_keys=True, default=_json_default).encode()
    return hashlib.sha256(blob).hexdigest()[:length]


def identity(resolved: dict) -> dict:
    """The part of a resolved config that defines the experiment: without `output_dir` and
    `trackers` (where it writes, which sinks it feeds), without the `profile` section (how
    `rlbatch profile` chooses its trials; no training reads it, so a new profile setting
    leaves every run id as it was), without how a command trial is
    watched (`command.poll_s`, `idle_timeout_s`, `stop_grace_s`), without `reward.workers`,
    `reward.max_error_rate` and `reward.error_window_calls` (how rewards are run and when the
    run gives up change no value it logs, so a run that failed on its error rate can be
    resumed with a new limit), and with the `reward` section's default values left out, so
    runs from before that section existed keep their ids."""
    from rlbatch.core.config import RewardConfig

    body = {k: v for k, v in resolved.items() if k not in ("output_dir", "trackers", "profile")}
    if isinstance(body.get("command"), dict):  # how the command is watched, not what it runs
        body["command"] = {k: v for k, v in body["command"].items()
                           if k not in ("poll_s", "idle_timeout_s", "stop_grace_s")}
    if isinstance(body.get("reward"), dict):
        defaults = RewardConfig().model_dump(mode="json")
        execution = ("workers", "max_error_rate", "error_window_calls")
        policy = {k: v for k, v in body["reward"].items()
                  if k not in execution and defaults.get(k, object()) != v}
        if policy:
            body["reward"] = policy
        else:
            del body["reward"]
    return body


def make_run_id(resolved: dict, seed: int) -> str:
    """Readable prefix + hash of the experiment's config (`identity`) and seed."""
    body = identity(resolved)
    batch = resolved.get("batch", {})
    lr = resolved.get("derived", {}).get("actor_lr")
    prefix = f"{resolved.get('algorithm', 'run')}-P{batch.get('prompts_per_step')}" \
             f"xG{batch.get('samples_per_prompt')}"
    if lr is not None:
        prefix += f"-lr{lr:.3g}"
    return f"{prefix}-s{seed}-{stable_hash([body, seed], 8)}"


def _git_sha() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5,
            cwd=Path(__file__).parent, check=False,  # not a checkout: no sha, not an error
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def build_manifest(run_id: str, backend: str, seed: int, extra: dict | None = None) -> dict:
    from rlbatch import __version__

    manifest = {
        "run_id": run_id,
        "backend": backend,
        "seed": seed,
        "rlbatch_version": __version__,
        "git_sha": _git_sha(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    manifest.update(extra or {})
    return manifest


def make_dir(path: str | Path) -> Path:
    """`mkdir -p path`; a file in the way, a read-only parent, a full disk: `OutputError`."""
    path = Path(path)
    with writing(path):
        path.mkdir(parents=True, exist_ok=True)
    return path


class JsonlAppender:
    """One JSONL file open for appending. Each `append` writes whole rows with one unbuffered
    write and fsyncs them; when the write fails (e.g. the disk fills part-way through a row)
    the file is cut back to its length before, so it never ends in a partial row."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        with writing(self.path):
            self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                                           0o644)

    def append(self, *rows: dict) -> None:
        data = "".join(dumps_strict(r) + "\n" for r in rows).encode()  # may raise: no I/O yet
        with writing(self.path):
            size = os.fstat(self._fd).st_size
            try:
                _write_all(self._fd, data)
                os.fsync(self._fd)
            except OSError:  # if even the cut fails, readers skip a cut last line
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, size)  # shrinking needs no space
                raise

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def append_jsonl(path: str | Path, *rows: dict) -> None:
    """Append rows to a JSONL file (opened and closed here), all or nothing."""
    fh = JsonlAppender(path)
    try:
        fh.append(*rows)
    finally:
        fh.close()


class RunWriter:
    """Appends rows to a run directory. Reopening an existing run appends (resume)."""

    def __init__(self, run_dir: str | Path):
        self.dir = make_dir(run_dir)
        # held open for the run's lifetime and closed by close() / __exit__
        self._steps = JsonlAppender(self.dir / "steps.jsonl")
        try:
            self._evals = JsonlAppender(self.dir / "evals.jsonl")
        except BaseException:
            self._steps.close()
            raise

    def write_config(self, resolved: dict) -> None:
        atomic_write_text(self.dir / "config.yaml", yaml_text(resolved))

    def write_manifest(self, manifest: dict) -> None:
        atomic_write_json(self.dir / "manifest.json", manifest)

    def write_summary(self, summary: dict) -> None:
        if summary.get("status") not in STATUSES:
            raise ValueError(f"summary status must be one of {STATUSES}")
        atomic_write_json(self.dir / "summary.json", summary)

    def log_step(self, row: dict) -> None:
        missing = [k for k in STEP_REQUIRED if k not in row]
        if missing:
            raise ValueError(f"step row lacks required keys {missing}")
        self._steps.append(row)

    def log_eval(self, row: dict) -> None:
        missing = [k for k in EVAL_REQUIRED if k not in row]
        if missing:
            raise ValueError(f"eval row lacks required keys {missing}")
        self._evals.append(row)

    def log_converted(self, steps: list[dict], evals: list[dict]) -> None:
        """Rows converted from another framework's log (a followed command), which carry
        the keys that framework measured and leave out the rest, as `rlbatch ingest` does."""
        if steps:
            self._steps.append(*steps)
        if evals:
            self._evals.append(*evals)

    def close(self) -> None:
        self._steps.close()
        self._evals.close()

    def __enter__(self) -> RunWriter:  # noqa: PYI034  (a final class; no Self needed)
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def truncate_jsonl_after_step(path: Path, last_step: int) -> None:
    """Drop rows with step > last_step and any cut last line (used when resuming). When the
    rows kept are the file's first lines (always, for files this package appends), the file
    is cut in place, which needs no free space; otherwise it is rewritten atomically."""
    path = Path(path)
    if not path.exists():
        return
    rows, _ = read_jsonl(path)
    keep = [int(r.get("step", 0)) <= last_step for r in rows]
    data, end, n = _read_bytes(path), 0, sum(keep)
    for raw in data.split(b"\n"):  # the byte offset after the n-th non-blank line
        if not n:
            break
        end += len(raw) + 1
        n -= bool(raw.strip())
    if all(keep[:sum(keep)]) and end <= len(data):  # the rows kept are the file's first lines
        with writing(path):
            os.truncate(path, end)  # in place: needs no free space
        return
    atomic_write_text(path, "".join(dumps_strict(r) + "\n" for r, k in zip(rows, keep) if k))


def _read_bytes(path: Path) -> bytes:
    """A log file's bytes; a folder in its place or an unreadable file: DataError naming it."""
    if path.is_dir():
        raise DataError("is a folder, not a file", where=str(path))
    try:
        return path.read_bytes()
    except OSError as exc:
        raise DataError(f"cannot be read ({exc.strerror or exc})", where=str(path)) from None


def read_jsonl(path: Path) -> tuple[list[dict], list[str]]:
    """Rows of a JSONL file and warnings. A cut *last* line is reported, not fatal; a bad
    line elsewhere is a DataError naming the file and line."""
    path = Path(path)
    rows, warnings = [], []
    if not path.exists():
        return rows, warnings
    lines = _read_bytes(path).split(b"\n")
    if complete_tail := lines[-1] == b"":
        lines.pop()
    for i, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
            if not isinstance(obj, dict):
                raise TypeError("a row must be a JSON object")
        except (ValueError, TypeError, UnicodeDecodeError, RecursionError) as exc:
            if i == len(lines) and not complete_tail:
                warnings.append(f"{path}:{i}: last line is truncated (killed mid-write); ignored")
                break
            raise DataError(f"invalid JSON row ({exc})", where=f"{path}:{i}")
        rows.append(obj)
    return rows, warnings


def last_jsonl_row(path: Path, tail_bytes: int = 65536) -> dict | None:
    """The last complete row of a JSONL file, read from its end (a cut last line is passed
    over, as `read_jsonl` ignores it); None when the file is absent or has none. What a
    watcher polling a growing log needs, without reading all of it each time."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - tail_bytes))
            chunk = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        rows = read_jsonl(path)[0]  # names the file in its DataError
        return rows[-1] if rows else None
    lines = chunk.split(b"\n")
    whole = size <= tail_bytes
    for raw in reversed(lines if whole else lines[1:]):  # the first piece may be cut
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            continue
        if isinstance(obj, dict):
            return obj
    if whole:
        return None
    rows = read_jsonl(path)[0]
    return rows[-1] if rows else None


@dataclass
class Run:
    dir: Path
    config: dict
    manifest: dict
    steps: list[dict]
    evals: list[dict]
    summary: dict
    warnings: list[str] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return self.manifest.get("run_id") or self.dir.name

    @property
    def seed(self) -> int | None:
        seed = self.manifest.get("seed", self.config.get("seed"))
        return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


# Run statuses (docs/metrics.md): `running`, then one of FINISHED or `failed`. `diverged`
# means the run produced non-finite values (nonfinite.max_consecutive skipped updates in a
# row); `stopped` means a stop was requested through the STOP file (its code in
# `stop_code`). Ended for good: re-running skips these. A `failed` run ended but can be
# resumed.
FINISHED = ("target_reached", "budget_exhausted", "stopped", "diverged")
STOP_FILE = "STOP"  # in a run directory: its text is "<code>: <detail>"; checked after every step


def ended_for_good(run_dir: Path, status: str | None) -> bool:
    """A run with this status is over and is not run again, except a `stopped` one whose
    STOP file was removed: that one is being continued (a probe being extended)."""
    return status in FINISHED and not (status == "stopped"
                                       and not (Path(run_dir) / STOP_FILE).exists())


def read_json(path: Path) -> dict:
    """A JSON object file of a run directory; {} when it does not exist, a DataError naming
    the file when it is not a JSON object."""
    if not path.exists():
        return {}
    try:
        obj = json.loads(_read_bytes(path))
    except (ValueError, RecursionError) as exc:
        raise DataError(f"invalid JSON ({exc})", where=str(path)) from None
    if not isinstance(obj, dict):
        raise DataError("expected a JSON object", where=str(path))
    return obj


def is_run_dir(path: str | Path) -> bool:
    return (Path(path) / "steps.jsonl").exists() or (Path(path) / "evals.jsonl").exists()


def read_run(run_dir: str | Path) -> Run:
    d = Path(run_dir)
    if not d.is_dir():
        raise DataError(missing(d, "run directory"), where=str(d))
    if not is_run_dir(d):
        raise DataError("not a run directory (no steps.jsonl or evals.jsonl)", where=str(d))
    config: dict = {}
    cfg_path = d / "config.yaml"
    if cfg_path.exists():
        try:
            config = yaml_data(_read_bytes(cfg_path).decode("utf-8", "replace")) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f":{mark.line + 1}" if mark else ""
            raise DataError("invalid YAML", where=f"{cfg_path}{line}") from None
        if not isinstance(config, dict) or not all(isinstance(k, str) for k in config):
            raise DataError("expected a mapping with text keys", where=str(cfg_path))
    steps, w1 = read_jsonl(d / "steps.jsonl")
    evals, w2 = read_jsonl(d / "evals.jsonl")
    return Run(dir=d, config=config, manifest=read_json(d / "manifest.json"), steps=steps,
               evals=evals, summary=read_json(d / "summary.json"), warnings=w1 + w2)


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run directories given directly or found one or two levels below a sweep directory."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise DataError(missing(p, "path"), where=str(p))
        if is_run_dir(p):
            found.append(p)
            continue
        for child in sorted(p.glob("*")) + sorted(p.glob("*/*")):
            if child.is_dir() and is_run_dir(child):
                found.append(child)
    return found
