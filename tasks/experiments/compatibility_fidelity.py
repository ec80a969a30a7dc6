"""Is a restored run the same as one never interrupted? The plan's fidelity check, on files.

Each ``fidelity.files`` item is compared between the uninterrupted reference run's copy and
the managed run's copy (the one taken through checkpoint → kill → restore cycles): the
same SHA-256 digest, or — with ``numbers`` — the same numbers, in order, each within
``rel_tol``/``abs_tol`` of the reference's. ``{log}`` is the copy's own stdout/stderr log.

A check that cannot be made is bad input, said with its field (``BadInput``): a file
the reference run never wrote, a regex that matches nothing in it, a match that is no
number. A managed run that lacks the file, or has other numbers, *differs*.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from tasks.data.errors import CkptPocError
from tasks.data.plan import Fidelity, FidelityFile, Numbers
from tasks.data.plan_workload import COPY_DIR, LOG

FidelityVerdict = Literal["same", "differs", "not checked"]  # datasets.FIDELITY_VERDICTS
MAX_DIFFS_SAID = 3


class BadInput(CkptPocError):
    """What the plan says of a workload cannot be done with it (names the field): a
    fidelity check that cannot be made, a prepare command that fails, a workload that
    exits before its first checkpoint. That workload's result; the others still run."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


@dataclass(frozen=True)
class CopyFiles:
    """Where one copy's files are: its folder (``{copy_dir}``) and its log (``{log}``)."""

    copy_dir: Path
    log: Path

    def resolve(self, path: str) -> Path:
        if path == LOG:
            return self.log
        return self.copy_dir / path.removeprefix(COPY_DIR + "/")


@dataclass(frozen=True)
class FileVerdict:
    path: str
    verdict: FidelityVerdict
    detail: str


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def numbers_in(text: str, numbers: Numbers, field: str) -> list[tuple[str, float]]:
    """Every (name, value) the regex captures, in order: a named group by its name, an
    unnamed one as ``#k``; a capture that is no number is bad input."""
    pattern = numbers.pattern()
    names = {index: name for name, index in pattern.groupindex.items()}
    found: list[tuple[str, float]] = []
    for match in pattern.finditer(text):
        for k in range(1, pattern.groups + 1):
            raw = match.group(k)
            if raw is None:
                continue
            try:
                value = float(raw)
            except ValueError:
                raise BadInput(
                    f"{field}.numbers.regex", f"group {names.get(k, k)} captured {raw!r}: no number"
                ) from None
            found.append((names.get(k, f"#{k}"), value))
    return found


def _close(a: float, b: float, numbers: Numbers) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=numbers.rel_tol, abs_tol=numbers.abs_tol)


def compare_numbers(
    reference: list[tuple[str, float]], managed: list[tuple[str, float]], numbers: Numbers
) -> tuple[bool, str]:
    """(same, what was seen): the same count, each pair within tolerance."""
    if len(reference) != len(managed):
        return False, f"{len(managed)} numbers, the reference has {len(reference)}"
    diffs = [
        f"{name} {b!r} vs {a!r} (#{i})"
        for i, ((name, a), (_, b)) in enumerate(zip(reference, managed, strict=True))
        if not _close(a, b, numbers)
    ]
    if diffs:
        shown = "; ".join(diffs[:MAX_DIFFS_SAID])
        more = f" and {len(diffs) - MAX_DIFFS_SAID} more" if len(diffs) > MAX_DIFFS_SAID else ""
        return False, f"{len(diffs)} of {len(reference)} numbers differ: {shown}{more}"
    tol = f"rel_tol {numbers.rel_tol:g}, abs_tol {numbers.abs_tol:g}"
    return True, f"{len(reference)} numbers within {tol}"


def check_reference(fidelity: Fidelity, reference: CopyFiles, field: str = "fidelity") -> None:
    """Raise BadInput when a file check cannot be made on the reference run's files."""
    for i, item in enumerate(fidelity.files):
        where = f"{field}.files.{i}"
        path = reference.resolve(item.path)
        if not path.is_file():
            raise BadInput(f"{where}.path", f"the reference run never wrote {item.path}")
        if item.numbers is not None:
            text = path.read_text(errors="replace")
            if not numbers_in(text, item.numbers, where):
                raise BadInput(
                    f"{where}.numbers.regex",
                    f"{item.numbers.regex!r} matches nothing in the reference run's {item.path}",
                )


def compare_file(
    item: FidelityFile, reference: CopyFiles, managed: CopyFiles, field: str
) -> FileVerdict:
    ref, got = reference.resolve(item.path), managed.resolve(item.path)
    if not got.is_file():
        return FileVerdict(item.path, "differs", "the restored run never wrote it")
    if item.numbers is None:
        a, b = digest(ref), digest(got)
        if a == b:
            return FileVerdict(item.path, "same", f"sha256 {a[:16]}")
        return FileVerdict(item.path, "differs", f"sha256 {b[:16]}, reference {a[:16]}")
    same, seen = compare_numbers(
        numbers_in(ref.read_text(errors="replace"), item.numbers, field),
        numbers_in(got.read_text(errors="replace"), item.numbers, field),
        item.numbers,
    )
    return FileVerdict(item.path, "same" if same else "differs", seen)


def compare_files(
    fidelity: Fidelity | None, reference: CopyFiles, managed: CopyFiles, field: str = "fidelity"
) -> tuple[FidelityVerdict, list[FileVerdict]]:
    """The verdict over every file (`same` only when each is), and each file's."""
    if fidelity is None or not fidelity.files:
        return "not checked", []
    check_reference(fidelity, reference, field)
    verdicts = [
        compare_file(item, reference, managed, f"{field}.files.{i}")
        for i, item in enumerate(fidelity.files)
    ]
    overall: FidelityVerdict = "same" if all(v.verdict == "same" for v in verdicts) else "differs"
    return overall, verdicts
