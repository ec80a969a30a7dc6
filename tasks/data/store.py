"""The one store that writes and reads the datasets declared in tasks/data/datasets.py.

Layout: ``<data_dir>/<poc>/<dataset>/week=YYYY-Www/<run_id>[-partNNNN].parquet``, written
atomically (temp file + rename), append-only: an existing file is never rewritten. Readers take
committed runs only (tasks/data/runs.py) unless asked otherwise, and the files of every earlier
version of a dataset beside the new ones (tasks/data/dataset_versions.py).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tasks.data.dataset_versions import (
    VersionsRead,
    file_version,
    read_table,
    versions_read,
    with_versions,
)
from tasks.data.datasets import DatasetSpec
from tasks.data.errors import DatasetError
from tasks.data.runs import committed_run_ids, run_id_of
from tasks.data.weeks import WEEK_PARTITION, arrow_week_labels


def dataset_dir(data_dir: str | Path, poc: str, spec: DatasetSpec) -> Path:
    return Path(data_dir) / poc / spec.name


def conform(table: pa.Table | pd.DataFrame, spec: DatasetSpec) -> pa.Table:
    """Cast to the declared schema (column order and types); refuse missing/extra columns."""
    if isinstance(table, pd.DataFrame):
        table = pa.Table.from_pandas(table, preserve_index=False)
    have, want = set(table.column_names), set(spec.column_names)
    if have != want:
        raise DatasetError(
            f"dataset {spec.name}: columns differ from the declaration: "
            f"missing {sorted(want - have)}, unexpected {sorted(have - want)}"
        )
    table = table.select(spec.column_names).replace_schema_metadata(None)
    # Dictionary-encoded values of the declared type stay encoded (smaller in memory and on
    # disk; a run's constant stamp is never a full column): Parquet gives other types than
    # strings back plain, and readers get the declared plain types.
    target = pa.schema(
        [
            table.schema.field(f.name)
            if _is_dictionary_of(table.schema.field(f.name).type, f.type)
            else f
            for f in spec.arrow_schema
        ],
        metadata=spec.arrow_schema.metadata,
    )
    try:
        return table.cast(target)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise DatasetError(f"dataset {spec.name}: {exc}") from exc


def _is_dictionary_of(t: pa.DataType, value_type: pa.DataType) -> bool:
    return pa.types.is_dictionary(t) and t.value_type == value_type


def _write_temp(table: pa.Table, target: Path, metadata: Mapping[str, str]) -> Path:
    """The file written and fsynced under a temp name beside ``target``; renamed by
    _publish (a reader sees the whole file or none)."""
    if target.exists():
        raise DatasetError(f"{target} exists: datasets are append-only, never rewritten")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
    schema_meta = dict(table.schema.metadata or {})
    schema_meta.update({k.encode(): v.encode() for k, v in metadata.items()})
    try:
        pq.write_table(
            table.replace_schema_metadata(schema_meta),
            tmp,
            compression="zstd",
            compression_level=1,
            # Parquet dictionaries only for the columns already dictionary-encoded: on ids and
            # timestamps (a value a row) the writer builds one, overflows and falls back, which
            # cost a quarter of the write and made the files larger.
            use_dictionary=[f.name for f in table.schema if pa.types.is_dictionary(f.type)],
            write_statistics=_with_statistics(table.schema),
        )
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


# Dictionary-encoded columns readers filter on (read_dataset by run, tasks.window.sampling by
# node and source): their statistics let a filter skip row groups.
_FILTERED = ("run_id", "node", "source")


def _with_statistics(schema: pa.Schema) -> list[str]:
    """The columns whose min/max statistics are written: all but dictionary-encoded ones no
    reader filters on, whose min and max the writer finds by decoding every row (for the
    jobs, a quarter of the write's CPU time, for statistics nothing reads)."""
    return [f.name for f in schema if not pa.types.is_dictionary(f.type) or f.name in _FILTERED]


def _publish(tmp: Path, target: Path) -> None:
    if target.exists():
        tmp.unlink(missing_ok=True)
        raise DatasetError(f"{target} exists: datasets are append-only, never rewritten")
    os.replace(tmp, target)


class StagedWrite:
    """One run's files of a dataset being written by background threads under temp names,
    while the caller goes on (the baseline runs its gates meanwhile); ``publish`` renames them
    into place once the caller decides they count, ``discard`` removes them."""

    def __init__(self, tables: dict[Path, pa.Table], metadata: Mapping[str, str]) -> None:
        self.targets = list(tables)
        # Parquet encoding and compression release the GIL: the week files are written at once.
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(len(tables), os.cpu_count() or 1)))
        self._futures = [
            self._pool.submit(_write_temp, rows, target, metadata)
            for target, rows in tables.items()
        ]

    def _written(self) -> tuple[list[Path], BaseException | None]:
        """Waits for every file; the temp files written, and the first error if any."""
        tmps: list[Path] = []
        error: BaseException | None = None
        for future in self._futures:
            try:
                tmps.append(future.result())
            except BaseException as exc:  # every write is waited for before any error is raised
                error = error or exc
        self._pool.shutdown()
        return tmps, error

    def publish(self) -> list[Path]:
        tmps, error = self._written()
        if error is not None:
            for tmp in tmps:
                tmp.unlink(missing_ok=True)
            raise error
        for tmp, target in zip(tmps, self.targets, strict=True):
            _publish(tmp, target)
        return self.targets

    def discard(self) -> None:
        for tmp in self._written()[0]:
            tmp.unlink(missing_ok=True)


