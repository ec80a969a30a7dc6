"""``sacct --json`` of every data_parser version, v0.0.37 (21.08) to v0.0.44 (25.11), through
the real baseline: the same jobs give the same numbers in every version, and the same numbers
as a ``sacct -P`` dump of those jobs."""

from __future__ import annotations

import copy
import json
import logging
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tasks.baseline import fields, sacct_json, sacct_json_fast
from tasks.baseline.dump_layout import SACCT_FIELDS
from tasks.baseline.run import BaselineResult, run_baseline
from tasks.data.errors import AccountingError
from tasks.data.plan import load_plan
from tasks.data.runctx import make_run_context
from tests.support.common import REPO

FIXTURES = REPO / "tests" / "support" / "fixtures" / "sacct_json"
VERSIONS = [f"v0.0.{n}" for n in range(37, 45)]
DEMO_PLAN = REPO / "plans" / "demo.yaml"

# The fixtures' jobs as sacct -P prints them (allocations only; written by hand from
# make_fixtures.JOBS, not by the converter).
D = "2026-11-02T"
PSV_ALLOCATIONS = [
    f"5001|5001|c1|gpu|alice|proj|train5001|COMPLETED|0:0|{D}00:00:00|{D}00:01:00|"
    f"{D}01:01:00|01:00:00|3600|02:00:00|1|4|cpu=4,mem=8G,node=1|n1",
    f"5002|5002|c1|gpu|alice|proj|train5002|FAILED|3:0|{D}00:00:00|{D}00:01:00|"
    f"{D}00:31:00|00:30:00|1800|01:00:00|1|8|cpu=8,gres/gpu:a100=4,gres/gpu=4,node=1|n1",
    f"5003|5003|c1|gpu|alice|proj|train5003|TIMEOUT|0:0|{D}00:00:00|{D}00:01:00|"
    f"{D}01:02:00|01:01:00|3660|01:00:00|1|2|cpu=2,gres/gpu=2,node=1|n1",
    f"5004|5004|c1|gpu|alice|proj|train5004|PREEMPTED|0:0|{D}00:00:00|{D}00:02:00|"
    f"{D}02:02:00|02:00:00|7200|10:00:00|2|16|cpu=16,gres/gpu:v100=2,gres/gpu:t4=1,node=2|"
    "n[1-2]",
    f"5005|5005|c1|gpu|alice|proj|train5005|NODE_FAIL|0:0|{D}00:00:00|{D}00:01:00|"
    f"{D}03:01:00|03:00:00|10800|UNLIMITED|2|32|cpu=32,gres/gpu=8,node=2|n[1-2]",
    f"5006|5006|c1|gpu|alice|proj|train5006|CANCELLED by 1000|0:15|{D}00:00:00|"
    f"{D}00:01:00|{D}00:11:00|00:10:00|600|01:00:00|1|1|cpu=1,node=1|n1",
    f"5007|5007|c1|gpu|alice|proj|requeued|REQUEUED|0:0|{D}00:00:00|{D}00:01:00|"
    f"{D}00:16:00|00:15:00|900|02:00:00|1|2|cpu=2,gres/gpu=1,node=1|n1",
    f"5007|5007|c1|gpu|alice|proj|requeued|COMPLETED|0:0|{D}00:16:00|{D}00:16:40|"
    f"{D}01:16:40|01:00:00|3600|02:00:00|1|2|cpu=2,gres/gpu=1,node=1|n1",
    f"5010_3|5013|c1|gpu|alice|proj|sweep|COMPLETED|0:0|{D}00:00:00|{D}00:01:00|"
    f"{D}01:01:00|01:00:00|3600|01:30:00|1|1|cpu=1,gres/gpu=1,node=1|n1",
    f"5020+0|5020|c1|gpu|alice|proj|het|COMPLETED|0:0|{D}00:00:00|{D}00:01:00|"
    f"{D}01:01:00|01:00:00|3600|01:30:00|1|4|cpu=4,node=1|n1",
    f"5020+1|5021|c1|gpu|alice|proj|het|COMPLETED|0:0|{D}00:00:00|{D}00:01:00|"
    f"{D}01:01:00|01:00:00|3600|01:30:00|1|2|cpu=2,gres/gpu=2,node=1|n1",
    f"5030|5030|c1|gpu|alice|proj|train5030|RUNNING|0:0|{D}00:00:00|{D}00:01:00|Unknown|"
    "00:30:00|1800|UNLIMITED|1|2|cpu=2,gres/gpu=1,node=1|n1",
]
STEPS_PER_DOCUMENT = 17
MEASURES = (
    "allocations_by_state",
    "node_hours_by_state",
    "gpu_hours_by_state",
    "exposed_gpu_hours",
    "timeout_gpu_hours",
    "chains",
    "not_computed",
)


