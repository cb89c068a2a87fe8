"""What a report is made from: one profile directory (its profile.json: analysis, decision,
decode sweep, trials, cost) and/or run and sweep directories (analysed here with
`rlbatch.analysis.analyze`). Reads files and calls the analysis; computes nothing itself.

Rules:
- a directory holding profile.json is a profile; at most one may be given;
- a profile alone, without --target/--reference, is reported from its stored analysis;
- otherwise `analyze` runs over every run directory (a profile contributes its runs/), with
  --target, else the profile's target, else the runs' single config target;
- run paths recorded in profile.json that no longer exist are looked up under the profile's
  runs/ folder (a moved profile directory still reports), and the frames are loaded from
  the paths that exist; missing runs only omit the figures that need their logs;
- profile.json is checked against the shape `rlbatch profile` writes (`PROFILE`: the type of
  every key the report reads, which keys must be present) before anything reads it, so a
  hand-edited or foreign file (a `decision` that is a string, a list at the top level, a
  sweep row without `concurrency`) is one line naming the file and the key.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rlbatch.analysis.analyze import analyze_frames, config_target
from rlbatch.analysis.crossing import Target, parse_target
from rlbatch.analysis.runs import RunFrames, load_runs
from rlbatch.core.errors import DataError, UserError, missing
from rlbatch.core.runlog import is_run_dir


@dataclass
class ReportInputs:
    doc: dict                 # the analysis document (docs/analysis.md)
    frames: RunFrames | None  # run logs (None when none of the runs can be found)
    profile: dict | None      # profile.json, when a profile directory was given


@dataclass(frozen=True)
class Shape:
    """What one JSON value must be: its allowed types; for an object, the shapes of its keys
    (and which are required); for a list, the shape of every item."""

    types: tuple
    required: bool = False
    keys: dict = field(default_factory=dict)
    items: Shape | None = None


_NUM, _NULL = (int, float), (type(None),)
_OPT_NUM, _OPT_INT, _OPT_STR = Shape(_NUM + _NULL), Shape((int,) + _NULL), Shape((str,) + _NULL)
# present in every document `rlbatch analyze` writes (the report indexes them), maybe null
_NUM_KEY, _INT_KEY, _STR_KEY = (Shape(_NUM + _NULL, True), Shape((int,) + _NULL, True),
                                Shape((str,) + _NULL, True))
_REQ_STR, _REQ_BOOL = Shape((str,), True), Shape((bool,), True)
_INTERVAL = Shape((list,) + _NULL, True, items=Shape(_NUM + _NULL))
_RUN = Shape((dict,), True, {"run": _REQ_STR, "run_id": _REQ_STR, "seed": _INT_KEY,
                             "samples_to_target": _NUM_KEY, "time_to_target": _NUM_KEY,
                             "censored": _REQ_BOOL, "last_samples": _NUM_KEY,
                             "throughput": _NUM_KEY})
_CONFIG = Shape((dict,), True, {
    "config": _REQ_STR, "sequences_per_step": _INT_KEY, "prompts_per_step": _INT_KEY,
    "samples_per_prompt": _INT_KEY, "lr": _NUM_KEY, "lr_scaling": _STR_KEY,
    "algorithm": _STR_KEY, "verdict": _STR_KEY, "time_to_target": _NUM_KEY,
    "time_to_target_ci": _INTERVAL, "runs": Shape((list,), True, items=_RUN)})
_TARGET = {"metric": _REQ_STR, "value": _OPT_NUM, "gain": _OPT_NUM}
ANALYSIS = Shape((dict,) + _NULL, keys={
    "target": Shape((dict,), True, _TARGET),
    "reference": Shape((dict,), True, {"config": _STR_KEY}),
    "settings": Shape((dict,), True, {"ci": Shape(_NUM, True)}),
    "configs": Shape((list,), True, items=_CONFIG),
    "recommendation": Shape((dict,) + _NULL, keys={
        "config": _REQ_STR, "is_reference": _REQ_BOOL, "time_to_target": _NUM_KEY,
        "time_to_target_ci": _INTERVAL, "p_faster_than_reference": _NUM_KEY,
        "speedup_vs_reference": _NUM_KEY})})
_SWEEP_ROW = Shape((dict,), True, {"concurrency": Shape(_NUM, True),
                                   "tokens_per_s": Shape(_NUM, True),
                                   "achieved_flops": _OPT_NUM, "roofline_bound_flops": _OPT_NUM})
PROFILE = Shape((dict,), True, {
    "config": _OPT_STR, "problem": _OPT_STR,
    "target": Shape((dict,) + _NULL, keys=_TARGET),
    "decision": Shape((dict,) + _NULL, keys={
        "config": _OPT_STR, "prompts_per_step": _OPT_INT, "samples_per_prompt": _OPT_INT,
        "sequences_per_step": _OPT_INT, "lr": _OPT_NUM, "generation_concurrency": _OPT_INT}),
    "decode": Shape((dict,) + _NULL, keys={
        "chosen": _OPT_INT,
        "sweep": Shape((dict,) + _NULL, keys={"rows": Shape((list,) + _NULL, items=_SWEEP_ROW),
                                             "max_concurrency_in_budget": _OPT_NUM,
                                             "plateau_concurrency": _OPT_NUM})}),
    "trials": Shape((list,) + _NULL, items=Shape((dict,), True, {"run_dir": _REQ_STR})),
    "cost": Shape((dict,) + _NULL, keys={k: _OPT_NUM for k in (
        "total_s", "trial_train_s", "decode_sweep_s", "multiple_of_baseline_time_to_target")}),
    "analysis": ANALYSIS})
_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer",
               float: "a number", bool: "true or false", type(None): "null"}


def _kind(value) -> str:
    return _TYPE_NAMES.get(type(value), type(value).__name__)


def check_shape(value, shape: Shape, key: str, where: str) -> None:
    """A DataError naming `where` and the dotted key of the first value that breaks `shape`
    (a bool is not a number here, an int is accepted where a float is)."""
    ok = isinstance(value, shape.types) and not (isinstance(value, bool)
                                                 and bool not in shape.types)
    if not ok:
        names = [_TYPE_NAMES[t] for t in shape.types if not (t is int and float in shape.types)]
        allowed = " or ".join(names)
        raise DataError(f"'{key}' must be {allowed}, not {_kind(value)}", where=where)
    if isinstance(value, dict):
        for name, sub in shape.keys.items():
            if name in value:
                check_shape(value[name], sub, f"{key}.{name}" if key else name, where)
            elif sub.required:
                raise DataError(f"'{key}.{name}' is missing" if key else f"'{name}' is missing",
                                where=where)
    if isinstance(value, list) and shape.items is not None:
        for i, item in enumerate(value):
            check_shape(item, shape.items, f"{key}[{i}]", where)


def read_profile(path: Path) -> dict:
    """profile.json of a profile directory, checked against `PROFILE`."""
    where = str(path / "profile.json")
    try:
        doc = json.loads((path / "profile.json").read_bytes())
    except ValueError as exc:  # UnicodeDecodeError included
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"invalid JSON ({first})", where=where) from None
    except OSError as exc:
        raise DataError(f"cannot read ({exc.strerror or type(exc).__name__})",
                        where=where) from None
    if not isinstance(doc, dict):
        raise DataError(f"expected a JSON object, got {_kind(doc)}", where=where)
    check_shape(doc, PROFILE, "", where)
    analysis = doc.get("analysis")
    if analysis:  # the configs the reference and the recommendation name must be there
        ids = {e["config"] for e in analysis["configs"]}
        for key in ("reference", "recommendation"):
            named = (analysis.get(key) or {}).get("config")
            if named is not None and named not in ids:
                raise DataError(f"'analysis.{key}.config' names '{named}', which is not in "
                                "'analysis.configs'", where=where)
    return doc


_PREDICTION = Shape((dict,), True, {k: _OPT_NUM for k in (
    "time_to_target", "time_ratio", "sequences_per_step", "lr", "samples")} | {
    k: Shape((list,) + _NULL, items=Shape(_NUM + _NULL)) for k in (
        "time_to_target_ci", "time_ratio_ci")})


def read_probe_profile(path: str | Path) -> tuple[dict, str]:
    """profile.json of a probe profile (`rlbatch profile --strategy probe`) and its path:
    the `PROFILE` shape, `strategy: probe` and every prediction's keys checked."""
    path = Path(path)
    where = str(path / "profile.json")
    if not (path / "profile.json").is_file():
        raise DataError("no profile.json here (give a profile directory)", where=str(path))
    doc = read_profile(path)
    if doc.get("strategy") != "probe":
        raise DataError("not a probe profile ('strategy' is not 'probe'); profile with "
                        "`rlbatch profile --strategy probe`", where=where)
    preds = doc.get("predictions")
    check_shape(preds, Shape((dict,), True), "predictions", where)
    for name, pred in preds.items():
        check_shape(pred, _PREDICTION, f"predictions.{name}", where)
    return doc, where


