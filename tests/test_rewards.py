"""Reward functions: table-driven cases computed by hand (rollout/rewards.py)."""

from __future__ import annotations

import pytest

from rlbatch.core.errors import ConfigError, UserError
from rlbatch.rollout.rewards import (
    last_boxed,
    last_number,
    make_reward,
    parse_number,
    reference_completion,
)
from rlbatch.rollout.tasks import Example


def score(spec: str, completion: str, answer: str, tolerance: float = 1e-6):
    return make_reward(spec, tolerance)("prompt", completion, Example("prompt", answer))


@pytest.mark.parametrize("text, value", [
    ("42", 42.0), ("-42", -42.0), ("+7", 7.0), ("1,234", 1234.0), ("-1,234,567.5", -1234567.5),
    ("$1,234.50", 1234.5), ("3.", 3.0), (".5", 0.5), ("1e3", 1000.0), ("3/4", 0.75),
    ("-3/4", -0.75), ("\\frac{1}{2}", 0.5), ("-\\dfrac{3}{4}", -0.75), ("50\\%", 50.0),
    ("\u22125", -5.0), (" 12 ", 12.0),
    ("abc", None), ("", None), ("1/0", None), ("12,34", None), ("1e999", None), ("4 apples", None),
])
def test_parse_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize("text, value", [
    ("the answer is 42", 42.0), ("5-3=2", 2.0), ("so x=-3", -3.0), ("total: -17 apples", -17.0),
    ("1,234,567 is big", 1234567.0), ("the answer is 3/4.", 0.75), ("\\frac{1}{2} or 0.25", 0.25),
    ("2 then 3 then -1.5.", -1.5), ("no digits", None), ("", None),
])
def test_last_number(text, value):
    assert last_number(text) == value


@pytest.mark.parametrize("text, content", [
    ("\\boxed{42}", "42"),
    ("first \\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{\\sqrt{\\frac{a}{b}}} end", "\\sqrt{\\frac{a}{b}}"),
    ("\\fbox{7}", "7"),
    ("\\boxed {x}", "x"),
    ("\\boxed{unclosed", None),
    ("no box", None),
])
def test_last_boxed(text, content):
    assert last_boxed(text) == content


