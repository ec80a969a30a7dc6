"""A dump's layout: which sacct fields it has, in which order, split on which delimiter.

The header (any case, any delimiter sacct's ``--delimiter`` took) gives the column order; a
header-less dump is in SACCT_FIELDS order unless ``--format`` names its columns. The fields a
dump has decide which measures can be computed at all (``not_computed``) and where a row's GPU
count comes from (GPU_SOURCES): other sites' dumps carry older or extra fields.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from tasks.data.errors import AccountingError

# The --format ckpt-poc asks sacct for, and the column order of a header-less dump.
SACCT_FIELDS = (
    "JobID",
    "JobIDRaw",
    "Cluster",
    "Partition",
    "User",
    "Account",
    "JobName",
    "State",
    "ExitCode",
    "Submit",
    "Start",
    "End",
    "Elapsed",
    "ElapsedRaw",
    "Timelimit",
    "NNodes",
    "NCPUS",
    "AllocTRES",
    "NodeList",
)
# Older and requested forms of the GPU count, read when a dump has them (see GPU_SOURCES).
OLDER_GPU_FIELDS = ("AllocGRES", "ReqTRES", "ReqGRES")
# The fields ckpt-poc reads from a dump; any other field a site dumps is carried, not read.
KNOWN_FIELDS = (*SACCT_FIELDS, *OLDER_GPU_FIELDS)
# What a dump must have at all: the job id (without State, hours are still counted).
JOB_ID_FIELDS = ("JobID", "JobIDRaw")
# What each measure needs besides that, as alternatives per need; a measure whose needs a
# dump lacks is reported as not computed (``not_computed``), never as zero.
_ELAPSED = ("ElapsedRaw", "Elapsed")
_GPUS_ALLOCATED = ("AllocTRES", "AllocGRES")
MEASURE_NEEDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "node_hours_by_state": (_ELAPSED, ("NNodes", "AllocTRES")),
    "gpu_hours_by_state": (_ELAPSED, _GPUS_ALLOCATED),
    "exposed_gpu_hours": (("State",), _ELAPSED, _GPUS_ALLOCATED),
    "timeout_gpu_hours": (("State",), _ELAPSED, _GPUS_ALLOCATED),
    "chains": (("State",), ("User",), ("Account",), ("JobName",), ("Submit",), ("End",)),
    "candidates": (("Account",), ("JobName",)),
}
# Where a row's GPU count comes from, in this order: what was allocated (AllocTRES, or the
# AllocGRES of Slurm before 17.11), else, for a row where nothing was allocated yet, what
# was requested. Reports say which sources the counts came from.
GPU_SOURCES = ("AllocTRES", "AllocGRES", "ReqTRES", "ReqGRES")
GPU_SOURCE_LABELS = {
    "AllocTRES": "allocated (AllocTRES)",
    "AllocGRES": "allocated (AllocGRES, older Slurm)",
    "ReqTRES": "requested (ReqTRES: nothing allocated yet)",
    "ReqGRES": "requested (ReqGRES, older Slurm: nothing allocated yet)",
    "none": "no GPU field given",
}


def not_computed(fields: Sequence[str]) -> dict[str, str]:
    """Measure → "the dump lacks X, Y" for each measure the dump's fields cannot give."""
    have = set(fields)
    out = {}
    for measure, needs in MEASURE_NEEDS.items():
        lacking = [" or ".join(alts) for alts in needs if not have.intersection(alts)]
        if lacking:
            out[measure] = f"the dump lacks {', '.join(lacking)}"
    return out


@dataclass(frozen=True)
class DumpLayout:
    """How a dump's fields map onto ours: its header's column order, or --format's."""

    names: tuple[str, ...]  # canonical field name per input column ("" for unknown ones)
    delimiter: bytes
    trailing_delimiter: bool
    has_header: bool

    @property
    def n_fields(self) -> int:
        return len(self.names) + (1 if self.trailing_delimiter else 0)

    @property
    def fields(self) -> tuple[str, ...]:
        """The known fields this dump has."""
        return tuple(n for n in self.names if n)

    @property
    def job_id_field(self) -> str:
        """JobID, or JobIDRaw in a dump without JobID."""
        return "JobID" if "JobID" in self.names else "JobIDRaw"

    @property
    def column_names(self) -> list[str]:
        """The reader's name per input column: ours, ``_unknown<i>`` for a field we do not
        read, and ``_trailing`` for the empty field after a trailing delimiter."""
        names = [n or f"_unknown{i}" for i, n in enumerate(self.names)]
        return [*names, "_trailing"] if self.trailing_delimiter else names


_CANONICAL = {f.lower(): f for f in KNOWN_FIELDS}
_FIELD_NAME_RE = re.compile(r"^[A-Za-z]+$")  # every sacct field name is letters only
# sacct's --format item: a field name, optionally with a column width (JobID%20).
_FORMAT_ITEM_RE = re.compile(r"^([A-Za-z]+)(?:%-?\d+)?$")
# The run of non-letters after a header's first field name is the header's delimiter.
_HEADER_DELIMITER_RE = re.compile(r"^[A-Za-z]+([^A-Za-z]+)[A-Za-z]")


