"""Contract tests of the exact commands and manifests; Cedana cannot run here.

Cedana's binaries and Slurm plugins are a licensed download and its Slurm builds target
23.11+, so these tests pin what tasks/engine/checkpointers/cedana.py would run (argv lists, Helm
stdin, Pod manifests, REST requests) against ../shared/notes/cedana.md, not Cedana itself.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import http.server
import json
import logging
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import SecretStr

from tasks.data.errors import BlastRadiusError, SecretError
from tasks.data.plan import SNAPSHOT_KINDS, Plan, load_plan
from tasks.engine.checkpointers import cedana, cedana_leftovers

REPO = Path(__file__).resolve().parents[2]
TOKEN = "tok-3f9c2a7e-not-a-real-secret"
CONFIG = cedana.CedanaConfig(url="https://cedana.example.org", cluster_id="poc-cluster-1")
SLURM_NODES = ("gpu-test-01", "gpu-test-02")
K8S_NODES = ("gpu-node-a", "gpu-node-b")


@pytest.fixture(scope="module")
def slurm_plan() -> Plan:
    return load_plan(REPO / "plans" / "slurm-example.yaml", check_cluster=False)


@pytest.fixture(scope="module")
def k8s_plan() -> Plan:
    return load_plan(REPO / "plans" / "k8s-example.yaml", check_cluster=False)


@pytest.fixture
def token() -> SecretStr:
    secret, where = cedana.load_auth_token(environ={cedana.TOKEN_ENV: TOKEN})
    assert where == "environment variable CEDANA_AUTH_TOKEN"
    return secret


def _with_gpus(plan: Plan, gpus: int) -> Plan:
    return plan.model_copy(update={"workload": plan.workload.model_copy(update={"gpus": gpus})})


def test_example_plans_validate_with_cedana(slurm_plan: Plan, k8s_plan: Plan) -> None:
    assert (slurm_plan.checkpointer.kind, slurm_plan.cluster.kind) == ("cedana", "slurm")
    assert (k8s_plan.checkpointer.kind, k8s_plan.cluster.kind) == ("cedana", "kubernetes")
    assert tuple(slurm_plan.cluster.nodes) == SLURM_NODES
    assert tuple(k8s_plan.cluster.nodes) == K8S_NODES


# --- Slurm -----------------------------------------------------------------------------------


def _srun(node: str, *command: str) -> tuple[str, ...]:
    return ("srun", "-w", node, "-p", "poc", "-N1", "-n1", *command)


def test_slurm_install_exact_argv_two_gpu_nodes(slurm_plan: Plan) -> None:
    steps = cedana.slurm_install_steps(slurm_plan, CONFIG)
    expected = []
    for node in SLURM_NODES:
        expected += [
            (node, _srun(node, "cedana", "plugin", "install", "slurm")),
            (node, _srun(node, "cedana", "plugin", "install", "gpu")),  # workload.gpus == 4
            (node, _srun(node, "cedana", "slurm", "setup", "--node-role", "worker")),
            (node, _srun(node, "cedana", "daemon", "check", "--full")),
        ]
    assert [(s.node, s.argv) for s in steps] == expected
    # No controller step unless the config names one; no step carries anything on stdin.
    assert not any("controller" in s.argv for s in steps)
    assert all(s.stdin is None for s in steps)


def test_slurm_install_without_gpus_has_no_gpu_plugin(slurm_plan: Plan) -> None:
    steps = cedana.slurm_install_steps(_with_gpus(slurm_plan, 0), CONFIG, nodes=["gpu-test-02"])
    assert [s.argv for s in steps] == [
        _srun("gpu-test-02", "cedana", "plugin", "install", "slurm"),
        _srun("gpu-test-02", "cedana", "slurm", "setup", "--node-role", "worker"),
        _srun("gpu-test-02", "cedana", "daemon", "check", "--full"),
    ]


def test_slurm_controller_step_only_on_the_named_plan_node(slurm_plan: Plan) -> None:
    config = dataclasses.replace(CONFIG, controller_node="gpu-test-02")
    steps = cedana.slurm_install_steps(slurm_plan, config)
    controller = [s for s in steps if "controller" in s.argv]
    assert [(s.node, s.argv) for s in controller] == [
        (
            "gpu-test-02",
            _srun("gpu-test-02", "cedana", "slurm", "setup", "--node-role", "controller"),
        )
    ]
    # A controller the plan does not name (the usual slurmctld host) is refused, not touched.
    with pytest.raises(BlastRadiusError, match="slurmctld-01"):
        cedana.slurm_install_steps(
            slurm_plan, dataclasses.replace(CONFIG, controller_node="slurmctld-01")
        )


def test_slurm_uninstall_exact_argv(slurm_plan: Plan) -> None:
    steps = cedana.slurm_uninstall_steps(slurm_plan)
    assert [(s.node, s.argv) for s in steps] == [
        (node, _srun(node, "cedana", "slurm", "destroy")) for node in SLURM_NODES
    ]


def test_every_slurm_step_is_pinned_to_its_plan_node(slurm_plan: Plan) -> None:
    config = dataclasses.replace(CONFIG, controller_node="gpu-test-01")
    steps = cedana.slurm_install_steps(slurm_plan, config) + cedana.slurm_uninstall_steps(
        slurm_plan
    )
    for step in steps:
        assert isinstance(step.argv, tuple) and all(isinstance(a, str) for a in step.argv)
        assert step.node in SLURM_NODES
        assert step.argv[:7] == ("srun", "-w", step.node, "-p", "poc", "-N1", "-n1")


def test_sbatch_opt_in_on_the_managed_arm_only(slurm_plan: Plan) -> None:
    script = ["/shared/poc/llm-finetune.sbatch"]
    managed = cedana.sbatch_argv(
        slurm_plan, arm="managed", node="gpu-test-01", job_name="m", script_argv=script
    )
    unmanaged = cedana.sbatch_argv(
        slurm_plan, arm="unmanaged", node="gpu-test-01", job_name="u", script_argv=script
    )
    assert managed == [
        "sbatch",
        "--parsable",
        "--job-name=m",
        "--partition=poc",
        "--nodelist=gpu-test-01",
        "--nodes=1",
        "--no-requeue",
        "--gres=gpu:4",
        "--export=ALL,CEDANA_ENABLE=1",
        "/shared/poc/llm-finetune.sbatch",
    ]
    # The option comes before the script: after it, sbatch would pass it to the script.
    assert managed.index("--export=ALL,CEDANA_ENABLE=1") < managed.index(script[0])
    assert not any("CEDANA" in a for a in unmanaged)
    assert unmanaged == [
        a if a != "--job-name=m" else "--job-name=u" for a in managed if "CEDANA" not in a
    ]
    assert cedana.sbatch_opt_in_args("managed") == ["--export=ALL,CEDANA_ENABLE=1"]
    assert cedana.sbatch_opt_in_args("unmanaged") == []
    with pytest.raises(cedana.CedanaError):
        cedana.sbatch_opt_in_args("both")


def test_unmanaged_arm_cannot_inherit_or_script_an_opt_in() -> None:
    env = {"PATH": "/usr/bin", "CEDANA_ENABLE": "1"}
    assert cedana.unmanaged_environ(env) == {"PATH": "/usr/bin"}
    assert env["CEDANA_ENABLE"] == "1"  # the caller's mapping is left alone
    cedana.ensure_script_does_not_opt_in("#!/bin/bash\n#SBATCH --gres=gpu:4\npython train.py\n")
    with pytest.raises(cedana.CedanaError, match="opts itself in"):
        cedana.ensure_script_does_not_opt_in("#!/bin/bash\n#SBATCH --export=CEDANA_ENABLE=1\n")


# --- REST: checkpoint, restore, list; the token ---------------------------------------------


def test_rest_requests_exact(slurm_plan: Plan, token: SecretStr) -> None:
    ckpt = cedana.checkpoint_request(slurm_plan, CONFIG, token, job_id="101", node="gpu-test-01")
    assert (ckpt.method, ckpt.url, ckpt.json) == (
        "POST",
        "https://cedana.example.org/v2/slurm/checkpoint/job",
        {"job_id": "101", "cluster_id": "poc-cluster-1"},
    )
    assert ckpt.http_headers()["Authorization"] == f"Bearer {TOKEN}"
    restore = cedana.restore_request(
        slurm_plan, CONFIG, token, job_id="101", node="gpu-test-01", checkpoint_id="c-7"
    )
    assert (restore.method, restore.url, restore.json) == (
        "POST",
        "https://cedana.example.org/v2/slurm/restore/job",
        {"job_id": "101", "cluster_id": "poc-cluster-1", "checkpoint_id": "c-7"},
    )
    listing = cedana.list_checkpoints_request(CONFIG, token)
    assert (listing.method, listing.url, listing.json) == (
        "GET",
        "https://cedana.example.org/v2/slurm/checkpoints",
        None,
    )
    with pytest.raises(cedana.CedanaError, match="not a Slurm job id"):
        cedana.checkpoint_request(slurm_plan, CONFIG, token, job_id="101; rm", node="gpu-test-01")


def test_token_never_in_repr_str_events_or_logs(
    slurm_plan: Plan, k8s_plan: Plan, token: SecretStr, caplog: pytest.LogCaptureFixture
) -> None:
    request = cedana.checkpoint_request(slurm_plan, CONFIG, token, job_id="101", node="gpu-test-01")
    steps = cedana.k8s_install_steps(k8s_plan, CONFIG, token)
    log = logging.getLogger("ckpt-poc.cedana-test")
    with caplog.at_level(logging.DEBUG):
        log.info("request %s", request)
        log.info("request %r headers %s", request, request.headers)
        log.info("steps %s", steps)
        log.info("token %s %r", token, token)
        log.info("event %s", json.dumps(request.redacted()))
        log.info("asdict %s", [dataclasses.asdict(s) for s in steps])
    text = caplog.text + repr(request) + str(request) + f"{request}" + repr(steps)
    text += json.dumps(request.redacted()) + repr(dataclasses.asdict(request))
    assert "request CedanaRequest(method='POST'" in caplog.text  # the capture did capture
    assert "Bearer **********" in caplog.text
    assert TOKEN not in text
    for step in steps:
        assert not any(TOKEN in a for a in step.argv)  # argv is visible to every user in ps


def test_the_redaction_test_can_fail(token: SecretStr) -> None:
    # Guard against a vacuous check: the unredacted headers do hold the token.
    request = cedana.list_checkpoints_request(CONFIG, token)
    assert TOKEN in repr(request.http_headers())


def test_token_sources() -> None:
    secret, where = cedana.load_auth_token(environ={cedana.TOKEN_ENV: TOKEN})
    assert secret.get_secret_value() == TOKEN and TOKEN not in where
    with pytest.raises(SecretError, match="CEDANA_AUTH_TOKEN"):
        cedana.load_auth_token(environ={})
    config = cedana.CedanaConfig.from_env(
        {
            "CEDANA_URL": "https://c.example.org/",
            "CEDANA_CLUSTER_ID": "c1",
            "CKPT_POC_CEDANA_TOKEN_BLOCK": "cedana-token",
        }
    )
    assert (config.url, config.cluster_id, config.token_secret_block) == (
        "https://c.example.org",
        "c1",
        "cedana-token",
    )
    with pytest.raises(cedana.CedanaError, match="CEDANA_URL"):
        cedana.CedanaConfig.from_env({"CEDANA_CLUSTER_ID": "c1"})
    with pytest.raises(cedana.CedanaError):
        cedana.CedanaConfig(url="https://a,b.example.org", cluster_id="c1")


@pytest.fixture
def cedana_stub() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A local HTTP server standing in for Cedana's control plane: records each request."""
    seen: list[dict[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            seen.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "auth": self.headers.get("Authorization"),
                    "json": body,
                }
            )
            if self.path.endswith("/restore/job"):
                status, answer = 200, {"job_id": "205", "checkpoint_id": "c-7"}
            elif self.path.endswith("/checkpoints"):
                status, answer = 200, [{"job_id": "101", "checkpoint_id": "c-7"}]
            else:
                status, answer = 500, {"error": "boom"}
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


