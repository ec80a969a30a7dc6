"""The Prometheus sampler backend against a real Prometheus (Debian's 2.42) and stand-ins.

The history is back-filled with promtool (tests/support/prometheus_server.py), so every number is
known: GPU-aaaa on local-a scrapes every second for 3.5 h with a 5-minute hole, ten NaN
samples and a job change; GPU-cccc starts 100 s late; local-b's GPU must never show up.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest

from tasks.data.datasets import SAMPLE_GAPS, SAMPLES, DatasetSpec
from tasks.data.plan import PrometheusMetric, PrometheusSource
from tasks.data.store import conform
from tasks.window.sampling.prometheus import (
    MAX_POINTS_PER_SERIES,
    PrometheusError,
    PrometheusReader,
    PrometheusUnreachable,
    fetch_span,
    node_expression,
    read_span,
    span_chunks,
)
from tests.support.prometheus_server import (
    PrometheusServer,
    backfill,
    free_port,
    serve_answers,
    silent_port,
    start_prometheus,
    write_openmetrics,
)

UTC = dt.UTC
# Inside the default 15-day retention (older back-filled blocks are deleted at start-up).
T0 = (dt.datetime.now(UTC) - dt.timedelta(days=1)).replace(minute=0, second=0, microsecond=0)
END = 12_600  # seconds of history after T0
HOLE = (3600, 3900)  # no samples strictly between
NAN = range(5000, 5010)
JOB_CHANGE = 6000
A, B, C = "GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbb", "GPU-cccc"


def _value(t: int) -> float:
    return float(t % 97)


def _history() -> list[tuple[str, dict[str, str], list[tuple[float, float]]]]:
    ts = T0.timestamp()
    base = {"Hostname": "local-a", "UUID": A, "gpu": "0"}

    def pts(times: range) -> list[tuple[float, float]]:
        return [
            (ts + t, float("nan") if t in NAN else _value(t))
            for t in times
            if not HOLE[0] < t < HOLE[1]
        ]

    util = "DCGM_FI_DEV_GPU_UTIL"
    return [
        (util, {**base, "hpc_job": "12"}, pts(range(0, JOB_CHANGE))),
        (util, {**base, "hpc_job": "13"}, pts(range(JOB_CHANGE, END + 1))),
        (
            util,
            {"Hostname": "local-b", "UUID": B, "gpu": "0", "hpc_job": "99"},
            pts(range(END + 1)),
        ),
        (
            util,
            {"Hostname": "local-a", "UUID": C, "gpu": "1", "hpc_job": ""},
            [(ts + t, 50.0) for t in range(100, END + 1)],
        ),
        # No UUID label: the entity is the series' labels, the device unknown.
        (
            "DCGM_FI_DEV_FB_USED",
            {"Hostname": "local-a", "gpu": "0"},
            [(ts + t, 1e9) for t in range(0, END + 1, 10)],
        ),
    ]


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    tmp = tmp_path_factory.mktemp("prometheus")
    tsdb = tmp / "tsdb"
    backfill(write_openmetrics(tmp / "history.om", _history()), tsdb)
    server = start_prometheus(tmp, tsdb)
    try:
        yield server
    finally:
        server.stop()
    assert server.proc.poll() is not None


def _source(url: str, step_s: float = 30, **kw: Any) -> PrometheusSource:
    metrics = kw.pop(
        "metrics",
        [
            PrometheusMetric(
                metric="gpu_utilization", query="DCGM_FI_DEV_GPU_UTIL", unit="percent"
            ),
            PrometheusMetric(metric="memory_used_bytes", query="DCGM_FI_DEV_FB_USED", unit="bytes"),
            PrometheusMetric(metric="sm_activity", query="DCGM_FI_PROF_SM_ACTIVE", unit="fraction"),
        ],
    )
    return PrometheusSource(url=url, step_s=step_s, metrics=metrics, **kw)


def _at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def _conforms(rows: list[dict[str, Any]], spec: DatasetSpec) -> pd.DataFrame:
    """Rows with dummy run columns pass conform and the declared allowed values/bounds."""
    df = pd.DataFrame(rows)
    df["poc"], df["run_id"] = "demo", "run-1"
    for col in spec.column_names:
        if col.startswith("fp_"):
            df[col] = 1 if col in ("fp_cores", "fp_mem_bytes", "fp_gpu_count") else "x"
    table = conform(df, spec)
    for col in spec.columns:
        values = table.column(col.name).to_pylist()
        if not col.nullable:
            assert None not in values, col.name
        if col.allowed is not None:
            assert {v for v in values if v is not None} <= set(col.allowed), col.name
        if col.min is not None:
            assert all(v >= col.min for v in values if v is not None), col.name
    return df


# --- pure ---------------------------------------------------------------------------------------


def test_span_chunks_cover_the_grid_once_within_the_limit() -> None:
    chunks = span_chunks(0, 25_000_500, 1000, max_points=11_000)
    times = [t for c in chunks for t in c.times()]
    assert times == [*range(1000, 25_000_001, 1000), 25_000_500]
    assert all(len(c.times()) <= 11_000 for c in chunks)
    assert [len(c.times()) for c in chunks] == [11_000, 11_000, 3_000, 1]
    assert chunks[-1].window_ms == 500  # the tail shorter than a step covers just itself


def test_node_expression_restricts_safely() -> None:
    assert node_expression("DCGM_FI_DEV_GPU_UTIL", "Hostname", "n1") == (
        'DCGM_FI_DEV_GPU_UTIL{Hostname="n1"}',
        True,
    )
    assert node_expression('x{gpu="0", a=~"}{,"} ', "Hostname", "n1") == (
        'x{gpu="0", a=~"}{,",Hostname="n1"}',
        True,
    )
    assert node_expression('{__name__="x"}', "h", 'a"b\\c') == (
        '{__name__="x",h="a\\"b\\\\c"}',
        True,
    )
    expr, selector = node_expression('avg by (Hostname) (x{Hostname="$node"})', "Hostname", 'q"')
    assert not selector
    assert expr == (
        '(avg by (Hostname) (x{Hostname="q\\""})) and on(Hostname) '
        'label_replace(vector(1), "Hostname", "q\\"", "", "")'
    )


def test_naive_datetimes_and_bad_label_names_are_refused() -> None:
    reader = PrometheusReader(_source("http://127.0.0.1:9"))
    with pytest.raises(ValueError, match="timezone-aware"):
        reader.fetch_span("n", dt.datetime(2025, 1, 1), dt.datetime(2025, 1, 2))
    with pytest.raises(PrometheusError, match="not a Prometheus label name"):
        PrometheusReader(_source("http://127.0.0.1:9", node_label='x"} or up{'))


# --- a real Prometheus with a back-filled history -----------------------------------------------


def test_rows_labels_and_gaps(prom: PrometheusServer) -> None:
    rows, gaps = read_span(_source(prom.url), "local-a", _at(0), _at(END + 60))
    df = _conforms(rows, SAMPLES)
    gdf = _conforms(gaps, SAMPLE_GAPS)

    assert set(df["entity"]) == {A, C, '{gpu="0"}'}  # never local-b's GPU
    assert set(df["node"]) == {"local-a"} and set(df["source"]) == {"prometheus"}
    a = df[df["entity"] == A].set_index("t_to")
    assert set(a["device"]) == {"gpu"} and set(a["gpu_uuid"]) == {A}
    assert set(a["unit"]) == {"percent"} and set(a["metric"]) == {"gpu_utilization"}
    assert set(a["gpu_index"]) == {0}
    # A row averages the 30 scrapes of its step (range closed on the right only).
    row = a.loc[_at(1230)]
    assert row["points"] == 30 and row["t_from"] == _at(1200)
    assert row["value"] == pytest.approx(sum(_value(t) for t in range(1201, 1231)) / 30)
    # Job from hpc_job; a job change mid-step is one row (no false gap), of the main job.
    assert a.loc[_at(5970), "job_id"] == "12" and a.loc[_at(6030), "job_id"] == "13"
    assert a.loc[_at(6000), "job_id"] == "12" and a.loc[_at(6000), "points"] == 30
    assert set(a["attributed_by"]) == {"label"}
    c = df[df["entity"] == C]
    assert c["job_id"].isna().all() and set(c["attributed_by"]) == {"none"}
    fb = df[df["entity"] == '{gpu="0"}']
    assert set(fb["device"]) == {"unknown"} and set(fb["points"]) == {3}

    def gaps_of(entity: str | None, metric: str) -> list[tuple[dt.datetime, dt.datetime]]:
        sel = gdf[(gdf["metric"] == metric)]
        sel = sel[sel["entity"].isna()] if entity is None else sel[sel["entity"] == entity]
        return sorted(zip(sel["t_from"], sel["t_to"], strict=True))

    assert gaps_of(A, "gpu_utilization") == [
        (_at(3600), _at(3870)),  # the hole: the step ending at 3900 holds its 3900 sample
        (_at(4980), _at(5010)),  # the steps whose average NaN made
        (_at(END), _at(END + 60)),  # the end of the span not covered
    ]
    assert gaps_of(C, "gpu_utilization") == [(_at(0), _at(90)), (_at(END), _at(END + 60))]
    assert gaps_of(None, "sm_activity") == [(_at(0), _at(END + 60))]
    assert set(gdf["detected_by"]) == {"prometheus"}
    assert gdf["reason"].str.startswith("no points from Prometheus").all()
    nan_gap = gdf[(gdf["entity"] == A) & (gdf["t_from"] == _at(4980))]
    assert "NaN" in nan_gap["reason"].iloc[0]
    # Every step but 9 in the hole, 1 NaN and the 2 after the history ends.
    assert len(df[(df["entity"] == A)]) == (END + 60) // 30 - 9 - 1 - 2


def test_more_points_than_prometheus_allows_are_chunked(prom: PrometheusServer) -> None:
    source = _source(
        prom.url,
        step_s=1,
        metrics=[
            PrometheusMetric(metric="gpu_utilization", query="DCGM_FI_DEV_GPU_UTIL", unit="percent")
        ],
    )
    reader = PrometheusReader(source)
    # The limit is real: one request for the whole span is refused by Prometheus.
    with pytest.raises(PrometheusError, match=r"HTTP 400.*bad_data.*11,000") as exc:
        reader.query_range(
            'DCGM_FI_DEV_GPU_UTIL{Hostname="local-a"}',
            round(T0.timestamp() * 1000) + 1000,
            round(T0.timestamp() * 1000) + END * 1000,
        )
    assert prom.url in str(exc.value)
    reader.requests.clear()

    rows, gaps = reader.fetch_span("local-a", _at(0), _at(END))
    assert END > MAX_POINTS_PER_SERIES
    assert [r.points for r in reader.requests] == [11_000, 11_000, END - 11_000, END - 11_000]
    a = {r["t_to"]: r for r in rows if r["entity"] == A}
    expected = [t for t in range(1, END + 1) if not HOLE[0] < t < HOLE[1] and t not in NAN]
    assert sorted(a) == [_at(t) for t in expected]  # every point, none twice
    assert all(a[_at(t)]["value"] == _value(t) and a[_at(t)]["points"] == 1 for t in expected)
    assert [(g["t_from"], g["t_to"]) for g in gaps if g["entity"] == A] == [
        (_at(3600), _at(3899)),
        (_at(4999), _at(5009)),
    ]


def test_weird_node_names_cannot_break_the_query(prom: PrometheusServer) -> None:
    node = 'local-a"} or DCGM_FI_DEV_GPU_UTIL{x="'
    rows, gaps = read_span(_source(prom.url), node, _at(0), _at(600))
    assert rows == []
    assert [g["metric"] for g in gaps] == ["gpu_utilization", "memory_used_bytes", "sm_activity"]
    assert all("no series" in g["reason"] and g["detected_by"] == "prometheus" for g in gaps)


def test_an_expression_is_filtered_to_the_node_and_averaged(prom: PrometheusServer) -> None:
    metric = PrometheusMetric(
        metric="gpu_utilization",
        query='max by (Hostname, UUID) (DCGM_FI_DEV_GPU_UTIL{Hostname=~"$node|local-b"})',
        unit="percent",
    )
    rows, gaps = fetch_span(_source(prom.url, metrics=[metric]), "local-a", _at(0), _at(600))
    assert {r["entity"] for r in rows} == {A, C}
    assert {(g["entity"], g["t_to"]) for g in gaps} == {(C, _at(90))}  # C starts at 100 s
    a = [r for r in rows if r["entity"] == A]
    assert len(a) == 20 and all(r["points"] == 6 for r in a)  # evaluations every 5 s


def test_a_bad_query_is_a_gap_with_prometheus_error_text(prom: PrometheusServer) -> None:
    bad = PrometheusMetric(metric="gpu_utilization", query="sum(", unit="percent")
    good = PrometheusMetric(metric="memory_used_bytes", query="DCGM_FI_DEV_FB_USED", unit="bytes")
    rows, gaps = read_span(_source(prom.url, metrics=[bad, good]), "local-a", _at(0), _at(600))
    assert {r["metric"] for r in rows} == {"memory_used_bytes"}  # the other metric still read
    (gap,) = gaps
    assert gap["metric"] == "gpu_utilization" and gap["entity"] is None
    assert (gap["t_from"], gap["t_to"]) == (_at(0), _at(600)) and gap["detected_by"] == "sampler"
    assert prom.url in gap["reason"] and "HTTP 400" in gap["reason"]
    assert "bad_data" in gap["reason"] and "parse error" in gap["reason"]


# --- Prometheus down or answering garbage -------------------------------------------------------


def test_prometheus_down_is_a_whole_span_gap_per_metric() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    reader = PrometheusReader(_source(url))
    rows, gaps = read_span(reader.source, "local-a", _at(0), _at(600), reader=reader)
    assert rows == [] and len(reader.requests) == 1  # down: the other metrics are not tried
    assert [g["metric"] for g in gaps] == ["gpu_utilization", "memory_used_bytes", "sm_activity"]
    for g in gaps:
        assert (g["t_from"], g["t_to"], g["gap_s"]) == (_at(0), _at(600), 600.0)
        assert url in g["reason"] and "connection refused" in g["reason"]
    _conforms(gaps, SAMPLE_GAPS)
    with pytest.raises(PrometheusUnreachable, match="connection refused"):
        fetch_span(reader.source, "local-a", _at(0), _at(600))


def test_prometheus_not_answering_times_out() -> None:
    with silent_port() as url:
        source = _source(url, timeout_s=0.5)
        started = time.monotonic()
        rows, gaps = read_span(source, "local-a", _at(0), _at(600))
        assert time.monotonic() - started < 5
    assert rows == [] and len(gaps) == 3
    assert all("timeout" in g["reason"] and url in g["reason"] for g in gaps)


def _matrix(result: Any) -> bytes:
    return json.dumps(
        {"status": "success", "data": {"resultType": "matrix", "result": result}}
    ).encode()


def test_nan_and_inf_values_are_gaps_not_rows() -> None:
    t = _at(30).timestamp()
    body = _matrix(
        [
            {
                "metric": {"Hostname": "n", "UUID": "GPU-x"},
                "values": [[t, "NaN"], [t + 30, "+Inf"], [t + 60, "7"]],
            }
        ]
    )
    metric = PrometheusMetric(metric="gpu_utilization", query="x", unit="percent")
    with serve_answers(200, body) as url:
        rows, gaps = fetch_span(_source(url, metrics=[metric]), "n", _at(0), _at(90))
    assert [(r["t_to"], r["value"]) for r in rows] == [(_at(90), 7.0)]
    assert [(g["t_from"], g["t_to"]) for g in gaps] == [(_at(0), _at(60))]


# --- a live exporter scraped by a real Prometheus -----------------------------------------------


def test_sample_window_reads_history_from_where_the_last_run_ended(
    prom: PrometheusServer, write_plan
) -> None:
    """Through the sampler run (tasks.window.sampling.nodes.sample): a first run reads one
    span back, a second starts exactly where the first ended; nothing is read twice, and only
    Prometheus's own holes are gaps."""
    from tasks.data.plan import load_plan
    from tasks.data.runctx import open_run
    from tasks.data.store import read_dataset
    from tasks.window.sampling.nodes import sample

    metrics = [{"metric": "gpu_utilization", "query": "DCGM_FI_DEV_GPU_UTIL", "unit": "percent"}]
    path = write_plan(
        {
            "window.sampler": "prometheus",
            "window.span_s": 86400,
            "window.prometheus": {"url": prom.url, "step_s": 60, "metrics": metrics},
            # The history starts yesterday (T0): a window opened before it reads it back.
            "window.start": (T0 - dt.timedelta(days=1)).date().isoformat(),
        }
    )
    plan = load_plan(path)
    with open_run(plan, path, "sample_window") as ctx:
        first = sample(plan, ctx, node="local-a")
    with open_run(plan, path, "sample_window") as ctx:
        second = sample(plan, ctx, node="local-a")
    assert second.from_ == first.to
    samples = read_dataset(SAMPLES, data_dir=plan.data_dir, poc=plan.poc)
    gaps = read_dataset(SAMPLE_GAPS, data_dir=plan.data_dir, poc=plan.poc)
    assert first.samples > 0 and len(samples) == first.samples + second.samples
    assert not samples.duplicated(["node", "source", "entity", "metric", "t_to"]).any()
    assert set(samples["node"]) == {"local-a"}  # local-b's GPU is never read
    assert set(samples["entity"]) <= {A, C}
    hole = gaps[(gaps["entity"] == A) & (gaps["reason"].str.contains("no points"))]
    assert len(hole) >= 1  # the exporter's 5-minute hole, at the least
