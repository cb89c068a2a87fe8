"""Following a command's log: the trial's run-log rows, from the framework's log as it is
written so far, across every attempt (a resumed command is a new attempt).

Each read converts every attempt's log with `rlbatch ingest`'s converter (the same rows
`rlbatch ingest` would write for it), and does so only when a file under the logs changed
(size or modification time). The attempts are then joined: an attempt that continued from a
checkpoint at rollout step c keeps the earlier attempts' rows up to step c and replaces the
rest with its own, and its training seconds continue from the earlier rows' `train_s` at
step c (a converter counts seconds from the start of the log it reads). An attempt whose
checkpoint step is not known from outside is cut where its own rows start. A log shared by
every attempt (a framework that resumes into its own log: `rlbatch train`) is read once, as
it stands. Rows once read are kept: when an attempt's own log is rotated or truncated (its rows
now start later, or fewer are left), the rows read before are kept up to where the new
ones start, the new ones' clock continues from them, and a warning says so
(`continue_rows`). An attempt that has ended keeps its rows in its folder (`freeze`): a
re-run reads those, not its log again. docs/integrations.md, "Following a command".
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from dataclasses import dataclass, is_dataclass, replace
from pathlib import Path

from rlbatch.core.errors import ConfigError, DataError
from rlbatch.core.runlog import atomic_write_json, read_json, read_jsonl

# what `train_s` of each framework's rows is measured by
TRAIN_S_SOURCE = {
    "trl": "TensorBoard event wall time since the attempt's writer opened (transformers "
           "opens it when training begins), less TRL's eval/runtime; checkpoint saves "
           "included",
    "verl": "the cumulative sum of verl's own timing_s/step, less timing_s/save_checkpoint "
            "(timed inside it)",
    "openrlhf": "the cumulative sum of OpenRLHF's timing/step_total (start-up, checkpoint "
                "saves and evaluations left out); in logs without it, TensorBoard event wall "
                "time since the attempt's writer opened, less evaluation time",
    "prime-rl": "the time of each step's trainer line less its checkpoint saves, since the "
                "start of the attempt's first step (the time between attempts left out)",
    "rlbatch": "the run's own train_s (rlbatch train's phase timers)",
}
# what a converter says when a log has nothing in it yet (a command still starting)
_NOTHING_YET = ("not found", "no TensorBoard event files", "no scalar events",
                "no training steps or evaluations", "no step records")


@dataclass(frozen=True)
class Attempt:
    """One start of the command: its number, its log, whether that log is shared with the
    other attempts, and the rollout step of the checkpoint it continued from (-1: a fresh
    start, which replaces every earlier row; None: not known)."""

    number: int
    log: Path
    shared: bool
    resume_step: int | None
    rows_file: Path | None = None  # its rows, kept once it ended (`Follower.freeze`)


def signature(paths: list[Path]) -> tuple:
    """(path, size, mtime) of every file under `paths`: changes when a log grows."""
    out = []
    for root in paths:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file()) \
            if root.is_dir() else []
        for f in files:
            try:
                st = f.stat()
            except OSError:
                continue
            out.append((str(f), st.st_size, st.st_mtime_ns))
    return tuple(out)


def _nothing_yet(exc: Exception) -> bool:
    return any(s in str(exc) for s in _NOTHING_YET)


def _rlbatch_rows(root: Path) -> tuple[list, list, list]:
    """The rows of the run `rlbatch train` writes below `root` (exactly one run folder)."""
    runs = sorted(p for p in root.glob("*") if (p / "config.yaml").is_file()) \
        if root.is_dir() else []
    if not runs:
        return [], [], []
    if len(runs) > 1:
        raise DataError(f"expected one run folder, found {len(runs)}", where=str(root))
    steps, w1 = read_jsonl(runs[0] / "steps.jsonl")
    evals, w2 = read_jsonl(runs[0] / "evals.jsonl")
    return steps, evals, w1 + w2


class Follower:
    """The run-log rows of a command's attempts so far (`read`), converted again only when
    a log changed."""

    def __init__(self, framework: str, options):
        self.framework = framework
        self.options = replace(options, live=True) if is_dataclass(options) else options
        self._sig: tuple | None = None
        self._rows: tuple[list, list] = ([], [])
        self._seen: dict[Path, tuple[list, list]] = {}  # each log's rows as last read
        self.warnings: list[str] = []
        self.conversions = 0  # reads that converted (a log had changed)
        self.cpu_s = 0.0  # CPU seconds of every read, in all
        self.last_cost_s = 0.0  # CPU seconds of the last read
        self.restarts: list[tuple[int, int, int]] = []  # (attempt, its checkpoint, 1st step)
        self.non_numbers: dict[str, str] = {}  # evaluation key -> where it is not a number

    def read(self, attempts: list[Attempt]) -> tuple[list, list, bool]:
        """(step rows, evaluation rows, whether anything changed since the last read)."""
        t0 = time.process_time()
        try:
            return self._read(attempts)
        finally:
            self.last_cost_s = time.process_time() - t0
            self.cpu_s += self.last_cost_s

    def _read(self, attempts: list[Attempt]) -> tuple[list, list, bool]:
        sig = (tuple(a.number for a in attempts), signature(sorted({a.log for a in attempts})))
        if sig == self._sig:
            return *self._rows, False
        self._sig = sig
        self.conversions += 1
        steps, evals = [], []
        shared_done = False
        for a in attempts:
            if a.shared:
                if not shared_done:  # the framework resumes into this one log itself (and
                    # cuts it back to its checkpoint: a shorter log is not a fault there)
                    steps, evals = self._convert_as_it_stands(a.log)
                    shared_done = True
                continue
            new_steps, new_evals = self._frozen(a) or self._convert(a.log)
            resume = a.resume_step
            if resume is not None and resume >= 0 and new_steps \
                    and not restarted(new_steps, resume) and _last_step(steps) < resume:
                steps, evals = self._reach(attempts[:attempts.index(a)], a)
            if restarted(new_steps, resume):
                resume = -1  # its rows replace every earlier row: never spliced
                note = (f"attempt {a.number} was given the checkpoint at step {a.resume_step} "
                        f"but logged step {new_steps[0]['step']} again: it started over, so "
                        "the run's rows are its own from its first step (the earlier "
                        "attempts' rows and time are not counted)")
                if note not in self.warnings:
                    self.warnings.append(note)
                    self.restarts.append((a.number, a.resume_step, new_steps[0]["step"]))
            steps, evals = join(steps, evals, new_steps, new_evals, resume)
        check_rows(steps, self._max_step(), attempts[-1].log if attempts else None)
        self._rows = (steps, evals)
        return steps, evals, True

    def _max_step(self) -> int | None:
        o = self.options
        b = None if getattr(o, "prompts_per_step", None) is None or \
            getattr(o, "samples_per_prompt", None) is None else o.prompts_per_step * o.samples_per_prompt
        m = getattr(o, "max_samples", None)
        return None if b is None or m is None else -(-m // b)

    def _reach(self, earlier: list[Attempt], a: Attempt) -> tuple[list, list]:
        """The rows of the attempts before `a` read again from their logs, up to any bad
        line in them (`convert_upto_bad_line`), when the rows kept of them end before the
        checkpoint `a` continues from: a resume must splice onto every step up to its
        checkpoint. A DataError naming the steps lost when they still do not reach it."""
        steps: list = []
        evals: list = []
        for e in earlier:
            if e.shared:
                continue
            rows = self._convert_upto_bad_line(e.log)
            if rows is None:
                rows = self._frozen(e) or ([], [])
            steps, evals = join(steps, evals, *rows, e.resume_step)
        if _last_step(steps) < a.resume_step:
            raise DataError(
                f"attempt {a.number} continues from the checkpoint at step {a.resume_step}, "
                f"but the rows of the attempts before it end at step {_last_step(steps)}: the "
                f"steps {_last_step(steps) + 1}..{a.resume_step} were never logged (or not "
                "readably); start the run over with --fresh", where=str(a.log))
        return steps, evals

    def _convert_upto_bad_line(self, log: Path) -> tuple[list, list] | None:
        """The rows of a JSON-lines log that a bad line keeps from converting: those of every
        valid line when they still run step after step (a garbled line between two steps),
        else those before the first bad line; None when nothing of it converts. Each line
        left out is warned."""
        bad: list[int] = []
        while len(bad) < BAD_LINES_SKIPPED:
            rows = self._convert_lines(log, bad)
            if not isinstance(rows, int):
                break
            bad.append(rows)
        else:
            rows = None
        if not bad:
            return rows
        if rows is None or any(b["step"] - a["step"] != 1 for a, b in
                               zip(rows[0], rows[0][1:], strict=False)):
            rows = self._convert_lines(log, bad[:1], upto=True)
            rows = None if isinstance(rows, int) else rows
        note = (f"{log}: line(s) {', '.join(map(str, bad))} cannot be read; the rows of the "
                "lines around them are kept")
        if rows is not None and note not in self.warnings:
            self.warnings.append(note)
        return rows

    def _convert_lines(self, log: Path, bad: list[int], upto: bool = False
                       ) -> tuple[list, list] | int | None:
        """The rows of `log` without its lines `bad` (`upto`: only the lines before the
        first of them): the rows, the number of a further line that a DataError names, or
        None for any other DataError."""
        if not bad:
            try:
                return self._convert_as_it_stands(log)
            except DataError as exc:
                return _bad_line(exc, log)
        with tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp) / log.name
            with open(log, "rb") as src, open(copy, "wb") as dst:
                for i, line in enumerate(src, start=1):
                    if upto and i >= bad[0]:
                        break
                    dst.write(b"\n" if i in bad else line)  # line numbers kept
            try:
                return self._convert_as_it_stands(copy)
            except DataError as exc:
                return _bad_line(exc, copy)

    def reached(self, attempts: list[Attempt]) -> int | None:
        """The last step the rows of `attempts` (ended ones) hold (0: none), None when there
        are no such attempts or their rows cannot be read: where the next attempt may resume
        at the latest."""
        if not attempts or any(a.shared for a in attempts):
            return None
        try:
            steps = self.read(attempts)[0]
        except DataError:
            return None
        return _last_step(steps)

    def vanished(self, attempts: list[Attempt]) -> str | None:
        """Why the run must fail when the log of the running attempt, from which rows were
        read, no longer exists (deleted, not rotated: a rotation leaves a new file), else
        None. Its rows stay kept for a resume."""
        if not attempts:
            return None
        a = attempts[-1]
        seen = self._seen.get(a.log) if not a.shared else self._rows
        if not seen or not seen[0] or a.log.exists():
            return None
        return f"deleted its log {a.log} (the rows read from it are kept)"

    def freeze(self, a: Attempt, exit_status: int | None = None) -> None:
        """Keep the rows of an attempt that has ended in its `rows_file`, read once more
        from its log, or as last read when the log no longer converts (a bad line after
        them), with the command's exit status: a later re-run joins those instead of
        converting the log again, so a log that failed its run does not fail every resume
        of it."""
        if a.shared or a.rows_file is None:
            return
        try:
            rows = self._convert(a.log)
        except DataError:
            rows = self._convert_upto_bad_line(a.log)
            seen = self._seen.get(a.log)
            if rows is None or (seen is not None and _last_step(seen[0]) > _last_step(rows[0])):
                rows = seen
        if rows is not None:
            atomic_write_json(a.rows_file, {"log": str(a.log), "exit_status": exit_status,
                                            "steps": rows[0], "evals": rows[1]})

    def _frozen(self, a: Attempt) -> tuple[list, list] | None:
        if a.rows_file is None or not a.rows_file.is_file():
            return None
        doc = read_json(a.rows_file)
        return doc["steps"], doc["evals"]

    def _convert(self, log: Path) -> tuple[list, list]:
        steps, evals = self._convert_as_it_stands(log)
        before = self._seen.get(log)
        if before is not None:
            steps, evals, lost = continue_rows(*before, steps, evals)
            if lost is not None and not any(w.startswith(f"{log}: ") for w in self.warnings):
                self.warnings.append(
                    f"{log}: the log was rotated or truncated (its rows now {lost}); the rows "
                    "read before are kept and its training seconds continue from them")
        self._seen[log] = (steps, evals)
        return steps, evals

    def _convert_as_it_stands(self, log: Path) -> tuple[list, list]:
        if self.framework == "rlbatch":
            steps, evals, warnings = _rlbatch_rows(log)
        else:
            from rlbatch.interop.ingest import convert

            try:
                conv = convert(self.framework, log, self.options)
            except (ConfigError, DataError) as exc:
                if _nothing_yet(exc):
                    return [], []
                raise
            steps, evals, warnings = list(conv.steps), list(conv.evals), conv.warnings
            for key, where in conv.summary_extra.get("non_numbers", {}).items():
                self.non_numbers.setdefault(key, where)
        for w in warnings:
            if w not in self.warnings and "truncated" not in w:  # a line being written
                self.warnings.append(w)
        return steps, evals


BAD_LINES_SKIPPED = 5  # unreadable lines an ended attempt's rows are read around


def _last_step(steps: list) -> int:
    return steps[-1]["step"] if steps else 0


def _bad_line(exc: DataError, log: Path) -> int | None:
    """The line number of `log` that a converter's DataError names (`file:line`), if any."""
    where = getattr(exc, "where", None) or ""
    head, _, line = str(where).rpartition(":")
    return int(line) if head == str(log) and line.isdigit() else None


