"""The SQL of bench/baseline_ingest_duckdb.py (the ``duckdb-equal`` contender): ours' parse
rules, checks, pseudonyms and exposure written as DuckDB SQL. The rules are restated from
tasks/baseline (fields.py, blocks.py, time_formats.py, exposure.py) so that DuckDB runs
nothing of ours; ``restated_drift`` there checks the restated constants against the product.
"""

from __future__ import annotations

from typing import Any

# Restated from tasks/baseline (the parser's rules), checked against it by restated_drift().
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
JOB_ID_RE = (
    r"^(?P<base>\d+)(?:_(?P<task>\d+|\[[^\]]*\]))?(?:\+(?P<het>\d+))?"
    r"(?:\.(?P<step>[A-Za-z0-9_-]+\+?))?$"
)
MEM_RE = r"^(\d+(?:\.\d+)?)([KMGTP]?)[nc]?$"
DURATION_RE = r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)(?:\.\d+)?$"
ABSENT = ("", "Unknown", "None")
ISO_FORMAT = "%Y-%m-%dT%H:%M:%S"
CHAIN_GAP_US = 24 * 3600 * 10**6
NO_STATE = "(no State in the dump)"
EXPOSED_STATES = (
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
)
TOP_CANDIDATES = 20

# --- SQL ----------------------------------------------------------------------------------------