def _relocate(doc: dict, profile_dir: Path) -> list[str]:
    """Point each run of the stored analysis at a folder that exists (as recorded, else
    <profile>/runs/<name>); returns the existing run folders."""
    found = []
    for e in doc.get("configs", []):
        for r in e["runs"]:
            p = Path(r["run"])
            if not is_run_dir(p):
                alt = profile_dir / "runs" / p.name
                p = alt if is_run_dir(alt) else p
            r["run"] = str(p)
            if is_run_dir(p):
                found.append(str(p))
    return found




def _split(paths: list[str]) -> tuple[Path | None, list[str]]:
    profiles = [Path(p) for p in paths if (Path(p) / "profile.json").is_file()]
    if len(profiles) > 1:
        raise UserError("give at most one profile directory (a folder holding profile.json); "
                        f"got {len(profiles)}")
    for p in paths:
        if not Path(p).exists():
            raise DataError(missing(p, "path"), where=str(p))
    return (profiles[0] if profiles else None), [p for p in paths
                                                 if not (Path(p) / "profile.json").is_file()]


def load_inputs(paths: list[str], target: str | None = None,
                reference: str | None = None) -> ReportInputs:
    """Profile and/or runs -> the analysis document, the run frames and profile.json."""
    if not paths:
        raise UserError("give one or more run, sweep or profile directories")
    profile_dir, run_paths = _split([str(p) for p in paths])
    profile = read_profile(profile_dir) if profile_dir else None
    stored = (profile or {}).get("analysis")
    if profile and stored and not run_paths and target is None and reference is None:
        found = _relocate(stored, profile_dir)
        frames = load_runs(found) if found else None
        return ReportInputs(stored, frames, profile)
    if profile_dir is not None:
        run_paths.append(str(profile_dir / "runs"))
    frames = load_runs(run_paths + ([reference] if reference is not None else []))
    if target is not None:
        tgt = parse_target(target)
    elif profile and isinstance(profile.get("target"), dict):
        t = profile["target"]
        tgt = Target(t["metric"], None if t.get("value") is None else float(t["value"]),
                     gain=None if t.get("gain") is None else float(t["gain"]))
    else:
        tgt = config_target(frames)
    doc = analyze_frames(frames, tgt, reference_run=reference)
    return ReportInputs(doc, frames, profile)