def check_rows(steps: list, max_step: int | None, log: Path | None) -> None:
    """The ordering rule's checks on the rows of every converter (docs/design.md, "The
    ordering rule"): a step past the run's length, or training seconds that go backwards
    from one step to the next, mean rows the trial did not produce (a writer outside it,
    a clock reset): a DataError naming the log and the step, so the trial fails with its
    rows kept instead of reading a wrong T."""
    from rlbatch.interop.ingest.logs import past_budget

    where = str(log) if log is not None else "the command's log"
    prev = None
    for r in steps:
        past_budget(r["step"], max_step, f"{where} (step {r['step']})")
        t = r.get("train_s")
        if t is not None and prev is not None and t < prev[1] - 1e-9:
            raise DataError(f"train_s goes back from {prev[1]:.6g} s at step {prev[0]} to "
                            f"{t:.6g} s at step {r['step']}: rows the trial's clock cannot "
                            "have given; the rows before it are kept", where=where)
        if t is not None:
            prev = (r["step"], t)


def continue_rows(steps: list, evals: list, new_steps: list, new_evals: list
                  ) -> tuple[list, list, str | None]:
    """One log's rows now (`new_*`) after its rows as last read: the new rows as they are
    when they still hold every step read before; otherwise (the log was rotated or truncated)
    the earlier rows up to where the new ones start, then the new ones, their `train_s`
    continued from the last kept row's when it restarted below it. The third item says what
    was seen (None: nothing was lost)."""
    if not steps or (new_steps and new_steps[0]["step"] <= steps[0]["step"]
                     and new_steps[-1]["step"] >= steps[-1]["step"]):
        return new_steps, new_evals, None
    if not new_steps:
        what = f"hold no step, after {len(steps)} were read"
        return steps, evals + [r for r in new_evals if r["step"] > steps[-1]["step"]], what
    first = new_steps[0]["step"]
    what = (f"start at step {first}, after steps {steps[0]['step']}..{steps[-1]['step']} "
            "were read" if first > steps[0]["step"] else
            f"end at step {new_steps[-1]['step']}, after steps up to {steps[-1]['step']} "
            "were read")
    if first <= steps[0]["step"]:  # truncated at its end: keep what was read past it
        tail = [r for r in steps if r["step"] > new_steps[-1]["step"]]
        tail_evals = [r for r in evals if r["step"] > new_steps[-1]["step"]]
        return new_steps + tail, [r for r in new_evals if r["step"] <= new_steps[-1]["step"]] \
            + tail_evals, what
    kept = [r for r in steps if r["step"] < first]
    last = kept[-1].get("train_s") if kept else None
    t0 = new_steps[0].get("train_s")
    offset = last if last is not None and t0 is not None and t0 < last else 0.0
    tokens = _token_offset(kept, new_steps)
    return (kept + [_shift(r, offset, tokens) for r in new_steps],
            [r for r in evals if r["step"] < first]
            + [_shift(r, offset, tokens) for r in new_evals], what)


