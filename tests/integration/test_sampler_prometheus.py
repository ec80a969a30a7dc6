"""The Prometheus sampler backend against a real Prometheus (Debian's 2.42) and stand-ins.

The history is back-filled with promtool (tests/support/prometheus_server.py), so every number is
known: GPU-aaaa on local-a scrapes every second for 3.5 h with a 5-minute hole, ten NaN
samples and a job change; GPU-cccc starts 100 s late; local-b's GPU must never show up.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import pytest

from tasks.data.plan import PrometheusMetric
from tasks.window.sampling.prometheus import (
    PrometheusError,
    PrometheusUnreachable,
    fetch_span,
    read_span,
)
from tests.support.prometheus_server import (
    serve_answers,
    start_exporter,
    start_prometheus,
)
from tests.unit.test_sampler_prometheus import UTC, A, _at, _matrix, _source


@pytest.mark.parametrize(
    ("status", "body", "cause"),
    [
        (200, b"<html>not prometheus</html>", "not JSON"),
        (200, b"[1, 2]", "not a JSON object"),
        (200, b'{"status":"success","data":{"resultType":"vector","result":[]}}', "not a matrix"),
        (200, b'{"status":"error","errorType":"timeout","error":"query timed out"}', "timed out"),
        (200, _matrix({"a": 1}), "not a list"),
        (200, _matrix([{"metric": {"a": 1}, "values": []}]), "map of label strings"),
        (200, _matrix([{"metric": {}, "values": [[1, "abc"]]}]), "is not [time"),
        (200, _matrix([{"metric": {}, "values": [["1", "2"]]}]), "is not [time"),
        (503, b"Service Unavailable", "HTTP 503"),
        (422, b'{"status":"error","errorType":"execution","error":"too many samples"}', "too many"),
    ],
)
def test_garbage_answers_are_clear_errors_naming_the_url(
    status: int, body: bytes, cause: str
) -> None:
    with serve_answers(status, body) as url:
        with pytest.raises(PrometheusError, match="Prometheus at") as exc:
            fetch_span(_source(url), "local-a", _at(0), _at(600))
        assert url in str(exc.value) and cause in str(exc.value)
        assert not isinstance(exc.value, PrometheusUnreachable)
        rows, gaps = read_span(_source(url), "local-a", _at(0), _at(600))
    assert rows == [] and len(gaps) == 3 and all(cause in g["reason"] for g in gaps)


def test_live_exporter_scrape_and_outage(tmp_path: Path) -> None:
    exporter = start_exporter(A, "live-node", "42", 63.0)
    server = start_prometheus(tmp_path, tmp_path / "tsdb", targets=[exporter.address])
    try:
        source = _source(
            server.url,
            step_s=1,
            metrics=[
                PrometheusMetric(
                    metric="gpu_utilization", query="DCGM_FI_DEV_GPU_UTIL", unit="percent"
                )
            ],
        )
        start = dt.datetime.now(UTC).replace(microsecond=0)
        deadline = time.monotonic() + 60
        rows: list[dict[str, Any]] = []
        while time.monotonic() < deadline and len(rows) < 4:
            time.sleep(1)
            now = dt.datetime.now(UTC).replace(microsecond=0)
            rows, _ = fetch_span(source, "live-node", start, now)
        assert len(rows) >= 4, server.log_tail()
        assert {(r["entity"], r["job_id"], r["value"], r["device"]) for r in rows} == {
            (A, "42", 63.0, "gpu")
        }
        exporter.stop()
        stopped = dt.datetime.now(UTC)
        time.sleep(5)
        end = dt.datetime.now(UTC).replace(microsecond=0)
        rows, gaps = read_span(source, "live-node", start, end)
        last = max(gaps, key=lambda g: g["t_to"])
        assert last["t_to"] == end and last["entity"] == A
        assert abs((last["t_from"] - stopped).total_seconds()) <= 3
        assert max(r["t_to"] for r in rows) <= last["t_from"]
    finally:
        exporter.stop()
        server.stop()