def test_restore_links_new_job_id_to_old(
    slurm_plan: Plan, token: SecretStr, cedana_stub: tuple[str, list[dict[str, Any]]]
) -> None:
    url, seen = cedana_stub
    config = dataclasses.replace(CONFIG, url=url)
    answer = cedana.send(
        cedana.restore_request(slurm_plan, config, token, job_id="101", node="gpu-test-02")
    )
    link = cedana.link_restored_job("101", answer)
    assert link == cedana.RestoreLink(old_job_id="101", new_job_id="205", checkpoint_id="c-7")
    assert link.event_detail() == {"job_id": "205", "linked_to": "101", "checkpoint_id": "c-7"}
    assert seen == [
        {
            "method": "POST",
            "path": "/v2/slurm/restore/job",
            "auth": f"Bearer {TOKEN}",  # the token does reach Cedana
            "json": {"job_id": "101", "cluster_id": "poc-cluster-1"},
        }
    ]
    assert cedana.send(cedana.list_checkpoints_request(config, token))[0]["job_id"] == "101"
    # A failed call names the route, never the token.
    with pytest.raises(cedana.CedanaError, match="checkpoint/job failed") as failed:
        cedana.send(
            cedana.checkpoint_request(slurm_plan, config, token, job_id="101", node="gpu-test-02")
        )
    assert TOKEN not in str(failed.value) and TOKEN not in repr(failed.value)


