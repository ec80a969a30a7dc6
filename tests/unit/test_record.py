"""The decision record from constructed datasets on disk: sections, numbers, HTML and PDF."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from tasks.data.datasets import (
    EXIT_DIFF,
    EXIT_VERDICTS,
    EXPOSURE,
    GATES,
    SAMPLE_GAPS,
    TRIALS,
    UTILIZATION,
    DatasetSpec,
)
from tasks.data.plan import Plan
from tasks.data.runctx import RunContext
from tasks.data.runs import commit_run
from tasks.data.store import write_dataset
from tasks.poc.record import build_record
from tasks.poc.record.sections import SECTIONS
from tests.unit.test_weekly import (
    EVIL,
    W1,
    W2,
    at,
    exposure_rows,
    fp,
    frame,
    make_plan,
    trial,
    util,
)

POC = "demo"


def write(rows: list[dict[str, Any]], spec: DatasetSpec, data_dir: Path, run_id: str) -> None:
    df = frame([{**r, "run_id": run_id} for r in rows], spec)
    write_dataset(df, spec, data_dir=data_dir, poc=POC, run_id=run_id)


def gate(name: str, expectation: str, success: bool, run_id: str) -> dict[str, Any]:
    return {
        "poc": POC,
        "run_id": run_id,
        "gate": name,
        "dataset": "trials",
        "expectation": expectation,
        "column": None,
        "success": success,
        "observed": json.dumps({"seen": 1}),
        "checked_at": at(W1, 30),
        **fp(),
    }


def restored(ready_s: float) -> dict[str, float]:
    """A restore's parts within its ready seconds, and a plain read of its images."""
    return {
        "restore_s": ready_s - 0.2,
        "restore_fork_s": 0.05,
        "restore_warmup_s": 0.2,
        "raw_read_gbps": 3.0,
    }


