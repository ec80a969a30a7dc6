"""The compatibility stage on the real CRIU: the two shipped examples, a workload known to
fail plainly (an established loopback TCP connection, dumped without the TCP options) and
the same with the options from the plan, and bad input, in one sweep of 3 cycles each
(~40 s here); then `ckpt-poc sweep --json` once (~15 s, on the session's Prefect server).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tasks.data.datasets import COMPATIBILITY
from tasks.data.plan import load_plan
from tasks.data.runctx import open_run
from tasks.data.store import read_dataset
from tasks.experiments.compatibility import run_compatibility
from tasks.experiments.compatibility_fidelity import compare_files
from tasks.experiments.compatibility_result import SWEEP_KEYS, compatibility_result
from tasks.experiments.compatibility_rows import write_and_gate_compatibility, write_matrix
from tests.support.common import demo_plan_dict

pytestmark = pytest.mark.criu

TRAIN: dict[str, Any] = {
    "name": "digits-train",
    "command": [
        "python",
        "-m",
        "examples.train_digits",
        "--steps",
        "150",
        "--step-sleep",
        "0.02",
        "--checkpoint-every",
        "25",
        "--checkpoint-dir",
        "{copy_dir}",
    ],
    "gpus": 0,
    "progress_probe": {"log_regex": r"^step=(\d+) "},
    "app_checkpoint": {"every_steps": 25, "path": "{copy_dir}/ckpt.npz"},
    "fidelity": {
        "files": [
            {"path": "{log}"},  # every line, byte for byte
            {"path": "{log}", "numbers": {"regex": r"^eval accuracy=(?P<accuracy>\S+)$"}},
        ]
    },
}
SERVE: dict[str, Any] = {
    "name": "digits-serve",
    "command": ["python", "-m", "examples.serve_digits", "--port", "{port}", "--init-steps", "50"],
    "gpus": 0,
    "ready_probe": {"url": "http://127.0.0.1:{port}/ready"},
    "fidelity": {
        "query": [
            "python",
            "-c",
            "import sys, urllib.request as u; print(u.urlopen(sys.argv[1]).read().decode())",
            "http://127.0.0.1:{port}/predict?i=7",
        ],
    },
}
# One process holding both ends of an established loopback TCP connection, talking over it
# every step: what CRIU refuses to dump without --tcp-established (range.md).
TCP_HOLDER = """
import socket, sys, time
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
a = socket.create_connection(srv.getsockname()); b, _ = srv.accept(); srv.close()
for step in range(1, int(sys.argv[1]) + 1):
    a.sendall(b"x"); assert b.recv(1) == b"x"
    print(f"step={step}", flush=True); time.sleep(0.01)
