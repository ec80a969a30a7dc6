"""docs/reference/cli.md is what the commands' help gives today (cli/reference.py writes it),
and `--help` reads as whole sentences: a docstring's wrapped lines are joined (cli/app.py)."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from cli.app import app, help_paragraphs
from cli.reference import MARKER, PAGE, REGENERATE, main, page_text

REPO = Path(__file__).resolve().parents[2]


def test_the_committed_page_is_what_the_commands_help_gives_today() -> None:
    assert PAGE == REPO / "docs" / "reference" / "cli.md"
    written = PAGE.read_text(encoding="utf-8")
    assert written == page_text(written), (
        f"docs/reference/cli.md is out of date with the commands' help (cli/): run {REGENERATE}"
    )


def test_every_command_has_its_section_usage_and_parameters() -> None:
    page = PAGE.read_text(encoding="utf-8")
    generated = page.partition(MARKER)[2]
    for heading in ("### baseline", "### demo", "### plan check", "### samples import"):
        assert f"\n{heading}\n" in generated, heading
    assert "ckpt-poc samples import [OPTIONS] PLAN FILE" in generated
    assert "| `--live`, `--no-live` | option | query sacct on this host |" in generated
    # A path default is the repository's, a bare `<` or `|` is text, not markup or a column.
    assert "(default: `plans/demo.yaml`)" in generated
    assert "&lt;data_dir&gt;" in generated and "not '\\|'" in generated


def test_check_mode_says_what_to_run_and_keeps_the_hand_written_part(
    tmp_path: Path, capsys
) -> None:
    out = tmp_path / "cli.md"
    out.write_text(f"# CLI\n\nWritten by hand.\n\n{MARKER}\n\n### stale\n", encoding="utf-8")
    assert main(["--check", "--output", str(out)]) == 1
    assert REGENERATE in capsys.readouterr().err
    assert main(["--output", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert text.startswith(f"# CLI\n\nWritten by hand.\n\n{MARKER}\n\n### baseline\n")
    assert "### stale" not in text
    assert main(["--check", "--output", str(out)]) == 0
    out.write_text("# CLI\n", encoding="utf-8")  # no marker: nothing to write below
    assert main(["--output", str(out)]) == 1
    assert MARKER in capsys.readouterr().err


def test_help_paragraphs_join_wrapped_lines_and_keep_paragraphs() -> None:
    doc = """First sentence runs
    on. Second one.

    Another paragraph,
    wrapped.

    \b
    kept
    as is"""
    assert help_paragraphs(doc) == (
        "First sentence runs on. Second one.\n\nAnother paragraph, wrapped.\n\n\b\nkept\nas is"
    )
    assert help_paragraphs(None) == ""


def test_help_breaks_no_sentence_where_the_source_wrapped_it() -> None:
    shown = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0
    # cli/app.py's docstring wraps after "starts its"; the help must not.
    assert "otherwise Prefect starts its ephemeral local server for the run." in shown.output
    # The command list: demo's docstring wraps after "with a"; its entry is one paragraph.
    assert "on plans/demo.yaml with a short window. Check the plan" in shown.output
