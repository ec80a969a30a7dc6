"""Live accounting from slurmrestd: ``GET /slurmdb/v0.0.NN/jobs``, paged by time windows.

Each page is the document ``sacct --json`` prints; it goes through the same converter as a
``sacct --json`` file (``source_files.sacct_json_to_psv``), so the rest of the baseline reads a
``-P`` dump as from any other source. The JWT travels in ``X-SLURM-USER-TOKEN`` only: it is in
no log line, no exception message and no dataset.

Windows are asked for as ``start_time``/``end_time`` (the names every dbv0.0.37…v0.0.44 jobs
query uses; checked against the server's OpenAPI description when it gives one) in ISO form,
which every version parses (22.05's refuses epoch seconds). The server reads them in its own
time zone, which the client cannot know: the whole span is widened by ``TZ_PAD`` on both sides
and each job is then kept or not by its own epoch times, the way ``sacct -S -E`` selects.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tasks.baseline import source_files
from tasks.data.errors import AccountingError

log = logging.getLogger(__name__)

# data_parser versions whose jobs documents the converter reads, newest first.
KNOWN_VERSIONS = tuple(f"v0.0.{n}" for n in range(44, 36, -1))
JOBS_PATH = re.compile(r"^/slurmdb/(v0\.0\.\d+)/jobs/?$")
TIME_PARAMS = ("start_time", "end_time")
# The widest offset of any time zone from UTC: the server may read our times in any of them.
TZ_PAD = dt.timedelta(hours=14)
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"
NOTHING_FOUND = 9003  # ESLURM_REST_EMPTY_RESULT


@dataclass(frozen=True)
class RestClient:
    """One slurmrestd, its token and user; the token is kept out of repr and of messages."""

    url: str
    token: str = field(repr=False)
    user: str | None = None
    timeout_s: float = 120.0

    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json", "X-SLURM-USER-TOKEN": self.token}
        if self.user:
            headers["X-SLURM-USER-NAME"] = self.user
        return headers

    def scrub(self, text: str) -> str:
        """``text`` with the token blanked, should a server ever echo it back."""
        return text.replace(self.token, "<token>") if self.token else text

    def get(self, path: str, query: dict[str, str] | None = None) -> tuple[int, bytes]:
        """(HTTP status, body) of ``GET path?query``; AccountingError if it cannot be reached."""
        target = self.url + path + ("?" + urllib.parse.urlencode(query) if query else "")
        request = urllib.request.Request(target, headers=self._headers(), method="GET")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, exc.read()
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise AccountingError(
                self.scrub(f"slurmrestd {self.url}{path}: cannot be reached: {reason}")
            ) from None

    # a dict: slurmrestd's JSON document, read as such
    def get_json(self, path: str, query: dict[str, str] | None = None) -> dict[str, Any]:
        """The JSON document at ``path``; AccountingError with status, path and errors[]."""
        status, body = self.get(path, query)
        shown = path + ("?" + urllib.parse.urlencode(query) if query else "")
        doc = _json_or_none(body)
        if status != 200 or doc is None or (doc.get("errors") and not _nothing_found(doc)):
            raise AccountingError(self.scrub(_failure(self.url, shown, status, body, doc)))
        return doc


def _json_or_none(body: bytes) -> dict[str, Any] | None:  # a dict: a JSON document
    try:
        doc = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def _nothing_found(doc: dict[str, Any]) -> bool:
    """22.05's answer to a window without jobs: an empty list and one "Nothing found" error."""
    return doc.get("jobs") == [] and all(
        isinstance(e, dict) and e.get("error_number") == NOTHING_FOUND for e in doc["errors"]
    )


def _failure(url: str, shown: str, status: int, body: bytes, doc: dict[str, Any] | None) -> str:
    """What went wrong, from the server's own errors[] (or its text when it sent no JSON)."""
    if doc is not None and doc.get("errors"):
        texts = [
            " ".join(str(e.get(k)) for k in ("error", "description", "source") if e.get(k))
            if isinstance(e, dict)
            else str(e)
            for e in doc["errors"]
        ]
        detail = "; ".join(t for t in texts if t) or "errors[] without text"
    elif doc is None:
        detail = body.decode(errors="replace").strip()[:300] or "an empty body"
    else:
        detail = "no errors[] given"
    refused = status in (401, 403) or "authentication" in detail.lower()
    hint = " (is the token valid and unexpired?)" if refused else ""
    return f"slurmrestd {url}{shown} answered HTTP {status}{hint}: {detail}"


def _offered_versions(description: dict[str, Any]) -> dict[str, set[str]]:
    """{version: the query parameter names its jobs GET lists} from an OpenAPI description."""
    offered: dict[str, set[str]] = {}
    for path, item in (description.get("paths") or {}).items():
        if m := JOBS_PATH.match(path):
            params = ((item or {}).get("get") or {}).get("parameters") or []
            offered[m.group(1)] = {p.get("name", "") for p in params if isinstance(p, dict)}
    return offered