def same(a: object, b: object) -> bool:
    """Equal, floats to 1e-9 relative, dicts key by key."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == pytest.approx(b, rel=1e-9)


def baseline(tmp_path: Path, name: str, text: str) -> BaselineResult:
    tmp_path.mkdir(parents=True, exist_ok=True)
    dump = tmp_path / name
    dump.write_text(text)
    plan = load_plan(DEMO_PLAN).model_copy(update={"data_dir": str(tmp_path / "data")})
    return run_baseline(plan, make_run_context(plan, DEMO_PLAN), sacct_file=str(dump))


@pytest.fixture(scope="module")
def psv_summary(tmp_path_factory: pytest.TempPathFactory) -> dict:
    text = "|".join(SACCT_FIELDS) + "\n" + "\n".join(PSV_ALLOCATIONS) + "\n"
    return baseline(tmp_path_factory.mktemp("psv"), "jobs.psv", text).summary.to_json()


def test_the_fixtures_are_what_the_generator_writes() -> None:
    """The committed documents are make_fixtures.py's output (no hand edits drifted)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_fixtures", FIXTURES / "make_fixtures.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for n in range(37, 45):
        written = json.loads((FIXTURES / f"v0.0.{n}.json").read_text())
        assert written == module.document(n), n


@pytest.mark.parametrize(
    ("step_id", "suffix"),
    [
        ("batch", "batch"),  # v0.0.37/38
        (0, "0"),
        ({"job_id": 5737, "step_id": "extern"}, "extern"),  # v0.0.39
        ({"job_id": 5737, "step_het_component": 1, "step_id": "0"}, "0"),
        ("5737.batch", "batch"),  # v0.0.40 on
        ("5737_3.0", "0"),
        ("5737+1.interactive", "interactive"),
        ("5737.0+1", "0"),
        ({"id": "5737.4"}, "4"),
    ],
)
def test_step_ids_in_every_shape(step_id: object, suffix: str) -> None:
    assert sacct_json.step_suffix(step_id, "steps[0].step.id") == suffix


def test_state_flags_read_as_sacct_p_prints_them() -> None:
    assert sacct_json.state_text(["TIMEOUT"], "state") == "TIMEOUT"
    assert sacct_json.state_text(["PENDING", "REQUEUED"], "state") == "REQUEUED"
    assert sacct_json.state_text(["COMPLETED", "REQUEUED"], "state") == "REQUEUED"
    assert sacct_json.state_text({"current": "FAILED"}, "state") == "FAILED"
    with pytest.raises(sacct_json.Unreadable, match=r"state\.current: int"):
        sacct_json.state_text({"current": 3}, "state")


def test_untracked_tres_counts_are_dropped_not_a_bad_row() -> None:
    entries = [
        {"type": "cpu", "name": "", "count": 4},
        {"type": "energy", "name": "", "count": -2},
        {"type": "fs", "name": "disk", "count": None},
        {"type": "gres", "name": "gpu", "count": {"set": True, "infinite": False, "number": 2}},
    ]
    text = sacct_json.tres_text(entries, "tres.allocated")
    assert text == "cpu=4,gres/gpu=2"
    parsed = fields.parse_tres(text)
    assert not parsed.bad and parsed.gpus == 2


