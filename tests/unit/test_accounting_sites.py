"""Real accounting dumps from other sites: their own --format, delimiter and Slurm version.

Every dump here is the committed real sample (data/samples/sacct-sample.psv) re-cut the way
another site's sacct would have written it: fewer or reordered fields, another delimiter,
older GPU fields, states and values this project's Slurm never produced.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from tasks.baseline import accounting as acct
from tasks.baseline import fields
from tasks.baseline.run import BaselineResult, run_baseline
from tasks.data.errors import AccountingError, GateFailed
from tasks.data.plan import load_plan
from tasks.data.runctx import make_run_context
from tasks.experiments.report import (
    baseline_markdown,
    candidates_table,
    exposure_rows,
    exposure_table,
    gpu_sources_line,
)
from tests.support.common import REPO

SAMPLE = REPO / "data" / "samples" / "sacct-sample.psv"
DEMO_PLAN = REPO / "plans" / "demo.yaml"
PS = acct.Pseudonymiser(b"unit-test-key-0123456789")


def sample_rows() -> list[dict[str, str]]:
    header, *lines = SAMPLE.read_text().splitlines()
    names = header.split("|")
    return [dict(zip(names, line.split("|"), strict=True)) for line in lines]


def cut(
    fields: list[str],
    rows: list[dict[str, str]] | None = None,
    delimiter: str = "|",
    header: bool = True,
) -> str:
    """The sample as ``sacct -P --format=FIELDS --delimiter=D`` would have printed it."""
    rows = sample_rows() if rows is None else rows
    lines = [delimiter.join(fields)] if header else []
    lines += [delimiter.join(r[f] for f in fields) for r in rows]
    return "\n".join(lines) + "\n"


def parse(text: str | bytes, **kw) -> tuple[pa.Table, list[acct.Quarantined], dict[str, int]]:
    data = text.encode() if isinstance(text, str) else text
    blocks = list(acct.parse_sacct_stream(io.BytesIO(data), "site.psv", PS, **kw))
    sources: dict[str, int] = {}
    for b in blocks:
        for k, v in b.gpu_sources.items():
            sources[k] = sources.get(k, 0) + v
    return (
        pa.concat_tables([b.jobs for b in blocks]),
        [q for b in blocks for q in b.quarantine],
        sources,
    )


def baseline(
    tmp_path: Path, text: str, name: str = "site.psv", max_share: float | None = None, **kw
) -> BaselineResult:
    tmp_path.mkdir(parents=True, exist_ok=True)
    dump = tmp_path / name
    dump.write_text(text)
    plan = load_plan(DEMO_PLAN).model_copy(update={"data_dir": str(tmp_path / "data")})
    if max_share is not None:
        limits = plan.baseline.model_copy(update={"max_quarantined_share": max_share})
        plan = plan.model_copy(update={"baseline": limits})
    return run_baseline(plan, make_run_context(plan, DEMO_PLAN), sacct_file=str(dump), **kw)


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> dict:
    """The summary of the sample as committed (every field ckpt-poc asks for)."""
    tmp = tmp_path_factory.mktemp("full")
    return baseline(tmp, SAMPLE.read_text()).summary.to_json()


# --- missing fields degrade what is computed ---------------------------------------------


LACKS_HOURS = "the dump lacks ElapsedRaw or Elapsed, NNodes or AllocTRES"
LACKS_GPUS = "the dump lacks ElapsedRaw or Elapsed, AllocTRES or AllocGRES"
LACKS_CHAINS = "the dump lacks User, Account, JobName, Submit, End"


@pytest.mark.parametrize("use_dask", [False, True])
def test_job_id_and_state_alone_give_state_counts_and_say_what_is_not_computed(
    tmp_path: Path, full: dict, use_dask: bool
) -> None:
    result = baseline(tmp_path, cut(["JobID", "State"]), use_dask=use_dask)
    s = result.summary.to_json()
    assert s["allocations_by_state"] == full["allocations_by_state"]
    assert s["rows_read"] == full["rows_read"] and s["rows_quarantined"] == 0
    # Never a silent zero: null, and why.
    for key in ("node_hours_by_state", "gpu_hours_by_state", "exposed_gpu_hours", "chains"):
        assert s[key] is None, key
    assert s["not_computed"] == {
        "node_hours_by_state": LACKS_HOURS,
        "gpu_hours_by_state": LACKS_GPUS,
        "exposed_gpu_hours": LACKS_GPUS,
        "timeout_gpu_hours": LACKS_GPUS,
        "chains": LACKS_CHAINS,
        "candidates": "the dump lacks Account, JobName",
    }
    assert json.loads(json.dumps(s))["not_computed"] == s["not_computed"]  # the --json output
    # The terminal and the artifacts say it in words.
    assert all(r["gpu_hours"] == "not computed" for r in exposure_rows(result))
    markdown = baseline_markdown(result)
    assert f"GPU-hours not computed: {LACKS_GPUS}" in markdown
    assert f"resubmission chains not computed: {LACKS_CHAINS}" in markdown
    assert "0.000" not in markdown
    assert f"node-hours not computed: {LACKS_HOURS}" in str(exposure_table(result).caption)
    assert "not computed" in str(candidates_table(result).caption)
    # And the written datasets carry it, where their columns could only hold zeros.
    for name in ("exposure", "jobs"):
        (first, *_) = result.written[name]
        meta = pq.read_schema(first).metadata
        assert json.loads(meta[b"ckpt_poc.not_computed"]) == s["not_computed"], name


def test_hours_without_identities_are_computed_and_chains_are_not(
    tmp_path: Path, full: dict
) -> None:
    result = baseline(tmp_path, cut(["JobIDRaw", "State", "ElapsedRaw", "NNodes", "AllocTRES"]))
    s = result.summary.to_json()
    assert s["gpu_hours_by_state"] == pytest.approx(full["gpu_hours_by_state"])
    assert s["node_hours_by_state"] == pytest.approx(full["node_hours_by_state"])
    assert s["exposed_gpu_hours"] == pytest.approx(full["exposed_gpu_hours"])
    assert s["chains"] is None and set(s["not_computed"]) == {"chains", "candidates"}
    assert result.exposure.candidates.empty


# --- GPUs from the older forms -------------------------------------------------------------


def _older_gpu_rows() -> list[dict[str, str]]:
    """The sample as Slurm before 17.11 wrote it: GPUs as AllocGRES, no AllocTRES."""
    rows = []
    for r in sample_rows():
        gpus = fields.parse_tres(r["AllocTRES"]).gpus
        rows.append({**r, "AllocGRES": f"gpu:{gpus}" if gpus else ""})
    return rows


def test_alloc_gres_of_older_slurm_gives_the_same_gpu_hours_labelled(
    tmp_path: Path, full: dict
) -> None:
    fields = ["JobID", "State", "User", "Account", "JobName", "Submit", "End", "ElapsedRaw"]
    result = baseline(tmp_path, cut([*fields, "NNodes", "AllocGRES"], _older_gpu_rows()))
    s = result.summary.to_json()
    assert s["gpu_hours_by_state"] == pytest.approx(full["gpu_hours_by_state"])
    assert s["not_computed"] == {}
    allocations = sum(full["allocations_by_state"].values())
    gpu_allocations = sum(1 for r in _older_gpu_rows() if r["AllocGRES"] and "." not in r["JobID"])
    assert result.gpu_sources == {
        "AllocGRES": gpu_allocations,
        "none": allocations - gpu_allocations,
    }
    line = gpu_sources_line(result)
    assert line and "allocated (AllocGRES, older Slurm)" in line
    assert line in baseline_markdown(result)


def test_requested_gpus_only_where_nothing_was_allocated_yet() -> None:
    text = (
        "JobID|State|ElapsedRaw|AllocTRES|ReqTRES|ReqGRES\n"
        "1|COMPLETED|60|cpu=1,gres/gpu=2,node=1|cpu=1,gres/gpu=8,node=1|gpu:8\n"
        "2|PENDING|0||cpu=1,gres/gpu=4,node=1|gpu:4\n"
        "3|PENDING|0|||gpu:tesla:3\n"
        "4|COMPLETED|60|cpu=1,node=1|cpu=1,gres/gpu=1,node=1|gpu:1\n"
        "5|PENDING|0|||\n"
    )
    jobs, quarantine, sources = parse(text)
    assert quarantine == []
    assert jobs.column("gpus").to_pylist() == [2, 4, 3, 0, 0]
    assert sources == {"AllocTRES": 2, "ReqTRES": 1, "ReqGRES": 1, "none": 1}


def test_gres_strings() -> None:
    assert fields.parse_gres("gpu:4").gpus == 4
    assert fields.parse_gres("gpu:tesla:2(IDX:0,1)").gpus == 2
    assert fields.parse_gres("gpu:a100:1,gpu:v100:2,mic:1").gpus == 3
    assert fields.parse_gres("gpu:2,gpu:tesla:2").gpus == 2  # untyped wins, as in TRES
    assert fields.parse_gres("gres/gpu:2").gpus == 2
    assert fields.parse_gres("gpu").gpus == 1
    assert fields.parse_gres("mic:1").gpus == 0 and fields.parse_gres("mic:1").given
    assert not fields.parse_gres("").given and not fields.parse_gres("(null)").given
    assert fields.parse_gres("gpu:a:b:c").bad and fields.parse_gres("gpu:tesla:x").bad


# --- JobIDRaw as the job id ----------------------------------------------------------------


def test_job_id_raw_stands_in_for_a_missing_job_id() -> None:
    jobs, quarantine, _ = parse(cut(["JobIDRaw", "State", "ElapsedRaw", "AllocTRES"]))
    assert quarantine == []
    raw_ids = [r["JobIDRaw"] for r in sample_rows()]
    assert jobs.column("job_id").to_pylist() == raw_ids
    allocation = [("." not in i) for i in raw_ids]
    assert jobs.column("is_allocation").to_pylist() == allocation


# --- the delimiter, from the header ---------------------------------------------------------


@pytest.mark.parametrize("delimiter", ["|", "^|^", "☃", ";", "\t", " | "])
@pytest.mark.parametrize("trailing", [False, True])
def test_the_delimiter_is_read_from_the_header(delimiter: str, trailing: bool) -> None:
    text = SAMPLE.read_text().replace("|", delimiter)
    if trailing:  # sacct -p ends every line with the delimiter
        text = "".join(line + delimiter + "\n" for line in text.splitlines())
    jobs, quarantine, _ = parse(text)
    reference, _, _ = parse(SAMPLE.read_text())
    assert quarantine == []
    for column in ("job_id", "state", "gpus", "elapsed_s", "submit", "user"):
        assert jobs.column(column).to_pylist() == reference.column(column).to_pylist(), column


def test_a_header_that_splits_into_one_field_asks_for_the_delimiter() -> None:
    with pytest.raises(AccountingError) as caught:
        parse(SAMPLE.read_text(), delimiter=b",")
    message = str(caught.value)
    assert message.startswith("site.psv:1: ") and "--delimiter" in message
    assert "no header line" not in message


def test_no_header_line_is_said_only_without_one() -> None:
    with pytest.raises(AccountingError, match="no header line") as caught:
        parse(cut(["JobID", "State", "ElapsedRaw"], header=False))
    assert "--format FIELDS" in str(caught.value)
    with pytest.raises(AccountingError) as header:
        parse("State|Submit\n")  # a header, lacking the job id: said as such
    assert "no header line" not in str(header.value)
    assert "site.psv:1: the header lacks JobID (or JobIDRaw)" in str(header.value)


# --- --format for header-less dumps ---------------------------------------------------------


def test_a_header_less_dump_in_another_order_is_read_with_format(
    tmp_path: Path, full: dict
) -> None:
    fields = ["State", "JobID", "AllocTRES", "ElapsedRaw", "NNodes"]
    text = cut(fields, header=False)
    jobs, quarantine, _ = parse(text, sacct_format="state,JobID%20,AllocTRES,ElapsedRaw,NNodes")
    reference, _, _ = parse(SAMPLE.read_text())
    assert quarantine == []
    for column in ("job_id", "state", "gpus", "elapsed_s"):
        assert jobs.column(column).to_pylist() == reference.column(column).to_pylist(), column
    result = baseline(tmp_path, text, sacct_format=",".join(fields))
    assert result.summary.gpu_hours_by_state == pytest.approx(full["gpu_hours_by_state"])
    # The same dump without --format: the error says what to give.
    with pytest.raises(AccountingError, match=r"site\.psv:1: no header line.*--format FIELDS"):
        parse(text)
    with pytest.raises(AccountingError, match=r"--format names 2"):
        parse(text, sacct_format="State,JobID")
    with pytest.raises(AccountingError, match=r"field 2 \('Job ID'\) is not a sacct field"):
        parse(text, sacct_format="State,Job ID,AllocTRES,ElapsedRaw,NNodes")


def test_the_cli_and_the_flow_take_format() -> None:
    import inspect

    from cli.app import app
    from flows.baseline import baseline as baseline_flow

    assert "sacct_format" in inspect.signature(baseline_flow.fn).parameters
    shown = CliRunner().invoke(app, ["baseline", "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0 and "--format" in shown.output and "FIELDS" in shown.output


# --- undocumented states ---------------------------------------------------------------------


def test_an_undocumented_state_is_kept_and_reported_as_unknown(tmp_path: Path) -> None:
    # Only the state differs from the real sample, so the block stays on the typed path
    # (where an unexpected state used to crash the quarantine with a TypeError).
    text = SAMPLE.read_text().replace("|mix-completed|COMPLETED|", "|mix-completed|SITE_DRAINED|")
    jobs, quarantine, _ = parse(text)
    assert quarantine == []
    row = next(r for r in jobs.to_pylist() if r["job_id"] == "2")
    assert (row["state"], row["state_raw"]) == ("UNKNOWN", "SITE_DRAINED")
    result = baseline(tmp_path, text)
    assert result.summary.to_json()["allocations_by_state"]["SITE_DRAINED"] == 1
    assert result.summary.gpu_hours_by_state["SITE_DRAINED"] > 0
    notes = {r["state"]: r["counts_as"] for r in exposure_rows(result)}
    assert notes["SITE_DRAINED"] == "unknown state (not documented by sacct)"
    assert "| SITE_DRAINED | 1 |" in baseline_markdown(result)


# --- implausible dates, negative times -------------------------------------------------------


def test_implausible_dates_and_negative_times_are_quarantined_with_their_reason() -> None:
    rows = sample_rows()
    good = rows[2]  # job 2, COMPLETED
    bad = [
        {**good, "JobID": "91", "JobIDRaw": "91", "Submit": "9999-12-31T23:59:59"},
        {**good, "JobID": "92", "JobIDRaw": "92", "End": "1970-01-01T00:00:01"},
        {**good, "JobID": "93", "JobIDRaw": "93", "ElapsedRaw": "-5"},
        {**good, "JobID": "94", "JobIDRaw": "94", "NNodes": "-1"},
    ]
    fields = list(rows[0])
    # Every value converts, so this block stays on the typed fast path.
    jobs, quarantine, _ = parse(cut(fields, [good, *bad]))
    assert jobs.column("job_id").to_pylist() == ["2"]
    reasons = {q.source_line: q.reason for q in quarantine}
    assert reasons == {
        3: "Submit is outside any plausible accounting history (2000-2099)",
        4: "End is outside any plausible accounting history (2000-2099)",
        5: "ElapsedRaw is negative",
        6: "NNodes is negative",
    }
    # The raw-bytes path says the same (one unconvertible value sends the block there).
    slow = [*bad, {**good, "JobID": "95", "JobIDRaw": "95", "NCPUS": "many"}]
    _, quarantine, _ = parse(cut(fields, [good, *slow]))
    assert [q.reason for q in quarantine][:4] == list(reasons.values())
    # Elapsed without ElapsedRaw, negative as sacct prints it.
    no_raw = [f for f in fields if f != "ElapsedRaw"]
    _, quarantine, _ = parse(cut(no_raw, [{**good, "Elapsed": "-00:00:05"}]))
    assert [q.reason for q in quarantine] == ["Elapsed is negative"]


# --- the quarantined share gates the run ------------------------------------------------------


def test_a_run_whose_every_row_is_quarantined_fails_its_gate(tmp_path: Path) -> None:
    rows = sample_rows()
    fields = list(rows[0])
    # One field too many on every row (a row short of fields reads them as empty).
    too_long = [line + "|x" for line in cut(fields, rows).splitlines()[1:]]
    with pytest.raises(GateFailed) as caught:
        baseline(tmp_path, "\n".join(["|".join(fields), *too_long]) + "\n")
    message = str(caught.value)
    assert "input_has_parsed_rows" in message and "quarantined_share_within_plan_limit" in message
    assert f"{len(rows)} of {len(rows)} rows quarantined (100.0%)" in message
    assert not list((tmp_path / "data").rglob("exposure/*/*.parquet"))


def test_a_quarantined_share_above_the_plans_limit_fails(tmp_path: Path) -> None:
    rows = sample_rows()
    broken = [{**r, "ElapsedRaw": "-1"} if i < 5 else r for i, r in enumerate(rows)]
    text = cut(list(rows[0]), broken)
    share = f"5 of {len(rows)} rows quarantined ({5 / len(rows):.1%})"
    with pytest.raises(GateFailed, match=r"quarantined_share_within_plan_limit") as caught:
        baseline(tmp_path / "strict", text, max_share=0.1)
    assert share in str(caught.value) and "max_quarantined_share is 10.0%" in str(caught.value)
    assert baseline(tmp_path / "loose", text).summary.to_json()["rows_quarantined"] == 5


# --- no identities in clear in the quarantine --------------------------------------------------


SECRET_USER, SECRET_ACCOUNT = "zelda_secret_user", "acct_secret_xq"


def test_quarantine_raw_keeps_no_identity_in_clear(tmp_path: Path) -> None:
    rows = [
        {**r, "User": SECRET_USER, "Account": SECRET_ACCOUNT, "WorkDir": f"/home/{SECRET_USER}"}
        for r in sample_rows()
    ]
    fields = [*list(sample_rows()[0]), "WorkDir"]
    lines = cut(fields, rows).splitlines()
    first = rows[2]
    lines += [
        # A job name holding the delimiter: one field too many.
        cut(fields, [{**first, "JobName": "a|b"}], header=False).strip(),
        # Cut short: read with the missing fields empty.
        "|".join(first[f] for f in fields[:8]),
        # Parsed, then quarantined: a count that is none.
        cut(fields, [{**first, "NCPUS": "many"}], header=False).strip(),
    ]
    result = baseline(tmp_path, "\n".join(lines) + "\n")
    n = len(rows)
    assert result.summary.to_json()["rows_quarantined"] == 2
    assert result.summary.to_json()["rows_short_of_fields"] == 1
    quarantine = pq.read_table(result.written["quarantine"]).to_pylist()
    assert {(q["source_line"], q["reason"].split(",")[0]) for q in quarantine} == {
        (n + 2, "21 fields"),
        (n + 4, "NCPUS is not an integer"),
    }
    assert all(q["raw"] for q in quarantine)
    # Nowhere in anything written: rows, values, file metadata (read back, not compressed).
    everything = []
    for path in (tmp_path / "data").rglob("*.parquet"):
        table = pq.read_table(path)
        everything.append(json.dumps(table.to_pylist(), default=str))
        everything.append(str(table.schema.metadata))
    written = "\n".join(everything)
    assert "mix-completed" in written  # a plain job name is found: the scan reads values
    for secret in (SECRET_USER, SECRET_ACCOUNT):
        assert secret not in written, secret