@pytest.mark.parametrize("spec, completion, answer, expected", [
    # exact: whitespace stripped, never None
    ("exact", " 9750\n", "9750", 1.0),
    ("exact", "9751", "9750", 0.0),
    ("exact", "", "9750", 0.0),
    # numeric: last number, commas, signs, decimals, fractions
    ("numeric", "so the total is 1,234", "1234", 1.0),
    ("numeric", "first 5 then 7", "5", 0.0),
    ("numeric", "it is -3", "-3", 1.0),
    ("numeric", "it is 3", "-3", 0.0),
    ("numeric", "half: 1/2", "0.5", 1.0),
    ("numeric", "2.50 dollars", "2.5", 1.0),
    ("numeric", "no number at all", "5", None),  # the extractor finds nothing
    ("numeric", "5", "blue", None),  # the ground truth does not parse
    ("numeric", "72", "48 + 24 = 72\n#### 72", 1.0),  # a GSM8K solution as ground truth
    # gsm8k: the number after the last ####
    ("gsm8k", "Natalia sold 48/2 = 24 clips.\n#### 72", "72", 1.0),
    ("gsm8k", "#### 1,234", "48 + 24\n#### 1234", 1.0),
    ("gsm8k", "#### $18", "18", 1.0),
    ("gsm8k", "#### -5", "-5", 1.0),
    ("gsm8k", "#### 42\n#### 43", "42", 0.0),  # the last marker counts
    ("gsm8k", "#### 41", "#### 42", 0.0),
    ("gsm8k", "the answer is 42", "42", None),  # no ####
    ("gsm8k", "#### forty-two", "42", None),  # no number after ####
    ("gsm8k", "#### 42", "forty-two", None),  # ground truth does not parse
    # boxed: last \boxed{}, nested braces, numbers or normalized LaTeX
    ("boxed", "so \\boxed{42}.", "42", 1.0),
    ("boxed", "\\boxed{41} no wait \\boxed{42}", "42", 1.0),
    ("boxed", "\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),
    ("boxed", "\\boxed{\\frac{1}{2}}", "0.5", 1.0),  # both parse: numeric comparison
    ("boxed", "\\boxed{\\dfrac{1}{2}}", "\\boxed{0.5}", 1.0),
    ("boxed", "\\boxed{-1,000}", "-1000", 1.0),
    ("boxed", "\\boxed{\\sqrt{2}}", "\\sqrt{2}", 1.0),  # not numbers: string comparison
    ("boxed", "\\boxed{ \\left( 1, 2 \\right) }", "(1,2)", 1.0),
    ("boxed", "\\boxed{\\sqrt{3}}", "\\sqrt{2}", 0.0),
    ("boxed", "\\boxed{43}", "42", 0.0),
    ("boxed", "the answer is 42", "42", None),  # no \boxed{}
    ("boxed", "\\boxed{42", "42", None),  # unbalanced
])
def test_reward_table(spec, completion, answer, expected):
    assert score(spec, completion, answer) == expected


@pytest.mark.parametrize("tolerance, completion, answer, expected", [
    # Edges use binary-exact values so `<=` is tested at equality.
    # below 1 in magnitude the tolerance is absolute: |a - b| <= tol
    (0.25, "0.75", "0.5", 1.0),
    (0.25, "0.7501", "0.5", 0.0),
    (0.25, "0.25", "0.5", 1.0),
    # above 1 it is relative: |a - b| <= tol * |b|
    (0.25, "125", "100", 1.0),
    (0.25, "125.01", "100", 0.0),
    (0.25, "-75", "-100", 1.0),
    (0.25, "-74.99", "-100", 0.0),
    (0.0, "3", "3", 1.0),
    (0.0, "3.0000001", "3", 0.0),
    (1e-6, "1000000.5", "1000000", 1.0),
    (1e-6, "1000001.5", "1000000", 0.0),
])
def test_numeric_tolerance_edges(tolerance, completion, answer, expected):
    assert score("numeric", completion, answer, tolerance) == expected
    assert score("gsm8k", f"#### {completion}", answer, tolerance) == expected
    assert score("boxed", f"\\boxed{{{completion}}}", answer, tolerance) == expected


def test_unknown_spec_is_a_config_error_naming_the_field():
    with pytest.raises(ConfigError, match=r"^task\.reward: unknown reward 'f1'"):
        make_reward("f1", 0.0)


def test_custom_reward_by_import_path(tmp_path, monkeypatch):
    (tmp_path / "my_rewards.py").write_text(
        "def length_match(prompt, completion, example):\n"
        "    return len(completion) == len(example.answer)\n"
        "def maybe(prompt, completion, example):\n"
        "    return None if completion == '?' else 0.25\n"
        "def bad(prompt, completion, example):\n"
        "    return 'yes'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert score("my_rewards:length_match", "abc", "xyz") == 1.0
    assert score("my_rewards:length_match", "ab", "xyz") == 0.0
    assert score("my_rewards:maybe", "?", "x") is None
    assert score("my_rewards:maybe", "!", "x") == 0.25
    with pytest.raises(ConfigError, match="returned str"):
        score("my_rewards:bad", "a", "b")
    with pytest.raises(ConfigError, match=r"task\.reward: module 'my_rewards' has no function"):
        make_reward("my_rewards:missing", 0.0)


@pytest.mark.parametrize("spec, message", [
    ("no_such_module_xyz:f", r"task\.reward: cannot import module 'no_such_module_xyz'"),
    (":f", r"task\.reward: ':f' is not of the form module:function"),
    ("os:", r"task\.reward: 'os:' is not of the form module:function"),
])
def test_custom_reward_errors_are_one_line_user_errors(spec, message):
    with pytest.raises(UserError, match=message) as info:
        make_reward(spec, 0.0)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("spec, answer, completion", [
    ("exact", "42", "42"),
    ("gsm8k", "42", "#### 42"),
    ("gsm8k", "a\n#### 42", "a\n#### 42"),
    ("boxed", "\\frac{1}{2}", "\\boxed{\\frac{1}{2}}"),
    ("boxed", "\\boxed{3}", "\\boxed{3}"),
])
def test_reference_completion_scores_one(spec, answer, completion):
    assert reference_completion(spec, answer) == completion
    assert score(spec, completion, answer) == 1.0
