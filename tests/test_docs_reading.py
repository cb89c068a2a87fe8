"""The newcomer's reading path (README.md and docs/guide.md) fits one sitting, and the user
docs carry no project history: the README at most 150 lines and the guide 400, at most
5,000 words together, no sentence over 60 words; no run date, commit hash, "this stop",
"this session" or "this machine" in the README, the guide or the generated reference; no
rlbatch commit, "this stop" or "this session" in any doc (history lives in git)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README, GUIDE, REFERENCE = ROOT / "README.md", ROOT / "docs" / "guide.md", \
    ROOT / "docs" / "reference.md"
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
HEX = re.compile(r"\b[0-9a-f]{7,40}\b")
QUOTED_HEX = re.compile(r"`[0-9a-f]{7,40}`")
HISTORY = re.compile(r"\bthis (stop|session)\b", re.IGNORECASE)


def prose(text: str) -> str:
    """The text without its code blocks (commands and pasted output are not prose)."""
    return re.sub(r"```.*?```", "", text, flags=re.DOTALL)


def sentences(text: str) -> list[str]:
    """Sentences of the prose: split at a sentence's end, a blank line, a heading, a table
    row and a list item's start."""
    parts = re.split(r"(?<=[.!?])\s+(?=[A-Z`(*\"])|\n\s*\n|\n\s*(?=[-*|#] |\d+\. )",
                     prose(text))
    return [p for p in parts if p.strip()]


def test_the_reading_path_fits_one_sitting():
    readme, guide = README.read_text(), GUIDE.read_text()
    assert len(readme.splitlines()) <= 150
    assert len(guide.splitlines()) <= 400
    assert len(prose(readme).split()) + len(prose(guide).split()) <= 5000
    long = [s[:120] for s in sentences(readme) + sentences(guide) if len(s.split()) > 60]
    assert long == []


def test_the_splitter_finds_a_long_sentence():
    text = "Short one. " + " ".join(["Word"] + ["word"] * 60) + ".\n\n- an item\n- another"
    assert [len(s.split()) for s in sentences(text)] == [2, 61, 3, 2]


@pytest.mark.parametrize("doc", [README, GUIDE, REFERENCE], ids=lambda p: p.name)
def test_the_newcomers_docs_carry_no_history(doc):
    text = doc.read_text()
    assert DATE.findall(text) == []
    assert QUOTED_HEX.findall(text) == []
    assert [h for h in HEX.findall(prose(text)) if not h.isdigit()] == []
    assert HISTORY.findall(text) == []
    assert re.findall(r"\bthis machine\b", text, re.IGNORECASE) == []


def _commits(words: set[str]) -> set[str]:
    """The words that name a commit of this repository (none outside a git checkout)."""
    git = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--git-dir"],
                         capture_output=True, text=True, check=False)
    if git.returncode != 0:
        return set()
    names = sorted(words)
    out = subprocess.run(["git", "-C", str(ROOT), "cat-file", "--batch-check"],
                         input="".join(w + "\n" for w in names), capture_output=True,
                         text=True, check=False).stdout.splitlines()
    # one line per name, in order: "<sha> commit <size>", or "<name> missing"
    return {w for w, line in zip(names, out, strict=True) if line.split()[1:2] == ["commit"]}


@pytest.mark.parametrize("doc", sorted((ROOT / "docs").glob("*.md")) + [README],
                         ids=lambda p: p.name)
def test_no_doc_names_a_commit_of_this_project_or_a_stop(doc):
    text = doc.read_text()
    assert HISTORY.findall(text) == []
    assert _commits(set(HEX.findall(text))) == set()
