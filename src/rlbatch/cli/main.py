"""`rlbatch` command line: parse -> config -> call a library function -> print.

Each command module registers itself on `app`. Library errors of type `UserError` (bad config,
dataset, model path or log file; output that cannot be written) print one line to stderr and
exit with status 2; with `--json` the last stdout line of a command is one JSON document. An
OSError that escaped a command but means its output cannot be written (a full disk, a
read-only folder, a file where a folder must be) is printed the same way, as an `OutputError`
naming its file; any other exception keeps its traceback.
"""

from __future__ import annotations

import inspect
import signal
import sys

import typer
from typer.core import TyperOption

from rlbatch.cli import (
    analyze_cmds,
    config_cmds,
    data_cmds,
    decode_cmds,
    ingest_cmds,
    model_cmds,
    plan_cmds,
    profile_cmds,
    replay_cmds,
    report_cmds,
    train_cmds,
)
from rlbatch.core.errors import (
    EXIT_FAILED,
    EXIT_USAGE,
    RunFailed,
    Terminated,
    UserError,
    output_error,
)

app = typer.Typer(
    name="rlbatch",
    help="Measured batch sizing for online RL of language models (GRPO, PPO): scale the LR "
    "with sqrt(B/B0), check that sample-indexed curves stay aligned, measure throughput, and "
    "pick the configuration with the lowest time to target.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        from rlbatch import __version__

        print(f"rlbatch {__version__}")
        raise typer.Exit(0)


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_version,
                                          is_eager=True, help="print rlbatch's version")) -> None:
    """Measured batch sizing for online RL of language models."""


def _unwrap(doc: str | None) -> str | None:
    """A docstring as help text: paragraphs kept, the line breaks inside them joined (the
    help renderer would otherwise keep them and break sentences at odd places)."""
    if not doc:
        return doc
    paragraphs = inspect.cleandoc(doc).split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs)


def _tidy_help(typer_app: typer.Typer) -> None:
    for cmd in typer_app.registered_commands:
        if cmd.help is None and cmd.callback is not None:
            cmd.help = _unwrap(cmd.callback.__doc__)
    for group in typer_app.registered_groups:
        _tidy_help(group.typer_instance)


def _flag_type(self, ctx):
    """No `<bool>` beside a flag in help: a flag takes no value."""
    return None if self.is_flag else _option_type(self, ctx)


_option_type = TyperOption.display_type_rich
TyperOption.display_type_rich = _flag_type
for _module in (config_cmds, model_cmds, train_cmds, decode_cmds, profile_cmds, analyze_cmds,
                data_cmds, plan_cmds, ingest_cmds, report_cmds, replay_cmds):  # the order of `rlbatch --help`
    _module.register(app)
_tidy_help(app)


def main(argv: list[str] | None = None) -> None:
    from rlbatch.cli import common

    common.INVOKED[:] = list(argv) if argv is not None else sys.argv[1:]
    common.WHOLE_PROCESS = argv is None
    try:
        app(args=argv, prog_name="rlbatch")
    except RunFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(EXIT_FAILED)
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
    finally:
        if argv is None:  # the process ends now: a late Ctrl-C must not raise in atexit callbacks
            signal.signal(signal.SIGINT, signal.SIG_IGN)


if __name__ == "__main__":
    main()
