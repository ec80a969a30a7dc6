"""The Prometheus backend of the long-window sampler: read a site's existing exporter history.

For sites that already scrape NVIDIA's DCGM exporter, a span [t_from, t_to] of one node is
read back with `query_range` instead of being sampled live. The span runner calls::

    rows, gaps = read_span(plan.window.prometheus, node, t_from, t_to)

which never raises for a Prometheus that is down or answers garbage: what could not be read
becomes `sample_gaps` rows whose reason names the URL and the cause. `fetch_span` is the
same read that raises `PrometheusError` instead.

How a plan metric's query is restricted to the node (node_label, default `Hostname`):

- A plain vector selector (`DCGM_FI_DEV_GPU_UTIL` or `DCGM_FI_DEV_GPU_UTIL{gpu="0"}`) gets
  the matcher `<node_label>="<node>"` added, and each row is `avg_over_time(S[step])` with
  `points = count_over_time(S[step])`: the mean of the samples actually scraped in the step
  and their number. No lookback fills a missed scrape, so an outage is missing timestamps.
- Any other expression may say `$node` inside a double-quoted string where the node's name
  goes (substituted escaped, e.g. `max by (Hostname, UUID) (x{Hostname="$node"})`: cheaper on
  a large site), and is in any case filtered with `and on(<node_label>)` the node, so its
  result must keep the node label (else: no series, a gap row saying so). It
  is averaged with a subquery `avg_over_time((E)[step:res])`, res = step/6 (≥ 1 s), points =
  subquery evaluations. Limit: inside a subquery Prometheus's lookback (5 min by default)
  repeats the last value, so an expression hides outages shorter than the lookback.

Time grid: row i covers (t_from + (i-1)·step, t_from + i·step]; a remainder shorter than a
step is one more row ending at t_to. The range is step − 1 ms long because Prometheus 2.x
range selectors include both ends: a sample on a boundary is counted once, not twice.
Requests are chunked so that none asks for more than 11,000 points per series (Prometheus
refuses more with HTTP 400 bad_data).

Gaps (`detected_by="prometheus"`): a stretch of the grid where an entity (GPU) has no point,
including the span's start or end, and a metric with no series for the node at all; a value
that is NaN or ±Inf is not written and is a gap too. A Prometheus that cannot be read gives a
gap for the whole span of each metric it failed on (`detected_by="sampler"`).
"""

from __future__ import annotations

import datetime as dt
import http.client
import itertools
import json
import math
import re
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from tasks.data.errors import CkptPocError
from tasks.data.plan import PrometheusMetric, PrometheusSource
from tasks.window.sampling import Attribution, GapRow, SampleRow, gap_row, sample_row

