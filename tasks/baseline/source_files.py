"""Accounting files: a ``sacct -P``/``--parsable`` text dump, or a ``sacct --json`` file.

A text dump is handed on as it is (its layout is detected from its first line); a JSON file is
converted up front to a ``-P`` dump in ckpt-poc's --format, with a header.
"""

from __future__ import annotations

import io
from pathlib import Path

# The converter lives in sacct_json; it is named here too, where callers have found it.
from tasks.baseline.sacct_json import sacct_json_to_psv
from tasks.baseline.sacct_json_parallel import sacct_json_path_to_psv
from tasks.data.errors import AccountingError

__all__ = ["open_source", "sacct_json_to_psv"]


def open_source(path: str | Path) -> tuple[io.BufferedIOBase, str]:
    """Open a dump; sacct --json is converted to a -P stream up front."""
    p = Path(path)
    try:
        fh = open(p, "rb")  # noqa: SIM115 - handed to the caller
    except OSError as exc:
        raise AccountingError(f"{p}: cannot open accounting file: {exc.strerror}") from exc
    head = fh.read(64).lstrip()
    fh.seek(0)
    if head.startswith(b"{"):
        fh.close()
        # Read afresh (sacct_json_parallel.convert_path): read() after the head's read would
        # join the buffered head to the rest, a second whole copy (1 M jobs: a 2.0 GB peak).
        try:
            return io.BytesIO(sacct_json_path_to_psv(p, str(p))), "json"
        except OSError as exc:
            raise AccountingError(f"{p}: cannot read accounting file: {exc.strerror}") from exc
    return fh, "psv"
