"""`rlbatch` command line: parse -> config -> call a library function -> print.

Each command module registers itself on `app`. Library errors of type `UserError` (bad config,
dataset, model path or log file; output that cannot be written) print one line to stderr and
exit with status 2; with `--json` the last stdout line of a command is one JSON document. An
OSError that escaped a command but means its output cannot be written (a full disk, a
read-only folder, a file where a folder must be) is printed the same way, as an `OutputError`
naming its file; any other exception keeps its traceback.
"""

from __future__ import annotations

import sys

import typer

from rlbatch.core.errors import EXIT_USAGE, Terminated, UserError, output_error

app = typer.Typer(
    name="rlbatch",
    help="Measured batch sizing for online RL of language models (GRPO, PPO): scale the LR "
    "with sqrt(B/B0), check that sample-indexed curves stay aligned, measure throughput, and "
    "pick the configuration with the lowest time to target.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register() -> None:
    from rlbatch.cli import config_cmds

    config_cmds.register(app)
    for name in ("model_cmds", "train_cmds", "decode_cmds", "profile_cmds", "analyze_cmds", "data_cmds",
                 "plan_cmds", "ingest_cmds", "report_cmds"):
        try:
            module = __import__(f"rlbatch.cli.{name}", fromlist=["register"])
        except ModuleNotFoundError as exc:
            if exc.name != f"rlbatch.cli.{name}":
                raise
            continue
        module.register(app)


_register()


def main(argv: list[str] | None = None) -> None:
    try:
        app(args=argv, prog_name="rlbatch")
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except OSError as exc:
        if (err := output_error(exc, output=False)) is None:
            raise
        print(f"error: {err}", file=sys.stderr)
        sys.exit(EXIT_USAGE)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Terminated as exc:
        print(str(exc), file=sys.stderr)
        sys.exit(128 + exc.signum)


if __name__ == "__main__":
    main()
