"""docs/reference/cli.md from the CLI itself: each command's help, usage line and parameters,
read from typer's click tree of `cli.app.app`, so the page says what `--help` says.

    scripts/cli-reference            # write docs/reference/cli.md
    scripts/cli-reference --check    # write nothing; exit 1 when the page is out of date

The page's top (what every command shares, the environment) is prose kept by hand: everything
down to the MARKER line is kept as it is, and everything after it is written here, the same
way every time, one section per command in the order `ckpt-poc --help` lists them.
"""

from __future__ import annotations

import html
import sys
from collections.abc import Iterator
from enum import Enum
from pathlib import Path

import typer.main
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

from cli.app import app
from tasks.data import generated
from tasks.data.generated import Generated, below_marker

REPO_ROOT = Path(__file__).resolve().parent.parent
PAGE = REPO_ROOT / "docs" / "reference" / "cli.md"
# What writes the page again; said whenever it is out of date.
REGENERATE = "scripts/cli-reference"
PROG = "ckpt-poc"
# The hand-written part ends with this line (an HTML comment: the site does not show it).
MARKER = (
    f"<!-- Below: written by {REGENERATE} from each command's help in cli/; "
    "edit the help there, not this page. -->"
)

Parameter = TyperArgument | TyperOption


def leaf_commands(
    group: TyperGroup, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], TyperCommand]]:
    """Every command that runs something, with its words after `ckpt-poc`, in --help's order
    (a group's commands in its place)."""
    for name, command in group.commands.items():
        if getattr(command, "hidden", False):
            continue
        if isinstance(command, TyperGroup):
            yield from leaf_commands(command, (*path, name))
        elif isinstance(command, TyperCommand):
            yield (*path, name), command


def _params(command: TyperCommand) -> list[Parameter]:
    return [
        p
        for p in command.params
        if isinstance(p, TyperArgument | TyperOption) and not getattr(p, "hidden", False)
    ]


def _argument_name(param: TyperArgument) -> str:
    return param.metavar or (param.name or "").upper()


def usage(path: tuple[str, ...], command: TyperCommand) -> str:
    """The usage line, click's way: `ckpt-poc plan check [OPTIONS] PLAN`."""
    words = [PROG, *path, "[OPTIONS]"]
    for param in _params(command):
        if isinstance(param, TyperArgument):
            name = _argument_name(param)
            name = name if param.required else f"[{name}]"
            words.append(name + ("..." if param.nargs != 1 else ""))
    return " ".join(words)


def _default(param: Parameter) -> str | None:
    """A default worth saying: not a flag's, not None; a path in the repository relative."""
    value = param.default
    if isinstance(param, TyperOption) and param.is_flag:
        return None
    if value is None or callable(value) or not param.show_default:
        return None
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, Path) and value.is_relative_to(REPO_ROOT):
        value = value.relative_to(REPO_ROOT).as_posix()
    return str(value)


def _cell(text: str) -> str:
    """Text for a table cell: no markup of its own, no column break."""
    return html.escape(text, quote=False).replace("|", "\\|")


def param_row(param: Parameter) -> str:
    """One table row: the parameter's names, kind, help and default."""
    if isinstance(param, TyperArgument):
        names, kind = [_argument_name(param)], "argument"
    else:
        names, kind = [*param.opts, *param.secondary_opts], "option"
    what = " ".join((param.help or "").split())
    default = _default(param)
    if default is not None:
        what = f"{what} (default: `{default}`)".strip()
    shown = ", ".join(f"`{n}`" for n in names)
    return f"| {shown} | {kind} | {_cell(what)} |"


def help_markdown(command: TyperCommand) -> str:
    """The command's help as markdown paragraphs (the text --help prints above its tables)."""
    text = (command.help or "").partition("\f")[0].strip()
    paragraphs = [p.removeprefix("\b").strip() for p in text.split("\n\n")]
    return "\n\n".join(html.escape(p, quote=False) for p in paragraphs if p)


def command_section(path: tuple[str, ...], command: TyperCommand) -> str:
    """One command's section: heading, help, usage and its parameters' table."""
    lines = [f"### {' '.join(path)}", ""]
    helped = help_markdown(command)
    if helped:
        lines += [helped, ""]
    lines += ["```text", usage(path, command), "```", ""]
    rows = [param_row(p) for p in _params(command)]
    if rows:
        lines += ["| name | kind | what it is |", "|---|---|---|", *rows, ""]
    return "\n".join(lines)


def commands_markdown() -> str:
    """Every command's section, in the order `ckpt-poc --help` lists them."""
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    return "\n".join(command_section(path, command) for path, command in leaf_commands(root))


# The page: its hand-written part down to MARKER, then every command's section.
page_text = below_marker("docs/reference/cli.md", MARKER, commands_markdown)
PAGE_FILE = Generated("docs/reference/cli.md", "the commands' help (cli/)", REGENERATE, page_text)


def main(argv: list[str] | None = None) -> int:
    return generated.main(
        [PAGE_FILE], "Write the CLI reference page from the commands' help.", argv
    )


if __name__ == "__main__":
    sys.exit(main())