def q(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def sql_in(values: tuple[str, ...] | list[str]) -> str:
    return "(" + ", ".join(q(v) for v in values) + ")"


def _blob(data: bytes) -> str:
    return "'" + "".join(f"\\x{b:02X}" for b in data) + "'::BLOB"


def pseudonym_macro(key: bytes) -> str:
    """HMAC-SHA256(key, prefix NUL value), hex, first 16: tasks.baseline.pseudonym's token."""
    import hashlib

    block = key if len(key) <= 64 else hashlib.sha256(key).digest()
    block = block.ljust(64, b"\0")
    ipad, opad = bytes(b ^ 0x36 for b in block), bytes(b ^ 0x5C for b in block)
    inner = f"unhex(sha256({_blob(ipad)} || encode(prefix) || '\\x00'::BLOB || encode(v)))"
    return (
        f"CREATE MACRO pseudonym(prefix, v) AS "
        f"prefix || '-' || left(sha256({_blob(opad)} || {inner}), 16)"
    )


TIMES = ("Submit", "Start", "End")
COUNTS = ("ElapsedRaw", "NNodes", "NCPUS")


def _reasons_late() -> str:
    """The per-row reasons after the per-distinct-value ones: times, counts, Elapsed."""
    out = []
    for name in TIMES:
        fmt = f"{name} is not a timestamp in the dump's format (standard ({ISO_FORMAT}))"
        out.append(
            f"CASE WHEN v_{name} IS NULL AND t_{name} NOT IN {sql_in(ABSENT)} THEN {q(fmt)} "
            f"WHEN v_{name} < TIMESTAMP '2000-01-01' OR v_{name} >= TIMESTAMP '2100-01-01' "
            f"THEN '{name} is outside any plausible accounting history (2000-2099)' END"
        )
    for name in COUNTS:
        out.append(
            f"CASE WHEN v_{name} < 0 THEN '{name} is negative' WHEN v_{name} IS NULL AND "
            f"t_{name} NOT IN {sql_in(ABSENT)} THEN '{name} is not an integer' END"
        )
    out.append(
        "CASE WHEN v_ElapsedRaw IS NULL AND starts_with(t_Elapsed, '-') THEN 'Elapsed is "
        "negative' WHEN v_ElapsedRaw IS NULL AND t_Elapsed <> '' AND dur_s(t_Elapsed) IS NULL "
        "THEN 'Elapsed is not [D-]HH:MM:SS' END"
    )
    return ",\n             ".join(out)


def parse_sql() -> str:
    """The dump → ``parsed``: per-row fields, and the first per-row reason (JobID first,
    then times, counts and Elapsed; the per-distinct-value ones come between, in the view).
    Each value is worked out once, a level below the expressions that use it."""
    columns = ", ".join(f"{q(f)}: 'VARCHAR'" for f in SACCT_FIELDS)
    texts = ", ".join(
        [f"trim(coalesce(\"{n}\", '')) AS t_{n}" for n in TIMES]
        + [f"coalesce(\"{n}\", '') AS t_{n}" for n in (*COUNTS, "Elapsed")]
    )
    values = ", ".join(
        [f"CAST(try_strptime(t_{n}, {q(ISO_FORMAT)}) AS TIMESTAMPTZ) AS v_{n}" for n in TIMES]
        + [
            f"CASE WHEN regexp_full_match(t_{n}, '-?\\d{{1,15}}') THEN CAST(t_{n} AS BIGINT) "
            f"END AS v_{n}"
            for n in COUNTS
        ]
    )
    step = "id.step"
    untruncated = " ".join(
        f"WHEN starts_with({q(s)}, left({step}, -1)) THEN {q(s)}"
        for s in ("batch", "extern", "interactive")
    )
    return f"""
CREATE TEMP TABLE parsed AS
WITH r AS (
    SELECT *, regexp_extract(coalesce(JobID, ''), {q(JOB_ID_RE)},
                             ['base', 'task', 'het', 'step']) AS id, {texts}
    FROM read_csv($path, delim = '|', header = true, quote = '', escape = '',
                  null_padding = true, store_rejects = true, auto_detect = false,
                  columns = {{{columns}}})
), v AS (SELECT *, {values} FROM r)
SELECT
    coalesce(nullif(Cluster, ''), 'unknown') AS cluster,
    coalesce(JobID, '') AS job_id,
    CASE WHEN split_part(coalesce(JobIDRaw, ''), '.', 1) = '' THEN id.base
         ELSE split_part(JobIDRaw, '.', 1) END AS job_id_raw,
    CASE WHEN id.task <> '' THEN id.base END AS array_job_id,
    nullif(id.task, '') AS array_task_id,
    CASE WHEN id.het <> '' THEN id.base END AS het_job_id,
    TRY_CAST(nullif(id.het, '') AS BIGINT) AS het_offset,
    CASE WHEN {step} = '' THEN NULL WHEN NOT ends_with({step}, '+') THEN {step}
         {untruncated} ELSE {step} END AS step,
    id.step = '' AS is_allocation,
    coalesce("Partition", '') AS "partition",
    coalesce("User", '') AS user_raw,
    coalesce(Account, '') AS account_raw,
    coalesce(JobName, '') AS job_name,
    coalesce(State, '') AS state_raw,
    coalesce(ExitCode, '') AS exit_raw,
    v_Submit AS submit, v_Start AS "start", v_End AS "end",
    -- CASE, not coalesce: DuckDB works out every argument of coalesce on every row
    CASE WHEN v_ElapsedRaw IS NOT NULL THEN v_ElapsedRaw
         ELSE coalesce(dur_s(t_Elapsed), 0) END AS elapsed_s,
    coalesce(Timelimit, '') AS timelimit_raw,
    v_NNodes AS nnodes_field,
    v_NCPUS AS ncpus_field,
    coalesce(AllocTRES, '') AS tres_raw,
    coalesce(NodeList, '') AS node_list,
    CASE WHEN id.base = '' THEN 'JobID does not match 123, 123_4, 123+0 or 123.step' END
        AS why_first,
    coalesce({_reasons_late()}) AS why_last
FROM v
"""


MACROS = f"""
CREATE MACRO dur_s(t) AS CASE WHEN regexp_full_match(t, {q(DURATION_RE)}) THEN
    ((coalesce(TRY_CAST(nullif(regexp_extract(t, {q(DURATION_RE)}, 1), '') AS BIGINT), 0) * 24
      + coalesce(TRY_CAST(nullif(regexp_extract(t, {q(DURATION_RE)}, 2), '') AS BIGINT), 0))
      * 60 + CAST(regexp_extract(t, {q(DURATION_RE)}, 3) AS BIGINT)) * 60
      + CAST(regexp_extract(t, {q(DURATION_RE)}, 4) AS BIGINT) END;
CREATE MACRO tres_items(t) AS list_transform(string_split(t, ','), lambda x: {{
    'name': CASE WHEN instr(x, '=') > 0 THEN left(x, instr(x, '=') - 1) END,
    'value': CASE WHEN instr(x, '=') > 0 THEN substr(x, instr(x, '=') + 1) END}});
CREATE MACRO mem_bytes(v) AS CAST(trunc(CAST(regexp_extract(v, {q(MEM_RE)}, 1) AS DOUBLE)
    * CASE regexp_extract(v, {q(MEM_RE)}, 2) WHEN 'K' THEN 1024 WHEN 'G' THEN 1073741824
      WHEN 'T' THEN 1099511627776 WHEN 'P' THEN 1125899906842624 ELSE 1048576 END) AS BIGINT);
CREATE MACRO tres_last(items, n) AS
    TRY_CAST(list_last(list_filter(items, lambda i: i.name = n)).value AS BIGINT);
"""


def maps_sql(states: tuple[str, ...]) -> str:
    """Each distinct value of the few-valued fields, parsed once (as ours does)."""
    mem = MEM_RE
    return f"""
CREATE TEMP TABLE state_map AS
SELECT v, CASE WHEN n IN {sql_in(states)} THEN n ELSE 'UNKNOWN' END AS state,
       CASE WHEN n IN {sql_in(states)} THEN n ELSE coalesce(nullif(n, ''), {q(NO_STATE)}) END AS sx,
       CASE WHEN n NOT IN {sql_in(states)} AND NOT regexp_full_match(n, '[A-Z][A-Z0-9_]*')
            THEN 'State is empty or not a state name (A-Z, 0-9, _)' END AS why
FROM (SELECT v, rtrim(split_part(regexp_replace(v, '^\\s+|\\s+$', '', 'g'), ' ', 1), '+') AS n
      FROM (SELECT DISTINCT state_raw AS v FROM parsed));
CREATE TEMP TABLE exit_map AS
SELECT v, code, signal,
       CASE WHEN v <> '' AND (NOT ok OR code IS NULL OR code > 255 OR signal > 255)
            THEN 'ExitCode is not N:M, 0 ≤ N, M ≤ 255' END AS why
FROM (SELECT v, ok,
             CASE WHEN ok THEN TRY_CAST(split_part(v, ':', 1) AS BIGINT) END AS code,
             CASE WHEN ok THEN coalesce(TRY_CAST(nullif(split_part(v, ':', 2), '') AS BIGINT), 0)
                  END AS signal
      FROM (SELECT v, regexp_full_match(v, '\\d+(:\\d+)?') AS ok
            FROM (SELECT DISTINCT exit_raw AS v FROM parsed)));
CREATE TEMP TABLE tl_map AS
SELECT v, CASE WHEN word THEN NULL WHEN digits THEN CAST(v AS BIGINT) * 60 ELSE dur_s(v) END AS s,
       CASE WHEN NOT word AND NOT digits AND dur_s(v) IS NULL
            THEN 'Timelimit is not [D-]HH:MM:SS, UNLIMITED or Partition_Limit' END AS why
FROM (SELECT v, v IN ('', 'UNLIMITED', 'Partition_Limit', 'INVALID', 'NONE') AS word,
             regexp_full_match(v, '\\d+') AS digits
      FROM (SELECT DISTINCT timelimit_raw AS v FROM parsed));
CREATE TEMP TABLE tres_map AS
SELECT v, given,
       CASE WHEN NOT given THEN 0
            ELSE coalesce(tres_last(items, 'gres/gpu'), list_sum(list_transform(
                list_filter(items, lambda i: starts_with(i.name, 'gres/gpu:')),
                lambda i: TRY_CAST(i.value AS BIGINT))), 0) END AS gpus,
       CASE WHEN given THEN tres_last(items, 'node') END AS nodes,
       CASE WHEN given THEN tres_last(items, 'cpu') END AS cpus,
       CASE WHEN given THEN mem_bytes(list_last(list_filter(items, lambda i: i.name = 'mem'
           AND regexp_full_match(i.value, {q(MEM_RE)}))).value) END AS mem,
       CASE WHEN given AND list_bool_or(list_transform(items, lambda i: i.name IS NULL
                OR (i.name = 'mem' AND NOT regexp_full_match(i.value, {q(mem)}))
                OR (i.name <> 'mem' AND NOT regexp_full_match(i.value, '\\d+'))))
            THEN 'AllocTRES is not name=value[,name=value…]' END AS why
FROM (SELECT v, v NOT IN ('', '(null)', 'N/A') AS given, tres_items(v) AS items
      FROM (SELECT DISTINCT tres_raw AS v FROM parsed));
CREATE TEMP TABLE user_map AS
SELECT v, pseudonym('user', v) AS token FROM (SELECT DISTINCT user_raw AS v FROM parsed);
CREATE TEMP TABLE account_map AS
SELECT v, pseudonym('account', v) AS token FROM (SELECT DISTINCT account_raw AS v FROM parsed);
"""


def checked_view(rejected_lines: int) -> str:
    """Each parsed row with its per-distinct-value fields and its first reason. Its line:
    the header is line 1, and lines the reader rejected are counted back in."""
    line = "p.rowid + 2"
    if rejected_lines:
        line += " + (SELECT count(*) FROM rejected WHERE rejected.rows_before <= p.rowid)"
    return f"""
CREATE TEMP TABLE rejected AS
SELECT line - 2 - row_number() OVER (ORDER BY line) + 1 AS rows_before FROM reject_errors;
CREATE TEMP VIEW checked AS
SELECT p.*, {line} AS source_line,
       s.state, s.sx, e.code AS exit_code, e.signal AS exit_signal, tl.s AS timelimit_s,
       coalesce(p.nnodes_field, t.nodes, 0) AS nnodes,
       coalesce(p.ncpus_field, t.cpus, 0) AS ncpus, t.gpus, t.mem AS mem_bytes,
       u.token AS "user", a.token AS account,
       coalesce(p.why_first, s.why, e.why, tl.why, t.why, p.why_last) AS reason
FROM parsed p
JOIN state_map s ON s.v = p.state_raw
JOIN exit_map e ON e.v = p.exit_raw
JOIN tl_map tl ON tl.v = p.timelimit_raw
JOIN tres_map t ON t.v = p.tres_raw
JOIN user_map u ON u.v = p.user_raw
JOIN account_map a ON a.v = p.account_raw
"""


def sql_type(t: Any) -> str:
    import pyarrow as pa

    if pa.types.is_string(t):
        return "VARCHAR"
    if pa.types.is_int64(t):
        return "BIGINT"
    if pa.types.is_float64(t):
        return "DOUBLE"
    if pa.types.is_boolean(t):
        return "BOOLEAN"
    if pa.types.is_timestamp(t) and t.tz is not None:
        return "TIMESTAMPTZ"
    raise TypeError(f"no DuckDB type for {t}")


def declared_select(spec: Any, exprs: dict[str, str]) -> str:
    """The declared columns, in the declared order, each cast to its declared type."""
    if list(exprs) != spec.column_names:
        raise SystemExit(f"bench: {spec.name} columns {list(exprs)} != {spec.column_names}")
    return ",\n    ".join(
        f'CAST({e} AS {sql_type(spec.column(n).type)}) AS "{n}"' for n, e in exprs.items()
    )


def stamped(spec: Any, exprs: dict[str, str]) -> dict[str, str]:
    """``exprs`` with the run stamp (poc, run_id, fingerprint) from the ``stamp`` table."""
    out = {name: f'stamp."{name}"' for name in ("poc", "run_id")}
    out.update(exprs)
    out.update({c.name: f'stamp."{c.name}"' for c in spec.columns if c.name.startswith("fp_")})
    return {n: out[n] for n in spec.column_names}


def exposure_sql() -> str:
    """Allocations (duplicate captures dropped) → by state, chains, ranked candidates."""
    exposed = sql_in(EXPOSED_STATES)
    # Workloads numbered: the windows partition by an integer, not three strings.
    order = "PARTITION BY wk ORDER BY submit NULLS LAST, source_line"
    hours = "elapsed_s * {} / 3600::DOUBLE"
    return f"""
CREATE TEMP TABLE workloads AS
SELECT user_raw, account_raw, job_name, row_number() OVER () AS wk
FROM (SELECT DISTINCT user_raw, account_raw, job_name FROM parsed);
CREATE TEMP TABLE alloc AS
SELECT c.cluster, c.job_id, c.job_id_raw, w.wk, c.account_raw, c.job_name, c.state, c.sx,
       c.state_raw, c.submit, c."start", c."end", {hours.format("nnodes")} AS node_h,
       {hours.format("gpus")} AS gpu_h, c.source_line
FROM checked c JOIN workloads w USING (user_raw, account_raw, job_name)
WHERE c.reason IS NULL AND c.is_allocation;
-- Duplicate captures: only rows whose raw job id repeats can be one (as ours looks).
DELETE FROM alloc WHERE rowid IN (
    SELECT rowid FROM (
        SELECT rowid, row_number() OVER (PARTITION BY cluster, job_id, submit, "start", "end",
                                         state_raw ORDER BY source_line) AS n
        FROM alloc
        WHERE job_id_raw IN (SELECT job_id_raw FROM alloc GROUP BY 1 HAVING count(*) > 1))
    WHERE n > 1);
CREATE TEMP TABLE by_state AS
SELECT sx AS state, count(*) AS allocations, sum(node_h) AS node_hours, sum(gpu_h) AS gpu_hours
FROM alloc GROUP BY sx ORDER BY sx;
CREATE TEMP TABLE chains AS
WITH linked AS (
    SELECT job_id, wk, account_raw, job_name, submit, source_line,
           coalesce(lag(job_id_raw) OVER w = job_id_raw AND lag(cluster) OVER w = cluster,
                    false) AS same_job,
           coalesce(NOT lag(state = 'COMPLETED') OVER w
                    AND epoch_us(submit) - epoch_us(lag("end") OVER w)
                        BETWEEN 0 AND {CHAIN_GAP_US}, false) AS follows
    FROM alloc WINDOW w AS ({order})
), grouped AS (
    SELECT *, sum(CASE WHEN same_job OR follows THEN 0 ELSE 1 END)
                  OVER ({order} ROWS UNBOUNDED PRECEDING) AS grp,
           coalesce(lead(same_job OR follows) OVER ({order}), false) AS next_linked
    FROM linked
)
SELECT any_value(account_raw) AS account_raw, any_value(job_name) AS job_name,
       list(job_id ORDER BY submit NULLS LAST, source_line) FILTER (WHERE NOT same_job) AS ids
FROM grouped
WHERE same_job OR follows OR next_linked  -- a row alone in its group is in no chain
GROUP BY wk, grp
HAVING count(*) FILTER (WHERE NOT same_job) >= 2;
CREATE TEMP TABLE candidates AS
WITH w AS (
    SELECT account_raw, job_name, count(*) AS allocations, sum(node_h) AS node_hours,
           sum(gpu_h) AS gpu_hours,
           coalesce(sum(gpu_h) FILTER (WHERE sx IN {exposed}), 0) AS exposed_gpu_hours,
           coalesce(sum(gpu_h) FILTER (WHERE sx = 'TIMEOUT'), 0) AS timeout_gpu_hours,
           count(*) FILTER (WHERE sx IN {exposed}) AS exposed_allocations
    FROM alloc GROUP BY account_raw, job_name
), c AS (SELECT account_raw, job_name, count(*) AS chains FROM chains GROUP BY ALL),
ranked AS (
    SELECT a.token || '/' || w.job_name AS workload, w.*, coalesce(c.chains, 0) AS chains
    FROM w JOIN account_map a ON a.v = w.account_raw
    LEFT JOIN c ON c.account_raw = w.account_raw AND c.job_name = w.job_name
    WHERE w.exposed_allocations > 0
)
SELECT *, row_number() OVER (ORDER BY exposed_gpu_hours DESC, exposed_allocations DESC,
                                      chains DESC, workload) AS rank
FROM ranked ORDER BY rank LIMIT {TOP_CANDIDATES};
CREATE TEMP TABLE exposure_rows AS
SELECT 'state' AS kind, state, NULL AS workload, allocations, node_hours, gpu_hours,
       CASE WHEN state IN {exposed} THEN gpu_hours ELSE 0 END AS exposed_gpu_hours,
       CASE WHEN state = 'TIMEOUT' THEN gpu_hours ELSE 0 END AS timeout_gpu_hours,
       CASE WHEN state IN {exposed} THEN allocations ELSE 0 END AS exposed_allocations,
       0 AS chains, NULL AS rank
FROM by_state
UNION ALL
SELECT 'candidate', NULL, workload, allocations, node_hours, gpu_hours, exposed_gpu_hours,
       timeout_gpu_hours, exposed_allocations, chains, rank
FROM candidates;
"""


def quarantine_select(spec: Any, states: tuple[str, ...], bad_rows: bool) -> str:
    """Quarantined rows (the checks' rejects and the reader's), identities as tokens: a
    checked row rebuilt from its fields as parsed, a rejected line as read, every field that
    is not plainly an id, count, time or state a token (tasks/baseline/quarantine.py)."""
    hms = " || ':' || ".join(
        f"lpad(CAST({e} AS VARCHAR), 2, '0')"
        for e in ("elapsed_s % 86400 // 3600", "elapsed_s % 3600 // 60", "elapsed_s % 60")
    )
    elapsed = f"CASE WHEN elapsed_s >= 86400 THEN (elapsed_s // 86400) || '-' ELSE '' END || {hms}"
    fields = ", ".join(
        f"coalesce({f}, '')"
        for f in [
            *("job_id", "job_id_raw", "cluster", '"partition"', '"user"', "account", "job_name"),
            *("state_raw", "exit_raw"),
            *(f"strftime({t}, {q(ISO_FORMAT)})" for t in ("submit", '"start"', '"end"')),
            elapsed,
            *("CAST(elapsed_s AS VARCHAR)", "timelimit_raw", "CAST(nnodes_field AS VARCHAR)"),
            *("CAST(ncpus_field AS VARCHAR)", "tres_raw", "node_list"),
        ]
    )
    plain = (
        "regexp_full_match(x, '[\\d\\s:_.+\\-\\[\\]%,T]*') OR x IN ('Unknown', 'None', "
        f"'None assigned', 'UNLIMITED', 'Partition_Limit') OR rtrim(split_part(x, ' ', 1), '+') "
        f"IN {sql_in(states)}"
    )
    tokens = (
        "array_to_string(list_transform(string_split(csv_line, '|'), lambda x, i: "
        f"CASE WHEN x <> '' AND (i IN (5, 6) OR NOT ({plain})) THEN pseudonym(CASE i WHEN 5 "
        "THEN 'user' WHEN 6 THEN 'account' WHEN 7 THEN 'name' ELSE 'field' END, x) ELSE x END), "
        "'|')"
    )
    too_many = f"len(string_split(csv_line, '|')) || ' fields, expected {len(SACCT_FIELDS)}'"
    cols = {c: f'"{c}"' for c in spec.column_names}
    cols.update(source="$source", read_at="$now")
    return f"""
SELECT {declared_select(spec, stamped(spec, cols))}
FROM (
    SELECT source_line, reason, concat_ws('|', {fields}) AS raw
    FROM checked WHERE {"reason IS NOT NULL" if bad_rows else "false"}
    UNION ALL
    SELECT line, CASE WHEN error_type = 'TOO MANY COLUMNS' THEN {too_many}
                      ELSE error_message END, {tokens}
    FROM reject_errors
) CROSS JOIN stamp
"""
