"""docs/design.md's "One GRPO step, top to bottom" names real functions, in under 80 lines."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"
LAYERS = ("algos", "analysis", "backends", "cli", "core", "interop", "profile", "report",
          "rollout")


def _section() -> str:
    text = DESIGN.read_text()
    start = text.index("## One GRPO step, top to bottom")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def _resolve(dotted: str):
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module("rlbatch." + ".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_step_section_is_short_and_every_name_exists():
    section = _section()
    assert len(section.splitlines()) < 80
    names = [n for n in re.findall(r"`([A-Za-z_][\w.]*)`", section)
             if n.split(".")[0] in LAYERS and "." in n]
    assert len(names) >= 30  # the section names the step's functions, not a few of them
    missing = []
    for name in names:
        try:
            assert callable(_resolve(name))
        except (AttributeError, ModuleNotFoundError, AssertionError):
            missing.append(name)
    assert not missing, f"named in docs/design.md but not in src/rlbatch: {missing}"
