"""Inputs and checks of tests/test_fuzz.py (issue 16, item 7): the in-process CLI, the
property every answer must have, byte- and value-level damage of files, and hypothesis
strategies for config files, dataset files and damaged run directories.

`KNOWN` lists the bugs fuzzing found outside this work that are not fixed yet (each pinned
by an `xfail(strict=True)` case of `test_found_by_fuzzing`): while one stands, an example that
hits it is counted (hypothesis `event`) instead of failing the fuzz test.
"""

from __future__ import annotations

import io
import json
import struct
import tempfile
import traceback
import unicodedata
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import yaml
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument
from pydantic import BaseModel

from rlbatch.cli.main import main
from rlbatch.core.config import Config
from rlbatch.core.loading import preset_names

RUN_FILES = {"steps.jsonl", "evals.jsonl", "config.yaml", "manifest.json", "summary.json"}
# known bugs outside this work: the sign of each (an exception in a file, a message) -> its
# case in tests/test_fuzz.py FOUND; an entry goes when its fix lands (its strict xfail fails)
KNOWN: dict[str, str] = {}
CRASHED = -1  # cli()'s status for an exception of a known bug


def note(what: str) -> None:
    """A hypothesis `event` (counted in --hypothesis-show-statistics); nothing outside @given."""
    try:
        event(what)
    except InvalidArgument:
        pass


def known(sign: str, why: str) -> None:
    assert sign in KNOWN, why
    note(f"known bug {KNOWN[sign]}")


def cli(args: list[str]) -> tuple[int, str, str]:
    """`rlbatch ARGS` in-process: (exit status, stdout, stderr), encoded as a terminal would
    (stdout strict UTF-8, stderr with backslash escapes). An exception propagates and fails
    the example, unless it is a KNOWN bug (status CRASHED)."""
    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="backslashreplace",
                           write_through=True)
    code = 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except Exception as exc:  # signed by the innermost frame of rlbatch's own code
            frame = [f for f in traceback.extract_tb(exc.__traceback__)
                     if "/rlbatch/" in f.filename][-1]
            sign = f"{type(exc).__name__} in {Path(frame.filename).name}"
            if sign not in KNOWN:
                raise
            known(sign, sign)
            code = CRASHED
    note(f"{args[0]} exit {code}")
    return code, out.buffer.getvalue().decode(), err.buffer.getvalue().decode()


def outcome(code: int, err: str, *places, line: int | None = None) -> bool:
    """True on exit 0 (stderr holds only warnings); on exit 2 one `error:` line without
    control characters naming one of `places` (`places[0]:line` when given); else fail."""
    if code == CRASHED:
        return False
    assert "Traceback" not in err, err
    if code == 0:
        assert all(w.startswith("warning: ") for w in err.rstrip("\n").split("\n") if w), err
        return True
    assert code == 2, (code, err)
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    if any(unicodedata.category(c) == "Cc" for c in lines[0]):
        known("control character", err)
    if not any(str(p) in lines[0] for p in places):
        known("unknown preset" if "unknown preset '" in lines[0] else "", (places, err))
    elif line is not None:
        assert f"{places[0]}:{line}" in lines[0], (line, err)
    return False


def strict(text: str):
    """JSON as RFC 8259 has it: NaN and Infinity refused."""
    def refuse(token):
        raise AssertionError(f"non-standard JSON token {token}")
    return json.loads(text, parse_constant=refuse)


def workdir(tmp_path: Path) -> Path:
    return Path(tempfile.mkdtemp(dir=tmp_path))


# ---------------------------------------------------------------- mutations
JUNK_LINES = [b"not json", b"{", b"[1, 2]", b"42", b'"text"', b"null", b"NaN", b"\xff\xfe\x00",
              b'{"a": 1}}', b"{'single': 1}", b"\x00\x01\x02"]
# terminal escape sequences and other control characters a message must not pass on raw
ESCAPES = ["\x1b[2J\x1b[31mFAKE: all good\r", "\x1b]0;title\x07", "\x9b31m", "a\rb", "\x00",
           "\x1b[1A\x1b[K", "\u202eevil"]
# subnormal floats (below 2.2250738585072014e-308): they parse, and then divide into overflow
SUBNORMALS = ["5e-324", "-5e-324", "1e-320", "2.2250738585072014e-309", "4.9406564584124654e-324"]
WEIRD = [*SUBNORMALS, *(json.dumps(e) for e in ESCAPES),
         "NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e308", "-1.7976931348623157e308",
         "-0.0", "0", "9" * 400, "123456789012345678901234567890", "-99999999999999999999",
         "null", "true", "false", '""', '"1.5"', '"nan"', '"\\u00e9\\u2028x"', "[]", "{}",
         "[1, 2]", '{"a": {"b": [null]}}']
