"""Ready probes as Kubernetes offers them (url, tcp, exec) and a log line: each says ready when
its server is, and its last answer when it never is; the plan's cold_start.workload picks the
server cold start times; and cold start times a real server that speaks no HTTP (Redis, by
a TCP connect and by its own log line) through real CRIU."""

from __future__ import annotations

import http.server
import socket
import threading
from pathlib import Path

import pytest
import yaml

from tasks.data.errors import PlanError
from tasks.data.plan import ReadyProbe, load_plan
from tasks.engine.ready import poll_ready
from tests.support.common import demo_plan_dict


def test_a_url_probe_says_ready_on_200_and_its_last_status_before() -> None:
    ready = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if ready.is_set() else 503)
            self.end_headers()

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        probe = ReadyProbe(url=f"http://127.0.0.1:{server.server_port}/ready")
        answer = poll_ready(probe, timeout=0.3)
        assert (answer.ready, answer.last) == (False, "HTTP 503")
        ready.set()
        assert poll_ready(probe, timeout=5).ready
    finally:
        server.shutdown()


def test_a_tcp_probe_says_ready_once_the_port_accepts() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        answer = poll_ready(ReadyProbe(tcp=str(port)), timeout=0.2)  # bound, not listening
        assert not answer.ready and f"127.0.0.1:{port}" in answer.last
        assert "refused" in answer.last.lower()
        s.listen()
        answer = poll_ready(ReadyProbe(tcp=f"127.0.0.1:{port}"), timeout=5)
        assert answer.ready and answer.last == f"connected to 127.0.0.1:{port}"


def test_an_exec_probe_says_ready_on_exit_0_and_its_exit_and_output_before(tmp_path) -> None:
    flag = tmp_path / "up"
    argv = [
        "python",
        "-c",
        f"import os, sys; print('not yet'); sys.exit(0 if os.path.exists({str(flag)!r}) else 3)",
    ]
    answer = poll_ready(ReadyProbe(exec=argv), timeout=0.5)
    assert (answer.ready, answer.last) == (False, "exit 3: not yet")
    flag.touch()
    assert poll_ready(ReadyProbe(exec=argv), timeout=10).ready
    missing = poll_ready(ReadyProbe(exec=["no-such-command-here"]), timeout=0.1)
    assert missing.last.startswith("cannot run no-such-command-here")


def test_a_log_probe_reads_complete_lines_past_the_offset(tmp_path) -> None:
    log = tmp_path / "workload.log"
    log.write_text("Ready to accept connections\n")
    probe = ReadyProbe(log="Ready to accept")
    earlier = log.stat().st_size  # an earlier copy's line does not count
    answer = poll_ready(probe, timeout=0.1, log=log, after_offset=earlier)
    assert not answer.ready and "no line matching" in answer.last
    with log.open("a") as fh:
        fh.write("Ready to accept")  # not a whole line yet
    assert not poll_ready(probe, timeout=0.1, log=log, after_offset=earlier).ready
    with log.open("a") as fh:
        fh.write(" connections tcp\n")
    assert poll_ready(probe, timeout=1, log=log, after_offset=earlier).ready


def test_a_probe_that_outlives_its_copy_says_so() -> None:
    answer = poll_ready(ReadyProbe(tcp="1"), timeout=5, alive=lambda: False)
    assert not answer.ready and answer.last.endswith("(the copy had exited)")


def _plan_file(tmp_path: Path, data: dict) -> Path:
    data["data_dir"] = str(tmp_path / "data")
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("probe", "said"),
    [
        (
            {"tcp": "host:port"},
            "workloads.1.ready_probe.tcp: tcp: 'host:port' is not HOST:PORT",
        ),
        (
            {"url": "http://x/", "log": "up"},
            "workloads.1.ready_probe: give exactly one of url, tcp, exec, log",
        ),
        (
            {"exec": "redis-cli ping"},
            "workloads.1.ready_probe.exec: exec must be an argv list",
        ),
        ({"log": "(unclosed"}, "workloads.1.ready_probe.log: log does not compile"),
        ({"tcp": "70000"}, "is not HOST:PORT"),
    ],
)
def test_a_bad_ready_probe_is_refused_naming_its_field(tmp_path, probe, said) -> None:
    data = demo_plan_dict()
    data["workloads"][1]["ready_probe"] = probe
    with pytest.raises(PlanError) as err:
        load_plan(_plan_file(tmp_path, data), check_cluster=False)
    assert said in str(err.value)