def stage_dataset(
    table: pa.Table | pd.DataFrame,
    spec: DatasetSpec,
    *,
    data_dir: str | Path,
    poc: str,
    run_id: str,
    part: int | None = None,
    metadata: Mapping[str, str] | None = None,
) -> StagedWrite:
    """Start writing one run's rows, one file per ISO week partition (see write_dataset);
    nothing is visible until the StagedWrite is published."""
    table = conform(table, spec)
    meta = {"ckpt_poc.run_id": run_id, **(metadata or {})}
    if table.num_rows == 0:
        return StagedWrite({}, meta)
    base = dataset_dir(data_dir, poc, spec)
    name = f"{run_id}.parquet" if part is None else f"{run_id}-part{part:05d}.parquet"
    weeks = _by_week(table, arrow_week_labels(table.column(spec.week_from)))
    return StagedWrite(
        {base / f"{WEEK_PARTITION}={label}" / name: rows for label, rows in weeks.items()}, meta
    )


def write_dataset(
    table: pa.Table | pd.DataFrame,
    spec: DatasetSpec,
    *,
    data_dir: str | Path,
    poc: str,
    run_id: str,
    part: int | None = None,
    metadata: Mapping[str, str] | None = None,
) -> list[Path]:
    """Write one run's rows: one file per ISO week partition, atomically, never overwriting."""
    return stage_dataset(
        table, spec, data_dir=data_dir, poc=poc, run_id=run_id, part=part, metadata=metadata
    ).publish()


def _by_week(table: pa.Table, labels: pa.Array) -> dict[str, pa.Table]:
    """Rows per week label, in their order of first appearance and in input order within a
    week. Accounting comes roughly in submit order, so each week is usually one run of rows
    and a zero-copy slice; otherwise one stable sort and one copy (a filter per week would
    copy every column once per week)."""
    encoded = pc.dictionary_encode(labels)
    names = encoded.dictionary.to_pylist()  # codes number labels by first appearance
    codes = encoded.indices.to_numpy()
    if len(names) == 1:
        return {names[0]: table}
    starts = np.concatenate([[0], np.flatnonzero(codes[1:] != codes[:-1]) + 1])
    if len(starts) == len(names):  # one run per week: codes[starts] is 0, 1, 2, ...
        ends = [*starts[1:], len(codes)]
        return {names[codes[a]]: table.slice(a, b - a) for a, b in zip(starts, ends, strict=True)}
    ordered = table.take(pa.array(np.argsort(codes, kind="stable")))
    bounds = np.concatenate([[0], np.cumsum(np.bincount(codes, minlength=len(names)))])
    return {
        name: ordered.slice(bounds[i], bounds[i + 1] - bounds[i]) for i, name in enumerate(names)
    }


