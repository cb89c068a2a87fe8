"""Finding a run's directory across rlbatch releases.

A run id hashes the experiment's config (`runlog.identity`). A release that adds a setting,
or stops counting one as part of the experiment (the `profile` section once was), changes
the hash of every config, though a run recorded before it is the same experiment: its
config.yaml simply lacks the new setting, which the new release gives its default value.
`find_run_dir` looks for such a directory when the run's own id names none: one with the
same readable prefix (algorithm, P, G, LR, seed) whose recorded config, read with today's
identity rules, equals this run's except for settings it lacks that hold their default
now. That directory is the run's: a profile begun before an upgrade resumes instead of
starting over, and the note it returns says so. A changed value of any setting the record
has is never matched.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from rlbatch.core.runlog import identity, make_run_id

_MISSING = object()


def _default_at(path: tuple[str, ...]):
    """The current default of the setting at `path` (JSON form), or _MISSING when the path
    is not a setting with a default (a derived value, a key inside a free-form mapping)."""
    from rlbatch.core.config import Config

    model: type[BaseModel] | None = Config
    for i, key in enumerate(path):
        if model is None or key not in model.model_fields:
            return _MISSING
        field = model.model_fields[key]
        if i == len(path) - 1:
            if field.is_required():
                return _MISSING
            return to_jsonable_python(field.get_default(call_default_factory=True))
        model = next((a for a in (field.annotation, *getattr(field.annotation, "__args__", ()))
                      if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return _MISSING


def added_at_default(resolved: dict, recorded: dict) -> list[str] | None:
    """The settings (dotted) this run's config has and a recorded config lacks, each at its
    default now, when the two agree on everything else under today's identity rules; None
    when they differ otherwise (a value changed, or a setting the record has is gone)."""
    added: list[str] = []

    def walk(ours, theirs, path: tuple[str, ...]) -> bool:
        if isinstance(ours, dict) and isinstance(theirs, dict):
            if set(theirs) - set(ours):
                return False
            for k, v in ours.items():
                if k not in theirs:
                    if _default_at((*path, k)) == v and v is not _MISSING:
                        added.append(".".join((*path, k)))
                        continue
                    return False
                if not walk(v, theirs[k], (*path, k)):
                    return False
            return True
        return ours == theirs

    ours, theirs = identity(resolved), identity(recorded)
    # derived values follow from the settings compared; each one recorded must still hold
    # (a value a release derives anew is not in the record)
    d_ours, d_theirs = ours.pop("derived", None) or {}, theirs.pop("derived", None) or {}
    if any(d_ours.get(k, _MISSING) != v for k, v in d_theirs.items()):
        return None
    if not walk(ours, theirs, ()):
        return None
    return added


def find_run_dir(output_dir: str | Path, resolved: dict, seed: int) -> tuple[Path, dict | None]:
    """(the run's directory, a note when it is one an earlier release named): the directory
    of its own id when that exists or nothing else matches, else an earlier one of the same
    experiment (module text). The note: {"run_dir", "expected", "added"}."""
    run_id = make_run_id(resolved, seed)
    own = Path(output_dir) / run_id
    if own.exists():
        return own, None
    prefix = run_id.rsplit("-", 1)[0] + "-"
    root = Path(output_dir)
    if not root.is_dir():
        return own, None
    for cand in sorted(p for p in root.glob(f"{prefix}*") if p.is_dir()):
        try:
            recorded = yaml.safe_load((cand / "config.yaml").read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        if not isinstance(recorded, dict) or recorded.get("seed") != seed:
            continue
        added = added_at_default(resolved, recorded)
        if added is not None:
            return cand, {"run_dir": str(cand), "expected": run_id, "added": added}
    return own, None


def note_text(note: dict) -> str:
    """The line that says an earlier release's run directory was taken."""
    added = ", ".join(note["added"]) or "none"
    return (f"note: {note['run_dir']} was written by an earlier rlbatch (its id today would "
            f"be {note['expected']}); its recorded config is this run's, the settings added "
            f"since at their defaults ({added}): it is this run, continued as it is")
