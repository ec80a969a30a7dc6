"""What every test shares: the environment the suite runs in, plans written from the demo
plan, and the markers set from the fixtures a test uses. The services (Slurm, Prefect, CRIU)
are in tests/integration/conftest.py; the code that runs them in tests/support."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from hypothesis import settings

from tests.support.common import REPO, demo_plan_dict

# Hypothesis's per-example deadline (200 ms) measures the machine's load, not the code: two
# unit tests at a time on a 2-core box went past it.
settings.register_profile("ckpt-poc", deadline=None)
settings.load_profile("ckpt-poc")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")


os.environ.setdefault("CKPT_POC_PSEUDONYM_KEY", "test-key-0123456789abcdef-not-a-secret")


def _writer_recorders(under: Path) -> set[int]:
    """The writer recorders (tasks/exit/writers/recorder.py) whose spec is under ``under``:
    this session's, not those of another suite or PoC on the machine."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                if b"tasks.exit.writers.recorder" in argv and any(
                    a.startswith(bytes(under)) for a in argv
                ):
                    found.add(int(entry))
    return found


@pytest.fixture(autouse=True)
def _no_writer_recorder_outlives_its_test(tmp_path_factory) -> Iterator[None]:
    """A test that takes a before_install snapshot and no after_uninstall one leaves its
    recorder running (as a PoC stopped halfway does, until its way out): ended here, so the
    suite does not pay for a fanotify reader per such test."""
    mine = tmp_path_factory.getbasetemp()
    before = _writer_recorders(mine)
    yield
    for pid in _writer_recorders(mine) - before:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 15)


@pytest.fixture
def write_plan(tmp_path: Path):
    """Write a plan (the demo plan with overrides) into tmp_path; data_dir points there too."""

    def _write(overrides: dict | None = None, name: str = "plan.yaml") -> Path:
        plan = demo_plan_dict()
        plan["data_dir"] = str(tmp_path / "data")
        for dotted, value in (overrides or {}).items():
            node = plan
            *parents, last = dotted.split(".")
            for p in parents:
                node = node[p]
            if value is _DELETE:
                del node[last]
            else:
                node[last] = value
        path = tmp_path / name
        path.write_text(yaml.safe_dump(plan, sort_keys=False))
        return path

    return _write


class _Delete:
    pass


_DELETE = _Delete()


@pytest.fixture
def delete_marker():
    return _DELETE


# Markers from the fixtures a test asks for: `-m "not slurm"` and the like select by what a
# test starts, whichever folder it is in.
MARKER_OF_FIXTURE = {
    "slurm_session": "slurm",
    "pristine_slurm_env": "slurm",
    "prefect_stack": "prefect_server",
    "prefect_harness": "prefect_server",
    "criu_binary": "criu",
}
UNIT_DIR = Path(__file__).resolve().parent / "unit"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test by its folder and the services it uses; a unit test that asks for a
    service is refused (tests/unit holds what runs without one). Tests that need the
    session's Slurm before any job ran on it go first."""
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        in_unit = UNIT_DIR in Path(str(item.path)).resolve().parents
        item.add_marker("unit" if in_unit else "integration")
        services = sorted({MARKER_OF_FIXTURE[f] for f in used & MARKER_OF_FIXTURE.keys()})
        for marker in services:
            item.add_marker(marker)
        if in_unit and services:
            raise pytest.UsageError(
                f"{item.nodeid} is in tests/unit but uses {', '.join(services)}: "
                "move it to tests/integration"
            )
    first = [i for i in items if "pristine_slurm_env" in getattr(i, "fixturenames", ())]
    if first:
        items[:] = first + [i for i in items if i not in first]


# Set by scripts/test when it runs two pytest processes side by side (tests/integration's
# services and the rest): the folder of the lock files they share. Taken out of the
# environment here, so that a test session a test starts (the watchdog's) holds no lock: it
# would wait behind an `alone` test of the other process, which waits for its own test.
SIDE_BY_SIDE_LOCKS = os.environ.pop("CKPT_POC_TEST_LOCKS", None)


@pytest.fixture(autouse=True)
def _alone_or_beside(request: pytest.FixtureRequest) -> Iterator[None]:
    """When two test runs go side by side, a test marked ``alone`` runs with no test of the
    other beside it. A readers-writer lock on a file the runs share: each test holds it
    shared, an ``alone`` test exclusively, and takes the turnstile first so that the other
    run's next test waits behind it rather than starving it."""
    folder = SIDE_BY_SIDE_LOCKS
    if not folder:
        yield
        return
    alone = request.node.get_closest_marker("alone") is not None
    with (
        open(Path(folder) / "turnstile", "a") as turnstile,
        open(Path(folder) / "lock", "a") as lock,
    ):
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if not alone:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)


@pytest.fixture
def sample_psv(tmp_path: Path) -> Path:
    src = REPO / "data" / "samples" / "sacct-sample.psv"
    dst = tmp_path / "sample.psv"
    shutil.copy(src, dst)
    return dst
