"""Fuzzing of the files rlbatch reads (issue 16, item 7; docs/reliability.md "Fuzzing").

Hypothesis writes config files, dataset files, damaged copies of the four trainers' logs that
`rlbatch ingest` reads (tests/fixtures/ingest), and damaged run directories, and calls the
CLI in-process on each. The property (docs/design.md, house rule 10): exit 0, or exit 2 with
one line that names the file (`file:line` where the fault has a line); never another exit
status or an exception; on exit 2 nothing written; on exit 0 strict JSON only, and a run never
marked complete when its log was cut mid-record. Inputs, damage and checks are in
tests/helpers/fuzzing.py.

Examples are derandomized (the same inputs on every machine and run) and bounded so the file
runs in well under a minute on two cores; RLBATCH_FUZZ_SCALE=k multiplies every example count
for a longer run by hand. `pytest --hypothesis-show-statistics` prints the examples per test
and the share of each mutation and outcome (`event`). The bugs fuzzing found are pinned by
`test_found_by_fuzzing`: fixed ones as regressions, the others (in files outside this work)
as `xfail(strict=True)` naming the fix; while one of those stands, a fuzz example that hits it
is counted (a `known bug` event) instead of failing (helpers.fuzzing.KNOWN).
"""

from __future__ import annotations

import io
import json
import os
import shutil
from importlib import resources
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from helpers import fuzzing
from helpers.fuzzing import (
    bad_utf8_parquet,
    check_run,
    cli,
    config_text,
    damage_run,
    dataset_file,
    list_bomb,
    mutate,
    outcome,
    replace_leaf,
    strict,
    symlink_loop,
    weird_event,
    whole_ends,
    workdir,
)
from rlbatch.core.loading import preset_names

FIX = Path(__file__).parent / "fixtures" / "ingest"
SCALE = float(os.environ.get("RLBATCH_FUZZ_SCALE", "1"))
PG = ["--prompts-per-step", "4", "--samples-per-prompt", "2"]
TRL_PG = ["--prompts-per-step", "2", "--samples-per-prompt", "4"]
TARGET = ["--target", "eval/openai/gsm8k/reward/mean@1=0.4"]


def fuzz(n: int):
    """n examples (times RLBATCH_FUZZ_SCALE), the same on every run, no deadline."""
    return settings(max_examples=max(1, int(n * SCALE)), deadline=None, derandomize=True,
                    database=None, suppress_health_check=list(HealthCheck), print_blob=False)


# ---------------------------------------------------------------- (a) config files
def check_config(path: Path) -> None:
    """`config show --json`: one error line and exit 2, or strict JSON; `config check` agrees
    on the exit status (or refuses, exit 2, what `train` checks beyond the config: a dataset
    path, a reward, a model folder) and lists its errors one `error:` line each."""
    code, out, err = cli(["config", "show", str(path), "--json"])
    if code == 2 and str(path) not in err:
        event("config error names a preset line, not the file")
    if outcome(code, err, path, "preset:"):
        strict(out.strip().split("\n")[-1])
    check, _, errs = cli(["config", "check", str(path)])
    assert check == code or (code == 0 and check == 2), (check, code, errs)
    if check == 2:
        assert "Traceback" not in errs
        assert all(ln.startswith("error: ") for ln in errs.strip().split("\n")), errs


@fuzz(100)
@given(text=config_text())
def test_fuzz_config_files(text, tmp_path):
    """Generated configs: real and made-up keys, every YAML type, duplicates, BOM, CRLF."""
    path = workdir(tmp_path) / "c.yaml"
    path.write_bytes(text.encode("utf-8", "surrogatepass"))
    check_config(path)


@fuzz(40)
@given(data=st.data())
def test_fuzz_damaged_config_files(data, tmp_path):
    """A preset file cut, with bytes flipped or inserted, lines dropped, doubled or junk."""
    name = data.draw(st.sampled_from(preset_names()))
    raw = (resources.files("rlbatch.core") / "presets" / f"{name}.yaml").read_bytes()
    _, damaged, _ = data.draw(mutate(raw, values=False))
    path = workdir(tmp_path) / f"{name}.yaml"
    path.write_bytes(damaged)
    check_config(path)


