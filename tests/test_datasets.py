"""Dataset tasks (rollout/datasets.py) and `rlbatch data check` (cli/data_cmds.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers.cli import run_cli
from rlbatch.core.config import TaskConfig
from rlbatch.core.errors import ConfigError, DataError
from rlbatch.rollout.datasets import DatasetTask, build_task, load_rows, split_held_out
from rlbatch.rollout.tasks import AdditionTask, Example, ReverseTask, take


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def qa_rows(n: int) -> list[dict]:
    return [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(n)]


# ---------------------------------------------------------------- JSONL

def test_jsonl_rows_become_examples(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [
        {"q": "1+1=", "a": 2, "extra": True}, "", {"q": "x", "a": "y"}, {"q": "h", "a": 0.5}])
    rows = load_rows(str(path), prompt_column="q", answer_column="a")
    assert (rows.container, rows.layout) == ("jsonl", "columns")
    assert [(e.prompt, e.answer) for e in rows.examples] == [("1+1=", "2"), ("x", "y"), ("h", "0.5")]
    assert [e.meta["source"] for e in rows.examples] == [f"{path}:1", f"{path}:3", f"{path}:4"]


def test_malformed_jsonl_collects_every_row(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [
        {"prompt": "a", "answer": "1"},           # 1 ok
        {"prompt": "b", "answer": "2"},           # 2 ok
        '{"prompt": "c", "answer": ',             # 3 invalid JSON
        {"prompt": "d", "answer": "4"},           # 4 ok
        {"answer": "5"},                          # 5 missing prompt column
        {"prompt": "f", "answer": "6"},           # 6 ok
        {"prompt": ["not", "messages"], "answer": "7"},  # 7 bad prompt
        {"prompt": "h", "answer": " "},           # 8 empty answer
    ])
    with pytest.raises(DataError) as info:
        load_rows(str(path))
    assert str(info.value) == (
        f"{path}:3: invalid JSON (Expecting value at column 27); "
        "3 more malformed rows (lines 5, 7, 8)")


@pytest.mark.parametrize("row, problem", [
    ({"prompt": "a"}, "missing column 'answer'"),
    ({"prompt": 3, "answer": "1"}, "prompt must be a string or a list of chat messages, not int"),
    ({"prompt": "  ", "answer": "1"}, "empty prompt"),
    ({"prompt": "a", "answer": None}, "must be a non-empty string or number, got empty"),
    ({"prompt": "a", "answer": [1, 2]}, "must be a non-empty string or number, got list"),
    ({"prompt": "a", "answer": True}, "must be a non-empty string or number, got bool"),
    ([1, 2], "expected a JSON object, got list"),
    ({"prompt": [{"role": "system", "content": "s"}], "answer": "1"}, "no user message"),
    ({"prompt": [{"content": "hi"}], "answer": "1"}, "prompt message 0 needs a string 'role'"),
])
def test_each_kind_of_malformed_row(tmp_path, row, problem):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "ok", "answer": "1"}, row])
    with pytest.raises(DataError, match=f"^{path}:2: .*{problem}"):
        load_rows(str(path))


def test_cli_reports_three_malformed_rows_with_exit_2(tmp_path, capsys):
    path = write_jsonl(tmp_path / "file.jsonl", [
        {"prompt": "a", "answer": "1"}, {"prompt": "b"}, {"prompt": "c", "answer": "3"},
        "{oops", {"prompt": 5, "answer": "5"}])
    code, out, err = run_cli(["data", "check", str(path)], capsys)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("error: ")
    assert f"{path}:2: missing column 'answer'" in err
    assert "2 more malformed rows (lines 4, 5)" in err


def test_real_cli_binary_exit_status_and_one_line(tmp_path):
    path = write_jsonl(tmp_path / "file.jsonl", ["[", {"prompt": "a", "answer": ""}, "nope"])
    proc = subprocess.run([sys.executable, "-m", "rlbatch.cli.main", "data", "check", str(path)],
                          check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [proc.stderr.strip()]
    assert f"{path}:1:" in proc.stderr and "2 more malformed rows (lines 2, 3)" in proc.stderr


def test_cli_check_prints_count_sample_and_json(tmp_path, capsys):
    path = write_jsonl(tmp_path / "ok.jsonl", qa_rows(5))
    code, out, err = run_cli(["data", "check", str(path), "--reward", "numeric"], capsys)
    assert code == 0 and err == ""
    assert out.splitlines()[0] == f"ok: 5 rows, jsonl (columns layout): {path}"
    assert "prompt: 0+0=" in out and "answer: 0" in out
    assert "5 correct, 0 wrong, 0 unscorable" in out
    code, out, _ = run_cli(["data", "check", str(path), "--reward", "gsm8k", "--json"], capsys)
    info = json.loads(out.splitlines()[-1])
    assert info["rows"] == 5 and info["reward"]["correct"] == 5


def test_cli_check_counts_unscorable_reference_answers(tmp_path, capsys):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p", "answer": "7"},
                                              {"prompt": "q", "answer": "blue"}])
    code, out, _ = run_cli(["data", "check", str(path), "--reward", "numeric"], capsys)
    assert code == 0
    assert f"1 correct, 0 wrong, 1 unscorable (first: {path}:2)" in out


@pytest.mark.parametrize("argv, message", [
    (["--format", "csv"], "--format: unknown format 'csv'"),
    (["--reward", "nope"], "task.reward: unknown reward 'nope'"),
])
def test_cli_bad_options_exit_2(tmp_path, capsys, argv, message):
    path = write_jsonl(tmp_path / "d.jsonl", qa_rows(2))
    code, _, err = run_cli(["data", "check", str(path), *argv], capsys)
    assert code == 2 and message in err and err.count("\n") == 1


def test_missing_file_and_unknown_extension(tmp_path):
    with pytest.raises(DataError, match=r"nope\.jsonl: file not found"):
        load_rows(str(tmp_path / "nope.jsonl"))
    csv = tmp_path / "d.csv"
    csv.write_text("prompt,answer\n")
    with pytest.raises(DataError, match=r"d\.csv: cannot tell the format .*'\.csv'"):
        load_rows(str(csv))
    txt = write_jsonl(tmp_path / "d.txt", qa_rows(1))  # an explicit format overrides the suffix
    assert load_rows(str(txt), fmt="jsonl").examples[0].answer == "0"


# ---------------------------------------------------------------- Parquet and verl

def test_parquet_round_trip(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"question": ["1+2=", "3+4="], "solution": ["3", "7"],
                             "n": [1, 2]}), path)
    rows = load_rows(str(path), prompt_column="question", answer_column="solution")
    assert (rows.container, rows.layout) == ("parquet", "columns")
    assert [Example(e.prompt, e.answer) for e in rows.examples] == [
        Example("1+2=", "3"), Example("3+4=", "7")]
    assert rows.examples[1].meta["source"] == f"{path}:row 1"


def test_parquet_bad_rows_and_missing_column(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.table({"prompt": ["a", "b", "c", "d"], "answer": ["1", None, "3", ""]}), path)
    with pytest.raises(DataError) as info:
        load_rows(str(path))
    assert str(info.value).startswith(f"{path}:row 1: answer 'answer' must be")
    assert str(info.value).endswith("1 more malformed row (row 3)")
    with pytest.raises(DataError, match=r"no column 'label' \(columns: prompt, answer\)"):
        load_rows(str(path), answer_column="label")
    junk = tmp_path / "junk.parquet"
    junk.write_text("not parquet")
    with pytest.raises(DataError, match="not a readable Parquet file"):
        load_rows(str(junk))


def verl_table(n: int) -> pa.Table:
    return pa.table({
        "data_source": ["openai/gsm8k"] * n,
        "prompt": [[{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": f"What is {i} + {i}?"}] for i in range(n)],
        "ability": ["math"] * n,
        "reward_model": [{"style": "rule", "ground_truth": str(2 * i)} for i in range(n)],
        "extra_info": [{"split": "train", "index": i} for i in range(n)],
    })


@pytest.mark.parametrize("fmt", ["auto", "verl", "parquet"])
def test_verl_parquet_chat_prompts(tmp_path, fmt):
    path = tmp_path / "train.parquet"
    pq.write_table(verl_table(3), path)
    rows = load_rows(str(path), fmt=fmt)
    assert rows.layout == "verl"
    ex = rows.examples[2]
    assert (ex.prompt, ex.answer) == ("What is 2 + 2?", "4")
    assert ex.meta["messages"] == [{"role": "system", "content": "Be brief."},
                                   {"role": "user", "content": "What is 2 + 2?"}]
    assert ex.meta["data_source"] == "openai/gsm8k"


def test_chat_prompt_in_jsonl_with_content_parts(tmp_path):
    path = write_jsonl(tmp_path / "chat.jsonl", [{
        "prompt": [{"role": "user", "content": "old"}, {"role": "assistant", "content": "x"},
                   {"role": "user", "content": [{"type": "text", "text": "new "},
                                                {"type": "text", "text": "question"}]}],
        "reward_model": {"ground_truth": 12}}])
    ex = load_rows(str(path)).examples[0]
    assert (ex.prompt, ex.answer) == ("new question", "12")
    assert len(ex.meta["messages"]) == 3


# ---------------------------------------------------------------- the task

def dataset_cfg(path: Path, **kw) -> TaskConfig:
    return TaskConfig(name="dataset", path=str(path), **kw)


def test_held_out_split_is_deterministic_and_disjoint(tmp_path):
    examples = [Example(f"p{i}", str(i)) for i in range(25)]
    train, held = split_held_out(examples)
    assert (len(train), len(held)) == (23, 2)  # max(1, 25 // 10)
    assert split_held_out(examples) == (train, held)
    assert not {e.prompt for e in train} & {e.prompt for e in held}
    big = [Example(f"p{i}", "0") for i in range(20000)]
    assert len(split_held_out(big)[1]) == 1024

    task = DatasetTask.from_config(dataset_cfg(write_jsonl(tmp_path / "d.jsonl", qa_rows(25))))
    assert len(task.train) == 23 and task.eval_set(1024) == task.eval_set(2)
    assert task.eval_set(1) == task.eval_set(2)[:1]


def test_eval_path_and_overlap_removal(tmp_path):
    train = write_jsonl(tmp_path / "train.jsonl", qa_rows(6))
    held = write_jsonl(tmp_path / "eval.jsonl", qa_rows(2))  # prompts 0+0=, 1+1= overlap
    task = DatasetTask.from_config(dataset_cfg(train, eval_path=str(held)))
    assert [e.prompt for e in task.eval_set(10)] == ["0+0=", "1+1="]
    assert len(task.train) == 4 and task.overlap_removed == 2
    with pytest.raises(DataError, match="every training prompt is also in the held-out set"):
        DatasetTask.from_config(dataset_cfg(held, eval_path=str(train)))
    with pytest.raises(DataError, match="need at least 2 rows"):
        DatasetTask.from_config(dataset_cfg(write_jsonl(tmp_path / "one.jsonl", qa_rows(1))))


def test_same_seed_same_stream_and_every_epoch_is_a_permutation(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", qa_rows(40))
    task = DatasetTask.from_config(dataset_cfg(path))
    n = len(task.train)
    first = [e.prompt for e in take(task.train_stream(7), 3 * n)]
    again = DatasetTask.from_config(dataset_cfg(path))
    assert [e.prompt for e in take(again.train_stream(7), 3 * n)] == first
    assert [e.prompt for e in take(task.train_stream(8), 3 * n)] != first
    epochs = [first[i * n:(i + 1) * n] for i in range(3)]
    assert all(sorted(ep) == sorted(e.prompt for e in task.train) for ep in epochs)
    assert epochs[0] != epochs[1]  # reshuffled each epoch
    assert next(task.train_stream(7)).prompt == first[0]


def test_task_reward_follows_config(tmp_path, monkeypatch):
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": f"q{i}", "answer": f"#### {i}"}
                                              for i in range(10)])
    task = build_task(dataset_cfg(path, reward="gsm8k"))
    ex = task.train[0]
    assert task.reward(ex.prompt, f"so\n#### {ex.answer[5:]}", ex) == 1.0
    assert task.reward(ex.prompt, "no marker", ex) is None
    (tmp_path / "rw.py").write_text("def one(p, c, e):\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert build_task(dataset_cfg(path, reward="rw:one")).reward("p", "c", ex) == 1.0
    with pytest.raises(ConfigError, match=r"task\.reward"):
        build_task(dataset_cfg(path, reward="levenshtein"))


def test_build_task_builtins():
    add = build_task(TaskConfig(name="addition", digits=2))
    assert isinstance(add, AdditionTask) and add.digits == 2
    rev = build_task(TaskConfig(name="reverse", digits=4))
    assert isinstance(rev, ReverseTask) and rev.digits == 4
    ex = add.eval_set(1)[0]
    assert add.reward(ex.prompt, ex.answer, ex) == 1.0
    numeric = build_task(TaskConfig(name="addition", reward="numeric"))
    assert numeric.reward("p", "the sum is 0012", Example("p", "12")) == 1.0


def test_vocabulary_covers_prompts_and_answers(tmp_path):
    task = DatasetTask.from_config(dataset_cfg(write_jsonl(tmp_path / "d.jsonl", qa_rows(12))))
    assert set(task.vocabulary()) == set("0123456789+=")
