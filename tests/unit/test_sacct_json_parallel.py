"""sacct_json_parallel: a document converted by several processes is the one-process conversion,
byte for byte; a region that does not prove out, a worker that dies or stalls, a file that
changed: converted again in one process, never a hang."""

from __future__ import annotations

import copy
import json
import logging
import os
import time
from pathlib import Path

import pytest

from tasks.baseline import sacct_json, source_files
from tasks.baseline import sacct_json_parallel as par
from tests.support.common import REPO

FIXTURES = REPO / "tests" / "support" / "fixtures" / "sacct_json"


def _jobs(n: int, nested: bool = False) -> list[dict]:
    """``n`` distinct jobs (the v0.0.44 fixture's, renumbered); ``nested``: each with a list of
    objects whose first key is the jobs' own, so the separator between jobs appears inside."""
    base = json.loads((FIXTURES / "v0.0.44.json").read_text())["jobs"]
    jobs = []
    for i in range(n):
        job = copy.deepcopy(base[i % len(base)])
        job["job_id"] = 900_000 + i
        if nested:
            job["comment"] = [{"account": f"a{i}"}, {"account": f"b{i}"}]
            job["name"] = '}, {"account": "x"}, {"account'  # in a string: escaped, no cut
        jobs.append(job)
    return jobs


def _text(jobs: list[dict], layout: str = "compact") -> bytes:
    meta = json.loads((FIXTURES / "v0.0.44.json").read_text())["meta"]
    if layout == "a job a line":
        lines = ",\n".join(json.dumps(job) for job in jobs)
        return f'{{"jobs": [\n{lines}\n], "meta": {json.dumps(meta)}, "errors": []}}'.encode()
    doc = {"jobs": jobs, "meta": meta, "errors": [], "warnings": []}
    return json.dumps(doc, indent=2 if layout == "pretty" else None).encode()


def _file(tmp_path: Path, data: bytes) -> tuple[Path, os.stat_result]:
    path = tmp_path / "sacct.json"
    path.write_bytes(data)
    return path, path.stat()


def _no_fallback(*_: object) -> object:
    raise AssertionError("converted again in one process")


def _parallel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, data: bytes, n: int, fallback: bool = False
) -> sacct_json.JsonConversion:
    """``data`` through convert_file with ``n`` processes; without ``fallback`` the
    one-process conversion must not be what answers."""
    path, stamp = _file(tmp_path, data)
    with monkeypatch.context() as m:
        m.setenv(par.WORKERS_ENV, str(n))
        if not fallback:
            m.setattr(par, "convert_sacct_json", _no_fallback)
        return par.convert_file(data, str(path), path, stamp)