WEIRD_VALUE = st.one_of(st.sampled_from(WEIRD), st.sampled_from(WEIRD),
                        st.integers(-2 ** 70, 2 ** 70).map(str),
                        st.floats(allow_nan=False, allow_infinity=False).map(repr),
                        st.text(max_size=12).map(json.dumps))


def leaves(obj, path=()) -> list[tuple]:
    """Paths of every scalar and empty container in a JSON value."""
    if isinstance(obj, dict) and obj:
        return [p for k, v in obj.items() for p in leaves(v, (*path, k))]
    if isinstance(obj, list) and obj:
        return [p for i, v in enumerate(obj) for p in leaves(v, (*path, i))]
    return [path]


# keys the readers use (counters, clocks, lengths, step and eval keys): drawn half the time
READ_KEYS = {"step", "samples", "train_s", "time", "timing_s/step", "timing_s/gen",
             "response_length/mean", "progress/total_rollouts", "progress/total_tasks",
             "progress/output_tokens", "progress/rollouts", "time/step", "train_runtime",
             "eval_runtime", "completions/mean_length", "status", "seed",
             "val-core/openai/gsm8k/reward/mean@1", "eval/gsm8k/avg@1", "eval_reward",
             "eval/openai/gsm8k/reward/mean@1", "reward/mean", "critic/score/mean", "run_id"}


def replace_leaf(draw, obj, indent=None) -> str:
    """`obj` as JSON text with one leaf replaced by a weird literal (NaN, 1e400, a list...)."""
    paths = leaves(obj)
    read = [p for p in paths if set(p) & READ_KEYS]
    path = draw(st.sampled_from(read if read and draw(st.booleans()) else paths))
    sentinel = "\u0000fuzz\u0000"
    if path:
        node = obj
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = sentinel
    else:
        obj = sentinel
    event(f"value of {path[-1] if path and isinstance(path[-1], str) else 'an item'}")
    return json.dumps(obj, indent=indent).replace(json.dumps(sentinel), draw(WEIRD_VALUE))


@st.composite
def mutate(draw, data: bytes, lines: bool = True, values: bool = True):
    """(kind, damaged bytes, line number of an inserted junk line or None). `lines`: the file
    is text lines; `values`: each line is a JSON object (whose values may be replaced)."""
    kinds = ["truncate", "flip", "bytes"] + (["junk_line", "drop_line", "dup_line"] if lines
                                             else []) + (["value"] * 3 if values else [])
    kind = draw(st.sampled_from(kinds))
    event(f"mutation {kind}")
    if kind == "truncate":
        return kind, data[:draw(st.integers(0, max(0, len(data) - 1)))], None
    if kind == "flip":
        i = draw(st.integers(0, len(data) - 1))
        return kind, data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:], None
    if kind == "bytes":
        i = draw(st.integers(0, len(data)))
        return kind, data[:i] + draw(st.binary(min_size=1, max_size=8)) + data[i:], None
    rows = data.split(b"\n")
    if rows[-1] == b"":
        rows.pop()
    k = draw(st.integers(0, len(rows) - 1))
    junk_at = None
    if kind == "junk_line":
        k = draw(st.integers(0, len(rows)))
        rows.insert(k, draw(st.sampled_from(JUNK_LINES)))
        junk_at = k + 1
    elif kind == "drop_line":
        del rows[k]
    elif kind == "dup_line":
        rows.insert(k, rows[k])
    else:
        rows[k] = replace_leaf(draw, json.loads(rows[k])).encode()
    return kind, b"\n".join(rows) + b"\n", junk_at


def whole_ends(data: bytes, tfrecord: bool) -> set[int]:
    """Lengths at which a prefix of `data` holds only whole records: lines of a JSON-lines
    file (the last newline may be missing) or TFRecords of an event file (8-byte length,
    4-byte CRC, data, 4-byte CRC)."""
    if not tfrecord:
        ends = {0} | {i + 1 for i, b in enumerate(data) if b == 0x0A}
        return ends | {e - 1 for e in ends if e}
    ends, pos = {0}, 0
    while pos + 12 <= len(data):
        pos += 12 + struct.unpack("<Q", data[pos:pos + 8])[0] + 4
        ends.add(pos)
    return ends


