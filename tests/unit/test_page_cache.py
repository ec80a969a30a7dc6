"""The page cache before a timed start: dropped (globally, or the files the start reads),
warm when the plan asks, not_allowed when no drop can be made; and the plan's conditions."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pandas as pd
import pytest

from tasks.data.errors import PlanError
from tasks.data.page_cache import judged
from tasks.data.plan import load_plan
from tasks.engine import page_cache
from tasks.engine.page_cache import advise_dontneed, interpreter_files, prepare_cache


def _resident_pages(path: Path) -> int:
    """Pages of ``path`` in the page cache, by mincore over a mapping of it."""
    import ctypes
    import mmap

    size = path.stat().st_size
    # A private mapping, never written: its pages are the file's pages in the cache.
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, mmap.MAP_PRIVATE, prot) as m:
        libc = ctypes.CDLL(None, use_errno=True)
        pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = (ctypes.c_ubyte * pages)()
        start = ctypes.c_char.from_buffer(m)
        addr = ctypes.c_void_p(ctypes.addressof(start))
        done = libc.mincore(addr, ctypes.c_size_t(size), vec)
        del start  # the mapping may close only once no buffer points into it
        assert done == 0, os.strerror(ctypes.get_errno())
        return sum(v & 1 for v in vec)


def test_warm_leaves_the_cache_and_says_so() -> None:
    cache = prepare_cache("warm", [])
    assert (cache.state, cache.drop) == ("warm", None)


def test_the_interpreter_files_hold_its_binary_and_extension_libraries() -> None:
    files = interpreter_files()
    assert files and all(f.is_file() for f in files)
    assert any(f.suffix == ".so" and "numpy" in str(f) for f in files)


def test_nothing_to_advise_is_not_allowed(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(page_cache, "DROP_CACHES", tmp_path)
    monkeypatch.setattr(page_cache, "interpreter_files", lambda: [])
    assert advise_dontneed([tmp_path / "absent"]) == 0
    cache = prepare_cache("dropped", [tmp_path / "absent"])
    assert (cache.state, cache.drop) == ("not_allowed", None)


def test_a_verdict_is_judged_on_the_dropped_rows_never_the_warm_ones() -> None:
    rows = pd.DataFrame({"page_cache": ["dropped", "warm", "not_allowed", "dropped"]})
    assert judged(rows).index.tolist() == [0, 2, 3]


@pytest.mark.parametrize(
    ("conditions", "said"),
    [
        (["warm"], "must include 'dropped'"),
        (["dropped", "dropped"], "names a condition twice"),
        (["dropped", "hot"], "cold_start.page_cache.1: Input should be 'dropped' or 'warm'"),
    ],
)
def test_the_plans_conditions_are_checked_naming_the_field(
    write_plan, conditions: list[str], said: str
) -> None:
    path = write_plan({"cold_start": {"page_cache": conditions}})
    with pytest.raises(PlanError) as info:
        load_plan(path, check_cluster=False)
    problems = "\n".join(info.value.problems)
    assert "cold_start.page_cache" in problems and said in problems


def test_a_plan_without_cold_start_times_the_dropped_cache(write_plan) -> None:
    plan = load_plan(write_plan(), check_cluster=False)
    assert plan.cold_start.page_cache == ["dropped"]
    both = load_plan(write_plan({"cold_start": {"page_cache": ["dropped", "warm"]}}),
                     check_cluster=False)  # fmt: skip
    assert both.cold_start.page_cache == ["dropped", "warm"]


def test_cold_start_needs_a_ready_probe_or_a_progress_line(write_plan) -> None:
    from tasks.data.errors import CkptPocError
    from tasks.experiments.cold_start import ensure_cold_start_supports
    from tasks.experiments.timed_runs import NO_PROGRESS, progress_regex

    plan = load_plan(write_plan(), check_cluster=False)
    ensure_cold_start_supports(plan)  # a training job: its first progress line
    serve = plan.workloads[1]  # the server: its ready probe alone
    server = plan.model_copy(update={"workload": serve, "workloads": [serve]})
    ensure_cold_start_supports(server)
    assert progress_regex(server) == NO_PROGRESS
    assert not re.compile(NO_PROGRESS, re.M).findall("ready\n\n12\nstep=3 loss=1\n")
    silent = serve.model_copy(update={"ready_probe": None})
    neither = plan.model_copy(update={"workload": silent, "workloads": [silent]})
    with pytest.raises(CkptPocError, match=r"ready_probe or progress_probe\.log_regex"):
        ensure_cold_start_supports(neither)