def discover_version(client: RestClient) -> str:
    """The newest dbv0.0.37…v0.0.44 jobs endpoint the server offers.

    From its OpenAPI description (``/openapi/v3``, else ``/openapi``); a server that gives
    neither is asked each version's jobs endpoint, newest first, over an empty minute.
    """
    for doc_path in ("/openapi/v3", "/openapi"):
        status, body = client.get(doc_path)
        if status in (401, 403):
            client.get_json(doc_path)  # raises, with the server's reason
        description = _json_or_none(body) if status == 200 else None
        if description is None:
            continue
        offered = _offered_versions(description)
        for version in KNOWN_VERSIONS:
            if version in offered:
                missing = [p for p in TIME_PARAMS if offered[version] and p not in offered[version]]
                if missing:
                    raise AccountingError(
                        f"slurmrestd {client.url}: /slurmdb/{version}/jobs lists no "
                        f"{', '.join(missing)} parameter: cannot page by time"
                    )
                return version
        raise AccountingError(
            f"slurmrestd {client.url} offers no jobs endpoint this reads "
            f"(offered: {sorted(offered) or 'none'}; known: {', '.join(KNOWN_VERSIONS)})"
        )
    probe = {"start_time": "2000-01-01T00:00:00", "end_time": "2000-01-01T00:01:00"}
    for version in KNOWN_VERSIONS:
        status, _body = client.get(f"/slurmdb/{version}/jobs", probe)
        if status != 404:
            return version
    raise AccountingError(f"slurmrestd {client.url}: no /slurmdb/v0.0.37…44/jobs answered")


def windows(
    start: dt.datetime, end: dt.datetime, days: int
) -> Iterator[tuple[dt.datetime, dt.datetime]]:
    """[start, end) in consecutive spans of at most ``days`` days."""
    t = start
    while t < end:
        nxt = min(t + dt.timedelta(days=days), end)
        yield t, nxt
        t = nxt


def _epoch(value: Any) -> int:
    """An epoch field, plain (22.05) or ``{"set", "infinite", "number"}`` (v0.0.39+); 0 unset."""
    if isinstance(value, dict):
        value = value.get("number") if value.get("set", True) else 0
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def job_key(job: dict[str, Any]) -> tuple[str, str, int]:
    """(cluster, job id, submit time): job ids repeat across requeues and id recycling."""
    return (
        str(job.get("cluster", "")),
        str(job.get("job_id", "")),
        _epoch((job.get("time") or {}).get("submission")),
    )


def in_span(job: dict[str, Any], start: int, end: int) -> bool:
    """Whether the job was eligible or running in [start, end) (epoch seconds), as sacct -S -E."""
    times = job.get("time") or {}
    began = next((t for k in ("start", "eligible", "submission") if (t := _epoch(times.get(k)))), 0)
    ended = _epoch(times.get("end"))
    return began < end and (ended == 0 or ended >= start)


def read_slurmrestd(
    client: RestClient,
    start: dt.datetime,
    end: dt.datetime,
    window_days: int = 1,
) -> tuple[bytes, int]:
    """Jobs of [start, end) (naive UTC) as a ``-P`` dump with a header; (dump, requests made).

    One request per window of ``window_days``; a job that several windows report is kept once.
    """
    version = discover_version(client)
    path = f"/slurmdb/{version}/jobs"
    lo, hi = (int(t.replace(tzinfo=dt.UTC).timestamp()) for t in (start, end))
    seen: set[tuple[str, str, int]] = set()
    out: list[bytes] = []
    requests = 0
    for a, b in windows(start - TZ_PAD, end + TZ_PAD, window_days):
        query = {"start_time": a.strftime(TIME_FORMAT), "end_time": b.strftime(TIME_FORMAT)}
        doc = client.get_json(path, query)
        requests += 1
        jobs = doc.get("jobs")
        if not isinstance(jobs, list):
            raise AccountingError(f"slurmrestd {client.url}{path}: the answer has no 'jobs' list")
        fresh = []
        for job in jobs:
            key = job_key(job) if isinstance(job, dict) else None
            if key is None or (key not in seen and in_span(job, lo, hi)):
                fresh.append(job)
                if key is not None:
                    seen.add(key)
        log.info("slurmrestd %s %s..%s: %d jobs, %d new", path, a, b, len(jobs), len(fresh))
        page = json.dumps({"meta": doc.get("meta", {}), "errors": [], "jobs": fresh}).encode()
        psv = source_files.sacct_json_to_psv(page, f"{client.url}{path}")
        # Every page has the converter's header line: keep the first page's only.
        out.append(psv if not out else psv.split(b"\n", 1)[1])
    return b"".join(out), requests