def dataset_files(
    data_dir: str | Path, poc: str, spec: DatasetSpec, include_uncommitted: bool = False
) -> list[str]:
    """The dataset's files of committed runs (tasks.data.runs): a run killed half-way, or still
    running, is not read unless asked for."""
    root = dataset_dir(data_dir, poc, spec)
    files = sorted(root.glob(f"{WEEK_PARTITION}=*/*.parquet"))
    if not include_uncommitted:
        committed = committed_run_ids(data_dir, poc)
        files = [p for p in files if run_id_of(p) in committed]
    return [str(p) for p in files]


def read_dataset(
    spec: DatasetSpec,
    *,
    data_dir: str | Path,
    poc: str,
    run_id: str | None = None,
    columns: Sequence[str] | None = None,
    include_uncommitted: bool = False,
) -> pd.DataFrame:
    """Read a dataset into pandas with the declared dtypes; committed runs only, unless
    ``include_uncommitted``. Files of every version are read together (dataset_versions.py);
    which ones, the frame says (``dataset_versions.versions_of``)."""
    files = dataset_files(data_dir, poc, spec, include_uncommitted)
    cols = list(columns or spec.column_names)
    if not files:
        empty = normalise_dtypes(pd.DataFrame({c: [] for c in cols}), spec)
        return with_versions(empty, versions_read(spec, [], cols))
    flt = pc.field("run_id") == run_id if run_id is not None else None
    table, read = read_table(spec, files, columns=cols, row_filter=flt)
    return with_versions(normalise_dtypes(table.to_pandas(types_mapper=pd.ArrowDtype), spec), read)


def stored_versions(
    spec: DatasetSpec, *, data_dir: str | Path, poc: str, include_uncommitted: bool = False
) -> VersionsRead:
    """The versions of the dataset's files (committed runs only, unless asked), as a read
    would take them in; only the files' footers are read."""
    files = dataset_files(data_dir, poc, spec, include_uncommitted)
    return versions_read(spec, [file_version(pq.read_schema(f)) for f in files])


def read_dataset_dask(spec: DatasetSpec, *, data_dir: str | Path, poc: str) -> Any:
    """The same dataset as a Dask DataFrame, normalised to the same dtypes as pandas."""
    import dask.dataframe as dd

    files = dataset_files(data_dir, poc, spec)
    if not files:
        raise DatasetError(f"dataset {spec.name} has no files under {data_dir}/{poc}")
    if stored_versions(spec, data_dir=data_dir, poc=poc).versions != (spec.version,):
        # Files of other versions: each read as read_dataset reads it (dataset_versions.py).
        meta = normalise_dtypes(pd.DataFrame({c: [] for c in spec.column_names}), spec)
        return dd.from_map(_read_file, files, spec=spec, meta=meta)
    ddf = dd.read_parquet(files, columns=spec.column_names, dtype_backend="pyarrow")
    return ddf.astype(spec.pandas_dtypes)


def _read_file(path: str, spec: DatasetSpec) -> pd.DataFrame:
    table, _ = read_table(spec, [path], columns=spec.column_names)
    return normalise_dtypes(table.to_pandas(types_mapper=pd.ArrowDtype), spec)


def normalise_dtypes(df: pd.DataFrame, spec: DatasetSpec) -> pd.DataFrame:
    dtypes = {c: t for c, t in spec.pandas_dtypes.items() if c in df.columns}
    return df.astype(dtypes)