def test_time_limit_and_open_jobs() -> None:
    assert sacct_json._time_limit({"set": False, "infinite": True, "number": 0}, "l") == (
        "UNLIMITED"
    )
    assert sacct_json._time_limit({"set": True, "infinite": False, "number": 90}, "l") == "90"
    assert sacct_json._time_limit({"set": False, "infinite": False, "number": 0}, "l") == ""
    assert sacct_json._time_limit(None, "l") == "UNLIMITED"
    assert sacct_json.epoch_text(0, "time.end") == "Unknown"
    assert sacct_json.epoch_text({"set": False, "number": 0}, "time.end") == "Unknown"


def _doc_45() -> dict:
    doc = json.loads((FIXTURES / "v0.0.44.json").read_text())
    doc["meta"]["plugin"]["data_parser"] = "data_parser/v0.0.45"
    doc["meta"]["slurm"]["release"] = "26.05.0"
    return doc


def test_an_unseen_version_is_read_as_far_as_it_goes_and_named_in_a_warning(
    tmp_path: Path, psv_summary: dict, caplog: pytest.LogCaptureFixture
) -> None:
    doc = _doc_45()
    doc["jobs"][5]["time"]["limit"] = ["90", "minutes"]  # a shape no version gave
    with caplog.at_level(logging.WARNING, logger=sacct_json.__name__):
        result = baseline(tmp_path, "v45.json", json.dumps(doc))
    (record,) = caplog.records
    message = record.getMessage()
    assert "data_parser v0.0.45 (Slurm 26.05.0)" in message
    assert "has not seen (it reads v0.0.37–v0.0.44)" in message
    assert "read 11 of 12 jobs" in message
    assert "first field it could not read: jobs[5] time.limit: list" in message
    s = result.summary.to_json()
    # The unreadable job (5006, the CANCELLED one) is quarantined; every other job is read.
    assert s["rows_quarantined"] == 1
    (quarantined,) = pq.read_table(result.written["quarantine"][0]).to_pylist()
    assert quarantined["raw"].startswith("unreadable-json-jobs[5].time.limit|")
    assert "JobID" in quarantined["reason"]
    expected = dict(psv_summary["allocations_by_state"])
    del expected["CANCELLED"]
    assert s["allocations_by_state"] == expected
    expected_gpu = {k: v for k, v in psv_summary["gpu_hours_by_state"].items() if k != "CANCELLED"}
    assert same(s["gpu_hours_by_state"], expected_gpu)


def test_an_unseen_version_read_whole_is_still_named(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=sacct_json.__name__):
        sacct_json.sacct_json_to_psv(json.dumps(_doc_45()), "v45.json")
    (record,) = caplog.records
    assert "v0.0.45" in record.getMessage()
    assert "read 12 of 12 jobs; every field it needs was read" in record.getMessage()


