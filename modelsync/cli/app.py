"""The application: parse input, build Settings once, run the engine, map errors to exit codes.

Every ModelsyncError becomes one `error: ...` line on stderr and its exit code
(modelsync.errors.ExitCode), and so does a mistake the parser catches (an
unknown option, a missing argument: exit 2); anything else is a bug and keeps
its traceback. Ctrl-C and SIGTERM stop any command at once with one
`error: interrupted ...` line and exit 130 or 143; the next run resumes
(modelsync/interrupt.py). Commands that need no S3 (a warm pull, ls) never
import the S3 stack.

Help is rendered as plain text, without markup, so the `[env var: ...; default: ...]`
of each option shows as written; tests/test_cli_help.py renders every command's help.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer

# typer 0.29 vendors click under this private name and re-exports neither the help formatter nor
# the parser's errors: typer is pinned to 0.29 (pyproject.toml), and tests/test_cli_help.py and
# tests/test_cli_errors.py check the behaviour relied on (tests/test_imports.py lists the import).
from typer._click import Context, HelpFormatter
from typer._click.exceptions import NoArgsIsHelpError
from typer._click.exceptions import UsageError as ParseError
from typer.core import TyperCommand

from modelsync import interrupt
from modelsync.cli import cache, node, prefetch, pull, verify
from modelsync.cli.options import user_errors
from modelsync.errors import ExitCode

app = typer.Typer(
    name="modelsync",
    help="Keep model weights staged on GPU nodes: verified, atomic, resumable pulls from S3.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"max_content_width": 120},
)


class _Command(TyperCommand):
    """Help that lists arguments by name alone (typer adds `<str>`, `<list[str]>`: noise to a reader)."""

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        params = self.get_params(ctx)
        arguments = [
            (f"{p.metavar or p.name}{'...' if p.nargs != 1 else ''}", getattr(p, "help", None) or "")
            for p in params
            if p.param_type_name == "argument"
        ]
        options = [r for p in params if p.param_type_name == "option" and (r := p.get_help_record(ctx))]
        for title, rows in (("Arguments", arguments), ("Options", options)):
            if rows:
                with formatter.section(title):
                    formatter.write_dl(rows)


def run(argv: Sequence[str]) -> int:
    """Run the command line on `argv`; the process's exit code.

    The parser's own mistakes (unknown option, missing argument, bad integer) are
    printed as one `error:` line like every other user error, not as a usage block.
    """
    try:
        code = app(args=list(argv), prog_name="modelsync", standalone_mode=False)
    except NoArgsIsHelpError as exc:
        exc.show()
        return int(ExitCode.USAGE)
    except ParseError as exc:
        where = f"`{exc.ctx.command_path} --help`" if exc.ctx is not None else "`modelsync --help`"
        message = " ".join(exc.format_message().split())
        typer.echo(f"error: {message} (see {where})", err=True)
        return int(ExitCode.USAGE)
    except typer.Abort as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt):  # Ctrl-C or SIGTERM outside a command's body
            return interrupt.report()
        typer.echo("error: aborted", err=True)
        return int(ExitCode.INTERNAL)
    return code if isinstance(code, int) else 0


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"modelsync {version('modelsync')}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", is_eager=True, callback=_print_version, help="Print the version and exit."),
    ] = False,
) -> None:
    """Keep model weights staged on GPU nodes: verified, atomic, resumable pulls from S3."""


for _name, _command in (
    ("pull", pull.pull),
    ("publish", pull.publish),
    ("demo", pull.demo),
    ("ls", cache.ls),
    ("evict", cache.evict_command),
    ("pin", cache.pin),
    ("unpin", cache.unpin),
    ("verify", verify.verify),
    ("gc", cache.gc),
    ("plan", node.plan),
    ("daemon", node.daemon),
    ("prefetch", prefetch.prefetch),
):
    app.command(_name, cls=_Command)(user_errors(_command))
