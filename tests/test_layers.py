"""The layer rule (docs/design.md, Layers): each folder of src/rlbatch is one layer and imports
only go downward; the README's layer list names exactly the folders that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "rlbatch"
# lowest first; a module may import its own layer and any layer before it
ORDER = ["core", "algos", "rollout", "interop", "backends", "analysis", "profile", "report",
         "cli"]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlbatch."):
            out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("rlbatch.")}
    return out


def test_every_folder_is_a_known_layer():
    folders = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(ORDER)


def test_imports_only_go_downward():
    bad = []
    for layer in ORDER:
        allowed = set(ORDER[: ORDER.index(layer) + 1])
        for path in (SRC / layer).rglob("*.py"):
            for target in _imports(path) - allowed:
                bad.append(f"{path.relative_to(SRC)} imports {target}")
    assert bad == []


def test_analysis_and_report_never_import_torch():
    for layer in ("analysis", "report"):
        for path in (SRC / layer).rglob("*.py"):
            assert not re.search(r"^\s*(import torch|from torch)", path.read_text(), re.MULTILINE), path


def test_readme_layer_list_matches_the_tree():
    readme = (SRC.parents[1] / "README.md").read_text()
    section = readme[readme.index("## Layout"):].split("\n## ")[0]
    named = re.findall(r"`([a-z_]+)`", section)
    first = list(dict.fromkeys(n for n in named if n in ORDER))  # in order of first mention
    assert first == ORDER


def test_every_module_is_under_500_lines():
    """A module holds one responsibility (docs/design.md, "Small rooms"): past 500 lines it
    holds several, and is split along them (as backends/command/run.py into preflight,
    procs, health and the run loop). No exceptions."""
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}