def test_an_unreadable_job_names_its_field_and_never_a_value() -> None:
    doc = json.loads((FIXTURES / "v0.0.41.json").read_text())
    broken = copy.deepcopy(doc)
    broken["jobs"][1]["tres"]["allocated"] = "gres/gpu=4"  # a string, not a list
    broken["jobs"][1]["user"] = "secret-alice"
    conversion = sacct_json.convert_sacct_json(json.dumps(broken), "x.json")
    assert conversion.unreadable == [(1, "tres.allocated: str, expected a list of TRES")]
    lines = conversion.psv.decode().splitlines()
    (row,) = [line for line in lines if line.startswith("unreadable-json-jobs[1].")]
    assert row == "unreadable-json-jobs[1].tres.allocated" + "|" * (len(SACCT_FIELDS) - 1)
    assert "secret-alice" not in conversion.psv.decode()
    assert conversion.problems("x.json").startswith(
        "x.json: sacct --json from data_parser v0.0.41 (Slurm 24.05.8): read 11 of 12 jobs"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"meta": {}, "errors": []}', "no 'jobs' list"),
        ('{"jobs": [{"job_id": 1}, ', "not valid sacct --json output"),
        ('{"jobs": [{"job_id": 1} {"job_id": 2}]}', "expected , or ] at line 1"),
        ("{}", "no 'jobs' list"),
    ],
)
def test_broken_documents_are_refused_with_a_clear_message(text: str, message: str) -> None:
    with pytest.raises(AccountingError, match=message) as info:
        sacct_json.sacct_json_to_psv(text, "broken.json")
    assert str(info.value).startswith("broken.json: ")


# --- the fast path (sacct_json_fast) agrees with the slow one --------------------------------


def _slow_conversion(
    monkeypatch: pytest.MonkeyPatch, text: str | bytes
) -> sacct_json.JsonConversion:
    """The document through iter_document and job_rows only."""
    with monkeypatch.context() as m:
        m.setattr(sacct_json, "fast_jobs", _refuse_document)
        m.setattr(sacct_json, "fast_job_rows", _refuse_job)
        return sacct_json.convert_sacct_json(text, "x.json")


def _refuse_document(*_: object) -> object:
    raise sacct_json.Unchunked


def _refuse_job(_: object) -> list[str]:
    raise sacct_json.NotCommon


def _all_fixture_jobs() -> list[dict]:
    return [
        job for v in VERSIONS for job in json.loads((FIXTURES / f"{v}.json").read_text())["jobs"]
    ]


ODD_VALUES = [
    None, 0, -1, 7, 2**40, 253402300800, True, "", "x", "5737.batch", "5737.0+1", "5_3.0",
    "a|b\nc", 1.5, [], ["RUNNING"], ["RUNNING", "REQUEUED"], {},
    {"set": True, "infinite": False, "number": 5}, {"set": False, "infinite": False, "number": 0},
    {"set": True, "infinite": True, "number": 0}, {"set": 1, "infinite": False, "number": 2},
    {"set": True, "number": 3}, [{"type": "gres", "name": 5, "count": 1}],
]  # fmt: skip


def _paths(value: object, path: tuple = ()) -> list[tuple]:
    if isinstance(value, dict):
        return [path, *(p for k, v in value.items() for p in _paths(v, (*path, k)))]
    if isinstance(value, list):
        return [path, *(p for i, v in enumerate(value) for p in _paths(v, (*path, i)))]
    return [path]


def _odd_variants(job: dict, rng: random.Random, n: int = 40) -> list[dict]:
    """``n`` copies of ``job``, each with one or two values swapped for odd ones."""
    variants = []
    for _ in range(n):
        variant = copy.deepcopy(job)
        for _ in range(rng.choice((1, 2))):
            *parents, leaf = rng.choice(_paths(variant)[1:])
            holder = variant
            for key in parents:
                holder = holder[key]
            holder[leaf] = copy.deepcopy(rng.choice(ODD_VALUES))
        variants.append(variant)
    return variants


def test_the_fast_reading_gives_job_rows_rows_or_leaves_the_job_to_it() -> None:
    """Every fixture job, and each with values swapped for odd ones: where fast_job_rows
    gives rows they are job_rows's (which reads the job), else it says NotCommon."""
    import random

    from tasks.baseline import sacct_json_fast

    rng = random.Random(20)
    accepted = 0
    for job in _all_fixture_jobs():
        for variant in [job, *_odd_variants(job, rng)]:
            try:
                rows = sacct_json_fast.fast_job_rows(variant)
            except (sacct_json.NotCommon, KeyError):
                continue
            accepted += 1
            assert rows == sacct_json.job_rows(variant), variant
    assert accepted > 100  # the common shapes are read fast, not all left to job_rows