SOURCE = "prometheus"
MAX_POINTS_PER_SERIES = 11_000  # Prometheus refuses a query_range answer with more
SUBQUERY_EVALUATIONS_PER_STEP = 6

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_STR = r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|`[^`]*`'
_MATCHER = rf"\s*[a-zA-Z_][a-zA-Z0-9_]*\s*(?:=~|!~|!=|=)\s*(?:{_STR})\s*"
_SELECTOR = re.compile(
    rf"^\s*(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)?\s*"
    rf"(?:\{{(?P<matchers>(?:{_MATCHER},)*(?:{_MATCHER})?)\}})?\s*$"
)
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MISSING = "no points from Prometheus (missing timestamps: the exporter or its scrape was down)"
_NAN = "no points from Prometheus (NaN/Inf values only, not written)"


class PrometheusError(CkptPocError):
    """Prometheus could not be read: refused, timed out, HTTP error or an answer we reject."""

    def __init__(self, url: str, cause: str) -> None:
        self.url = url
        self.cause = cause
        super().__init__(f"Prometheus at {url}: {cause}")


class PrometheusUnreachable(PrometheusError):
    """No answer at all (connection refused, timeout): later requests would fail the same."""


@dataclass(frozen=True)
class RangeRequest:
    """One query_range request as sent (kept so callers and tests can check chunking)."""

    query: str
    start_ms: int
    end_ms: int
    step_ms: int

    @property
    def points(self) -> int:
        return (self.end_ms - self.start_ms) // self.step_ms + 1


@dataclass(frozen=True)
class _Chunk:
    """Evaluation times start_ms, start_ms+step, …, end_ms, each averaging `window_ms`."""

    start_ms: int
    end_ms: int
    step_ms: int
    window_ms: int

    def times(self) -> range:
        return range(self.start_ms, self.end_ms + 1, self.step_ms)


def promql_string(value: str) -> str:
    """A PromQL double-quoted string literal holding `value` (any text is safe inside)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def node_expression(query: str, node_label: str, node: str) -> tuple[str, bool]:
    """The plan query restricted to `node`, and whether it is a plain vector selector."""
    node_value = promql_string(node)
    match = _SELECTOR.match(query)
    if match and (match["name"] or match["matchers"] is not None):
        matchers = (match["matchers"] or "").strip().rstrip(",").strip()
        # `$node` in a selector's matcher is substituted too (it is inside a string there).
        matchers = matchers.replace("$node", node_value[1:-1])
        added = f"{node_label}={node_value}"
        inner = f"{matchers},{added}" if matchers else added
        return f"{match['name'] or ''}{{{inner}}}", True
    substituted = query.replace("$node", node_value[1:-1])
    # vector(1) labelled with the node: `and on(label)` keeps the node's series only.
    only_node = f'label_replace(vector(1), "{node_label}", {node_value}, "", "")'
    return f"({substituted}) and on({node_label}) {only_node}", False


def _duration(ms: int) -> str:
    return f"{ms}ms"


def span_chunks(
    t_from_ms: int, t_to_ms: int, step_ms: int, max_points: int = MAX_POINTS_PER_SERIES
) -> list[_Chunk]:
    """The evaluation grid of a span, cut so that no request exceeds `max_points`."""
    chunks: list[_Chunk] = []
    full_steps = (t_to_ms - t_from_ms) // step_ms
    done = 0
    while done < full_steps:
        n = min(max_points, full_steps - done)
        start = t_from_ms + (done + 1) * step_ms
        chunks.append(_Chunk(start, start + (n - 1) * step_ms, step_ms, step_ms))
        done += n
    remainder = (t_to_ms - t_from_ms) - full_steps * step_ms
    if remainder > 0:
        # The tail shorter than a step: one point at t_to averaging just that tail.
        chunks.append(_Chunk(t_to_ms, t_to_ms, step_ms, remainder))
    return chunks


def _to_ms(t: dt.datetime, name: str) -> int:
    if t.tzinfo is None or t.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware (UTC), got naive {t.isoformat()}")
    return round((t - _EPOCH).total_seconds() * 1000)


def _from_ms(ms: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(milliseconds=ms)


@dataclass
class _Point:
    value: float
    points: int
    job_id: str | None
    gpu_uuid: str | None
    gpu_index: int | None


@dataclass
class PrometheusReader:
    """Reads one plan's Prometheus for any node and span; `requests` logs what was asked."""

    source: PrometheusSource
    max_points: int = MAX_POINTS_PER_SERIES
    requests: list[RangeRequest] = field(default_factory=list)

    def __post_init__(self) -> None:
        for what, label in (
            ("node_label", self.source.node_label),
            ("gpu_label", self.source.gpu_label),
            ("job_label", self.source.job_label),
        ):
            if label is not None and not _LABEL_NAME.match(label):
                raise PrometheusError(
                    self.source.url, f"{what} {label!r} is not a Prometheus label name"
                )
        if not 1 <= self.max_points <= MAX_POINTS_PER_SERIES:
            raise ValueError(f"max_points must be 1..{MAX_POINTS_PER_SERIES}")
        self.step_ms = max(1, round(self.source.step_s * 1000))

    # --- HTTP -------------------------------------------------------------------------------

    def query_range(self, query: str, start_ms: int, end_ms: int) -> list[dict[str, Any]]:
        """The matrix of one query_range call, validated; raises PrometheusError."""
        request = RangeRequest(query, start_ms, end_ms, self.step_ms)
        self.requests.append(request)
        url = f"{self.source.url}/api/v1/query_range"
        body = urllib.parse.urlencode(
            {
                "query": query,
                "start": f"{start_ms / 1000:.3f}",
                "end": f"{end_ms / 1000:.3f}",
                "step": f"{self.step_ms / 1000:.3f}",
            }
        ).encode()
        # POST (form-encoded) so that long expressions never hit a URL length limit.
        req = urllib.request.Request(
            url,
            data=body,
            method="POST",
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.source.timeout_s) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise PrometheusError(
                self.source.url, f"HTTP {exc.code} for query_range: {_http_error_text(exc)}"
            ) from exc
        except urllib.error.URLError as exc:
            raise PrometheusUnreachable(
                self.source.url, f"unreachable: {_reason_text(exc.reason)}"
            ) from exc
        except TimeoutError as exc:
            raise PrometheusUnreachable(
                self.source.url, f"no answer within {self.source.timeout_s:g} s (timeout)"
            ) from exc
        except (http.client.HTTPException, OSError) as exc:
            raise PrometheusUnreachable(
                self.source.url, f"connection failed: {type(exc).__name__}: {exc}"
            ) from exc
        return _parse_matrix(self.source.url, raw)

    # --- reading a span ---------------------------------------------------------------------

    def fetch_span(
        self, node: str, t_from: dt.datetime, t_to: dt.datetime
    ) -> tuple[list[SampleRow], list[GapRow]]:
        """Rows and holes for every plan metric; raises PrometheusError on the first failure."""
        rows: list[SampleRow] = []
        gaps: list[GapRow] = []
        for metric in self.source.metrics:
            r, g = self.fetch_metric(metric, node, t_from, t_to)
            rows += r
            gaps += g
        return rows, gaps

    def fetch_metric(
        self, metric: PrometheusMetric, node: str, t_from: dt.datetime, t_to: dt.datetime
    ) -> tuple[list[SampleRow], list[GapRow]]:
        from_ms, to_ms = _to_ms(t_from, "t_from"), _to_ms(t_to, "t_to")
        if to_ms <= from_ms:
            raise ValueError(f"empty span: t_to {t_to} is not after t_from {t_from}")
        expr, is_selector = node_expression(metric.query, self.source.node_label, node)
        chunks = span_chunks(from_ms, to_ms, self.step_ms, self.max_points)
        # entity -> evaluation time (ms) -> what the series of that entity said there
        seen: dict[str, dict[int, list[_Point]]] = defaultdict(lambda: defaultdict(list))
        for chunk in chunks:
            avg_q, count_q = self._queries(expr, is_selector, chunk.window_ms)
            counts = {
                (_label_key(s["metric"]), ts): v
                for s in self.query_range(count_q, chunk.start_ms, chunk.end_ms)
                for ts, v in s["values"]
            }
            for series in self.query_range(avg_q, chunk.start_ms, chunk.end_ms):
                labels: dict[str, str] = series["metric"]
                entity = self._entity(labels)
                key = _label_key(labels)
                for ts, value in series["values"]:
                    n = counts.get((key, ts), 1.0)
                    seen[entity][ts].append(
                        _Point(
                            value=value,
                            points=max(1, int(n)) if math.isfinite(n) else 1,
                            job_id=self._label(labels, self.source.job_label),
                            gpu_uuid=self._label(labels, self.source.gpu_label),
                            gpu_index=_int_or_none(labels.get("gpu")),
                        )
                    )
        return self._rows_and_gaps(metric, node, chunks, seen, from_ms, to_ms)

    def _queries(self, expr: str, is_selector: bool, window_ms: int) -> tuple[str, str]:
        # Why averages and not the instant value: a row stands for its whole interval, and
        # an instant value at t is only the last scrape (a duty cycle of the last second).
        rng = _duration(max(1, window_ms - 1))
        if is_selector:
            return f"avg_over_time({expr}[{rng}])", f"count_over_time({expr}[{rng}])"
        res = _duration(max(1000, window_ms // SUBQUERY_EVALUATIONS_PER_STEP))
        return (
            f"avg_over_time(({expr})[{rng}:{res}])",
            f"count_over_time(({expr})[{rng}:{res}])",
        )

    def _label(self, labels: dict[str, str], name: str | None) -> str | None:
        # DCGM writes hpc_job="" on a GPU no job holds: empty means none.
        return (labels.get(name) or None) if name else None

    def _entity(self, labels: dict[str, str]) -> str:
        gpu = self._label(labels, self.source.gpu_label)
        if gpu:
            return gpu
        # No GPU label: the series' own labels, minus those that do not name the thing
        # measured (the node is its own column; the job changes while the GPU stays).
        drop = {"__name__", self.source.node_label, self.source.job_label}
        kept = {k: v for k, v in labels.items() if k not in drop}
        return "{" + ",".join(f"{k}={promql_string(v)}" for k, v in sorted(kept.items())) + "}"

    def _rows_and_gaps(
        self,
        metric: PrometheusMetric,
        node: str,
        chunks: list[_Chunk],
        seen: dict[str, dict[int, list[_Point]]],
        from_ms: int,
        to_ms: int,
    ) -> tuple[list[SampleRow], list[GapRow]]:
        rows: list[SampleRow] = []
        gaps: list[GapRow] = []
        if not seen:
            gaps.append(
                gap_row(
                    node=node,
                    source=SOURCE,
                    t_from=_from_ms(from_ms),
                    t_to=_from_ms(to_ms),
                    reason=f"no points from Prometheus for {metric.metric}: no series of "
                    f"{metric.query!r} for {self.source.node_label}={node!r}",
                    detected_by="prometheus",
                    metric=metric.metric,
                )
            )
            return rows, gaps
        grid = [(t, c.window_ms) for c in chunks for t in c.times()]
        for entity, by_time in sorted(seen.items()):
            # Each grid time gets a row, or the reason it has none; runs of one reason
            # become one gap row covering the intervals of those times.
            status: list[tuple[int, int, str | None]] = []
            for t, window in grid:
                pts = [p for p in by_time.get(t, []) if math.isfinite(p.value)]
                if pts:
                    rows.append(self._row(metric, node, entity, t, window, pts))
                    status.append((t, window, None))
                else:
                    status.append((t, window, _NAN if t in by_time else _MISSING))
            for reason, run in itertools.groupby(status, key=lambda s: s[2]):
                if reason is None:
                    continue
                run_list = list(run)
                gaps.append(
                    gap_row(
                        node=node,
                        source=SOURCE,
                        t_from=_from_ms(run_list[0][0] - run_list[0][1]),
                        t_to=_from_ms(run_list[-1][0]),
                        reason=reason,
                        detected_by="prometheus",
                        entity=entity,
                        metric=metric.metric,
                    )
                )
        return rows, gaps

    def _row(
        self,
        metric: PrometheusMetric,
        node: str,
        entity: str,
        t: int,
        window: int,
        pts: list[_Point],
    ) -> SampleRow:
        # Several series of one entity in one step (its job label changed mid-step): the
        # mean of all their scrapes, the job of the series with most of them.
        n = sum(p.points for p in pts)
        value = sum(p.value * p.points for p in pts) / n
        main = max(pts, key=lambda p: (p.points, p.job_id or ""))
        job = main.job_id
        gpu_uuid = next((p.gpu_uuid for p in pts if p.gpu_uuid), None)
        return sample_row(
            node=node,
            source=SOURCE,
            entity=entity,
            device="gpu" if gpu_uuid else "unknown",
            metric=metric.metric,
            unit=metric.unit,
            value=value,
            t_from=_from_ms(t - window),
            t_to=_from_ms(t),
            points=n,
            gpu_uuid=gpu_uuid,
            gpu_index=main.gpu_index,
            attribution=Attribution(job_id=job, attributed_by="label") if job else Attribution(),
        )


def fetch_span(
    source: PrometheusSource, node: str, t_from: dt.datetime, t_to: dt.datetime
) -> tuple[list[SampleRow], list[GapRow]]:
    """`read_span` that raises PrometheusError instead of writing the failure as a gap."""
    return PrometheusReader(source).fetch_span(node, t_from, t_to)


def read_span(
    source: PrometheusSource,
    node: str,
    t_from: dt.datetime,
    t_to: dt.datetime,
    *,
    reader: PrometheusReader | None = None,
) -> tuple[list[SampleRow], list[GapRow]]:
    """Samples and gaps of `node` over [t_from, t_to] (aware datetimes); never raises for
    Prometheus: a metric it could not read is a whole-span gap whose reason is the error.

    Once Prometheus is unreachable the remaining metrics are not tried (each would wait for
    the timeout again); they get the same gap.
    """
    reader = reader or PrometheusReader(source)
    rows: list[SampleRow] = []
    gaps: list[GapRow] = []
    down: PrometheusUnreachable | None = None
    for metric in source.metrics:
        if down is None:
            try:
                r, g = reader.fetch_metric(metric, node, t_from, t_to)
            except PrometheusUnreachable as exc:
                down = exc
            except PrometheusError as exc:
                gaps.append(_failure_gap(node, metric, t_from, t_to, exc))
                continue
            else:
                rows += r
                gaps += g
                continue
        gaps.append(_failure_gap(node, metric, t_from, t_to, down))
    return rows, gaps


def _failure_gap(
    node: str, metric: PrometheusMetric, t_from: dt.datetime, t_to: dt.datetime, exc: Exception
) -> GapRow:
    return gap_row(
        node=node,
        source=SOURCE,
        t_from=t_from,
        t_to=t_to,
        reason=f"no points from Prometheus for {metric.metric}: {exc}",
        detected_by="sampler",
        metric=metric.metric,
    )


# --- parsing ----------------------------------------------------------------------------------


def _reason_text(reason: object) -> str:
    if isinstance(reason, TimeoutError):
        return "timeout"
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    return (
        f"{type(reason).__name__}: {reason}" if isinstance(reason, BaseException) else str(reason)
    )


def _http_error_text(exc: urllib.error.HTTPError) -> str:
    try:
        raw = exc.read()
    except OSError:
        raw = b""
    try:
        doc = json.loads(raw)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and "error" in doc:
        return f"{doc.get('errorType', 'error')}: {doc['error']}"
    return _snippet(raw) or str(exc.reason)


def _snippet(raw: bytes, n: int = 200) -> str:
    text = raw.decode("utf-8", "replace").strip().replace("\n", " ")
    return text if len(text) <= n else text[:n] + "…"


def _parse_matrix(url: str, raw: bytes) -> list[dict[str, Any]]:
    """Validate `{"status":"success","data":{"resultType":"matrix","result":[...]}}`; values
    become (ms, float). Anything else is a PrometheusError naming what was wrong."""
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise PrometheusError(url, f"answer is not JSON: {_snippet(raw)!r}") from exc
    if not isinstance(doc, dict):
        raise PrometheusError(url, f"answer is not a JSON object: {_snippet(raw)!r}")
    if doc.get("status") != "success":
        raise PrometheusError(
            url, f"status {doc.get('status')!r}: {doc.get('errorType')}: {doc.get('error')}"
        )
    data = doc.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        got = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise PrometheusError(url, f"answer is not a matrix (data.resultType {got!r})")
    result = data.get("result")
    if not isinstance(result, list):
        raise PrometheusError(url, "answer's data.result is not a list")
    out: list[dict[str, Any]] = []
    for i, series in enumerate(result):
        labels = series.get("metric") if isinstance(series, dict) else None
        values = series.get("values") if isinstance(series, dict) else None
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise PrometheusError(url, f"series {i}: 'metric' is not a map of label strings")
        if not isinstance(values, list):
            raise PrometheusError(url, f"series {i} {labels}: 'values' is not a list")
        parsed: list[tuple[int, float]] = []
        for pair in values:
            parsed.append(_parse_point(url, i, pair))
        out.append({"metric": labels, "values": parsed})
    return out


def _parse_point(url: str, i: int, pair: object) -> tuple[int, float]:
    ok = (
        isinstance(pair, list)
        and len(pair) == 2
        and isinstance(pair[0], (int, float))
        and not isinstance(pair[0], bool)
        and isinstance(pair[1], str)
    )
    if ok:
        try:
            # Prometheus writes NaN and ±Inf as "NaN", "+Inf", "-Inf": float() reads them;
            # the caller skips them (and counts a gap).
            return round(float(pair[0]) * 1000), float(pair[1])  # type: ignore[index]
        except ValueError:
            pass
    raise PrometheusError(url, f'series {i}: point {pair!r} is not [time, "number"]')


def _label_key(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


def _int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None and text.isdigit() else None
