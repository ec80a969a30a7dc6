"""Files the documentation generates from the code (the plan's JSON Schema, the CLI page, the
datasets' and measures' pages): each one's check and write, and the one command line they
share (``--check`` writes nothing and exits 1 when a file is out of date)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tasks.data.render import write_atomically

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Generated:
    """One generated file: where it lives under the repository, what it is written from and
    what writes it again (both said when it is out of date), and ``text``: the whole file
    from what it holds now (None: no file yet), raising ValueError when that cannot be."""

    path: str
    source: str
    regenerate: str
    text: Callable[[str | None], str]

    def _read(self, path: Path) -> tuple[str | None, str]:
        """What ``path`` holds (None: no file) and what it should hold; ValueError when the
        file cannot be written from what it holds (a page without its marker)."""
        try:
            written: str | None = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            written = None
        return written, self.text(written)

    def out_of_date(self, path: Path) -> str | None:
        """Why ``path`` is not what the code gives today (None: it is)."""
        try:
            written, wanted = self._read(path)
        except ValueError as exc:
            return f"{path}: {exc}"
        if written is None:
            return f"{path} does not exist: run {self.regenerate}"
        if written != wanted:
            return f"{path} is out of date with {self.source}: run {self.regenerate}"
        return None

    def write(self, path: Path) -> str | None:
        """Write the file at ``path``; the problem, if it could not be written."""
        try:
            _, text = self._read(path)
        except ValueError as exc:
            return f"{path}: {exc}"
        write_atomically(path, text.encode("utf-8"))
        print(f"wrote {path}")
        return None


def below_marker(name: str, marker: str, body: Callable[[], str]) -> Callable[[str | None], str]:
    """A page's ``text``: its hand-written part down to the ``marker`` line kept as it is,
    then ``body()``."""

    def text(current: str | None) -> str:
        if current is None:
            raise ValueError(f"{name} does not exist: its hand-written part comes first")
        head, found, _ = current.partition(marker + "\n")
        if not found:
            raise ValueError(f"{name} has no line {marker!r}")
        return head + marker + "\n\n" + body().rstrip("\n") + "\n"

    return text


def main(files: Sequence[Generated], description: str, argv: list[str] | None = None) -> int:
    """The generators' command line: one file takes ``--output``, several ``--root`` (the
    repository whose files to write)."""
    parser = argparse.ArgumentParser(prog=files[0].regenerate, description=description)
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 when a file is out of date"
    )
    if len(files) == 1:
        parser.add_argument(
            "--output", type=Path, default=REPO_ROOT / files[0].path, help="default: %(default)s"
        )
    else:
        parser.add_argument(
            "--root", type=Path, default=REPO_ROOT, help="the repository whose files to write"
        )
    args = parser.parse_args(argv)
    paths = [args.output] if len(files) == 1 else [args.root / f.path for f in files]
    done = [
        (f.out_of_date(p) if args.check else f.write(p)) for f, p in zip(files, paths, strict=True)
    ]
    problems = [p for p in done if p]
    for problem in problems:
        print(problem, file=sys.stderr)
    if args.check and not problems:
        print(f"{', '.join(str(p) for p in paths)}: up to date")
    return 1 if problems else 0