def build_poc(data_dir: Path, *, short_repeats: bool = True) -> None:
    """Two weeks of a PoC: recovery, overhead, cold start and checkpoint trials, a baseline,
    utilization, gates (one repeats check failed when ``short_repeats``), a gap and an exit
    diff with one leftover; every run committed."""
    runs: dict[str, list[tuple[list[dict[str, Any]], DatasetSpec]]] = {}
    rec = [
        trial("recovery", a, w, recovery_s=v, fault="sigkill", work_lost_gpu_h=lost, steps_lost=3)
        for w in (W1, W2)
        for a, vals, lost in (
            ("managed", (2.0, 3.0, 4.0), 0.002),
            ("unmanaged", (20.0, 30.0, 40.0), 0.05),
        )
        for v in vals
    ]
    for t in rec:
        # Its parts: what the phases figure stacks (detection, scheduling, restore, warm-up).
        parts = {"scheduling_s": 0.2, "restore_s": t["recovery_s"] - 1.0, "warmup_s": 0.3}
        t.update(detection_s=0.5, work_lost_s=100.0, clock="fault_injected→serving_again", **parts)
    runs["rec-1"] = [(rec, TRIALS)]
    oh = []
    for pair, m in enumerate((101.0, 102.0, 103.0, 104.0)):
        oh.append(trial("overhead", "managed", W1, variant="steady", pair=pair, run_s=m))
        oh.append(trial("overhead", "unmanaged", W1, variant="steady", pair=pair, run_s=100.0))
    runs["oh-1"] = [(oh, TRIALS)]
    cs = [trial("cold_start", "unmanaged", W2, ready_s=v) for v in (3.0, 3.2, 3.4)]
    cs += [
        trial("cold_start", "managed", W2, ready_s=v, checkpoint_bytes=2_000_000_000, **restored(v))
        # Short of the plan's 3 restores when short_repeats: the run's own gate says so too.
        for v in ((1.0, 1.1) if short_repeats else (1.0, 1.1, 1.5))
    ]
    runs["cs-1"] = [(cs, TRIALS)]
    ck = [trial("checkpoint", "managed", W1, dump_s=d, freeze_s=d / 2) for d in (1.0, 2.0, 3.0)]
    runs["ck-1"] = [(ck, TRIALS)]
    cands = [
        {
            **exposure_rows()[0],
            "kind": "candidate",
            "state": None,
            "workload": EVIL,
            "rank": 1,
            "exposed_gpu_hours": 12.5,
            "chains": 2,
        }
    ]
    runs["base-1"] = [(exposure_rows() + cands, EXPOSURE)]
    runs["util-1"] = [
        (
            [util(w, "managed", 9.0) for w in (W1, W2)]
            + [util(w, "unmanaged", 7.5) for w in (W1, W2)],
            UTILIZATION,
        )
    ]
    g = [gate("recovery", "same_clock_both_arms", True, "rec-1")]
    g += [gate("recovery", "real_fault_and_measured_serving_again", True, "rec-1")]
    g += [
        gate("recovery", f"repeats[sigkill,{a}]", True, "rec-1") for a in ("managed", "unmanaged")
    ]
    g += [gate("recovery", "arms_differ_only_in_managed[fp_driver]", True, "rec-1")]
    # Each stage's gate rows are committed with its trials, by its own run (as the stages do).
    runs["rec-1"].append((g, GATES))
    runs["cs-1"].append(
        ([gate("cold_start", "repeats[managed]", not short_repeats, "cs-1")], GATES)
    )
    gap = {
        "poc": POC,
        "node": "node-a",
        "source": "procfs",
        "entity": None,
        "metric": None,
        "t_from": at(W2, 5),
        "t_to": at(W2, 6),
        "gap_s": 3600.0,
        "reason": EVIL,
        "detected_by": "next_run",
        **fp(),
    }
    runs["samp-1"] = [([gap], SAMPLE_GAPS)]
    verdict = {
        "poc": POC,
        "node": "node-a",
        "from_phase": "before_install",
        "to_phase": "after_uninstall",
        "verdict": "leftovers",
        "leftovers": 1,
        "items_compared": 42,
        "diffed_at": at(W2, 40),
        **fp(),
    }
    diff = {
        "poc": POC,
        "node": "node-a",
        "from_phase": "before_install",
        "to_phase": "after_uninstall",
        "kind": "files",
        "key": "/etc/criu/default.conf",
        "change": "added",
        "before": None,
        "after": "sha256:1",
        "diffed_at": at(W2, 40),
        **fp(),
    }
    runs["exit-1"] = [([verdict], EXIT_VERDICTS), ([diff], EXIT_DIFF)]
    for run_id, parts in runs.items():
        for rows, spec in parts:
            write(rows, spec, data_dir, run_id)
        commit_run(data_dir, POC, run_id, "test", "complete")


def context(plan: Plan, data_dir: Path) -> RunContext:
    return RunContext(
        poc=plan.poc,
        run_id="record-1",
        plan_path="plan.yaml",
        plan_hash="h",
        git_sha="g",
        data_dir=data_dir,
        started_at=pd.Timestamp(at(W2)).to_pydatetime(),
        fingerprint=fp(),
        stage="record",
    )


def numbers(text: str) -> list[str]:
    """Every number in a cell, as printed (−, +, decimals kept)."""
    return re.findall(r"[+−-]?\d+(?:\.\d+)?", text)


def pdf_pages(path: Path, out: Path) -> tuple[int, str]:
    """Render each page to PNG (as a reader sees it) and extract the text."""
    import pypdfium2 as pdfium

    pdf = pdfium.PdfDocument(str(path))
    texts = []
    for i, page in enumerate(pdf):
        image = page.render(scale=1).to_pil()
        png = out / f"page-{i + 1}.png"
        image.save(png)
        assert png.stat().st_size > 1000
        assert image.convert("L").getextrema()[0] < 128, f"page {i + 1} is blank"
        texts.append(page.get_textpage().get_text_range())
    return len(pdf), "\n".join(texts)


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    data_dir = tmp_path_factory.mktemp("data")
    build_poc(data_dir)
    plan = make_plan(poc=POC, data_dir=str(data_dir))
    result = build_record(plan, context(plan, data_dir), n_resamples=200)
    return {**result.to_json(), "data_dir": data_dir, "plan": plan}


