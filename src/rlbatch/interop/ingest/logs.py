"""Pieces shared by the framework modules of `rlbatch ingest`: the log side (each module's
`convert`; the config side is `ingest.common`).

- Readers of logged records: JSON lines with file:line errors, one line at a time
  (`RecordReader`; `read_records` for the whole file at once), TensorBoard
  event files (`read_tensorboard`, `tb_step_records`; needs the optional `tensorboard`
  package from the `trackers` extra, imported lazily).
- Row helpers: merging the several records a framework logs for one step
  (`consecutive_steps`, streaming; `merge_steps`, a list with restarts applied),
  picking the first present source key (`first`, `map_metrics`), keeping the other numeric
  values (`extras`), numeric checks (`is_number`, `num`).

Deviation from a plain JSON-lines reader (`core.runlog.read_jsonl`): records keep their line
numbers so that an unusable record (not an object, no step) is reported as `file:line`, and
a logged value that is not a number (a string, true/false, a list, an object inside the
metrics), which the converters leave out, is warned once per key and file with the first
`file:line`, the value and the count (`RecordReader.warnings`), instead of vanishing.
No torch import: ingest runs where the framework's own stack is not installed.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlbatch.core.errors import DataError, missing


# ---------------------------------------------------------------- JSON lines
class RecordReader:
    """JSON-lines records of one file, read one line at a time (memory stays flat in the
    file's size): iterate it for (line number, object) of every non-blank line. An
    unreadable line is a DataError naming `file:line`, except a last line cut mid-write
    (no newline after it), which ends the file: `truncated` is set and a warning says so.
    After the iteration, `warnings` also holds the non-number warnings (below)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise DataError(missing(self.path), where=str(self.path))
        self.truncated = False
        self._warnings: list[str] = []
        self._first: dict[str, tuple[int, Any]] = {}
        self._counts: dict[str, int] = {}

    def __iter__(self):
        with open(self.path, "rb") as fh:
            for i, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except (ValueError, UnicodeDecodeError, RecursionError) as exc:
                    if not line.endswith(b"\n"):
                        self._warnings.append(f"{self.path}:{i}: last line is truncated (cut "
                                              f"mid-write); ignored")
                        self.truncated = True
                        return
                    obj = _after_cut(line)
                    if obj is None:
                        raise DataError(f"invalid JSON ({exc.__class__.__name__})",
                                        where=f"{self.path}:{i}") from None
                    self._warnings.append(f"{self.path}:{i}: a line cut mid-write (a killed "
                                          "writer) runs into the next writer's line; the cut "
                                          "part ignored")
                if not isinstance(obj, dict):
                    raise DataError("expected a JSON object", where=f"{self.path}:{i}")
                self._note_values(i, obj)
                yield i, obj

    def _note_values(self, line: int, obj: dict) -> None:
        """Keys are the record's own, and those of an object one level down (verl's
        `data`); `step` is left to the converters, which reject a bad one."""
        for key, value in obj.items():
            if key == "step":
                continue
            if isinstance(value, dict):
                for inner, v in value.items():
                    self._note(str(inner), v, line)
            else:
                self._note(key, value, line)

    def _note(self, key: str, value: Any, line: int) -> None:
        if value is None or is_number(value):
            return
        self._first.setdefault(key, (line, value))
        self._counts[key] = self._counts.get(key, 0) + 1

    @property
    def warnings(self) -> list[str]:
        """The truncation warning, then one per key whose logged values include some that
        are not numbers (nor null), with the first `file:line`, the value and the count."""
        out = list(self._warnings)
        for key, (line, value) in self._first.items():
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
            out.append(f"{self.path}:{line}: '{key}' is {shown}, not a number; "
                       f"{self._counts[key]} such value(s) of '{key}' in this file not ingested")
        return out


def _after_cut(line: bytes) -> dict | None:
    """The record that follows a line cut mid-write on the same line: a writer killed
    mid-line leaves no newline, and the next writer to append to the file (a resumed
    attempt, prime-rl's other process) starts its line right after the cut. The object
    starting at the first `{"` past the start that parses as a whole to the end, or None."""
    start = line.find(b'{"', 1)
    while start != -1:
        try:
            obj = json.loads(line[start:])
        except (ValueError, UnicodeDecodeError, RecursionError):
            start = line.find(b'{"', start + 1)
            continue
        return obj if isinstance(obj, dict) else None
    return None


def read_records(path: Path) -> tuple[list[tuple[int, dict]], list[str], bool]:
    """Every record of a file at once (`RecordReader`): (records, warnings, truncated)."""
    reader = RecordReader(path)
    records = list(reader)
    return records, reader.warnings, reader.truncated


def consecutive_steps(items):
    """(step, data) records -> one (step, data) per run of consecutive records of the same
    step, merged (later keys win): frameworks log several dicts per step. Streams; a lower
    step is passed on as it comes (a restart: `merge_steps`, `ordered`)."""
    for _, step, data in merged_lines((None, s, d) for s, d in items):
        yield step, data


# ---------------------------------------------------------------- the ordering rule
def going_back(step: int, last: int, following: int | None) -> str | None:
    """The one ordering rule of every converter (docs/design.md, "The ordering rule"), for a
    record of a strictly ordered writer (a training step's line; never an evaluation-only
    one, which only adds or replaces that evaluation) whose `step` is at or below the last
    step that writer logged (`last`), given the step of that writer's next record
    (`following`; None while none is written yet):

    - 'restart': the writer continues from there (its next step at most `step` + 1): a
      restart from a checkpoint, whose rows replace those from `step` on;
    - 'stray': the writer jumps back past it: a single line that went back (another
      writer's, a replayed buffer), which no restart explains;
    - None: not known yet; the record and what follows it wait until the log goes on."""
    if following is None:
        return None
    return "restart" if following <= step + 1 else "stray"


def stray_line(step: int, last: int, following: int, where: str) -> DataError:
    return DataError(f"a line for step {step} after step {last}, then step {following}: a "
                     "single line that goes back, not a restart (a restart continues from the "
                     "step it goes back to); the rows before it are kept", where=where)


def past_budget(step: int, max_step: int | None, where: str) -> None:
    """A DataError for a step beyond the run's length (`max_step` steps, one more allowed
    for a framework's closing line): a log that jumps forward past the budget holds lines
    the trial did not run (a writer outside it), and its counters would be the last row's."""
    if max_step is not None and step > max_step + 1:
        raise DataError(f"step {step} is past the run's length ({max_step} steps of its "
                        "budget.max_samples): a line the trial did not write; the rows "
                        "before it are kept", where=where)


def ordered(records, where: str, eval_only, max_step: int | None = None):
    """Merged (line, step, data) records of one strictly ordered writer -> (kind, record)
    under `going_back`: 'step' for a record to take as it comes, 'restart' for the first
    record of a restart (the rows from its step on are replaced), 'eval' for an
    evaluation-only record of an earlier step (`eval_only(data)`), 'held' for a record
    that goes back with nothing written after it yet (the converter stops there). A stray
    line, or a step past `max_step` (`past_budget`), is a DataError naming `where:line`."""
    it = iter(records)
    ahead: list = []
    last = None
    while True:
        rec = ahead.pop(0) if ahead else next(it, None)
        if rec is None:
            return
        line, step, data = rec
        if last is None or step > last:
            past_budget(step, max_step, f"{where}:{line}")
            last = step
            yield "step", rec
            continue
        if eval_only(data):
            yield "eval", rec
            continue
        following = next((r for r in ahead if not eval_only(r[2])), None)
        while following is None and (nxt := next(it, None)) is not None:
            ahead.append(nxt)
            following = nxt if not eval_only(nxt[2]) else None
        verdict = going_back(step, last, None if following is None else following[1])
        if verdict is None:
            yield "held", rec
            return
        if verdict == "stray":
            raise stray_line(step, last, following[1], f"{where}:{line}")
        last = step
        yield "restart", rec


def merged_lines(items):
    """(line, step, data) records -> one (first line, step, data) per run of consecutive
    records of the same step, merged (later keys win), as `consecutive_steps`."""
    pending = None
    for line, step, data in items:
        if pending is not None and step == pending[1]:
            pending[2].update(data)
            continue
        if pending is not None:
            yield pending
        pending = (line, step, dict(data))
    if pending is not None:
        yield pending


def merge_steps(items: list[tuple[int, dict]], where: str) -> tuple[list[tuple[int, dict]],
                                                                     list[str]]:
    """Records keyed by step -> one dict per step, in order.

    Consecutive records of the same step are merged (later keys win): frameworks log several
    dicts per step. A step lower than the previous one is a restart from a checkpoint: the
    rows it re-logs replace the earlier ones from that step on (warned).
    """
    out: list[tuple[int, dict]] = []
    warnings: list[str] = []
    for step, data in consecutive_steps(items):
        if out and step < out[-1][0]:
            dropped = sum(1 for s, _ in out if s >= step)
            out = [(s, d) for s, d in out if s < step]
            warnings.append(f"{where}: step {step} logged again (restart); {dropped} earlier "
                            f"row(s) from step {step} on replaced")
        out.append((step, data))
    return out, warnings


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def num(v: Any) -> float | None:
    """A finite number (ints stay ints), else None (NaN/inf are stored as null)."""
    if not is_number(v):
        return None
    if isinstance(v, int):
        return v
    f = float(v)
    return f if math.isfinite(f) else None


def first(data: dict, keys: tuple) -> tuple[str | None, Any]:
    """The first of `keys` present in `data` with a numeric value (or null)."""
    for k in keys:
        if k in data and (data[k] is None or is_number(data[k])):
            return k, data[k]
    return None, None


def map_metrics(data: dict, mapping: dict[str, tuple], used: set) -> dict:
    """rlbatch key -> value of the first present source key; source keys used are recorded."""
    row = {}
    for target, sources in mapping.items():
        key, value = first(data, sources)
        if key is not None:
            row[target] = num(value)
            used.add(key)
    return row


def extras(data: dict, used: set, prefix: str) -> dict:
    """Every other numeric value, kept under `<prefix>/<original key>` (names are only ever
    added, never renamed)."""
    return {f"{prefix}/{k}": num(v) for k, v in data.items()
            if k not in used and (is_number(v) or v is None)}


# ---------------------------------------------------------------- TensorBoard
@dataclass
class TBScalars:
    """Scalars of one TensorBoard run: tag -> {step: (wall_time, value)}; `origin` is the
    earliest event wall time (the writer's file_version record, written when it opened)."""

    scalars: dict
    origin: float
    files: list
    warnings: list
    truncated: bool


class _TruncationLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Truncated record"):
            self.messages.append(record.getMessage())


def event_files(path: Path) -> list[Path]:
    path = Path(path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise DataError(missing(path, "path"), where=str(path))
    files = sorted(p for p in path.rglob("events.out.tfevents.*") if p.is_file())
    if not files:
        raise DataError("no TensorBoard event files (events.out.tfevents.*) found", where=str(path))
    return files


def read_tensorboard(path: Path) -> TBScalars:
    """Scalar events of every event file under `path` (later wall time wins per tag/step).

    A record cut mid-write (or failing its checksum) ends the file: reported, not fatal —
    TensorBoard's own loader stops there silently; we catch its log message to say so.
    """
    try:
        from google.protobuf.message import DecodeError
        from tensorboard.backend.event_processing import event_file_loader
        from tensorboard.util import tensor_util
    except ImportError:
        raise DataError("reading TensorBoard event files needs the 'tensorboard' package: "
                        "pip install 'rlbatch[trackers]'", where=str(path)) from None
    files = event_files(path)
    scalars: dict[str, dict[int, tuple[float, float]]] = {}
    origin = math.inf
    warnings: list[str] = []
    for f in files:
        catcher = _TruncationLog()
        log = getattr(event_file_loader, "logger", logging.getLogger("tensorboard"))
        old_level = log.level
        log.addHandler(catcher)
        log.setLevel(logging.DEBUG)
        try:
            for ev in event_file_loader.LegacyEventFileLoader(str(f)).Load():
                origin = min(origin, ev.wall_time)
                for v in ev.summary.value:
                    value = _scalar(v, tensor_util)
                    if value is None:
                        continue
                    old = scalars.setdefault(v.tag, {}).get(ev.step)
                    if old is None or ev.wall_time >= old[0]:
                        scalars[v.tag][ev.step] = (ev.wall_time, value)
        except (OSError, DecodeError) as exc:
            raise DataError(f"cannot read TensorBoard events ({exc.__class__.__name__}: {exc})",
                            where=str(f)) from None
        finally:
            log.removeHandler(catcher)
            log.setLevel(old_level)
        if catcher.messages:
            warnings.append(f"{f}: ends in a truncated or corrupt record (cut mid-write); "
                            f"events after it ignored")
    if not scalars:
        raise DataError("no scalar events in the TensorBoard files", where=str(path))
    return TBScalars(scalars, origin, files, warnings, bool(warnings))


def _scalar(v, tensor_util) -> float | None:
    if v.HasField("simple_value"):
        # stored as float32: decode to the shortest decimal that round-trips (1e-06, not
        # 9.999999974752427e-07)
        return float(str(np.float32(v.simple_value)))
    if v.HasField("tensor"):
        arr = tensor_util.make_ndarray(v.tensor)
        if arr.size == 1 and arr.dtype.kind in "fiu":
            return float(arr.reshape(-1)[0])
    return None


def tb_step_records(tb: TBScalars, prefix_map: dict[str, str],
                    undated: tuple = ()) -> list[tuple[int, dict, float]]:
    """(step, {key: value}, latest wall time) per step, keeping tags that start with one of
    `prefix_map`'s prefixes (renamed to its value: 'train/' -> '' strips the prefix). Tags in
    `undated` give their value but not their wall time (one logged later beside something
    else: transformers writes `train/epoch` with every evaluation's metrics too)."""
    by_step: dict[int, tuple[dict, float]] = {}
    for tag, series in tb.scalars.items():
        for prefix, repl in prefix_map.items():
            if tag.startswith(prefix):
                key = repl + tag[len(prefix):]
                break
        else:
            continue
        for step, (wall, value) in series.items():
            data, last = by_step.setdefault(step, ({}, -math.inf))
            data[key] = value
            by_step[step] = (data, last if tag in undated else max(last, wall))
    return [(s, d, w) for s, (d, w) in sorted(by_step.items())]
