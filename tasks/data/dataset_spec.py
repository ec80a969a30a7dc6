"""How a dataset is declared (``Column``, ``DatasetSpec``) and the schema each declaration
gives: pyarrow's for the writer, pandas dtypes for the readers. The declarations themselves
are in tasks/data/datasets.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pyarrow as pa

from tasks.data.errors import DatasetError

SCHEMA_VERSION = "1"


@dataclass(frozen=True)
class Column:
    name: str
    type: pa.DataType
    nullable: bool = True
    allowed: tuple[str, ...] | None = None
    min: float | None = None
    max: float | None = None
    doc: str = ""


@dataclass(frozen=True)
class DatasetSpec:
    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    week_from: str  # timestamp column whose ISO week names the partition
    doc: str = ""
    version: str = SCHEMA_VERSION
    _by_name: dict[str, Column] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            raise DatasetError(f"dataset {self.name}: duplicate column names")
        for k in (*self.key, self.week_from):
            if k not in names:
                raise DatasetError(f"dataset {self.name}: key/week column {k!r} not declared")
        self._by_name.update({c.name: c for c in self.columns})

    @property
    def column_names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> Column:
        return self._by_name[name]

    @property
    def arrow_schema(self) -> pa.Schema:
        fields = [pa.field(c.name, c.type, nullable=c.nullable) for c in self.columns]
        meta = {"ckpt_poc.dataset": self.name, "ckpt_poc.schema_version": self.version}
        return pa.schema(fields, metadata=meta)

    @property
    def pandas_dtypes(self) -> dict[str, Any]:
        """The dtypes every reader normalises to (pandas and Dask alike)."""
        return {c.name: _pandas_dtype(c.type) for c in self.columns}


def _pandas_dtype(t: pa.DataType) -> Any:
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
