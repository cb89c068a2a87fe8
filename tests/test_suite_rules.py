"""The suite's own rules (tests/README.md), checked on a throwaway test folder that uses
this suite's conftest: a `trained` test must say whether its outcome can depend on where a
run lands, and every session ends with its slowest tests and a warning past the limit."""

from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

CONFTEST = (Path(__file__).resolve().parent / "conftest.py").read_text()


def test_an_unclassified_trained_test_stops_collection(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_x="""
        import pytest

        @pytest.mark.trained
        def test_unclassified():
            pass

        @pytest.mark.trained
        @pytest.mark.lands
        def test_classified():
            pass
    """)
    result = pytester.runpytest_subprocess("--collect-only", "-q")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*1 trained test(s) not classified*test_x.py::test_unclassified"])
    assert "test_x.py::test_classified" not in result.stderr.str().split("not classified")[1]


def test_the_tiny_model_fixture_counts_as_trained(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_y="""
        def test_uses_the_model(tiny_model_dir):
            pass
    """)
    result = pytester.runpytest_subprocess("--collect-only", "-q")
    assert result.ret != 0
    result.stderr.fnmatch_lines(["*not classified*test_y.py::test_uses_the_model"])


def test_the_slowest_tests_are_listed_and_those_past_the_limit_warned(pytester, monkeypatch):
    monkeypatch.setenv("RLBATCH_SLOW_TEST_S", "0.2")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_z="""
        import time

        def test_quick():
            pass

        def test_slow():
            time.sleep(0.3)
    """)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == 0
    out = result.stdout.str()
    assert "ten slowest tests (setup + call)" in out
    (warning,) = [line for line in out.splitlines() if line.startswith("warning: ")]
    assert warning.startswith("warning: 1 test(s) over 0.2 s of setup plus call: ")
    assert "test_z.py::test_slow" in warning and "test_quick" not in warning


def test_two_workers_collect_trained_files_of_equal_rank_in_one_order(pytester):
    """`_file_order` picks the first trained file by its rank in LONGEST_FIRST; files outside
    it tie, and each xdist worker has its own string hash (PYTHONHASHSEED), so a tie broken
    by a set's order gave the workers different orders, which xdist refuses ("Different
    tests were collected"). Eight tied files: a tie left to the hash differs between two
    workers seven times in eight."""
    pytester.makeconftest(CONFTEST)
    for name in "abcdefgh":
        pytester.makepyfile(**{f"test_{name}": """
            import pytest

            @pytest.mark.trained
            @pytest.mark.landing_free
            def test_one():
                pass
        """})
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadfile",
                                           "--no-loadscope-reorder", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str()[-2000:]
    result.assert_outcomes(passed=8)
