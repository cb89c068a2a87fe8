"""Shared fixtures. The warm-started tiny model is built once per cache (about a minute on
2 cores) under <repo>/.rlbatch-cache unless RLBATCH_CACHE is set; subprocesses inherit it.

Tests that build, train on or profile a warm-started model carry the marker `trained`
(tests/README.md). A test that requests `tiny_model_dir` is marked by itself; any other test
that reaches the model (through the CLI, a subprocess or a build) must say so with
`@pytest.mark.trained`, or it errors here: every use of the model is logged
(`RLBATCH_MODEL_USE_LOG`) and checked against the marker after each test.

Every `trained` test is also classified, or collection fails: `lands` when its outcome can
depend on where a run lands on this CPU's arithmetic (a learning fact, the build's band; CI
runs these a second time under another `ATEN_CPU_CAPABILITY`), `landing_free` when its
assertions hold wherever the run lands (budgets, equality with a run on the same machine,
refusals).

At the end of a session the ten slowest tests (setup plus call) are listed, and a warning
line names every test over `RLBATCH_SLOW_TEST_S` seconds (60 by default), so that growth is
seen by the change that causes it.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("RLBATCH_CACHE", str(REPO / ".rlbatch-cache"))


def pytest_configure(config):
    # xdist's workers share the machine's CPUs: each gets its part of them for the trials it
    # starts (profile/executors.py available_threads); two trainings with a thread per core
    # each, spinning on the same cores, run 10x slower
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        os.environ.setdefault("RLBATCH_THREADS",
                              str(max(1, len(os.sched_getaffinity(0)) // workers)))
    fd, log = tempfile.mkstemp(prefix="rlbatch-model-use-", suffix=".jsonl")
    os.close(fd)
    os.environ["RLBATCH_MODEL_USE_LOG"] = log


def pytest_unconfigure(config):
    log = os.environ.pop("RLBATCH_MODEL_USE_LOG", None)
    if log:
        Path(log).unlink(missing_ok=True)


def pytest_collection_modifyitems(items):
    unclassified = []
    for item in items:
        if "tiny_model_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.trained)
        if item.get_closest_marker("trained") is not None and \
                not any(item.get_closest_marker(m) for m in ("lands", "landing_free")):
            unclassified.append(item.nodeid)
    if unclassified:
        raise pytest.UsageError(
            f"{len(unclassified)} trained test(s) not classified: mark each `lands` or "
            f"`landing_free` (tests/README.md): {', '.join(unclassified)}")
    items[:] = sorted(items, key=_file_order(items))


# The files that take longest (setup plus call, a serial run on 2 cores), longest first.
LONGEST_FIRST = ("test_reliability.py", "test_ownership.py", "test_command_profile.py",
                 "test_schedule.py", "test_fuzz.py", "test_trl_backend.py", "test_disk.py",
                 "test_trainer.py", "test_kill.py", "test_command.py",
                 "test_staleness_command.py", "test_input_messages.py",
                 "test_report.py", "test_gpu_check.py", "test_progress_lines.py")


def _file_order(items):
    """The order in which `make test`'s two workers take files (`--dist loadfile
    --no-loadscope-reorder`): one file that needs the tiny model first (its worker builds
    the model), the files that need no model next (the other worker runs them meanwhile
    instead of waiting on the build), then the other trained files; longest first within
    each group, so the run does not end on one worker's long file."""
    def name(item) -> str:
        return item.nodeid.split("::")[0].rsplit("/", 1)[-1]

    trained = {name(i) for i in items if i.get_closest_marker("trained") is not None}
    rank = {f: i for i, f in enumerate(LONGEST_FIRST)}
    # ties broken by name: a set's order follows the string hash, which differs between the
    # workers (PYTHONHASHSEED), and xdist refuses workers that collected different orders
    first = min(trained, key=lambda f: (rank.get(f, len(rank)), f), default=None)

    def key(item):
        f = name(item)
        group = 0 if f == first else (2 if f in trained else 1)
        return group, rank.get(f, len(rank))

    return key


_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if report.when in ("setup", "call"):
        _SECONDS[report.nodeid] = _SECONDS.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if not _SECONDS:
        return
    tr = terminalreporter
    limit = float(os.environ.get("RLBATCH_SLOW_TEST_S", "60"))
    ranked = sorted(_SECONDS.items(), key=lambda kv: -kv[1])
    tr.write_sep("=", "ten slowest tests (setup + call)")
    for nodeid, seconds in ranked[:10]:
        tr.write_line(f"{seconds:8.1f} s  {nodeid}")
    over = [f"{nodeid} ({seconds:.0f} s)" for nodeid, seconds in ranked if seconds > limit]
    if over:
        tr.write_line(f"warning: {len(over)} test(s) over {limit:g} s of setup plus call: "
                      + ", ".join(over))


def _model_users(log: Path) -> set[str]:
    if not log.exists():
        return set()
    return {json.loads(line)["test"] for line in log.read_text().splitlines() if line.strip()}


@pytest.fixture(autouse=True)
def _trained_marker_is_honest(request):
    """Fail a test that reached a warm-started model without the `trained` marker."""
    yield
    log = Path(os.environ["RLBATCH_MODEL_USE_LOG"])
    if request.node.nodeid in _model_users(log) and \
            request.node.get_closest_marker("trained") is None:
        pytest.fail(f"{request.node.nodeid} uses a warm-started model: mark it "
                    "@pytest.mark.trained (tests/README.md)", pytrace=False)


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    from rlbatch.rollout.tiny_model import recipe_for, tiny_model_path

    return tiny_model_path(recipe_for("addition", 3))


@pytest.fixture
def small_llama():
    """A small random Llama (not warm-started) for fast engine and gradient tests."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=12, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    return LlamaForCausalLM(cfg).eval()
