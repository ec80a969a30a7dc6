"""A dataset folder that holds files of several versions, read as one table.

A PoC lives for months and the product is upgraded under it: a dataset's folder then holds
the files earlier versions wrote beside the new ones. They are read together, as one table of
the declared schema (tasks/data/dataset_spec.py), never refused:

- a file's version is its schema metadata's ``ckpt_poc.schema_version`` (none: version 1);
- a column a later version added is null in the rows of an older file, and its declaration
  says what that null means (``Column.since``, ``Column.meaning_when_missing``);
- a value a later version renamed is read under its new name (``RenamedValue``);
- a file newer than the declaration (a later release wrote it) is read with the declared
  columns.

Which versions a read took in, and what the older files' rows mean, is a ``VersionsRead``:
``read_dataset`` attaches it to the frame it returns (``versions_of``), ``versions_lines``
says it in words for a report.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads

from tasks.data.dataset_spec import VERSION_KEY, DatasetSpec

# The frame attribute (``DataFrame.attrs``) that carries a read's VersionsRead.
VERSIONS_ATTR = "ckpt_poc.versions_read"

Renames = dict[str, dict[str, str]]  # column → {value in the file: value read}


class VersionsRead(NamedTuple):
    """The versions of one dataset's files a read took in (how many files of each, oldest
    first), the version it read them as (the declaration's), and what a reader of the older
    rows must know: the columns null in them and why, the values mapped."""

    dataset: str
    version: int
    files: tuple[tuple[int, int], ...]
    notes: tuple[str, ...] = ()

    def __deepcopy__(self, memo: dict[int, Any]) -> VersionsRead:
        # Immutable; pandas deep-copies a frame's attrs on every operation.
        return self

    @property
    def versions(self) -> tuple[int, ...]:
        return tuple(v for v, _ in self.files)

    def line(self) -> str:
        """e.g. ``events: v1 (3 files), v2 (1 file), read as v2``, then the notes."""
        if not self.files:
            return f"{self.dataset}: no files"
        counts = ", ".join(f"v{v} ({n} file{'' if n == 1 else 's'})" for v, n in self.files)
        return "; ".join([f"{self.dataset}: {counts}, read as v{self.version}", *self.notes])


def file_version(schema: pa.Schema) -> int:
    """The version that wrote a file, from its schema metadata; version 1 when it says none
    (or nothing readable as a number)."""
    raw = (schema.metadata or {}).get(VERSION_KEY.encode())
    try:
        return int(raw) if raw else 1
    except ValueError:
        return 1


def renames(spec: DatasetSpec, version: int, columns: Iterable[str]) -> Renames:
    """The values a file of ``version`` holds under an older name, per column read, mapped
    through every later rename (a → b in v2 then b → c in v3: a file of v1 reads a as c)."""
    wanted = set(columns)
    out: Renames = {}
    for r in sorted(spec.renamed, key=lambda r: r.since):
        if r.since <= version or r.column not in wanted:
            continue
        mapping = out.setdefault(r.column, {})
        for old, new in mapping.items():
            if new == r.old:
                mapping[old] = r.new
        mapping.setdefault(r.old, r.new)
    return out


def apply_renames(table: pa.Table, mapping: Renames) -> pa.Table:
    """``table`` with each mapped column's old values replaced by the new ones."""
    for name, values in mapping.items():
        i = table.schema.get_field_index(name)
        column = table.column(i)
        old = pa.array(list(values), column.type)
        new = pa.array(list(values.values()), column.type)
        renamed = pc.take(new, pc.index_in(column, value_set=old))
        table = table.set_column(i, table.field(i), pc.coalesce(renamed, column))
    return table


def notes(spec: DatasetSpec, versions: Iterable[int], columns: Iterable[str]) -> tuple[str, ...]:
    """What the rows of the older (or newer) files among ``versions`` mean, per column read."""
    seen = sorted(set(versions))
    if not seen:
        return ()
    oldest, wanted = seen[0], set(columns)
    out = [
        f"{c.name} is null in files before v{c.since}: {c.meaning_when_missing}"
        for c in spec.columns
        if c.since > oldest and c.name in wanted
    ]
    out += [
        f"{r.column} {r.old!r} in files before v{r.since} is read as {r.new!r}"
        for r in spec.renamed
        if r.since > oldest and r.column in wanted
    ]
    out += [
        f"v{v} files are newer than this code's v{spec.version}: read with its columns"
        for v in seen
        if v > spec.version
    ]
    return tuple(out)


def versions_read(
    spec: DatasetSpec, versions: Sequence[int], columns: Iterable[str] | None = None
) -> VersionsRead:
    """``versions``: one per file read."""
    counts = tuple(sorted((v, versions.count(v)) for v in set(versions)))
    cols = list(spec.column_names if columns is None else columns)
    return VersionsRead(spec.name, spec.version, counts, notes(spec, versions, cols))


def read_table(
    spec: DatasetSpec,
    files: Sequence[str],
    *,
    columns: Sequence[str],
    row_filter: pc.Expression | None = None,
) -> tuple[pa.Table, VersionsRead]:
    """``files`` (any mix of versions) as one table of the declared schema, in file order,
    and which versions they were. Only runs of files whose values need mapping are read
    apart: a folder of one version reads in one scan, as before versions existed."""
    ds = pads.dataset(list(files), schema=spec.arrow_schema, format="parquet")
    fragments = list(ds.get_fragments())
    # The footer each reads here is kept by its fragment: the scan does not read it again.
    versions = [file_version(f.physical_schema) for f in fragments]
    read = versions_read(spec, versions, columns)
    maps = [renames(spec, v, columns) for v in versions]
    if not any(maps):
        return ds.to_table(columns=list(columns), filter=row_filter), read
    tables = []
    for mapping, run in itertools.groupby(zip(maps, fragments, strict=True), key=lambda x: x[0]):
        part = pads.FileSystemDataset([f for _, f in run], ds.schema, ds.format, ds.filesystem)
        tables.append(
            apply_renames(part.to_table(columns=list(columns), filter=row_filter), mapping)
        )
    return pa.concat_tables(tables), read


def with_versions(frame: pd.DataFrame, read: VersionsRead) -> pd.DataFrame:
    frame.attrs[VERSIONS_ATTR] = read
    return frame


def versions_of(frame: pd.DataFrame) -> VersionsRead | None:
    """The versions the read that returned ``frame`` took in (None: not read from a dataset,
    or lost on the way: pandas keeps attrs through most operations, not through a concat of
    frames whose attrs differ)."""
    read = frame.attrs.get(VERSIONS_ATTR)
    return read if isinstance(read, VersionsRead) else None


def versions_lines(frames: Mapping[str, pd.DataFrame]) -> list[str]:
    """One line per dataset read (``VersionsRead.line``), in ``frames``' order: what a report
    says of the versions it read. Frames without a VersionsRead are left out."""
    return [read.line() for frame in frames.values() if (read := versions_of(frame)) is not None]
