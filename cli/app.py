"""`ckpt-poc`: every command runs the matching Prefect flow.

With PREFECT_API_URL set, runs show in that server's UI; otherwise Prefect starts its
ephemeral local server for the run.
"""

# The docstring above is the app's --help. A command is a plain function in the module of
# its stage (cli/<stage>.py); COMMANDS and GROUPS below are the one place that names and
# registers it, in the order --help lists them. Its docstring is its --help, as paragraphs
# (help_paragraphs); docs/reference/cli.md is written from the same help (cli/reference.py).

from __future__ import annotations

import inspect
import re
from collections.abc import Callable

import typer

from cli import (
    baseline,
    compatibility,
    experiments,
    install,
    plan,
    poc,
    record,
    samples,
    status,
    window,
)
from cli import exit as exit_cmds

Command = Callable[..., None]

COMMANDS: tuple[tuple[str, Command], ...] = (
    ("baseline", baseline.baseline_cmd),
    ("side-by-side", experiments.side_by_side_cmd),
    ("sweep", compatibility.sweep_cmd),
    ("recovery", experiments.recovery_cmd),
    ("overhead", experiments.overhead_cmd),
    ("cold-start", experiments.cold_start_cmd),
    ("sample", window.sample_cmd),
    ("utilization", window.utilization_cmd),
    ("report", window.report_cmd),
    ("status", status.status_cmd),
    ("clean", status.clean_cmd),
    ("demo", poc.demo_cmd),
    ("snapshot", exit_cmds.snapshot_cmd),
    ("exit-diff", exit_cmds.exit_diff_cmd),
    ("install", install.install_cmd),
    ("opt-in", install.opt_in_cmd),
    ("uninstall", install.uninstall_cmd),
    ("poc", poc.poc_cmd),
    ("record", record.record_cmd),
)
# Sub-commands: `ckpt-poc GROUP COMMAND`, with the group's one-line help.
GROUPS: tuple[tuple[str, str, tuple[tuple[str, Command], ...]], ...] = (
    ("plan", "Check PoC plans.", (("check", plan.check_cmd),)),
    ("samples", "Sample history a site already has.", (("import", samples.import_cmd),)),
)


_BLANK_LINES = re.compile(r"\n\s*\n")


def help_paragraphs(doc: str | None) -> str:
    """A docstring as --help text: each paragraph's wrapped lines joined into one line, so that
    the help wraps whole sentences to the terminal's width instead of breaking a sentence where
    the source did. Blank lines still part paragraphs; a paragraph that starts with click's
    ``\\b`` (keep these line breaks) is kept as written."""
    paragraphs = _BLANK_LINES.split(inspect.cleandoc(doc or "").strip())
    return "\n\n".join(
        p if p.startswith("\b") else " ".join(line.strip() for line in p.splitlines())
        for p in paragraphs
    )


def build_app() -> typer.Typer:
    """The `ckpt-poc` app with every command of COMMANDS and GROUPS, each command's docstring
    its help (help_paragraphs)."""
    built = typer.Typer(no_args_is_help=True, add_completion=False, help=help_paragraphs(__doc__))
    for name, command in COMMANDS:
        built.command(name, help=help_paragraphs(command.__doc__))(command)
    for group, help_text, commands in GROUPS:
        sub = typer.Typer(no_args_is_help=True, help=help_text)
        for name, command in commands:
            sub.command(name, help=help_paragraphs(command.__doc__))(command)
        built.add_typer(sub, name=group)
    return built


app = build_app()
