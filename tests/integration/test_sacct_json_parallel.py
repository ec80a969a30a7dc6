"""sacct_json_parallel: a document converted by several processes is the one-process conversion,
byte for byte; a region that does not prove out, a worker that dies or stalls, a file that
changed: converted again in one process, never a hang."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from tasks.baseline import sacct_json
from tasks.baseline import sacct_json_parallel as par
from tests.unit.test_sacct_json_parallel import _jobs, _parallel, _text


@pytest.mark.parametrize("layout", ["compact", "pretty", "a job a line"])
@pytest.mark.parametrize("n", [2, 3])
def test_several_processes_give_the_one_process_conversion(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, layout: str, n: int
) -> None:
    jobs = _jobs(1500)
    # Unreadable jobs in the first region, in a worker's (late in the list), and the last job.
    for i in (3, 1100, 1499):
        jobs[i]["time"] = "soon"
    data = _text(jobs, layout)
    expected = sacct_json.convert_sacct_json(data, "x.json")
    got = _parallel(monkeypatch, tmp_path, data, n)
    assert got.psv == expected.psv
    assert got == expected
    assert [i for i, _ in got.unreadable] == [3, 1100, 1499]
    assert b"unreadable-json-jobs[1100].time|" in got.psv
    assert got.data_parser == "v0.0.44"  # meta comes after the list: read by the last worker


@pytest.mark.parametrize(
    "code",
    [
        "import os, signal; os.kill(os.getpid(), signal.SIGKILL)",
        # the real worker, killed as it runs
        "import os, signal, threading; "
        "threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGKILL)).start(); "
        + par._WORKER_CODE,
        "import sys; sys.exit(3)",
        "import sys; sys.stdout.buffer.write(b'garbage'); sys.stdout.flush()",
        "import sys; sys.stdout.buffer.write(b'\\xff' * 64); sys.stdout.flush()",
    ],
    ids=["killed at once", "killed while working", "exits", "half an answer", "garbage"],
)
def test_a_worker_that_dies_leaves_the_document_to_one_process(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    code: str,
) -> None:
    data = _text(_jobs(1500))
    monkeypatch.setattr(par, "_WORKER_CODE", code)
    t = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=par.__name__):
        got = _parallel(monkeypatch, tmp_path, data, 2, fallback=True)
    assert got == sacct_json.convert_sacct_json(data, "x.json")
    assert time.monotonic() - t < 30