def parse_format(text: str) -> tuple[str, ...]:
    """sacct's ``--format`` syntax (``JobID,State%20,…``, any case) → the field names as given."""
    names = []
    for i, item in enumerate(text.split(","), 1):
        m = _FORMAT_ITEM_RE.match(item.strip())
        if not m:
            raise AccountingError(
                f"--format {text!r}: field {i} ({item.strip()!r}) is not a sacct field name "
                "(--format takes comma-separated names such as JobID,State,AllocTRES)"
            )
        names.append(m.group(1))
    return tuple(names)


def _canonical(names: Sequence[str]) -> tuple[str, ...]:
    """Our spelling of each known field, "" for the rest (a repeat counts once)."""
    out: list[str] = []
    for name in names:
        known = _CANONICAL.get(name.lower(), "")
        out.append(known if known not in out else "")
    return tuple(out)


def _require_job_id(names: Sequence[str], where: str, what: str) -> None:
    if not set(names).intersection(JOB_ID_FIELDS):
        raise AccountingError(
            f"{where}: {what} lacks JobID (or JobIDRaw): every count needs the job id "
            f"(ckpt-poc's full set: --format={','.join(SACCT_FIELDS)})"
        )


def _looks_like_header(text: str) -> bool:
    """Field names, whatever the delimiter: no digits (every data row has a job id), and
    at least one of the names ckpt-poc reads."""
    if not text[:1].isalpha() or any(c.isdigit() for c in text):
        return False
    return any(w.lower() in _CANONICAL for w in re.findall(r"[A-Za-z]+", text))


def detect_layout(
    first_line: bytes,
    source: str,
    delimiter: bytes | None = None,
    sacct_format: str | None = None,
    line_number: int = 1,
) -> DumpLayout:
    """Header, delimiter and trailing delimiter from the first non-empty line.

    A header gives the column order and, unless ``delimiter`` is given, the delimiter (any
    string sacct's --delimiter took). A header-less dump is in SACCT_FIELDS order unless
    ``sacct_format`` (sacct's --format syntax) names its columns.
    """
    line = first_line.rstrip(b"\r\n")
    where = f"{source}:{line_number}"
    try:
        text = line.decode().lstrip("\ufeff \t")  # a byte-order mark is no field name
    except UnicodeDecodeError:
        text = ""
    if _looks_like_header(text):
        if not first_line.endswith(b"\n"):  # no row can follow: the file ends in its header
            raise AccountingError(
                f"{where}: the dump ends inside its header line (it ends {text[-30:]!r}, with "
                "no line end and no rows after it): a truncated file?"
            )
        return _header_layout(text, where, delimiter, sacct_format)
    delim = delimiter or (b"^|^" if b"^|^" in line else b"|")
    fields = line.split(delim)
    given = parse_format(sacct_format) if sacct_format else SACCT_FIELDS
    # sacct -p ends every line with the delimiter too.
    trailing = len(fields) == len(given) + 1 and fields[-1] == b""
    if len(fields) - trailing != len(given):
        shown = delim.decode(errors="replace")
        if sacct_format:
            raise AccountingError(
                f"{where}: the first row has {len(fields)} fields split on {shown!r}, but "
                f"--format names {len(given)}; give the fields the dump was taken with, in "
                "its order (and its delimiter with --delimiter)"
            )
        raise AccountingError(
            f"{where}: no header line, and the first row has {len(fields)} fields split on "
            f"{shown!r}; a header-less dump is read in ckpt-poc's order "
            f"(--format={','.join(SACCT_FIELDS)}, {len(SACCT_FIELDS)} fields) unless "
            "--format FIELDS names the fields it was taken with (sacct's --format syntax: "
            "comma-separated field names), and its delimiter is '|' unless --delimiter says"
        )
    names = _canonical(given)
    _require_job_id(names, where, f"--format {sacct_format!r}")
    return DumpLayout(names, delim, trailing, False)


def _header_layout(
    text: str, where: str, delimiter: bytes | None, sacct_format: str | None
) -> DumpLayout:
    if delimiter:
        delim: str | None = delimiter.decode(errors="replace")
    else:
        m = _HEADER_DELIMITER_RE.match(text)
        delim = m.group(1) if m else None
    fields = [f.strip() for f in text.split(delim)] if delim else [text.strip()]
    trailing = len(fields) > 1 and fields[-1] == ""
    if trailing:
        fields = fields[:-1]
    split_on = repr(delim) if delim else "any delimiter"
    if len(fields) == 1:
        raise AccountingError(
            f"{where}: the first line looks like a header but splits into one field on "
            f"{split_on} ({text[:80]!r}); give the dump's delimiter with --delimiter"
        )
    odd = [f for f in fields if not _FIELD_NAME_RE.match(f)]
    if odd:
        raise AccountingError(
            f"{where}: the first line looks like a header but splitting it on {split_on} "
            f"gives {odd[0]!r}, which is not a sacct field name; give the dump's delimiter "
            "with --delimiter"
        )
    names = _canonical(fields)
    _require_job_id(names, where, "the header")
    if sacct_format and [f.lower() for f in parse_format(sacct_format)] != [
        f.lower() for f in fields
    ]:
        raise AccountingError(
            f"{where}: the header names {','.join(fields)} but --format names "
            f"{sacct_format}; the header says what the columns are: drop --format"
        )
    return DumpLayout(names, (delim or "|").encode(), trailing, True)
