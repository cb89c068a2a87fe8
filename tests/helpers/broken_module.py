"""A reward module whose import fails (tests/test_reliability.py)."""

RATIO = 1 / 0


def f(prompt, completion, example):
    return 1.0