def test_cold_start_times_the_first_server_unless_the_plan_names_one(tmp_path) -> None:
    data = demo_plan_dict()
    plan = load_plan(_plan_file(tmp_path, data), check_cluster=False)
    assert plan.cold_start_workload.name == "digits-serve"  # the first with a ready probe
    assert not any("cold_start" in w for w in plan.check_warnings)

    data["cold_start"] = {"workload": "redis"}
    assert (
        load_plan(_plan_file(tmp_path, data), check_cluster=False).cold_start_workload.name
        == "redis"
    )

    data["cold_start"] = {"workload": "nginx"}
    with pytest.raises(
        PlanError,
        match=r"cold_start.workload: 'nginx' is none of the plan's workloads "
        r"\(digits-train, digits-serve, redis\)",
    ):
        load_plan(_plan_file(tmp_path, data), check_cluster=False)

    data["cold_start"] = {"workload": "digits-train"}  # no ready probe: timed, and told so
    plan = load_plan(_plan_file(tmp_path, data), check_cluster=False)
    (warning,) = [w for w in plan.check_warnings if "cold_start" in w]
    assert "digits-train has no ready_probe" in warning and "first progress line" in warning


def _redis_cold_start_plan(tmp_path: Path, ready_probe: dict) -> Path:
    data = demo_plan_dict()
    redis = next(w for w in data["workloads"] if w["name"] == "redis")
    redis["ready_probe"] = ready_probe
    data["cold_start"] = {"workload": "redis", "repeats": 3}
    return _plan_file(tmp_path, data)


def test_weights_the_node_cannot_hold_are_refused_naming_the_prepare_item(tmp_path) -> None:
    from tasks.data.plan_sizes import size_problems, weights_mb

    data = demo_plan_dict()
    serve = data["workloads"][1]
    serve["prepare"][0][serve["prepare"][0].index("--mb") + 1] = "100000000"  # ~95 TiB
    with pytest.raises(PlanError) as err:
        load_plan(_plan_file(tmp_path, data), check_cluster=False)
    said = str(err.value)
    assert (
        "workloads.1.prepare.0: --mb 1e+08 writes 97656.2 GiB of weights; the disk of data_dir"
        in said
    )
    assert "GiB available (MemAvailable)" in said
    # The figures, given: 64 MiB twice fits 1 GiB; 600 MiB twice does not.
    argv = ["python", "-m", "examples.weights", "w.safetensors", "--mb", "600"]
    assert weights_mb(argv) == 600 and weights_mb(["python", "-m", "other", "--mb", "6"]) is None
    disk = (10 * 1 << 30, tmp_path)
    assert size_problems([("w.0", [*argv[:-1], "64"])], "x", disk=disk, memory=1 << 30) == []
    (problem,) = size_problems([("w.0", argv)], "x", disk=disk, memory=1 << 30)
    assert problem == (
        "w.0: --mb 600: each copy reads 0.6 GiB of weights and the comparisons run 2 at once "
        "(1.2 GiB); the node has 1.0 GiB available (MemAvailable)"
    )


def test_a_relative_images_dir_is_refused(tmp_path) -> None:
    data = demo_plan_dict()
    data["checkpointer"]["images_dir"] = "scratch/images"
    with pytest.raises(
        PlanError, match=r"checkpointer\.images_dir: 'scratch/images' is not an abs"
    ):
        load_plan(_plan_file(tmp_path, data), check_cluster=False)