@pytest.mark.parametrize(
    ("response", "message"),
    [
        ({"job_id": "101"}, "kept job id 101"),
        ({"status": "ok"}, "names no job id"),
        ({"job_id": "12x"}, "not a Slurm job id"),
    ],
)
def test_restore_link_refuses_a_reused_or_missing_id(response: dict, message: str) -> None:
    with pytest.raises(cedana.CedanaError, match=message):
        cedana.link_restored_job("101", response)
    assert cedana.link_restored_job("101", {"new_job_id": 300}).new_job_id == "300"


# --- Kubernetes ------------------------------------------------------------------------------


HELM_ARGV = (
    "helm",
    "install",
    "cedana",
    "oci://registry-1.docker.io/cedana/cedana-helm",
    "--version",
    "0.7.6",
    "-n",
    "cedana-system",
    "--create-namespace",
    "--set-string",
    "config.url=https://cedana.example.org",
    "--set-string",
    "config.clusterId=poc-cluster-1",
    "--set-string",
    r"daemonHelper.nodeSelector.cedana\.ai/enabled=true",
    "--values",
    "-",
)


def test_k8s_install_exact_argv(k8s_plan: Plan, token: SecretStr) -> None:
    steps = cedana.k8s_install_steps(k8s_plan, CONFIG, token)
    assert [(s.node, s.argv) for s in steps] == [
        ("gpu-node-a", ("kubectl", "label", "nodes", "gpu-node-a", "cedana.ai/enabled=true")),
        ("gpu-node-b", ("kubectl", "label", "nodes", "gpu-node-b", "cedana.ai/enabled=true")),
        (None, HELM_ARGV),
    ]
    # Labels first: the helper DaemonSet must find only the labelled plan nodes.
    assert all(s.stdin is None for s in steps[:2])
    # One argv element holds the escaped key (no shell: no quotes to strip).
    assert HELM_ARGV[14] == "daemonHelper.nodeSelector.cedana" + "\\" + ".ai/enabled=true"


