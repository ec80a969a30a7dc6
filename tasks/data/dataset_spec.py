"""How a dataset is declared (``Column``, ``DatasetSpec``) and the schema each declaration
gives: pyarrow's for the writer, pandas dtypes for the readers. The declarations themselves
are in tasks/data/datasets.py.

A dataset has a version, raised whenever its files change shape or meaning, with one line
of history per version; every file carries the version that wrote it in its schema metadata
(``VERSION_KEY``). A column added by a later version says since when (``since``) and what a
null means in the rows of older files (``meaning_when_missing``); a value renamed by a later
version is declared (``RenamedValue``) and mapped when older files are read
(tasks/data/dataset_versions.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import pyarrow as pa

from tasks.data.errors import DatasetError

# What pandas takes as a column's dtype (its dtype= and astype): an extension dtype or a name.
PandasDtype = pd.api.extensions.ExtensionDtype | str

DATASET_KEY = "ckpt_poc.dataset"
VERSION_KEY = "ckpt_poc.schema_version"  # a file without it: version 1
FIRST_VERSION = "1: the first released version"


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    nullable: bool = True
    allowed: tuple[str, ...] | None = None
    min: float | None = None
    max: float | None = None
    doc: str = ""
    since: int = 1  # the dataset version that added the column
    meaning_when_missing: str = ""  # what a null means in rows of files older than ``since``


@dataclass(frozen=True)
class RenamedValue:
    """``old`` in ``column`` became ``new`` in version ``since``: files older than that are
    read with ``new``."""

    column: str
    old: str
    new: str
    since: int


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    week_from: str  # timestamp column whose ISO week names the partition
    doc: str = ""
    history: tuple[str, ...] = (FIRST_VERSION,)  # one line per version, "N: what changed"
    renamed: tuple[RenamedValue, ...] = ()
    _by_name: dict[str, Column] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise DatasetError(f"dataset {self.name}: duplicate column names")
        for k in (*self.key, self.week_from):
            if k not in names:
                raise DatasetError(f"dataset {self.name}: key/week column {k!r} not declared")
        self._by_name.update({c.name: c for c in self.columns})
        self._check_versions()

    def _check_versions(self) -> None:
        """The history has a line per version; what a later version added or renamed is
        declared with what older files mean."""
        where = f"dataset {self.name}"
        numbered = [line.split(":", 1)[0] for line in self.history]
        if numbered != [str(v) for v in range(1, self.version + 1)] or not numbered:
            raise DatasetError(f"{where}: history needs one line 'N: ...' per version 1..N")
        for c in self.columns:
            if not 1 <= c.since <= self.version:
                raise DatasetError(f"{where}: column {c.name} since {c.since}, not a version")
            if c.since > 1 and (c.meaning_when_missing == "" or not c.nullable):
                raise DatasetError(
                    f"{where}: column {c.name} (since {c.since}) must be nullable and say "
                    "what a null means in older files (meaning_when_missing)"
                )
        for r in self.renamed:
            allowed = self._by_name[r.column].allowed if r.column in self._by_name else None
            if r.column not in self._by_name or not 2 <= r.since <= self.version:
                raise DatasetError(f"{where}: renamed value {r} names no column or version")
            if allowed is not None and self._latest_name(r) not in allowed:
                raise DatasetError(f"{where}: renamed value {r.new!r} is not allowed")

    def _latest_name(self, r: RenamedValue) -> str:
        """What ``r.new`` is called now, through the renames after it."""
        name = r.new
        for later in sorted(self.renamed, key=lambda x: x.since):
            if later.since > r.since and later.column == r.column and later.old == name:
                name = later.new
        return name

    @property
    def version(self) -> int:
        """The version new files are written as: one per line of the history."""
        return len(self.history)

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        return self._by_name[name]

    @property
    def arrow_schema(self) -> pa.Schema:
        fields = [pa.field(c.name, c.type, nullable=c.nullable) for c in self.columns]
        meta = {DATASET_KEY: self.name, VERSION_KEY: str(self.version)}
        return pa.schema(fields, metadata=meta)

    @property
    def pandas_dtypes(self) -> dict[str, PandasDtype]:
        """The dtypes every reader normalises to (pandas and Dask alike)."""
        return {c.name: _pandas_dtype(c.type) for c in self.columns}


def _pandas_dtype(t: pa.DataType) -> PandasDtype:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return pd.StringDtype("pyarrow")
    if pa.types.is_integer(t):
        return pd.ArrowDtype(t)
    if pa.types.is_floating(t):
        return "float64"
    if pa.types.is_boolean(t):
        return pd.ArrowDtype(pa.bool_())
    if pa.types.is_timestamp(t):
        return pd.ArrowDtype(pa.timestamp("us", tz="UTC"))
    if pa.types.is_date(t):
        return pd.ArrowDtype(t)
    raise DatasetError(f"no pandas dtype for arrow type {t}")


TS = pa.timestamp("us", tz="UTC")
S = pa.string()
I64 = pa.int64()
F64 = pa.float64()
