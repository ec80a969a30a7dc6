"""Contract tests of the exact requests the slurmrestd source makes, against a local HTTP
server this test runs: for the versions the tests' Slurm (22.05, dbv0.0.38) cannot serve —
the OpenAPI description of a newer slurmrestd, and the newest-first probe of one without it.
What a real slurmrestd answers is tested in tests/integration/test_baseline_slurmrestd.py.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tasks.baseline.source_slurmrestd import TZ_PAD, RestClient, read_slurmrestd
from tasks.data.errors import AccountingError

TOKEN = "eyJhbGciOiJIUzI1NiJ9.contract-test-token.sig"
T0 = dt.datetime(2026, 3, 1)


def _epoch(t: dt.datetime) -> dict:
    """v0.0.40's number object."""
    return {"set": True, "infinite": False, "number": int(t.replace(tzinfo=dt.UTC).timestamp())}


def _job(job_id: int, start: dt.datetime, hours: float) -> dict:
    end = start + dt.timedelta(hours=hours)
    return {
        "job_id": job_id,
        "cluster": "c1",
        "name": f"j{job_id}",
        "state": {"current": ["COMPLETED"]},
        "time": {
            "submission": _epoch(start),
            "start": _epoch(start),
            "end": _epoch(end),
            "elapsed": int(hours * 3600),
        },
        "tres": {"allocated": [{"type": "gres", "name": "gpu", "count": 1}]},
    }


# Three days of history; job 2 runs across the first day edge, so two windows report it.
HISTORY = [
    _job(1, T0 + dt.timedelta(hours=2), 1),
    _job(2, T0 + dt.timedelta(hours=23), 3),
    _job(3, T0 + dt.timedelta(days=2, hours=5), 2),
]


class _Server:
    def __init__(self, openapi: bool, errors: list | None = None) -> None:
        self.requests: list[tuple[str, dict[str, str], dict[str, str]]] = []
        self.openapi, self.errors = openapi, errors

    def answer(self, path: str, query: dict[str, str]) -> tuple[int, dict]:
        if path.startswith("/openapi"):
            if not self.openapi:
                return 404, {}
            params = [{"name": n, "in": "query"} for n in ("start_time", "end_time", "users")]
            paths = {f"/slurmdb/v0.0.{n}/jobs": {"get": {"parameters": params}} for n in (38, 40)}
            paths["/slurmdb/v0.0.45/jobs"] = {"get": {"parameters": params}}  # not known yet
            return 200, {"paths": paths}
        if path != "/slurmdb/v0.0.40/jobs":
            return 404, {}
        if self.errors:
            return 500, {"errors": self.errors, "jobs": []}
        a, b = (dt.datetime.fromisoformat(query[k]) for k in ("start_time", "end_time"))
        lo, hi = (_epoch(t)["number"] for t in (a, b))
        jobs = [
            j
            for j in HISTORY
            if j["time"]["start"]["number"] < hi and j["time"]["end"]["number"] >= lo
        ]
        return 200, {"meta": {}, "errors": [], "jobs": jobs}


@pytest.fixture
def server(request) -> Iterator[tuple[str, _Server]]:
    state = _Server(*getattr(request, "param", (True,)))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(parts.query))
            state.requests.append(
                (parts.path, query, {k.lower(): v for k, v in self.headers.items()})
            )
            status, doc = state.answer(parts.path, query)
            body = json.dumps(doc).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", state
    httpd.shutdown()
    httpd.server_close()


def test_contract_pages_by_window_newest_known_version_headers(server) -> None:
    url, state = server
    start, end = T0, T0 + dt.timedelta(days=3)
    data, requests = read_slurmrestd(RestClient(url, TOKEN, "alice", 10), start, end, 1)
    assert state.requests[0][0] == "/openapi/v3"
    pages = state.requests[1:]
    assert requests == len(pages) == 5  # 3 days + 2 x 14 h of padding, one day a request
    assert {p for p, _, _ in pages} == {"/slurmdb/v0.0.40/jobs"}  # 0.0.45 is not known yet
    spans = [(q["start_time"], q["end_time"]) for _, q, _ in pages]
    assert spans[0][0] == f"{start - TZ_PAD:%Y-%m-%dT%H:%M:%S}"
    assert spans[-1][1] == f"{end + TZ_PAD:%Y-%m-%dT%H:%M:%S}"
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))  # no gap
    for _, _, headers in state.requests:
        assert headers["x-slurm-user-token"] == TOKEN and headers["x-slurm-user-name"] == "alice"
    rows = [line.split("|") for line in data.decode().splitlines()[1:]]
    assert sorted(r[1] for r in rows) == ["1", "2", "3"]  # job 2: two windows, one row
    assert {r[7] for r in rows} == {"COMPLETED"}


@pytest.mark.parametrize("server", [(False,)], indirect=True)
def test_contract_without_openapi_probes_newest_first(server) -> None:
    url, state = server
    read_slurmrestd(RestClient(url, TOKEN, None, 10), T0, T0 + dt.timedelta(days=1), 2)
    paths = [p for p, _, _ in state.requests]
    assert paths[:2] == ["/openapi/v3", "/openapi"]
    probes = ["/slurmdb/v0.0.44/jobs", "/slurmdb/v0.0.43/jobs", "/slurmdb/v0.0.42/jobs"]
    assert paths[2:6] == [*probes, "/slurmdb/v0.0.41/jobs"] and paths[6] == "/slurmdb/v0.0.40/jobs"
    assert all("x-slurm-user-name" not in h for _, _, h in state.requests)


ECHO = [{"error": f"bad token {TOKEN}", "description": "Unable to query", "error_number": 1}]


@pytest.mark.parametrize("server", [(True, ECHO)], indirect=True)
def test_contract_an_error_names_status_path_and_errors_never_the_token(server) -> None:
    url, _state = server
    with pytest.raises(AccountingError) as info:
        read_slurmrestd(RestClient(url, TOKEN, None, 10), T0, T0 + dt.timedelta(days=1))
    message = str(info.value)
    assert "HTTP 500" in message and "/slurmdb/v0.0.40/jobs" in message
    assert "Unable to query" in message and "<token>" in message
    assert TOKEN not in message and TOKEN not in repr(RestClient(url, TOKEN))


def test_contract_unreachable_server_is_named() -> None:
    with pytest.raises(AccountingError, match=r"127\.0\.0\.1:9/openapi/v3: cannot be reached"):
        read_slurmrestd(RestClient("http://127.0.0.1:9", TOKEN, None, 5), T0, T0)