def test_the_typed_reading_gives_job_rows_rows_or_leaves_the_chunk_to_orjson() -> None:
    """Every fixture job and its odd variants, each alone in a chunk and in every layout:
    where sacct_json_typed answers, its rows are job_rows's; a chunk holding one job it does
    not take is not answered at all (orjson's dicts and fast_job_rows read it)."""
    from tasks.baseline import sacct_json_typed

    rng = random.Random(21)
    accepted: dict[str, int] = {}
    for version in VERSIONS:
        jobs = json.loads((FIXTURES / f"{version}.json").read_text())["jobs"]
        for job in jobs:
            for variant in [job, *_odd_variants(job, rng, 20)]:
                for indent in (None, 2):
                    chunk = json.dumps([variant], indent=indent).encode()
                    rows = sacct_json_typed.chunk_rows(chunk)
                    if rows is None:
                        continue
                    accepted[version] = accepted.get(version, 0) + 1
                    assert rows == [sacct_json.job_rows(variant)], variant
                    assert all(type(r) is sacct_json_fast.Converted for r in rows)
        # A chunk is taken whole or not at all: one odd job leaves the others to orjson, as
        # does an int past 64 bits (msgspec reads one, orjson does not).
        odd = {**jobs[0], "state": {"current": ["RUNNING", "REQUEUED"]}}
        assert sacct_json_typed.chunk_rows(json.dumps([*jobs, odd]).encode()) is None
        big = {**jobs[-1], "job_id": 2**64}
        assert sacct_json_typed.chunk_rows(json.dumps([*jobs, big]).encode()) is None
    # The shape Slurm writes from v0.0.40 (25.11's v0.0.44 included) is the one it reads.
    assert all(accepted.get(v, 0) > 10 for v in VERSIONS if v >= "v0.0.40"), accepted


def _layouts(doc: dict) -> dict[str, str]:
    one_per_line = ",\n".join(json.dumps(job) for job in doc["jobs"])
    return {
        "compact": json.dumps(doc),
        "pretty": json.dumps(doc, indent=2),
        "a job a line": f'{{"meta": {json.dumps(doc["meta"])}, "jobs": [\n{one_per_line}\n], '
        '"errors": []}',
    }


@pytest.mark.parametrize("version", ["v0.0.38", "v0.0.41", "v0.0.44"])
def test_the_chunked_reader_reads_every_layout_as_the_standard_library(
    monkeypatch: pytest.MonkeyPatch, version: str
) -> None:
    from tasks.baseline import sacct_json_fast

    doc = json.loads((FIXTURES / f"{version}.json").read_text())
    doc["jobs"][2]["name"] = '}, {"account": "x"}, {"account'  # a separator inside a string
    doc["jobs"] = doc["jobs"] * 3
    monkeypatch.setattr(sacct_json_fast, "CHUNK_BYTES", 1)  # a cut after every job
    for layout, text in _layouts(doc).items():
        expected = _slow_conversion(monkeypatch, text)
        got = sacct_json.convert_sacct_json(text.encode(), "x.json")
        assert got == expected, layout
        assert got.jobs == 36