def test_helm_token_goes_on_stdin_as_values(k8s_plan: Plan, token: SecretStr) -> None:
    helm = cedana.k8s_install_steps(k8s_plan, CONFIG, token)[-1]
    assert helm.argv[-2:] == ("--values", "-")
    assert not any("authToken" in a or TOKEN in a for a in helm.argv)
    assert helm.stdin is not None and TOKEN not in repr(helm)
    values = yaml.safe_load(helm.stdin.get_secret_value())
    assert values == {"config": {"authToken": TOKEN}}  # nothing but the token rides on stdin


def test_k8s_uninstall_exact_argv(k8s_plan: Plan) -> None:
    steps = cedana.k8s_uninstall_steps(k8s_plan)
    assert [(s.node, s.argv) for s in steps] == [
        (None, ("helm", "uninstall", "cedana", "-n", "cedana-system")),
        ("gpu-node-a", ("kubectl", "label", "nodes", "gpu-node-a", "cedana.ai/enabled-")),
        ("gpu-node-b", ("kubectl", "label", "nodes", "gpu-node-b", "cedana.ai/enabled-")),
    ]
    # A label that was there before the install is not ours to remove.
    kept = cedana.k8s_uninstall_steps(k8s_plan, labelled_before={"gpu-node-b"})
    assert [s.node for s in kept] == [None, "gpu-node-a"]