def restarted(new_steps: list, resume_step: int | None) -> bool:
    """Whether an attempt given a checkpoint (resume_step >= 0) started over instead: its
    first logged step is not after the checkpoint's (it could not load it, or a wrapper
    turned resuming off). Splicing its rows after the earlier ones would mix two runs and
    count the redone steps' time twice."""
    return bool(resume_step is not None and resume_step >= 0 and new_steps
                and new_steps[0]["step"] <= resume_step)


def join(steps: list, evals: list, new_steps: list, new_evals: list,
         resume_step: int | None) -> tuple[list, list]:
    """Rows of the attempts so far followed by one more attempt's rows: the earlier rows up
    to the step it continued from (`resume_step`; -1 for a fresh start; where its own step
    rows start when not known), then its rows, their `train_s` shifted by the earlier rows'
    at that step."""
    if resume_step is None:
        if not new_steps:
            return steps, evals
        resume_step = new_steps[0]["step"] - 1
    kept = [r for r in steps if r["step"] <= resume_step]
    offset = kept[-1]["train_s"] if kept else 0.0
    later = [r for r in new_steps if r["step"] > resume_step]
    tokens = _token_offset(kept, later)
    out_steps = kept + [_shift(r, offset, tokens) for r in later]
    out_evals = [r for r in evals if r["step"] <= resume_step] + \
        [_shift(r, offset, tokens) for r in new_evals if r["step"] > resume_step]
    return out_steps, out_evals