# the list settings, a number setting given a list, and a key that does not exist
LIST_KEYS = ["profile.concurrency", "profile.prompts_per_step", "profile.seeds", "seed",
             "made_up.key"]


@fuzz(12)
@given(key=st.sampled_from(LIST_KEYS), n=st.sampled_from([65, 5000, 60_000, 400_000]),
       depth=st.sampled_from([1, 1, 2, 6]), given_as=st.sampled_from(["file", "--set"]))
def test_fuzz_list_bombs(key, n, depth, given_as, tmp_path):
    """A list far longer than any setting takes (`MAX_LIST`), nested, up to a config beyond
    its size limit, in a config file or a `--set`: refused in one line, in seconds."""
    work = workdir(tmp_path)
    bomb = list_bomb(n, depth)
    path = work / "c.yaml"
    if given_as == "file":
        section, _, name = key.rpartition(".")
        body = f"{section}:\n  {name}: {bomb}\n" if section else f"{name}: {bomb}\n"
        path.write_text("extends: grpo-tiny\n" + body)
        check_config(path)
        return
    path.write_text("extends: grpo-tiny\n")
    code, _, err = cli(["config", "show", str(path), "--set", f"{key}={bomb}", "--json"])
    outcome(code, err, path, "--set")


# ---------------------------------------------------------------- (b) dataset files
@fuzz(100)
@given(case=dataset_file(), suffix=st.sampled_from([".jsonl", ".json"]),
       eol=st.sampled_from([b"\n", b"\r\n"]))
def test_fuzz_dataset_rows_exact_outcome(case, suffix, eol, tmp_path):
    """Exact oracle: every bad row is found, the first one named as file:line, the others
    counted; a file without bad rows is read whole."""
    lines, kinds = case
    path = workdir(tmp_path) / f"data{suffix}"
    path.write_bytes(eol.join(lines) + eol)
    code, out, err = cli(["data", "check", str(path)])
    bad = [i for i, k in enumerate(kinds, start=1) if k == "bad"]
    if bad:
        assert not outcome(code, err, path, line=bad[0])
        more = len(bad) - 1
        assert (f"{more} more malformed row" in err) == (more > 0), err
    else:
        assert outcome(code, err, path)
        assert out.startswith(f"ok: {kinds.count('good')} rows"), out


@fuzz(100)
@given(case=dataset_file(), data=st.data(),
       suffix=st.sampled_from([".jsonl", ".json", ".parquet", ".txt"]))
def test_fuzz_damaged_dataset_files(case, data, suffix, tmp_path):
    """Byte- and value-level damage to a valid JSONL or Parquet file (or another suffix)."""
    lines = [line for line, kind in zip(*case) if kind == "good"]
    raw = b"\n".join(lines) + b"\n"
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        sink = io.BytesIO()
        rows = [{k: v if isinstance(v, str) else json.dumps(v) for k, v in json.loads(x).items()}
                for x in lines]
        pq.write_table(pa.Table.from_pylist(rows), sink)
        raw = sink.getvalue()
    text = suffix != ".parquet"
    _, damaged, _ = data.draw(mutate(raw, lines=text, values=text))
    path = workdir(tmp_path) / f"data{suffix}"
    path.write_bytes(damaged)
    code, _, err = cli(["data", "check", str(path)])
    outcome(code, err, path)


# ---------------------------------------------------------------- (c) trainer logs
LOGS = {  # case: (framework, fixture file or folder, flags, an evaluation metric it logs)
    "verl": ("verl", "verl/metrics.jsonl", PG, "eval/openai/gsm8k/reward/mean@1"),
    "prime-rl": ("prime-rl", "prime-rl/run", [], "eval/gsm8k/all/agent/avg@1"),
    "trl-json": ("trl", "trl/trainer_state.json", TRL_PG, "eval/reward"),
    "trl-tensorboard": ("trl", "trl/tb", TRL_PG, "eval/reward"),
    "openrlhf": ("openrlhf", "openrlhf/tb", PG, "eval/eval_gsm8k_pass1"),
}


