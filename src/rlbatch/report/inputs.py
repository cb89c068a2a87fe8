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
  the paths that exist; missing runs only omit the figures that need their logs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlbatch.analysis.analyze import analyze_frames, config_target
from rlbatch.analysis.crossing import Target, parse_target
from rlbatch.analysis.runs import RunFrames, load_runs
from rlbatch.core.errors import DataError, UserError
from rlbatch.core.runlog import is_run_dir


@dataclass
class ReportInputs:
    doc: dict                 # the analysis document (docs/analysis.md)
    frames: RunFrames | None  # run logs (None when none of the runs can be found)
    profile: dict | None      # profile.json, when a profile directory was given


def read_profile(path: Path) -> dict:
    try:
        doc = json.loads((path / "profile.json").read_text())
    except ValueError as exc:
        raise DataError(f"invalid JSON ({exc})", where=str(path / "profile.json")) from None
    if not isinstance(doc, dict):
        raise DataError("expected a JSON object", where=str(path / "profile.json"))
    return doc


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
            raise DataError("path not found", where=str(p))
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