def _token_offset(kept: list, new_steps: list) -> int | None:
    """What the new rows' cumulative `tokens` continue from: a converter counts tokens from
    the start of the log it reads, so a resumed attempt's (or a rotated log's) count starts
    again near 0. The last kept row's count where the new rows restart below it; 0 where
    nothing is kept or the new rows already continue it; None (the new rows' counts are
    dropped, not left restarting) where the kept rows have none."""
    if not kept or not new_steps or new_steps[0].get("tokens") is None:
        return 0
    last = kept[-1].get("tokens")
    if last is None:
        return None
    return last if new_steps[0]["tokens"] <= last else 0


def _shift(row: dict, offset: float, tokens: int | None = 0) -> dict:
    """`row` with `offset` added to its train_s and `tokens` to its tokens (None: its tokens
    dropped); the row itself where neither applies."""
    shift_s = bool(offset) and row.get("train_s") is not None
    shift_tokens = tokens != 0 and row.get("tokens") is not None
    if not (shift_s or shift_tokens):
        return row
    out = dict(row)
    if shift_s:
        out["train_s"] += offset
    if shift_tokens and tokens is None:
        del out["tokens"]
    elif shift_tokens:
        out["tokens"] += tokens
    return out


_ERROR_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt|Exit)\b"
                         r"(?::.*)?$")
_WRAPPERS = ("subprocess.CalledProcessError", "CalledProcessError")  # a launcher re-raising


def output_tail(path: Path, limit: int = 600) -> str:
    """What a failed command said, in one line: the last exception line of its output that
    is not a launcher's (`accelerate launch`, `torchrun` re-raise a child's failure as
    CalledProcessError), else its last non-blank line (sanitized by the error quoting it)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - 256 * 1024))
            text = fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    # progress bars redraw with \r: keep what each line ended as
    lines = [x for x in (y.rsplit("\r", 1)[-1].strip() for y in text.splitlines()) if x]
    errors = [x for x in lines if _ERROR_LINE.match(x) and not x.startswith(_WRAPPERS)]
    said = errors[-1] if errors else (lines[-1] if lines else "")
    return said if len(said) <= limit else said[:limit - 3] + "..."