@pytest.mark.parametrize("arm", ["managed", "unmanaged"])
@pytest.mark.parametrize("node", K8S_NODES)
def test_pod_manifests_pinned_and_opted_in_by_arm(k8s_plan: Plan, arm: str, node: str) -> None:
    pod = cedana.pod_manifest(
        k8s_plan,
        arm=arm,
        node=node,
        name=f"vllm-serve-{arm}",
        image="vllm/vllm-openai:v0.6.0",
        command=["vllm", "serve", "m"],
    )
    again = yaml.safe_load(yaml.safe_dump(pod))
    assert again == pod
    assert again["apiVersion"] == "v1" and again["kind"] == "Pod"
    assert again["metadata"]["name"] == f"vllm-serve-{arm}"
    assert again["metadata"]["namespace"] == "poc"
    assert again["spec"]["containers"][0]["image"] == "vllm/vllm-openai:v0.6.0"
    assert again["spec"]["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert again["spec"]["nodeSelector"] == {"kubernetes.io/hostname": node}
    assert "nodeName" not in again["spec"]
    labels = again["metadata"]["labels"]
    assert labels["ckpt-poc/arm"] == arm
    if arm == "managed":
        assert again["spec"]["runtimeClassName"] == "cedana"
        assert labels["cedana.ai/node-restore"] == "true"
        assert labels["cedana.ai/heartbeat-checkpoint"] == "120"  # checkpointer.interval_s
    else:
        assert "runtimeClassName" not in again["spec"]
        assert not [k for k in labels if k.startswith("cedana.ai/")]


def test_opt_in_pod_refuses_what_would_blur_the_arms(k8s_plan: Plan) -> None:
    recipe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "vllm-serve"},
        "spec": {"containers": [{"name": "c", "image": "i"}], "runtimeClassName": "cedana"},
    }
    with pytest.raises(cedana.CedanaError, match="opts itself in"):
        cedana.opt_in_pod(recipe, k8s_plan, arm="unmanaged", node="gpu-node-a")
    managed = cedana.opt_in_pod(recipe, k8s_plan, arm="managed", node="gpu-node-a")
    assert managed["spec"]["runtimeClassName"] == "cedana"
    assert "labels" not in recipe["metadata"]  # the recipe itself is not modified
    other_ns = {**recipe, "metadata": {"name": "vllm-serve", "namespace": "default"}}
    with pytest.raises(BlastRadiusError, match="namespace"):
        cedana.opt_in_pod(other_ns, k8s_plan, arm="managed", node="gpu-node-a")
    with pytest.raises(cedana.CedanaError, match="v1 Pod"):
        cedana.opt_in_pod(
            {**recipe, "kind": "Deployment"}, k8s_plan, arm="managed", node="gpu-node-a"
        )
    with pytest.raises(cedana.CedanaError, match="Kubernetes name"):
        cedana.pod_manifest(
            k8s_plan, arm="managed", node="gpu-node-a", name="Bad_Name", image="i", command=["x"]
        )


# --- blast radius ----------------------------------------------------------------------------

OUTSIDE = "gpu-prod-17"


def _slurm_calls(plan: Plan, token: SecretStr) -> list[Callable[[], object]]:
    return [
        lambda: cedana.slurm_install_steps(plan, CONFIG, nodes=["gpu-test-01", OUTSIDE]),
        lambda: cedana.slurm_uninstall_steps(plan, nodes=[OUTSIDE]),
        lambda: cedana.sbatch_argv(plan, arm="managed", node=OUTSIDE, job_name="j", script_argv=[]),
        lambda: cedana.checkpoint_request(plan, CONFIG, token, job_id="1", node=OUTSIDE),
        lambda: cedana.restore_request(plan, CONFIG, token, job_id="1", node=OUTSIDE),
        lambda: cedana_leftovers.exit_checklist(plan, nodes=[OUTSIDE]),
    ]


def _k8s_calls(plan: Plan, token: SecretStr) -> list[Callable[[], object]]:
    return [
        lambda: cedana.k8s_install_steps(plan, CONFIG, token, nodes=[OUTSIDE]),
        lambda: cedana.k8s_uninstall_steps(plan, nodes=["gpu-node-a", OUTSIDE]),
        lambda: cedana.k8s_uninstall_steps(plan, labelled_before=[OUTSIDE]),
        lambda: cedana.pod_manifest(
            plan, arm="unmanaged", node=OUTSIDE, name="p", image="i", command=["x"]
        ),
        lambda: cedana.opt_in_pod(
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {}},
            plan,
            arm="managed",
            node=OUTSIDE,
        ),
        lambda: cedana_leftovers.exit_checklist(plan, nodes=[OUTSIDE]),
    ]


def test_every_builder_refuses_a_node_outside_the_plan(
    slurm_plan: Plan, k8s_plan: Plan, token: SecretStr
) -> None:
    calls = _slurm_calls(slurm_plan, token) + _k8s_calls(k8s_plan, token)
    for call in calls:
        with pytest.raises(BlastRadiusError, match=OUTSIDE):
            call()
    # The other cluster kind's nodes are outside too.
    with pytest.raises(BlastRadiusError):
        cedana.sbatch_argv(
            slurm_plan, arm="managed", node="gpu-node-a", job_name="j", script_argv=[]
        )
    with pytest.raises(cedana.CedanaError, match="for a kubernetes cluster"):
        cedana.k8s_install_steps(slurm_plan, CONFIG, token)