def test_separators_inside_jobs_near_a_cut_are_not_taken_for_cuts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every job holds the separator between jobs (a nested list of objects that open with the
    jobs' first key; inside a string its quotes are escaped, so it is never found there): the
    cuts guessed are checked, and the ones kept prove out."""
    data = _text(_jobs(1500, nested=True))
    expected = sacct_json.convert_sacct_json(data, "x.json")
    checked: list[bool] = []
    real = par._next_cut_from

    def check(*args: object) -> bool:
        try:
            checked.append(real(*args))
        except sacct_json.Unchunked:
            checked.append(False)
        return checked[-1]

    monkeypatch.setattr(par, "_next_cut_from", check)
    assert _parallel(monkeypatch, tmp_path, data, 4) == expected
    assert False in checked  # a guess inside a job was found, and passed over
    assert checked.count(True) == 3


def test_a_cut_that_does_not_prove_out_is_converted_again(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A guessed cut inside a job (as if the check had passed it): the region before does not
    end there, so the document is converted again in one process, to the same answer."""
    data = _text(_jobs(1500, nested=True))
    between = b'}, {"account"'
    inside = data.find(b'"comment": [{"account"', len(data) // 2)
    false_cut = data.find(between, inside)
    assert data.rfind(b'"comment"', 0, false_cut) == inside  # inside that job's comment
    monkeypatch.setattr(par, "_stops", lambda *_: [false_cut])
    calls: list[object] = []
    real = par.convert_sacct_json
    monkeypatch.setattr(par, "convert_sacct_json", lambda *a: calls.append(a) or real(*a))
    got = _parallel(monkeypatch, tmp_path, data, 2, fallback=True)
    assert calls, "the false cut was taken"
    assert got == sacct_json.convert_sacct_json(data, "x.json")


def test_a_worker_that_dies_is_said(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = _text(_jobs(1500))
    monkeypatch.setattr(par, "_WORKER_CODE", "import os, signal; os.kill(os.getpid(), 9)")
    with caplog.at_level(logging.WARNING, logger=par.__name__):
        _parallel(monkeypatch, tmp_path, data, 2, fallback=True)
    assert "killed by signal 9" in caplog.text
    assert "converting in one process instead" in caplog.text


def test_a_stalled_worker_is_given_up_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data = _text(_jobs(1500))
    monkeypatch.setattr(par, "_WORKER_CODE", "import time; time.sleep(600)")
    monkeypatch.setattr(par, "_STALL_MIN_S", 1.0)
    t = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=par.__name__):
        got = _parallel(monkeypatch, tmp_path, data, 2, fallback=True)
    assert time.monotonic() - t < 20
    assert "timed out" in caplog.text
    assert got == sacct_json.convert_sacct_json(data, "x.json")


def test_a_file_changed_since_it_was_read_is_not_read_by_workers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = _text(_jobs(1500))
    path, stamp = _file(tmp_path, data)
    path.write_bytes(data.replace(b'"account": "proj"', b'"account": "PROJ"'))
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1_000_000))
    monkeypatch.setenv(par.WORKERS_ENV, "2")
    got = par.convert_file(data, str(path), path, stamp)
    assert got == sacct_json.convert_sacct_json(data, "x.json")
    assert b"|PROJ|" not in got.psv


def test_how_many_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(par.WORKERS_ENV, raising=False)
    assert par.processes(par.MIN_PARALLEL_BYTES - 1) == 1
    cpus = len(os.sched_getaffinity(0))
    assert par.processes(par.MIN_PARALLEL_BYTES) == min(cpus, par.MAX_PROCESSES)
    monkeypatch.setenv(par.WORKERS_ENV, "1")
    assert par.processes(1 << 40) == 1
    monkeypatch.setenv(par.WORKERS_ENV, "2")
    assert par.processes(100) == 2
    monkeypatch.setenv(par.WORKERS_ENV, "many")
    assert par.processes(1 << 40) == 1


def test_a_json_file_opened_as_a_source_is_converted_by_workers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    data = _text(_jobs(600))
    path, _ = _file(tmp_path, data)
    monkeypatch.setenv(par.WORKERS_ENV, "2")
    monkeypatch.setattr(par, "convert_sacct_json", _no_fallback)
    fh, kind = source_files.open_source(path)
    assert kind == "json"
    assert fh.read() == sacct_json.convert_sacct_json(data, "x.json").psv


@pytest.mark.parametrize("n", ["1", "2"])
def test_a_path_converted_from_the_file_mapped_gives_the_bytes_conversion(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, n: str
) -> None:
    """convert_path maps the file for the workers (no bytes copy of it in this process) and
    answers what convert_sacct_json gives for its bytes; one process reads it whole."""
    jobs = _jobs(1500)
    jobs[1100]["time"] = "soon"
    data = _text(jobs)
    path, _ = _file(tmp_path, data)
    monkeypatch.setenv(par.WORKERS_ENV, n)
    if n != "1":
        monkeypatch.setattr(par, "convert_sacct_json", _no_fallback)
    got = par.convert_path(path, "x.json")
    monkeypatch.undo()
    assert got == sacct_json.convert_sacct_json(data, "x.json")
    assert [i for i, _ in got.unreadable] == [1100]