@st.composite
def weird_event(draw) -> bytes:
    """One TFRecord holding a scalar event with odd wall time, step, tag or value."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.record_writer import RecordWriter

    odd = st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e300, -1e300, 0.0])
    tag = draw(st.sampled_from(["train/reward", "train/policy_loss", "train/loss", "eval/runtime",
                                "eval/reward", "eval/eval_gsm8k_pass1"]) | st.text(max_size=8))
    ev = event_pb2.Event(
        wall_time=draw(odd | st.floats(0, 3000)), step=draw(st.integers(-2 ** 63, 2 ** 63 - 1)),
        summary=summary_pb2.Summary(value=[summary_pb2.Summary.Value(
            tag=tag, simple_value=draw(odd | st.floats(width=32, allow_nan=False)))]))
    buf = io.BytesIO()
    RecordWriter(buf).write(ev.SerializeToString())
    return buf.getvalue()


# ---------------------------------------------------------------- config files
SECTIONS = {name: sorted(f.annotation.model_fields) for name, f in Config.model_fields.items()
            if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)}
# made-up keys, JSON-quoted: printable text as is, or (one in four) any text \u-escaped
KEY = st.one_of(*[st.text(st.characters(blacklist_categories=("Cc", "Cs"),
                                        blacklist_characters=":"), min_size=1, max_size=10).map(
    lambda k: json.dumps(k, ensure_ascii=False))] * 3, st.text(st.characters(
        max_codepoint=0xFFFF, blacklist_categories=("Cs",), blacklist_characters=":"),
        min_size=1, max_size=10).map(json.dumps))
YAML_VALUES = [
    "0", "-1", "1", "2", "8", "16", "128", "0.5", "1.0e-4", "true", "false", "yes", "off", "~",
    ".inf", "-.inf", ".nan", "1e400", "99999999999999999999", "-99999999999999999999", "0x10",
    "0o17", "1_000", "2.5e-300", "[]", "{}", "[8, true]", "[1, [2, [3]]]", "{a: {b: {c: 1}}}",
    "!!binary aGVsbG8=", "!!python/object/apply:os.getcwd []", "!!str 5", "!!float nan",
    "&anchor 3", "*anchor", "sqrt", "linear", "none", "grpo", "ppo", "tiny", "addition",
    "dataset", "exact", "drop", '"\\ud800"', "2020-01-01", "'it''s'", "|\n    block text",
    "<<: {a: 1}", "[*anchor]", "? complex\n  : key",
    "5.0e-324", "-5.0e-324", "1.0e-320", "2.2250738585072014e-309",
    *(json.dumps(e) for e in ESCAPES)]
PLAUSIBLE = st.sampled_from(["1", "2", "4", "8", "16", "64", "128", "0.5", "1.0e-4", "true"])
YAML_VALUE = st.one_of(PLAUSIBLE, PLAUSIBLE, st.sampled_from(YAML_VALUES),
                       st.integers(-10 ** 6, 10 ** 25).map(str), st.floats().map(repr), KEY)


def real_or_made_up(names) -> st.SearchStrategy:
    """A real name four times in five, else a made-up key (any text, JSON-quoted)."""
    return st.one_of(*[st.sampled_from(sorted(names))] * 4, KEY)


@st.composite
def config_text(draw) -> str:
    """A config that `extends:` a preset, then random sections, keys (real and made up) and
    values of every YAML type; now and then a line given twice, a BOM, CRLF or tabs."""
    lines = [f"extends: {draw(st.sampled_from(preset_names()))}"]
    top = [*Config.model_fields, "extends", "derived"]
    for sec in draw(st.lists(real_or_made_up(top), max_size=4, unique=True)):
        if sec in SECTIONS and draw(st.integers(0, 3)):
            lines.append(f"{sec}:")
            lines += [f"  {key}: {draw(YAML_VALUE)}" for key in draw(
                st.lists(real_or_made_up(SECTIONS[sec]), min_size=1, max_size=3, unique=True))]
        else:
            lines.append(f"{sec}: {draw(YAML_VALUE)}")
    if draw(st.integers(0, 7)) == 0:
        event("a line twice")
        lines.append(draw(st.sampled_from(lines)))
    text = "\n".join(lines) + "\n"
    style = draw(st.sampled_from(["plain"] * 7 + ["bom", "crlf", "tabs"]))
    event(f"style {style}")
    return {"plain": text, "bom": "\ufeff" + text, "crlf": text.replace("\n", "\r\n"),
            "tabs": text.replace("  ", "\t")}[style]


# ---------------------------------------------------------------- dataset files
TEXT = st.one_of(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1,
                         max_size=20), st.sampled_from(ESCAPES)).filter(str.strip)
ANSWER = st.one_of(TEXT, st.integers(-10 ** 30, 10 ** 30),
                   st.floats(allow_nan=False, allow_infinity=False))
BAD_LINES = [b"not json", b"{", b"\xff\xfe", b"[1, 2]", b"42", b'"row"', b"null",
             b'{"prompt": "2+2"}', b'{"answer": "4"}', b'{"prompt": " \\t", "answer": "4"}',
             b'{"prompt": 5, "answer": "4"}', b'{"prompt": null, "answer": "4"}',
             b'{"prompt": {"a": 1}, "answer": "4"}', b'{"prompt": "2+2", "answer": true}',
             b'{"prompt": "2+2", "answer": null}', b'{"prompt": "2+2", "answer": " "}',
             b'{"prompt": "2+2", "answer": []}', b'{"prompt": [5], "answer": "4"}',
             b'{"prompt": [{"role": "system", "content": "x"}], "answer": "4"}',
             b'{"prompt": [{"content": "x"}], "answer": "4"}']
BAD_VERL_LINES = [b'{"prompt": [{"role": "user", "content": "x"}], "reward_model": {}}',
                  (b'{"prompt": [{"role": "user", "content": [1]}], '
                  b'"reward_model": {"ground_truth": "4"}}'),
                  (b'{"prompt": [{"role": "user", "content": "x"}], '
                  b'"reward_model": {"ground_truth": ""}}')]


@st.composite
def good_row(draw, verl: bool) -> bytes:
    answer = draw(ANSWER)
    if verl:
        content = draw(TEXT | TEXT.map(lambda t: [{"type": "text", "text": t}]))
        system = [{"role": "system", "content": draw(TEXT)}] if draw(st.booleans()) else []
        row = {"data_source": "fuzz", "prompt": [*system, {"role": "user", "content": content}],
               "reward_model": {"style": "rule", "ground_truth": answer}}
    else:
        row = {"prompt": draw(TEXT), "answer": answer, "id": draw(st.integers())}
    return json.dumps(row, ensure_ascii=draw(st.booleans())).encode()


@st.composite
def dataset_file(draw):
    """(lines, kinds): rows that are good, bad (a known fault) or blank, in the columns or
    the verl layout; the first row is good, so the layout is detected as drawn."""
    verl = draw(st.booleans())
    bad = st.sampled_from(BAD_LINES + (BAD_VERL_LINES if verl else []))
    lines, kinds = [draw(good_row(verl))], ["good"]
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["good"] * 4 + ["bad", "blank"]))
        lines.append(draw(good_row(verl)) if kind == "good" else draw(bad) if kind == "bad"
                     else draw(st.sampled_from([b"", b"  ", b"\t"])))
        kinds.append(kind)
    event(f"{'verl' if verl else 'columns'} layout, {'bad rows' if 'bad' in kinds else 'clean'}")
    return lines, kinds


# ---------------------------------------------------------------- run directories
def check_run(out: Path, cut: bool) -> None:
    """A complete run directory of strict JSON, `running` when its log was cut, nothing
    left beside it."""
    assert {p.name for p in out.iterdir()} == RUN_FILES
    summary = strict((out / "summary.json").read_text())
    strict((out / "manifest.json").read_text())
    for name in ("steps.jsonl", "evals.jsonl"):
        for row in (out / name).read_text().split("\n")[:-1]:
            assert isinstance(strict(row), dict)
    assert isinstance(yaml.safe_load((out / "config.yaml").read_text()), dict)
    assert summary["status"] in (("running",) if cut else ("running", "budget_exhausted"))
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]


@st.composite
def damage_run(draw, run: Path) -> Path:
    """Damage one file of `run` in place (its content, one value, emptied, removed, made a
    folder, another JSON type); return the file."""
    path = run / draw(st.sampled_from(sorted(RUN_FILES)))
    how = draw(st.sampled_from(["content"] * 4 + ["empty", "missing", "folder", "other type",
                                                   "symlink loop"]
                               + ["document"] * (path.suffix != ".jsonl")))
    event(f"{path.name}: {how}")
    raw = path.read_bytes()
    if how == "content":
        _, raw, _ = draw(mutate(raw, values=path.suffix == ".jsonl"))
    elif how == "document":  # one value of the whole document (config.yaml written as JSON)
        raw = replace_leaf(draw, yaml.safe_load(raw), indent=2).encode()
    elif how == "other type":
        raw = draw(st.sampled_from([b"[]", b'"text"', b"null", b"1", b"- 1\n", b"[1, {}]"]))
    path.unlink()
    if how == "folder":
        path.mkdir()
    elif how == "symlink loop":
        symlink_loop(path)
    elif how != "missing":
        path.write_bytes(b"" if how == "empty" else raw)
    return path


def symlink_loop(path: Path) -> None:
    """Make `path` a symbolic link to itself (opening it fails with ELOOP)."""
    path.symlink_to(path.name)


def list_bomb(n: int, depth: int = 1) -> str:
    """A YAML flow list of `n` items, nested `depth` deep: `[[1, 1, ...], ...]`."""
    text = "[" + ", ".join(["1"] * n) + "]"
    for _ in range(depth - 1):
        text = f"[{text}, {text}]"
    return text


def bad_utf8_parquet() -> bytes:
    """A Parquet file whose one prompt is not UTF-8 (pyarrow does not check on reading)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table({"prompt": ["zzzzzzzz"], "answer": ["4"]}), sink,
                   compression="none", write_statistics=False)
    return sink.getvalue().replace(b"zzzzzzzz", b"\xff" * 8)