# --- the way out -----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["slurm", "kubernetes"])
def test_expected_leftovers_in_the_snapshot_vocabulary(kind: str) -> None:
    items = cedana_leftovers.expected_leftovers(kind)
    assert all(set(item) == {"kind", "key_glob", "why"} for item in items)
    assert all(item["kind"] in SNAPSHOT_KINDS and item["why"] for item in items)
    pairs = [(item["kind"], item["key_glob"]) for item in items]
    assert len(pairs) == len(set(pairs))  # one entry per planted item
    common = {
        ("units", "*multi-user.target.wants/cedana.service*"),
        ("files", "/etc/profile.d/cedana.sh"),
        ("sysctls", "fs.pipe-user-pages-soft"),
        ("sysctls", "fs.pipe-max-size"),
        ("sysctls", "kernel.io_uring_disabled"),
        ("files", "/run/criu.kdat"),
        ("files", "/usr/local/bin/criu"),
        ("packages", "libnet-dev"),
        ("processes", "*cedana*"),
    }
    slurm_only = {
        ("scheduler", "file:*plugstack*"),
        ("scheduler", "config:TaskPlugin"),
        ("scheduler", "file:*/*cedana*.so"),
        ("files", "/usr/*bin/cedana-slurm"),
        ("units", "*slurmd.service.d/*"),
    }
    k8s_only = {
        ("files", "/etc/containerd/conf.d/999-cedana.toml"),
        ("files", "*/99-cedana.conf"),
        ("scheduler", "label:cedana.ai/enabled"),
    }
    mine, other = (slurm_only, k8s_only) if kind == "slurm" else (k8s_only, slurm_only)
    assert common | mine <= set(pairs)
    assert not other & set(pairs)


def test_exit_checklist_per_plan_node(slurm_plan: Plan) -> None:
    checklist = cedana_leftovers.exit_checklist(slurm_plan)
    per_node = len(cedana_leftovers.expected_leftovers("slurm"))
    assert len(checklist) == 2 * per_node
    assert {item["node"] for item in checklist} == set(SLURM_NODES)
    with pytest.raises(cedana.CedanaError, match="no 'local' install"):
        cedana_leftovers.expected_leftovers("local")


# Keys as tasks/exit/snapshots.py writes them: each planted leftover must match a glob of its kind.
PLANTED = {
    "slurm": [
        ("units", "/etc/systemd/system/multi-user.target.wants/cedana.service"),
        ("units", "/etc/systemd/system/slurmd.service.d/cedana.conf"),
        ("files", "/etc/profile.d/cedana.sh"),
        ("files", "/run/criu.kdat"),
        ("files", "/usr/local/bin/criu"),
        ("sysctls", "fs.pipe-max-size"),
        ("packages", "libseccomp-dev"),
        ("processes", "/usr/local/bin/cedana daemon start"),
        ("scheduler", "config:TaskPlugin"),
        ("scheduler", "file:/usr/lib/x86_64-linux-gnu/slurm-wlm/spank_cedana.so"),
        ("scheduler", "file:/etc/slurm/plugstack.conf"),
    ],
    "kubernetes": [
        ("files", "/etc/containerd/conf.d/999-cedana.toml"),
        ("files", "/etc/kubernetes/kubelet.conf.d/99-cedana.conf"),
        ("sysctls", "kernel.io_uring_disabled"),
        ("scheduler", "label:cedana.ai/enabled"),
        ("scheduler", "taint:cedana.ai/not-ready:NoSchedule"),
    ],
}
UNRELATED = [
    ("files", "/etc/profile.d/site.sh"),
    ("sysctls", "vm.swappiness"),
    ("scheduler", "config:SelectType"),
    ("scheduler", "label:kubernetes.io/hostname"),
    ("units", "/etc/systemd/system/multi-user.target.wants/ssh.service"),
]


@pytest.mark.parametrize("cluster", ["slurm", "kubernetes"])
def test_leftover_globs_match_snapshot_keys(cluster: str) -> None:
    globs = cedana_leftovers.expected_leftovers(cluster)

    def matched(kind: str, key: str) -> bool:
        return any(g["kind"] == kind and fnmatch.fnmatchcase(key, g["key_glob"]) for g in globs)

    for kind, key in PLANTED[cluster]:
        assert matched(kind, key), (kind, key)
    for kind, key in UNRELATED:
        assert not matched(kind, key), (kind, key)