def test_a_document_the_chunks_cannot_take_is_read_whole_by_the_standard_library(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """NaN (which json reads and orjson refuses) in the middle of the list: no cut there is
    proven, so the whole document is read again by iter_document."""
    from tasks.baseline import sacct_json_fast

    doc = json.loads((FIXTURES / "v0.0.44.json").read_text())
    doc["jobs"] = doc["jobs"] * 4
    doc["jobs"][20] = {**doc["jobs"][20], "comment": float("nan")}
    text = json.dumps(doc, indent=2)
    monkeypatch.setattr(sacct_json_fast, "CHUNK_BYTES", 1)
    with pytest.raises(sacct_json.Unchunked):
        list(sacct_json_fast.fast_jobs(text.encode(), {}, lambda tail, top: iter([])))
    assert sacct_json.convert_sacct_json(text, "x.json") == _slow_conversion(monkeypatch, text)


def test_jobs_holding_many_nested_lists_are_still_cut_into_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 25.11 job's steps carry TRES lists (requested and consumed: min, max, average,
    total), hundreds of ``},{`` before the job's own end, all written alike: the separator
    between jobs is still learnt (each distinct one tried once), so the document is cut into
    chunks, not read whole by the slow reader, and reads as the slow reader reads it."""
    doc = json.loads((FIXTURES / "v0.0.44.json").read_text())
    usage = [{"type": "cpu", "name": "", "id": i, "count": i} for i in range(40)]
    for job in doc["jobs"]:
        for step in job.get("steps") or []:
            step["tres_usage"] = {"requested": {"max": usage, "min": usage}, "consumed": usage}
    doc["jobs"] = doc["jobs"] * 3
    monkeypatch.setattr(sacct_json_fast, "CHUNK_BYTES", 1)  # a cut after every job
    for indent in (None, 2):
        text = json.dumps(doc, indent=indent)
        assert text.count("}, {" if indent is None else "},", 0, len(text) // 36) > 64
        # More than the last job left to the tail reader: the document was not cut.
        monkeypatch.setattr(sacct_json_fast, "_TAIL_BYTES", len(text) // 10)
        list(sacct_json_fast.fast_jobs(text.encode(), {}, lambda tail, top: iter([])))
        expected = _slow_conversion(monkeypatch, text)
        assert sacct_json.convert_sacct_json(text.encode(), "x.json") == expected


def test_a_document_whose_separator_stops_is_read_whole_not_copied(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No cut found before the end: the rest is read by iter_document only while small;
    beyond that the whole document goes to the slow reader (no second copy of a big rest)."""
    from tasks.baseline import sacct_json_fast

    text = (FIXTURES / "v0.0.40.json").read_text()
    monkeypatch.setattr(sacct_json_fast, "_TAIL_BYTES", 0)
    with pytest.raises(sacct_json.Unchunked):
        list(sacct_json_fast.fast_jobs(text.encode(), {}, lambda tail, top: iter([])))
    assert sacct_json.convert_sacct_json(text, "x.json") == _slow_conversion(monkeypatch, text)


def test_the_fast_times_are_strftime_s() -> None:
    import random

    from tasks.baseline import sacct_json_fast

    rng = random.Random(3)
    epochs = [1, 86_399, 86_400, 951_782_400, 4_102_444_800, 253_402_300_799]
    epochs += [rng.randrange(1, 253_402_300_799) for _ in range(2000)]
    for epoch in epochs:
        assert sacct_json_fast._epoch_text(epoch) == sacct_json.epoch_text(epoch, "t"), epoch
    assert sacct_json_fast._epoch_text(0) == sacct_json_fast._epoch_text(-5) == "Unknown"


def test_memoised_fields_step_aside_for_what_orjson_cannot_write_and_stay_bounded() -> None:
    from tasks.baseline import sacct_json_fast as fast

    # An int past 64 bits (the standard library reads one) is job_rows' to judge.
    with pytest.raises(fast.NotCommon):
        fast._exit({"return_code": 2**70, "signal": {}})
    # The same JSON is the same text; a full table is emptied, never grown past its bound.
    code = {"return_code": {"set": True, "infinite": False, "number": 2}, "signal": {}}
    assert fast._exit(code) == fast._exit(dict(code)) == "2:0"
    for rc in range(fast._MEMO_MAX + 10):
        fast._exit({"return_code": rc, "signal": {}})
    assert len(fast._EXIT_TEXT) <= fast._MEMO_MAX
    assert fast._exit({"return_code": 7, "signal": {"id": 9}}) == "7:9"