print("done", flush=True)
"""
TCP: dict[str, Any] = {
    "name": "tcp-plain",
    # 600 steps, ~6 s: three failed dumps (~1 s each) still fall inside the run.
    "command": ["python", "-c", TCP_HOLDER, "600"],
    "gpus": 0,
    "progress_probe": {"log_regex": r"^step=(\d+)$"},
    "fidelity": {"files": [{"path": "{log}"}]},
}
TCP_OPTIONS = {
    **TCP,
    "name": "tcp-options",
    "command": ["python", "-c", TCP_HOLDER, "300"],
    "criu": {
        "dump": ["--tcp-established", "--network-lock", "nftables"],
        "restore": ["--tcp-established"],
    },
}
NEVER_WRITTEN = {
    **copy.deepcopy(TRAIN),
    "name": "bad-fidelity",
    "fidelity": {"files": [{"path": "{copy_dir}/never.txt"}]},
}
NEVER_WRITTEN["command"][4] = "20"  # --steps 20
EARLY_EXIT = {
    "name": "early-exit",
    # Alive long enough to be seen started, gone before any cycle can dump it.
    "command": ["python", "-c", "import time; print('step=1', flush=True); time.sleep(0.2)"],
    "gpus": 0,
    "progress_probe": {"log_regex": r"^step=(\d+)$"},
}


def _plan(tmp_path: Path, workloads: list[dict[str, Any]], cycles: int = 3) -> Path:
    data = demo_plan_dict()
    data.pop("workload")
    data.update(
        workloads=workloads,
        compatibility={"cycles": cycles, "timeout_s": 90},
        data_dir=str(tmp_path / "data"),
    )
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_a_sweep_over_the_examples_a_tcp_holder_and_bad_input(tmp_path: Path, criu_binary) -> None:
    workloads = [TRAIN, SERVE, TCP, TCP_OPTIONS, NEVER_WRITTEN, EARLY_EXIT]
    path = _plan(tmp_path, workloads)
    plan = load_plan(path)
    with open_run(plan, path, "compatibility") as ctx:
        run = run_compatibility(plan, ctx)
        files = write_and_gate_compatibility(run, ctx)
    result = compatibility_result(run, ctx, files)
    matrix = write_matrix(result)
    by = {w.name: w for w in result.workloads}
    print(json.dumps(result.sweep_json(), indent=1))  # the figures, in the test's output

    train = by["digits-train"]
    assert (train.cycles, train.restored, train.fidelity) == (3, 3, "same"), train
    assert [r["moment"] for r in train.cycle_rows] == ["app-checkpoint", "io", "periodic"]
    assert train.cycle_rows[0]["caught"] is not None and train.cycle_rows[1]["caught"]
    # Resumed from the frozen step on (the same step when frozen between a line's text and
    # its newline: the line completes after the restore), before the end.
    for r in train.cycle_rows:
        assert r["step"] <= r["resumed_step"] <= 150, r
    assert train.freeze_s_median > 0 and train.image_bytes_median > 1e6
    frame = read_dataset(COMPATIBILITY, data_dir=plan.data_dir, poc=plan.poc, run_id=ctx.run_id)
    dumped = frame[(frame["row"] == "cycle") & (frame["dump"] == "ok")]
    assert dumped[["dump_memdump_s", "dump_pages_written"]].notna().all().all()
    restored = dumped[dumped["restore"] == "ok"]
    assert (restored["restore_fork_s"] <= restored["restore_s"]).all()
    assert train.ci is not None and train.ci[1] == 1.0

    serve = by["digits-serve"]
    assert (serve.cycles, serve.restored, serve.fidelity) == (3, 3, "same"), serve
    assert all(r["query"] == "same" for r in serve.cycle_rows)

    plain = by["tcp-plain"]  # the result, never a crash: CRIU's own line, the option it wants
    assert (plain.cycles, plain.restored, plain.success_rate) == (3, 0, 0.0), plain
    assert all(r["dump"] == "failed" and r["restore"] == "not tried" for r in plain.cycle_rows)
    (cause,) = plain.causes
    assert "Connected TCP socket" in cause.cause and "--tcp-established" in cause.cause
    assert cause.criu_log and Path(cause.criu_log).is_file()
    assert all(r["wants_option"] == "--tcp-established" for r in plain.cycle_rows)
    assert plain.ci is not None and plain.ci[0] == 0.0
    assert plain.fidelity == "not checked" and "was restored" in plain.fidelity_detail

    options = by["tcp-options"]  # the plan's options: it restores, and talks on
    assert (options.cycles, options.restored, options.fidelity) == (3, 3, "same"), options

    bad = by["bad-fidelity"]
    assert bad.error == (
        "workloads.4.fidelity.files.0.path: the reference run never wrote {copy_dir}/never.txt"
    )
    assert bad.cycles == 0 and bad.sweep_json()["failures"][0]["cause"] == bad.error
    early = by["early-exit"]
    assert early.error is not None and early.error.startswith(
        "workloads.5.command: the workload exited before its first checkpoint"
    )

    rows = read_dataset(COMPATIBILITY, data_dir=plan.data_dir, poc=plan.poc)
    assert set(rows["workload"]) == {w["name"] for w in workloads}
    assert (rows["row"] == "cycle").sum() == 12
    assert "| digits-train | 3/3 | 3/3 |" in matrix.read_text()

    # An altered reference file is detected: the same check, the reference log edited.
    sweep_dir = Path(result.run_dir)
    ref_log = next(sweep_dir.glob("*-unmanaged-digits-train-ref.log"))
    managed_log = next(sweep_dir.glob("*-managed-digits-train-m1.log"))
    ref_log.write_text(ref_log.read_text().replace("step=100 loss=", "step=100 loss=9"))
    verdict, _ = compare_files(
        load_plan(path).workloads[0].fidelity,
        _files(sweep_dir / "compat-digits-train" / "reference", ref_log),
        _files(sweep_dir / "compat-digits-train" / "managed-1", managed_log),
    )
    assert verdict == "differs"


def _files(copy_dir: Path, log: Path):
    from tasks.experiments.compatibility_fidelity import CopyFiles

    return CopyFiles(copy_dir, log)


@pytest.mark.prefect_server
def test_sweep_json_prints_exactly_the_issue_s_shape(tmp_path: Path, criu_binary, cli) -> None:
    short = {**copy.deepcopy(TRAIN)}
    short["command"][4] = "60"
    done = cli("sweep", str(_plan(tmp_path, [short], cycles=2)), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert list(out) == ["workloads"]
    (w,) = out["workloads"]
    assert tuple(w) == SWEEP_KEYS
    assert (w["name"], w["cycles"], w["restored"], w["fidelity"]) == ("digits-train", 2, 2, "same")
    assert len(w["ci"]) == 2 and w["failures"] == []
