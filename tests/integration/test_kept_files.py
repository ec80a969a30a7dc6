"""A program that keeps writing its own output file, dumped with `--leave-running` (what the
managed arm's periodic checkpoints do), then killed and restored with real CRIU.

CRIU refuses to restore once a file the tree held open has grown (`File … has bad size`,
range.md); the checkpoint keeps a copy of such files at the dump and puts it back before the
restore (tasks/engine/checkpointers/open_files.py). The second test takes the copy away and
shows CRIU's own refusal, so the first one cannot pass without it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.data.plan import load_plan
from tasks.data.runctx import make_run_context
from tasks.engine.checkpointers import open_files
from tasks.engine.checkpointers.criu import CriuCheckpointer, CriuError
from tasks.engine.clock import EventRecorder
from tasks.engine.clusters.local.cluster import LocalCluster
from tests.support.common import REPO

pytestmark = pytest.mark.criu

STEPS = 300
# Opened "w" (O_WRONLY, no O_APPEND): CRIU checks its size at restore. Each line depends on
# the one before, so a restore that lost or repeated state shows in the file.
WRITER = f"""
import sys, time
out = open(sys.argv[1], "w")
x = 1
for step in range(1, {STEPS} + 1):
    x = (x * 6364136223846793005 + step) % 2**64
    out.write(f"step={{step}} x={{x}}\\n"); out.flush()
    print(f"step={{step}}", flush=True)
    time.sleep(0.01)
"""


@pytest.fixture
def setup(tmp_path: Path, criu_binary: str):
    plan = load_plan(REPO / "plans" / "demo.yaml").model_copy(
        update={"data_dir": str(tmp_path / "data")}
    )
    recorder = EventRecorder(make_run_context(plan, REPO / "plans" / "demo.yaml"))
    cluster = LocalCluster(nodes=list(plan.cluster.nodes), run_dir=tmp_path / "run", workdir=REPO)
    criu = CriuCheckpointer(tmp_path / "ckpt", 2, recorder, "t1", binary=criu_binary)
    yield cluster, criu, recorder, tmp_path
    left = cluster.stop_all()
    cluster.close()
    criu.close()
    assert left == [], f"processes left running: {left}"


def _reference(tmp: Path) -> str:
    out = tmp / "reference.txt"
    subprocess.run([sys.executable, "-c", WRITER, str(out)], check=True, timeout=60)
    return out.read_text()


def _wait(cond, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def _dump_run_on_kill(cluster: LocalCluster, criu: CriuCheckpointer, out: Path):
    proc = cluster.start("local-a", "managed", [sys.executable, "-c", WRITER, str(out)])
    _wait(lambda: out.exists() and out.stat().st_size > 2000)
    point = criu.dump(proc)  # left running, as a periodic checkpoint is
    at_dump = point.kept_bytes
    _wait(lambda: out.stat().st_size > at_dump + 2000)  # it went on writing
    cluster.kill(proc)
    assert cluster.wait_gone(proc)
    return proc, point


def test_a_file_that_grew_after_a_leave_running_dump_is_put_back_and_the_run_ends_the_same(
    setup,
) -> None:
    cluster, criu, recorder, tmp = setup
    want = _reference(tmp)
    out = tmp / "out.txt"
    _, point = _dump_run_on_kill(cluster, criu, out)
    manifest = open_files.read_manifest(point.path)
    assert manifest is not None
    assert [f["path"] for f in manifest["files"]] == [str(out)], manifest
    assert point.kept_bytes == manifest["bytes"] > 2000

    restored = criu.restore(cluster, "local-a", point)
    assert cluster.wait_gone(restored, timeout=60)
    assert out.read_text() == want  # resumed from the dump's state, file and memory alike
    put_back = recorder.events(event="files_put_back")[-1].detail
    assert put_back["files"] == 1 and put_back["bytes"] == point.kept_bytes


def test_without_the_kept_copy_criu_refuses_the_grown_file(setup) -> None:
    cluster, criu, _, tmp = setup
    out = tmp / "out.txt"
    _, point = _dump_run_on_kill(cluster, criu, out)
    (point.path / open_files.KEPT / open_files.MANIFEST).unlink()
    with pytest.raises(CriuError) as failed:
        criu.restore(cluster, "local-a", point)
    assert "bad size" in (failed.value.cause or ""), failed.value


def test_a_dump_that_ends_the_workload_keeps_no_files(setup) -> None:
    cluster, criu, _, tmp = setup
    out = tmp / "out.txt"
    proc = cluster.start("local-a", "managed", [sys.executable, "-c", WRITER, str(out)])
    _wait(lambda: out.exists() and out.stat().st_size > 2000)
    point = criu.dump(proc, leave_running=False)  # nothing grows after it: nothing to keep
    assert point.kept_bytes == 0 and open_files.read_manifest(point.path) is None
    assert cluster.wait_gone(proc)
