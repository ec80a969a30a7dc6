"""What every `ckpt-poc` command shares: the consoles, the arguments and options declared
once, JSON output, and `command_body`, the one way a command readies Prefect and says a
`CkptPocError` (a clear line, exit 1).

Imports no command module (they import this), and nothing of Prefect or flows/ at import:
a command that only reads must answer without loading them.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.text import Text

from tasks.data.errors import CkptPocError, PlanError

# Errors are never wrapped (a log or a CI page has its own width); tables still fit.
# emoji off: a line number like `plan.yaml:100:` must not print as an emoji.
err = Console(stderr=True, soft_wrap=True, emoji=False)
# Piped into a log, rich would wrap tables at 80 columns; a log has room for their width.
out = Console(emoji=False) if Console().is_terminal else Console(width=160, emoji=False)

PlanArg = Annotated[Path, typer.Argument(help="the PoC plan (YAML)")]


def _json_option(what: str) -> Any:
    return Annotated[bool, typer.Option("--json", help=f"print the {what} as JSON")]


# `--json`, named after what the command prints (its help says which).
JsonOpt = _json_option("result")
SummaryJsonOpt = _json_option("summary")
RowsJsonOpt = _json_option("rows")
ReportJsonOpt = _json_option("report")
StatusJsonOpt = _json_option("status")

NoWaitOpt = Annotated[
    bool,
    typer.Option(
        "--no-wait",
        help="refuse at once when another experiment holds the plan's nodes (default: wait)",
    ),
]
WeekOpt = Annotated[
    str | None, typer.Option("--week", help="ISO week YYYY-Www (default: the current week)")
]


def write_json(data: object, default: Callable[[Any], Any] | None = None) -> None:
    """The `--json` output: one line on stdout, nothing else."""
    sys.stdout.write(json.dumps(data, default=default) + "\n")


def fail(exc: CkptPocError) -> NoReturn:
    """Say the error (a plan's problems one a line, else one `error: …` line); exit 1."""
    if isinstance(exc, PlanError):
        err.print(f"[bold red]plan {exc.path} has {len(exc.problems)} problem(s):[/]")
        for problem in exc.problems:
            err.print(f"  {problem}", markup=False, highlight=False)
    else:
        # The message is text, not markup: "[fault,arm]" in a gate's name must survive.
        err.print(Text.assemble(("error: ", "bold red"), str(exc)), highlight=False)
    raise typer.Exit(1)


@contextmanager
def command_body(
    *, prefect: bool = True, on_error: Callable[[], object] | None = None
) -> Iterator[None]:
    """A command's work: `with command_body(): from flows.x import x; result = x(...)`.

    With `prefect` (commands that run a flow), first a Prefect API and a terminal that
    shows each error once (`flows_ready`); import the flow inside the block, after it.
    A `CkptPocError` raised inside is said by `fail` (exit 1), after `on_error` (an undo)
    when given; one raised while readying Prefect is said at once.
    """
    if prefect:
        try:
            _flows_ready()
        except CkptPocError as exc:
            fail(exc)
    try:
        yield
    except CkptPocError as exc:
        if on_error is not None:
            on_error()
        fail(exc)


class _TerminalNoise(logging.Filter):
    """On the terminal, a failed run's error is printed once, by the command; Prefect's own
    "Finished in state Failed(...)" and exception lines still reach the UI (API handler).
    A "View at" link to the command's own server is dropped too: it has no UI, and is gone
    when the command ends."""

    def __init__(self, own_server: bool) -> None:
        super().__init__()
        self.own_server = own_server

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.INFO or not record.name.startswith("prefect."):
            return True
        exc = record.exc_info[1] if record.exc_info else None
        message = record.getMessage()
        return not (
            isinstance(exc, CkptPocError)
            or message.startswith("Finished in state Failed(")
            or message.startswith(("Task run failed with exception:", "Encountered exception"))
            or (self.own_server and message.startswith("View at "))
        )


def _flows_ready() -> None:
    """Before a command's first flow: a Prefect API (PREFECT_API_URL, else the command's
    own server, cli/server.py) and a terminal that shows each error once."""
    from cli.server import ensure_prefect_api, server_pid

    ensure_prefect_api()
    from prefect.logging.handlers import PrefectConsoleHandler

    # Prefect builds its console handlers anew whenever it reconfigures logging, so the
    # filter goes on the class (in this CLI process only), not on one handler object.
    if not getattr(PrefectConsoleHandler, "_ckpt_poc_quiet", False):
        quiet = _TerminalNoise(own_server=server_pid() is not None)
        shown = PrefectConsoleHandler.filter
        PrefectConsoleHandler.filter = lambda self, record: bool(  # type: ignore[method-assign]
            shown(self, record) and quiet.filter(record)
        )
        PrefectConsoleHandler._ckpt_poc_quiet = True  # type: ignore[attr-defined]
