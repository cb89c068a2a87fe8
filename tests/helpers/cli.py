"""`rlbatch ARGS` run in this process, for tests: the one CLI runner, and `--set` pairs."""

from __future__ import annotations

from rlbatch.cli.main import main


def run_cli(args, capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `rlbatch ARGS` run in this process, the output
    captured by pytest's `capsys`. Arguments are made strings (a Path may be passed as it
    is); the status is 0 when the command returned without exiting."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def set_flags(items) -> list[str]:
    """`--set ITEM` for each item."""
    return [x for item in items for x in ("--set", item)]
