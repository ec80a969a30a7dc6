"""DuckDB doing ours' work, for bench/baseline_ingest.py: the contender ``duckdb-equal``.

Ours (``run_baseline``) does not only get the by-state numbers: it parses and checks every
field of every row, pseudonymises users and accounts, writes the ``jobs`` dataset, computes
the exposure (by state, resubmission chains, ranked candidate workloads), gates all of it and
writes the ``exposure``, ``quarantine`` and ``gates`` datasets. This contender does that work
in DuckDB SQL, from the same dump:

* ``read_csv`` (``|``, header, no quoting, short rows padded as ours pads them, rows with
  too many fields kept as rejects), every field as text, parsed in SQL with ours' rules
  (tasks/baseline/fields.py, blocks.py): the JobID grammar, states, exit codes, time limits,
  AllocTRES (GPUs: the untyped ``gres/gpu=N`` else the typed ones summed; nodes, cpus, mem),
  times, counts, elapsed. Fields of few distinct values are parsed once per distinct value
  (as ours does) and joined back. A row that fails a rule goes to the quarantine with the
  first reason it fails for, in ours' order and words;
* users and accounts as ours' HMAC-SHA256 tokens, in SQL (``sha256`` over the HMAC pads),
  once per distinct value;
* exposure in SQL: allocations, duplicate captures dropped, by state, chains (window
  functions over (user, account, job name) in submit order), candidates ranked as ours ranks;
* the gate's checks: the counts reconcile, the input has parsed rows, the quarantined share,
  and every declared column rule (not null, allowed values, bounds, the column set) over
  every row, in SQL;
* ``COPY ... TO`` parquet (zstd level 1), a file per ISO week as ours' store partitions (the
  jobs: a COPY per week's range of submit), each column cast to the type
  ``tasks.data.datasets`` declares, under a temp name beside its target, fsynced, renamed
  into place once every check has passed (the gates: whether they passed or not).

The SQL is in baseline_ingest_duckdb_sql.py.

What it does not do as ours does is listed in ``DIFFERENCES`` (printed by the bench).
``dataset_digest`` lets the parent compare what both wrote, column by column.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import resource
import time
import uuid
from pathlib import Path
from typing import Any

from baseline_ingest_duckdb_sql import (
    ABSENT,
    CHAIN_GAP_US,
    DURATION_RE,
    EXPOSED_STATES,
    ISO_FORMAT,
    JOB_ID_RE,
    MACROS,
    NO_STATE,
    SACCT_FIELDS,
    checked_view,
    declared_select,
    exposure_sql,
    maps_sql,
    parse_sql,
    pseudonym_macro,
    q,
    quarantine_select,
    sql_in,
    sql_type,
    stamped,
)

MAX_QUARANTINED_SHARE = 0.5  # plans/demo.yaml's (the plan default)
KEY_ENV = "CKPT_POC_PSEUDONYM_KEY"
POC = "demo"

DIFFERENCES = (
    "times: the standard format (%Y-%m-%dT%H:%M:%S) only; ours detects each time field's "
    "format (epoch, relative, a site's strftime)",
    "layout: the 19 fields ckpt-poc asks sacct for, in its order, with a header, on '|'; ours "
    "reads any header and delimiter, a header-less dump, the older GPU fields",
    "no Great Expectations: the declared column rules in SQL over every row; ours runs the GX "
    "suite on a 20,000-row sample and the same rules over every row (pyarrow)",
    "parquet: DuckDB's writer, the declared columns, order and types, but every column "
    "optional (ours: required where declared not null) and strings plain (ours: dictionary)",
    "a quarantined row's raw text (none in this dump) is rebuilt from its parsed fields (a "
    "value that did not parse is empty); source_line does not count blank lines",
)


def restated_drift(plan_path: Path) -> list[str]:
    """Where this module's restated rules differ from the product's (the parent checks)."""
    from tasks.baseline import fields
    from tasks.baseline.dump_layout import SACCT_FIELDS as OURS_FIELDS
    from tasks.baseline.exposure import CHAIN_GAP_US as OURS_GAP
    from tasks.baseline.exposure import EXPOSED_STATES as OURS_EXPOSED
    from tasks.baseline.pseudonym import KEY_ENV as OURS_KEY_ENV
    from tasks.baseline.time_formats import ISO_FORMAT as OURS_ISO
    from tasks.data.plan import load_plan
    from tasks.data.slurm_states import NO_STATE as OURS_NO_STATE

    plan = load_plan(plan_path)
    pairs = {
        "SACCT_FIELDS": (SACCT_FIELDS, tuple(OURS_FIELDS)),
        "JOB_ID_RE": (JOB_ID_RE, fields.JOB_ID_RE),
        "DURATION_RE": (DURATION_RE, fields._DURATION_RE.pattern),
        "ABSENT": (ABSENT, tuple(fields.ABSENT)),
        "ISO_FORMAT": (ISO_FORMAT, OURS_ISO),
        "CHAIN_GAP_US": (CHAIN_GAP_US, OURS_GAP),
        "NO_STATE": (NO_STATE, OURS_NO_STATE),
        "EXPOSED_STATES": (EXPOSED_STATES, tuple(OURS_EXPOSED)),
        "MAX_QUARANTINED_SHARE": (MAX_QUARANTINED_SHARE, plan.baseline.max_quarantined_share),
        "KEY_ENV": (KEY_ENV, OURS_KEY_ENV),
    }
    return [f"{name}: bench {a!r} != product {b!r}" for name, (a, b) in pairs.items() if a != b]


def declaration_checks(con: Any, spec: Any, relation: str) -> tuple[list[dict[str, Any]], int]:
    """The declaration's rules over every row of ``relation`` (tasks.data.gates' suite: the
    column set, not null, allowed values, bounds; nulls are not judged by set or bounds)."""
    names = [d[0] for d in con.execute(f"SELECT * FROM {relation} LIMIT 0").description]
    checks = [
        _check(
            spec.name,
            "expect_table_columns_to_match_set",
            None,
            names == spec.column_names,
            observed_value=names,
        )
    ]
    aggregates, labels = ["count(*)"], []
    for col in spec.columns:
        c = f'"{col.name}"'
        if not col.nullable:
            aggregates.append(f"count(*) FILTER (WHERE {c} IS NULL)")
            labels.append(("expect_column_values_to_not_be_null", col.name))
        if col.allowed is not None:
            aggregates.append(f"count(*) FILTER (WHERE {c} NOT IN {sql_in(col.allowed)})")
            labels.append(("expect_column_values_to_be_in_set", col.name))
        if col.min is not None or col.max is not None:
            out = [f"{c} < {col.min}" if col.min is not None else None]
            out.append(f"{c} > {col.max}" if col.max is not None else None)
            aggregates.append(f"count(*) FILTER (WHERE {' OR '.join(o for o in out if o)})")
            labels.append(("expect_column_values_to_be_between", col.name))
    total, *bad = con.execute(f"SELECT {', '.join(aggregates)} FROM {relation}").fetchall()[0]
    for (expectation, column), n in zip(labels, bad, strict=True):
        checks.append(
            _check(spec.name, expectation, column, n == 0, element_count=total, unexpected_count=n)
        )
    return checks, total


def _check(dataset: str, name: str, column: str | None, ok: bool, **observed: Any) -> dict:
    observed["engine"] = "duckdb (every row)"
    return {
        "gate": "baseline",
        "dataset": dataset,
        "expectation": name,
        "column": column,
        "success": bool(ok),
        "observed": json.dumps(observed, default=str),
    }


def count_checks(con: Any, parsed: int) -> tuple[list[dict[str, Any]], int, int, int]:
    """The baseline gate's domain checks (tasks.baseline.run.baseline_checks); with the
    rows read, parsed (the jobs' rows) and quarantined (the rest, and the reader's rejects)."""
    rows = con.execute("SELECT count(*) FROM parsed").fetchall()[0][0]
    rejected = con.execute("SELECT count(*) FROM reject_errors").fetchall()[0][0]
    quarantined = rows - parsed + rejected
    read = parsed + quarantined
    share = quarantined / read if read else 0.0
    checks = [
        _check(
            "jobs",
            "rows_read_equals_parsed_plus_quarantined",
            None,
            read == parsed + quarantined,
            rows_read=read,
            parsed=parsed,
            quarantined=quarantined,
        ),
        _check("jobs", "input_has_rows", None, read > 0, rows_read=read),
        _check("jobs", "input_has_parsed_rows", None, read == 0 or parsed > 0, parsed=parsed),
        _check(
            "quarantine",
            "quarantined_share_within_plan_limit",
            None,
            share <= MAX_QUARANTINED_SHARE,
            quarantined_share=round(share, 4),
        ),
    ]
    return checks, read, parsed, quarantined


# --- writing ------------------------------------------------------------------------------------

PARQUET = "FORMAT parquet, COMPRESSION zstd, COMPRESSION_LEVEL 1"


class Staged:
    """Files written and fsynced under temp names beside their targets, renamed into place
    by ``publish`` (ours' store: a reader sees a whole file or none)."""

    def __init__(self) -> None:
        self.pairs: list[tuple[Path, Path]] = []

    def copy(self, con: Any, select: str, target: Path, params: dict | None = None) -> int:
        """``COPY (select)`` to ``target``'s temp name; its rows (none: no file, as ours)."""
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        rows = con.execute(f"COPY ({select}) TO {q(str(tmp))} ({PARQUET})", params or {})
        n = rows.fetchall()[0][0]
        if not n:
            tmp.unlink(missing_ok=True)
            return 0
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        self.pairs.append((tmp, target))
        return n

    def publish(self) -> list[Path]:
        for tmp, target in self.pairs:
            os.replace(tmp, target)
        return [target for _, target in self.pairs]


def stage_jobs(con: Any, staged: Staged, dataset: Path, run_id: str) -> int:
    """The jobs, one file per ISO week of submit (``week=unknown`` without one), each week
    a range of submit the scan skips to (the dump comes in submit order)."""
    mondays = con.execute(
        "SELECT DISTINCT date_trunc('week', submit) FROM parsed WHERE submit IS NOT NULL ORDER BY 1"
    ).fetchall()
    rows = 0
    for (monday,) in mondays:
        rows += staged.copy(
            con,
            "SELECT * FROM jobs_out WHERE submit >= $a AND submit < $a + INTERVAL 7 DAY",
            dataset / f"week={monday:%G-W%V}" / f"{run_id}.parquet",
            {"a": monday},
        )
    where = "SELECT * FROM jobs_out WHERE submit IS NULL"
    return rows + staged.copy(con, where, dataset / "week=unknown" / f"{run_id}.parquet")


# --- the contender ------------------------------------------------------------------------------


def _header_ok(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.readline().rstrip(b"\r\n").decode(errors="replace") == "|".join(SACCT_FIELDS)


def child_duckdb_equal(path: Path, workdir: Path) -> dict[str, Any]:
    """Ours' work in DuckDB, timed by phase; the by-state numbers for the agreement check."""
    t0 = time.perf_counter()
    import duckdb

    from tasks.data.datasets import JOBS
    from tasks.data.fingerprint import collect_fingerprint
    from tasks.data.slurm_states import DOCUMENTED_STATES

    t_import = time.perf_counter() - t0
    run_id = str(uuid.uuid4())
    stamp = {"poc": POC, "run_id": run_id, **collect_fingerprint()}
    key = os.environ[KEY_ENV].encode()
    data = workdir / "data" / POC
    t_setup = time.perf_counter() - t0 - t_import

    lap = _Laps()
    if not _header_ok(path):
        raise SystemExit(f"duckdb-equal reads the fields {SACCT_FIELDS} in order, with a header")
    con = duckdb.connect(config={"temp_directory": str(workdir / "duckdb-tmp")})
    con.execute("SET TimeZone = 'UTC'")
    con.execute(pseudonym_macro(key))
    con.execute(MACROS)
    con.execute(parse_sql(), {"path": str(path)}).fetchall()
    lap("read_csv + per-row fields (parsed table)")
    con.execute(maps_sql(tuple(DOCUMENTED_STATES)))
    con.execute(checked_view(_n(con, "reject_errors")))
    stamp_cols = ", ".join(f'CAST(${n} AS {sql_type(JOBS.column(n).type)}) AS "{n}"' for n in stamp)
    con.execute(f"CREATE TEMP TABLE stamp AS SELECT {stamp_cols}", stamp).fetchall()
    lap("distinct values parsed, users/accounts pseudonymised (maps)")
    jobs_cols = {c: f'"{c}"' for c in JOBS.column_names}
    con.execute(
        "CREATE TEMP VIEW jobs_out AS SELECT "
        + declared_select(JOBS, stamped(JOBS, jobs_cols))
        + " FROM checked CROSS JOIN stamp WHERE reason IS NULL"
    )
    staged = Staged()
    stage_jobs(con, staged, data / "jobs", run_id)
    lap("jobs parquet (a COPY per ISO week, fsync)")
    con.execute(exposure_sql())
    lap("exposure (dedup, by state, chains, candidates)")
    jobs_checks, jobs_rows = declaration_checks(con, JOBS, "jobs_out")
    checks, rows_read, parsed, quarantined = count_checks(con, jobs_rows)
    checks += jobs_checks
    now = dt.datetime.now(dt.UTC)
    bad_rows = rows_read - parsed - _n(con, "reject_errors")
    checks += stage_small(con, staged, now, path, data, run_id, bad_rows > 0)
    gates = Staged()
    write_gates(
        con, gates, checks, now, data / "gates" / f"week={now:%G-W%V}" / f"{run_id}.parquet"
    )
    gates.publish()
    lap("checks + quarantine/exposure/gates parquet")
    failed = [c for c in checks if not c["success"]]
    if failed:
        raise SystemExit(f"duckdb-equal: checks failed: {failed}")
    written = staged.publish()
    lap("publish (rename into place)")
    return {
        "seconds": lap.total(),
        "cpu_s": sum(cpu for _, cpu in lap.phases.values()),
        "import_s": t_import,
        "setup_s": t_setup,
        "rows": rows_read,
        "rows_parsed": parsed,
        "rows_quarantined": quarantined,
        "checks": len(checks),
        "phases": lap.phases,
        **_results(con, written),
    }


class _Laps:
    """Wall and CPU seconds (the whole process's) of each phase, one after the other."""

    def __init__(self) -> None:
        self.phases: dict[str, tuple[float, float]] = {}
        self.start = self.last = (time.perf_counter(), _cpu_s())

    def __call__(self, name: str) -> None:
        now = (time.perf_counter(), _cpu_s())
        self.phases[name] = (now[0] - self.last[0], now[1] - self.last[1])
        self.last = now

    def total(self) -> float:
        return self.last[0] - self.start[0]


def _results(con: Any, files: list[Path]) -> dict[str, Any]:
    """The by-state numbers (for the agreement check), chains, files, threads."""
    by_state = con.execute("SELECT * FROM by_state").fetchall()
    gpu = {r[0]: float(r[3]) for r in by_state}
    return {
        "allocations_by_state": {r[0]: int(r[1]) for r in by_state},
        "node_hours_by_state": {r[0]: float(r[2]) for r in by_state},
        "gpu_hours_by_state": gpu,
        "exposed_gpu_hours": sum(v for k, v in gpu.items() if k in EXPOSED_STATES),
        "timeout_gpu_hours": gpu.get("TIMEOUT", 0.0),
        "chains": int(con.execute("SELECT count(*) FROM chains").fetchall()[0][0]),
        "files_written": len(files),  # jobs, quarantine, exposure (not gates: as ours counts)
        "bytes_written": sum(f.stat().st_size for f in files),
        "threads": int(con.execute("SELECT current_setting('threads')").fetchall()[0][0]),
    }


def stage_small(
    con: Any,
    staged: Staged,
    now: dt.datetime,
    path: Path,
    data: Path,
    run_id: str,
    bad_rows: bool,
) -> list[dict[str, Any]]:
    """The quarantine and exposure built, checked and staged; their checks. Rows the
    checks rejected are looked for (the view evaluated again) only when there are some."""
    from tasks.data.datasets import EXPOSURE, QUARANTINE
    from tasks.data.slurm_states import DOCUMENTED_STATES

    q_select = quarantine_select(QUARANTINE, tuple(DOCUMENTED_STATES), bad_rows)
    params = {"source": str(path), "now": now}
    con.execute(f"CREATE TEMP TABLE quarantine_out AS {q_select}", params).fetchall()
    e_cols = {c: f'"{c}"' for c in EXPOSURE.column_names}
    e_cols.update(
        window_start="(SELECT min(submit) FROM alloc)",
        window_end='(SELECT max("end") FROM alloc)',
        computed_at="$now",
        provenance="'measured'",
    )
    e_select = declared_select(EXPOSURE, stamped(EXPOSURE, e_cols))
    con.execute(
        f"CREATE TEMP TABLE exposure_out AS SELECT {e_select} FROM exposure_rows CROSS JOIN stamp",
        {"now": now},
    ).fetchall()
    checks = declaration_checks(con, EXPOSURE, "exposure_out")[0]
    if _n(con, "quarantine_out"):
        checks += declaration_checks(con, QUARANTINE, "quarantine_out")[0]
    for name in ("quarantine", "exposure"):
        target = data / name / f"week={now:%G-W%V}" / f"{run_id}.parquet"
        staged.copy(con, f"SELECT * FROM {name}_out", target)
    return checks


def write_gates(
    con: Any, staged: Staged, checks: list[dict[str, Any]], now: dt.datetime, target: Path
) -> None:
    """Every check as a row of the gates dataset (written whether they passed or not)."""
    import pyarrow as pa

    from tasks.data.datasets import GATES

    con.register("gate_rows", pa.Table.from_pylist(checks))
    cols = {c: f'"{c}"' for c in GATES.column_names}
    cols["checked_at"] = "$now"
    select = declared_select(GATES, stamped(GATES, cols))
    staged.copy(con, f"SELECT {select} FROM gate_rows CROSS JOIN stamp", target, {"now": now})


# --- comparing what the two wrote ---------------------------------------------------------------

FLOAT_TYPES = ("DOUBLE", "FLOAT")
# Differ by run (the run's id, when it ran) or by definition between the two contenders.
NOT_COMPARED = ("run_id", "computed_at", "read_at", "checked_at")


def dataset_digest(data_dir: Path, name: str) -> dict[str, Any]:
    """What a contender wrote of one dataset, order-free: rows per week partition, the file
    schema (names and types, dictionaries as their values), per column the non-null count
    and the sum of DuckDB's hash of every value (floats: their sum), and the candidates'
    order. Read with DuckDB, in the parent, after the contender's process has ended."""
    import duckdb
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted((data_dir / POC / name).glob("week=*/*.parquet"))
    if not files:
        return {"files": 0, "rows": 0}
    con = duckdb.connect()
    con.execute("SET TimeZone = 'UTC'")
    rel = f"read_parquet({[str(f) for f in files]!r}, hive_partitioning = true)"
    described = con.execute(f"SELECT * FROM {rel} LIMIT 0").description
    cols = [(d[0], str(d[1])) for d in described if d[0] != "week"]
    aggregates = ["count(*)"]
    for col, kind in cols:
        summed = f'sum("{col}")' if kind in FLOAT_TYPES else f'CAST(sum(hash("{col}")) AS VARCHAR)'
        aggregates += [f'count("{col}")', summed]
    rows, *values = con.execute(f"SELECT {', '.join(aggregates)} FROM {rel}").fetchall()[0]
    weeks = dict(con.execute(f"SELECT week, count(*) FROM {rel} GROUP BY week").fetchall())
    schema = pq.read_schema(files[0])
    types = [
        (f.name, str(f.type.value_type if pa.types.is_dictionary(f.type) else f.type))
        for f in schema
    ]
    digest = {
        "files": len(files),
        "rows": rows,
        "weeks": weeks,
        "schema": types,
        "columns": {c: values[2 * i : 2 * i + 2] for i, (c, _) in enumerate(cols)},
        "floats": [c for c, kind in cols if kind in FLOAT_TYPES],
    }
    if name == "exposure":
        digest["ranked"] = [
            r[0]
            for r in con.execute(
                f"SELECT workload FROM {rel} WHERE kind = 'candidate' ORDER BY rank"
            ).fetchall()
        ]
    return digest


def compare_digests(
    ours: dict, duck: dict, name: str, rel_tol: float, skip: tuple[str, ...] = ()
) -> list[str]:
    """How DuckDB's dataset differs from ours (empty: the same rows, to float tolerance);
    ``skip``: columns known to differ."""
    problems = []
    for key in ("rows", "weeks", "schema", "ranked"):
        if ours.get(key) != duck.get(key):
            problems.append(f"{name}: {key} ours {ours.get(key)!r}, duckdb {duck.get(key)!r}")
    for col, (count, value) in ours.get("columns", {}).items():
        if col in NOT_COMPARED or col in skip:
            continue
        other = duck.get("columns", {}).get(col)
        if other is None:
            problems.append(f"{name}.{col}: not in DuckDB's files")
            continue
        if count != other[0]:
            problems.append(f"{name}.{col}: {count} values, DuckDB {other[0]}")
        elif col in ours["floats"]:
            if abs(value - other[1]) > rel_tol * max(abs(value), abs(other[1]), 1e-9):
                problems.append(f"{name}.{col}: sum {value!r}, DuckDB {other[1]!r}")
        elif value != other[1]:
            problems.append(f"{name}.{col}: values differ (hash sums {value} / {other[1]})")
    return problems


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _n(con: Any, table: str) -> int:
    return con.execute(f"SELECT count(*) FROM {table}").fetchall()[0][0]