def test_html_sections_numbers_lineage_escaped(record: dict[str, Any]) -> None:
    page = Path(record["html"]).read_text(encoding="utf-8")
    for section in SECTIONS:
        assert f"<h2>{html.escape(section)}</h2>" in page, section
    assert EVIL not in page and html.escape(EVIL) in page
    for cells in record["table"]:
        for cell in cells:
            assert html.escape(cell) in page, cell
    # Both arms on one line: recovery 3.00 s (managed) beside 30.0 s (unmanaged).
    assert "<h3>Side by side</h3>" in page
    assert re.search(
        r"<td>recovery time</td><td>3\.00 s \(2\.00 s … 4\.00 s\)</td>"
        r"<td>30\.0 s \(20\.0 s … 40\.0 s\)</td><td>6 / 6</td>",
        page,
    )
    # Method from the rows: the fault, the clock, the checkpoint size, the versions.
    assert "sigkill" in page and "fault_injected→serving_again" in page
    assert "2000.0 MB" in page and "criu 4.0" in page and "CUDA 12.4" in page
    # Lineage: every run and its parquet files.
    for run_id in ("rec-1", "oh-1", "cs-1", "ck-1", "util-1", "exit-1", "base-1"):
        assert run_id in page
    trial_files = sorted((record["data_dir"] / POC / "trials").glob("week=*/rec-1.parquet"))
    assert trial_files and all(str(f) in page for f in trial_files)
    assert "/etc/criu/default.conf" in page  # the leftover itself


def test_pdf_pages_sections_and_no_number_missing(record: dict[str, Any], tmp_path: Path) -> None:
    pages, text = pdf_pages(Path(record["pdf"]), tmp_path)
    assert pages >= 3
    flat = " ".join(text.split())
    for section in SECTIONS:
        assert section in flat, section
    html_text = html.unescape(Path(record["html"]).read_text(encoding="utf-8"))
    assert not missing_numbers(record["table"], flat)
    assert not missing_numbers(record["table"], html_text)
    assert len(record["table"]) >= 15


def missing_numbers(table: list[list[str]], text: str) -> list[tuple[str, str]]:
    """(measure, number) for every number of the verdict table (n, weeks, value, CI,
    threshold) that ``text`` lacks."""
    return [
        (row[0], n) for row in table for cell in row[3:8] for n in numbers(cell) if n not in text
    ]


def test_number_check_can_fail(record: dict[str, Any], tmp_path: Path) -> None:
    """The comparison finds a number taken out of the PDF's text."""
    _, text = pdf_pages(Path(record["pdf"]), tmp_path)
    flat = " ".join(text.split())
    value = record["table"][0][5]  # the managed recovery time, e.g. "3.00 s"
    assert numbers(value)[0] in flat
    gone = missing_numbers(record["table"], flat.replace(numbers(value)[0], "?"))
    assert (record["table"][0][0], numbers(value)[0]) in gone
    assert numbers("1.23 … −4.5 %") == ["1.23", "−4.5"]


def test_no_data_record(tmp_path: Path) -> None:
    plan = make_plan(poc=POC, data_dir=str(tmp_path))
    result = build_record(plan, context(plan, tmp_path), n_resamples=100)
    assert set(result.verdicts.values()) == {"no data"}
    assert result.exit == "not tried"
    assert not any(g["passed"] for k, g in result.gates.items() if k != "synthetic_workload")
    assert Path(result.pdf).read_bytes().startswith(b"%PDF")