def damage_log(data, path: Path) -> int | None:
    """Damage one log file in place; return the line of an inserted junk line, if any. A cut
    (truncation off a record boundary) is told apart by the caller."""
    raw, tb = path.read_bytes(), "tfevents" in path.name
    junk_at = None
    if data.draw(st.integers(0, 11)) == 0:
        event("mutation symlink loop")
        path.unlink()
        symlink_loop(path)
        return None
    if tb and data.draw(st.integers(0, 3)) == 0:
        event("mutation event record")
        at = data.draw(st.sampled_from(sorted(whole_ends(raw, True) - {0})))
        damaged = raw[:at] + data.draw(weird_event()) + raw[at:]
    elif path.suffix == ".json" and data.draw(st.integers(0, 2)) == 0:
        event("mutation value")
        damaged = replace_leaf(data.draw, json.loads(raw), indent=2).encode()
    else:
        _, damaged, junk_at = data.draw(mutate(raw, lines=not tb, values=path.suffix == ".jsonl"))
    path.write_bytes(damaged)
    return junk_at if path.suffix == ".jsonl" else None


@pytest.mark.parametrize("case", list(LOGS))
@fuzz(40)
@given(data=st.data())
def test_fuzz_damaged_trainer_logs(case, data, tmp_path):
    """A valid log of each trainer, damaged (cut, bytes flipped or inserted, junk lines, a
    value made NaN/huge/a string, a stray event record), through `ingest`, then `analyze`."""
    pytest.importorskip("tensorboard")
    framework, fixture, flags, metric = LOGS[case]
    work, src = workdir(tmp_path), FIX / fixture
    given_path = work / src.name
    if src.is_dir():
        shutil.copytree(src, given_path)
    else:
        shutil.copy(src, given_path)
    path = data.draw(st.sampled_from(sorted(p for p in given_path.rglob("*") if p.is_file())
                                     if src.is_dir() else [given_path]))
    raw = path.read_bytes()
    junk_at = damage_log(data, path)
    damaged = b"" if path.is_symlink() else path.read_bytes()
    cut = raw.startswith(damaged) and len(damaged) not in whole_ends(raw, "tfevents" in path.name)
    out = work / "out"
    code, _, err = cli(["ingest", framework, str(given_path), "--out", str(out), *flags])
    if not outcome(code, err, path if junk_at else given_path, line=junk_at):
        if junk_at:
            event("junk line refused at its file:line")
        assert not out.exists() and not [p for p in work.iterdir() if p.name.startswith(".")]
        return
    check_run(out, cut)
    if cut:
        event("cut mid-record, ingested as running")
    code, _, err = cli(["analyze", str(out), "--target", f"{metric}=0.4", "--bootstrap", "20"])
    outcome(code, err, out, f"target metric '{metric}'")


CONFIGS = {  # framework: (its config file among the fixtures, the log given with it)
    "verl": ("verl/ppo_config.yaml", "verl/metrics.jsonl"),
    "verl-script": ("verl/run_grpo.sh", "verl/metrics.jsonl"),
    "openrlhf": ("openrlhf/train_grpo_ray.sh", "openrlhf/tb"),
    "trl": ("trl/grpo_config.yaml", "trl/trainer_state.json"),
    "prime-rl": ("prime-rl/rl.toml", "prime-rl/run"),
}


@pytest.mark.parametrize("case", list(CONFIGS))
@fuzz(12)
@given(data=st.data())
def test_fuzz_damaged_framework_configs(case, data, tmp_path):
    """`ingest --config FILE`: each trainer's own config file (YAML, TOML, a launch script),
    damaged, read for the batch size and learning rate."""
    pytest.importorskip("tensorboard")
    config, log = CONFIGS[case]
    path = workdir(tmp_path) / Path(config).name
    _, damaged, _ = data.draw(mutate((FIX / config).read_bytes(), values=False))
    path.write_bytes(damaged)
    out = path.parent / "out"
    code, _, err = cli(["ingest", case.split("-script")[0], str(FIX / log), "--out", str(out),
                        "--config", str(path)])
    if outcome(code, err, path, "--prompts-per-step"):
        check_run(out, cut=False)
    else:
        assert not out.exists()


# ---------------------------------------------------------------- run directories
@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """Two seeds of one ingested configuration: a sweep `analyze` and `report` accept."""
    root = tmp_path_factory.mktemp("sweep") / "sweep"
    for seed in ("1", "2"):
        code, _, err = cli(["ingest", "verl", str(FIX / "verl" / "metrics.jsonl"), "--out",
                            str(root / f"run{seed}"), *PG, "--lr", "1e-6", "--seed", seed])
        assert code == 0, err
    return root