def test_cli_json_prints_exactly_the_record_keys(
    record: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    import cli.common
    import flows.record
    from cli.record import record_cmd

    monkeypatch.setattr(cli.common, "_flows_ready", lambda: None)
    from dataclasses import fields

    from flows.results import RecordRun
    from tasks.poc.record.build import DecisionRecord

    built = DecisionRecord(**{f.name: record[f.name] for f in fields(DecisionRecord)})
    monkeypatch.setattr(flows.record, "record", lambda plan_path: RecordRun(POC, "r", built))
    app = typer.Typer()
    app.command("record")(record_cmd)
    app.command("noop")(lambda: None)  # a single-command app would take no command name
    res = CliRunner().invoke(app, ["record", "plan.yaml", "--json"])
    assert res.exit_code == 0, res.output
    printed = json.loads(res.stdout)
    assert list(printed) == [
        "html",
        "pdf",
        "decision",
        "decision_reason",
        "verdicts",
        "gates",
        "exit",
    ]
    assert printed["decision"] in ("adopt", "reject", "extend", "undecided")
    assert printed["exit"] == "leftovers: 1"


def test_checkpointer_version_from_fingerprint() -> None:
    from tasks.poc.record.method import version_of

    assert version_of(json.dumps({"criu": "4.1"}), "criu") == "4.1"
    assert version_of("none", "criu") == "none"  # fingerprint.NONE, not JSON
    assert version_of(None, "criu") == "none"
    assert version_of(json.dumps({"prefect": "3"}), "criu") == "none"


# --- figures and extrapolation inputs (tasks/poc/record/figures.py) ----------------------------

FIGURE_TITLES = (
    "Recovery time per fault and arm (every trial)",
    "Work lost per interruption per arm (every trial)",
    "Goodput per arm per week, and the gain against the plan",
    "Cold start by checkpoint size, both clocks",
    "Steady-state overhead per A/B pair",
    "Where the seconds go, per arm (medians of each phase)",
    "Restore throughput against checkpoint size",
)


@pytest.fixture(scope="module")
def figured(record: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The record's facts with the figures and the inputs tables written into a Doc, and the
    Doc rendered as the record renders it."""
    import time

    from tasks.poc.record.build import gather
    from tasks.poc.record.document import Doc, render_html, render_pdf
    from tasks.poc.record.figures import add_extrapolation_inputs, add_figures

    facts = gather(record["plan"], record["data_dir"], n_resamples=200)
    doc = Doc()
    started = time.monotonic()
    add_figures(doc, facts)
    drawing_s = time.monotonic() - started
    add_extrapolation_inputs(doc, facts)
    out = tmp_path_factory.mktemp("figures")
    pdf = out / "figures.pdf"
    pdf.write_bytes(render_pdf(doc, "figures"))
    return {"doc": doc, "html": render_html(doc, "figures"), "pdf": pdf, "drawing_s": drawing_s}


def test_record_figures_in_the_html_as_inline_svg(figured: dict[str, Any]) -> None:
    page = figured["html"]
    figures = [b for b in figured["doc"].blocks if b.kind == "figure"]
    assert len(figures) == len(FIGURE_TITLES)  # every figure has data in this PoC
    assert page.count("<svg") == len(FIGURE_TITLES)
    for title in FIGURE_TITLES:
        assert f"<h3>{html.escape(title)}</h3>" in page
        assert f"<title>{html.escape(title)}</title>" in page
    assert "<img" not in page and "http://" not in page.replace(
        "http://www.w3.org/", ""
    )  # self-contained: nothing to fetch
    ids = re.findall(r'\bid="([^"]+)"', page)
    assert len(ids) == len(set(ids))  # figures on one page share no id
    # Every recovery trial a point: 6 managed, 6 unmanaged (one fault, sigkill).
    rec = page[page.index("<title>Recovery time") :]
    for i in (0, 1):
        group = re.search(rf'<g id="recovery-recovery-{i}">(.*?)</g>', rec, re.S)
        assert group and group.group(1).count("<use") == 6
    # The figures drawn in well under a second each (also on a loaded test machine).
    assert figured["drawing_s"] < len(FIGURE_TITLES) * 2.0


def test_record_figures_embedded_in_the_pdf(figured: dict[str, Any], tmp_path: Path) -> None:
    import pypdfium2 as pdfium
    import pypdfium2.raw as pdfium_c

    pdf = pdfium.PdfDocument(str(figured["pdf"]))
    images = sum(len(list(page.get_objects(filter=[pdfium_c.FPDF_PAGEOBJ_IMAGE]))) for page in pdf)
    assert images >= len(FIGURE_TITLES)
    _, text = pdf_pages(figured["pdf"], tmp_path)  # every page renders, none blank
    flat = " ".join(text.split())
    for title in FIGURE_TITLES:
        assert title in flat, title
    assert "n = 12" in flat  # the recovery figure's caption: which rows, how many


def test_record_inputs_as_tables(figured: dict[str, Any]) -> None:
    from tasks.poc.record.figures import INPUT_HEADS

    tables = [b for b in figured["doc"].blocks if b.kind == "table"]
    assert tables and all(tuple(t.heads) == INPUT_HEADS for t in tables)
    assert not [b for b in figured["doc"].blocks if b.kind == "pre"]
    names = {r[0] for t in tables for r in t.rows}
    assert {
        "δ, checkpoint cost",
        "Daly's optimal interval",
        "waste at the plan's interval",
    } <= names


def test_record_without_data_has_a_line_per_figure(tmp_path: Path) -> None:
    from tasks.poc.record.build import gather
    from tasks.poc.record.document import Doc
    from tasks.poc.record.figures import add_extrapolation_inputs, add_figures

    facts = gather(make_plan(poc=POC, data_dir=str(tmp_path)), tmp_path, n_resamples=100)
    doc = Doc()
    add_figures(doc, facts)
    add_extrapolation_inputs(doc, facts)
    figures = doc.blocks[: 2 * len(FIGURE_TITLES)]
    assert [b.kind for b in figures] == ["h3", "p"] * len(FIGURE_TITLES)
    assert all("nothing to draw" in b.text for b in figures[1::2])
    # The extrapolated rows still list what they had (the plan's interval), as a table.
    assert [b.kind for b in doc.blocks[len(figures) :]] == ["h3", "table"]


def test_record_opens_with_the_decision_and_status_shows_it(record: dict[str, Any]) -> None:
    from tasks.poc.progress import state_lines
    from tasks.poc.record.build import read_decision

    # build_poc's exit diff has a leftover: the way out is not met, and the plan's rule rejects.
    assert record["decision"] == "reject" and "exit" in record["decision_reason"]
    html = Path(record["html"]).read_text()
    assert html.index("Decision: REJECT") < html.index("<h2>Verdicts</h2>")
    saved = read_decision(record["data_dir"], POC)
    assert saved is not None
    assert (saved["decision"], saved["decision_reason"]) == (
        record["decision"],
        record["decision_reason"],
    )
    state = {"decision": saved}
    line = next(x for x in _decision_lines(state_lines, state) if "decision:" in x)
    assert f"decision: reject: {record['decision_reason']}" in line
    # The way out lists the node's own changes apart from the leftovers.
    assert "<h3>Leftovers</h3>" in html and "<h3>The node&#x27;s own</h3>" in html


def _decision_lines(state_lines: Any, state: dict[str, Any]) -> list[str]:
    """state_lines over a state whose stages are all due (only the decision line matters)."""
    from tasks.poc.stages import STAGE_NAMES

    full = {
        "weeks_sampled": 0,
        "weeks_planned": 1,
        "gap_s": 0.0,
        "gap_rows": 0,
        "failed_gates": [],
        "scheduled": {"available": False},
        **state,
        "stages": {n: {"status": "due", "why": None} for n in STAGE_NAMES},
    }
    return state_lines(full)