def damaged_sweep(data, sweep: Path, tmp_path: Path) -> tuple[Path, Path]:
    work = workdir(tmp_path)
    shutil.copytree(sweep, work / "sweep")
    run = work / "sweep" / data.draw(st.sampled_from(["run1", "run2"]))
    data.draw(damage_run(run))
    return work, run


@fuzz(50)
@given(data=st.data())
def test_fuzz_damaged_run_directories_analyze(data, sweep, tmp_path):
    work, run = damaged_sweep(data, sweep, tmp_path)
    code, _, err = cli(["analyze", str(work / "sweep"), *TARGET, "--bootstrap", "20", "--json"])
    outcome(code, err, run)


@fuzz(3)
@given(data=st.data())
def test_fuzz_damaged_run_directories_report(data, sweep, tmp_path):
    work, run = damaged_sweep(data, sweep, tmp_path)
    report = work / "report.md"
    code, _, err = cli(["report", str(work / "sweep"), "-o", str(report), "--format", "md",
                        *TARGET])
    assert outcome(code, err, run) == report.is_file()
    assert not [p for p in work.iterdir() if p.name.startswith(".")]


# ---------------------------------------------------------------- what fuzzing found
DEEP = b"[" * 100_000 + b"]" * 100_000 + b"\n"
HUGE = b"9" * 400
ANALYZE = ["analyze", "{d}", *TARGET, "--bootstrap", "20"]
DATA, CONFIG = ["data", "check", "{d}/d.jsonl"], ["config", "check", "{d}/c.yaml"]
VERL = ["ingest", "verl", "{d}/m.jsonl", "--out", "{d}/o", *PG]
PRIME = ["ingest", "prime-rl", "{d}/metrics.jsonl", "--out", "{d}/o"]
TRL = ["ingest", "trl", "{d}/trainer_state.json", "--out", "{d}/o", *PG]
STEP1 = b'{"step": 1, "data": {"timing_s/step": 1.0, "response_length/mean": %s}}\n'
# Ids of FOUND cases whose bug is still open (a strict xfail each); empty: all are fixed.
OPEN: set[str] = set()
FOUND = [  # id, files written into a copy of the sweep ({d}), command, file named, its line,
    # and where the fix went (None: in the ingest converters, with the fuzz tests)
    ("deep-json-dataset", {"d.jsonl": DEEP}, DATA, "d.jsonl", 1,
     "rollout/datasets.py read_jsonl: catch RecursionError (nesting too deep) as bad JSON"),
    ("deep-json-verl", {"m.jsonl": DEEP}, VERL, "m.jsonl", 1,
     "interop/ingest/logs.py read_records: catch RecursionError as invalid JSON"),
    ("deep-json-prime-rl", {"metrics.jsonl": DEEP}, PRIME, "metrics.jsonl", 1,
     "interop/ingest/logs.py read_records: catch RecursionError as invalid JSON"),
    ("deep-json-run-log", {"run1/steps.jsonl": DEEP}, ANALYZE, "run1/steps.jsonl", 1,
     "core/runlog.py read_jsonl: catch RecursionError as an invalid row"),
    ("deep-yaml-config", {"c.yaml": b"extends: grpo-tiny\nseed: " + DEEP[::20]}, CONFIG,
     "c.yaml", None, "core/loading.py _parse_yaml: catch RecursionError (nesting too deep)"),
    ("parquet-bad-utf8", {"d.parquet": bad_utf8_parquet}, ["data", "check", "{d}/d.parquet"],
     "d.parquet", None, ("rollout/datasets.py read_parquet: to_pylist() raises "
     "UnicodeDecodeError on a string that is not UTF-8; report it as not readable")),
    ("nan-answer", {"d.jsonl": b'{"prompt": "2+2", "answer": NaN}\n{"prompt": "1", "answer": '
                    b'1e999}\n'}, DATA, "d.jsonl", 1, ("rollout/datasets.py parse_answer: "
     "refuse a non-finite float answer (NaN, 1e999 now become the answers 'nan', 'inf')")),
    ("config-yaml-list", {"run1/config.yaml": b"- 1\n"}, ANALYZE, "run1/config.yaml", None,
     "core/runlog.py read_run: a config.yaml that is not a mapping is a DataError"),
    ("config-yaml-mixed-keys", {"run1/config.yaml": b"algorithm: grpo\n1: x\n"}, ANALYZE,
     "run1/config.yaml", None, ("core/runlog.py read_run: a config.yaml whose keys are not all "
     "strings is a DataError (stable_hash's sort_keys cannot compare 1 with 'algorithm')")),
    ("huge-int-counter", {"run1/evals.jsonl": b'{"step": 0, "samples": %s, "train_s": 0}\n'
                          % HUGE}, ANALYZE, "run1/evals.jsonl", None,
     "analysis/runs.py numeric_column: catch OverflowError (an integer beyond float range)"),
    ("manifest-seed-list", {"run1/manifest.json": b'{"seed": [1]}'},
     ["report", "{d}", "-o", "{d}/r.md", "--format", "md", *TARGET], "run1", None,
     ("report/text.py run_cells: num(r['seed']) calls abs() on a list; a seed that is not an "
     "integer should not leave core/runlog.py Run.seed")),
    ("extends-unknown-preset", {"c.yaml": b"extends: grpo-tinyy\n"}, CONFIG, "c.yaml", 1,
     ("core/loading.py _load_layer: give the unknown-preset ConfigError "
     "where=origins[('extends',)]")),
    ("control-character", {"c.yaml": b'extends: grpo-tiny\n"\\e[2J": 1\n"\\e[2J": 1\n'},
     CONFIG, "c.yaml", 3, ("core/errors.py UserError: escape control characters (a key quoted "
     "from a file, ESC or CR, rewrites the terminal)")),
    ("subnormal-temperature", {"c.yaml": b"extends: grpo-tiny\nrollout:\n  temperature: "
                               b"1.0e-320\n"}, CONFIG, "c.yaml", 3,
     ("core/schema.py: a floor (MIN_TEMPERATURE = 0.01) on rollout and eval temperature; "
      "1e-320 overflowed logits / T and every reward was 0 (issue 32)")),
    ("verl-huge-length", {"m.jsonl": STEP1 % b"1e308"}, VERL, "m.jsonl", None, None),
    ("verl-huge-int", {"m.jsonl": STEP1 % HUGE}, VERL, "m.jsonl", None, None),
    ("verl-huge-step", {"m.jsonl": b'{"step": %s, "data": {}}\n' % HUGE}, VERL, "m.jsonl", 1,
     None),
    ("trl-deep-json", {"trainer_state.json": DEEP}, TRL, "trainer_state.json", None, None),
    ("trl-runtime-string", {"trainer_state.json": b'{"log_history": [{"step": 1, "loss": 1}, '
                            b'{"step": 1, "train_loss": 1, "train_runtime": "x"}]}'}, TRL,
     "trainer_state.json", None, None),
    ("prime-rl-huge-time", {"metrics.jsonl": b'{"step": 1, "time": %s, "progress/total_'
                            b'rollouts": %s}\n' % (HUGE, HUGE)}, PRIME, "metrics.jsonl", None,
     None),
]


@pytest.mark.parametrize("files,args,place,line", [pytest.param(
    *case[1:5], id=case[0], marks=[pytest.mark.xfail(strict=True, reason=case[5])] * (
        case[0] in OPEN)) for case in FOUND])
def test_found_by_fuzzing(files, args, place, line, sweep, tmp_path, monkeypatch):
    """Each input fuzzing found a traceback, a message without its place, or a bad row
    accepted, for: one line naming the place (`file:line`, where a line is given: then exit 2
    is the only answer), or exit 0 with a complete run of strict JSON."""
    monkeypatch.setattr(fuzzing, "KNOWN", {})  # no bug is tolerated here
    d = tmp_path / "d"
    shutil.copytree(sweep, d)
    for name, data in files.items():
        (d / name).write_bytes(data() if callable(data) else data)
    code, _, err = cli([a.replace("{d}", str(d)) for a in args])
    if outcome(code, err, d / place, line=line):
        assert line is None, f"accepted, not refused at line {line}"
        if "ingest" in args:
            check_run(d / "o", cut=False)
