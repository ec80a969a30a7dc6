"""Cedana as a system under test: the exact steps, as data; nothing runs by default.

Cedana cannot run on these machines (its binaries and Slurm plugins are a licensed download,
its Slurm builds target 23.11+), so this module produces, from a validated plan, the exact
commands (argv lists, never shell strings), Kubernetes manifests (dicts) and REST requests
a run would make, following ../shared/notes/cedana.md. Tests check them as a contract.

- Slurm: per plan node, pinned with ``srun -w NODE -p QUEUE -N1 -n1``: ``cedana plugin
  install slurm`` (+ ``gpu`` when the workload has GPUs), ``cedana slurm setup --node-role
  worker``, ``cedana daemon check``. The controller step runs only when ``CedanaConfig.
  controller_node`` names a node, and that node must be one of the plan's (the plan has no
  field for it yet: by default the slurmctld side is the site's precondition, not ours).
  A job opts in with ``--export=ALL,CEDANA_ENABLE=1`` on the managed arm's sbatch argv only.
  Checkpoint/restore go through Cedana's REST API with a bearer token kept in a SecretStr.
  Removal: ``cedana slurm destroy`` per node, then the exit snapshot checks
  ``expected_leftovers`` (tasks/engine/checkpointers/cedana_leftovers.py: nothing is deleted
  that the PoC did not create).
- Kubernetes: ``kubectl label nodes N cedana.ai/enabled=true`` per plan node, the Helm
  release with its helper DaemonSet pinned to that label, the auth token given on stdin
  (``--values -``: never on the argv, which ``ps`` shows, never in a file on disk); pods opt in
  with ``runtimeClassName: cedana`` and ``cedana.ai/*`` labels on the managed arm only.

Every builder refuses a node the plan does not name (BlastRadiusError) before building
anything.
"""

from __future__ import annotations

import copy
import json
import os
import re
import urllib.request
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from pydantic import SecretStr

from tasks.data.arms import ARMS, MANAGED, UNMANAGED
from tasks.data.errors import BlastRadiusError, CkptPocError, SecretError
from tasks.data.plan import SAFE_NAME, Plan
from tasks.data.settings import env_name, settings

URL_ENV = "CEDANA_URL"
TOKEN_ENV = "CEDANA_AUTH_TOKEN"
CLUSTER_ID_ENV = "CEDANA_CLUSTER_ID"
TOKEN_BLOCK_ENV = env_name("cedana_token_block")  # name of a Prefect Secret block holding it
CONTROLLER_ENV = env_name("cedana_controller")  # a plan node that also runs slurmctld

OPT_IN_ENV = "CEDANA_ENABLE"
SBATCH_OPT_IN = f"--export=ALL,{OPT_IN_ENV}=1"

HELM_RELEASE = "cedana"
HELM_NAMESPACE = "cedana-system"
HELM_CHART = "oci://registry-1.docker.io/cedana/cedana-helm"
# The chart version the notes' leftovers were read from: a newer chart may leave other things.
HELM_CHART_VERSION = "0.7.6"
NODE_LABEL = "cedana.ai/enabled"
RUNTIME_CLASS = "cedana"
HOSTNAME_LABEL = "kubernetes.io/hostname"

_DNS_1123 = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_JOB_ID = re.compile(r"^[0-9]+$")
_URL = re.compile(r"^https?://[^\s,\\]+$")  # no comma or backslash: Helm's --set splits on them


class CedanaError(CkptPocError):
    """A Cedana step cannot be built as asked (bad input, an arm that would opt in wrongly)."""


@dataclass(frozen=True)
class Step:
    """One command: its argv, the plan node it acts on (None: cluster-wide, e.g. Helm), why,
    and what goes on its stdin (a SecretStr: redacted in repr, never on the argv)."""

    argv: tuple[str, ...]
    node: str | None
    why: str
    stdin: SecretStr | None = None


@dataclass(frozen=True)
class CedanaConfig:
    """Where Cedana's control plane is and how this PoC talks to it (not in the plan yet)."""

    url: str
    cluster_id: str
    token_secret_block: str | None = None
    controller_node: str | None = None
    chart_version: str = HELM_CHART_VERSION

    def __post_init__(self) -> None:
        if not _URL.match(self.url):
            raise CedanaError(f"{URL_ENV} {self.url!r} is not an http(s) URL without , or \\")
        for what, value in (("cluster id", self.cluster_id), ("chart", self.chart_version)):
            if not SAFE_NAME.match(value):
                raise CedanaError(f"Cedana {what} {value!r} is not a safe name")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> CedanaConfig:
        env = os.environ if environ is None else environ
        missing = [name for name in (URL_ENV, CLUSTER_ID_ENV) if not env.get(name)]
        if missing:
            raise CedanaError(f"set {' and '.join(missing)} for the Cedana checkpointer")
        ours = settings(environ)
        return cls(
            url=env[URL_ENV].rstrip("/"),
            cluster_id=env[CLUSTER_ID_ENV],
            token_secret_block=ours.cedana_token_block,
            controller_node=ours.cedana_controller,
        )


def load_auth_token(
    secret_block: str | None = None, environ: Mapping[str, str] | None = None
) -> tuple[SecretStr, str]:
    """The bearer token from $CEDANA_AUTH_TOKEN, else a Prefect Secret block; (token, where).

    The token is wrapped at once: every repr, log line or event shows '**********'."""
    env = os.environ if environ is None else environ
    if env.get(TOKEN_ENV):
        return SecretStr(env[TOKEN_ENV]), f"environment variable {TOKEN_ENV}"
    if secret_block:
        try:
            from prefect.blocks.system import Secret

            value = Secret.load(secret_block).get()
        except Exception as exc:  # absent block or unreachable API: say which, not the value
            raise SecretError(
                f"cannot load Prefect Secret block {secret_block!r} for the Cedana token "
                f"({type(exc).__name__}); set {TOKEN_ENV} instead"
            ) from None
        return SecretStr(str(value)), f"Prefect Secret {secret_block!r}"
    raise SecretError(f"no Cedana token: set {TOKEN_ENV} or {TOKEN_BLOCK_ENV} (a Secret block)")


# --- blast radius ----------------------------------------------------------------------------


def plan_nodes(plan: Plan, kind: str, nodes: Iterable[str] | None = None) -> list[str]:
    """The nodes to act on: all the plan's by default; any other name is refused first."""
    if plan.cluster.kind != kind:
        raise CedanaError(f"this step is for a {kind} cluster; the plan's is {plan.cluster.kind}")
    chosen = list(plan.cluster.nodes if nodes is None else nodes)
    for node in chosen:
        if node not in plan.cluster.nodes:
            raise BlastRadiusError(
                f"node {node!r} is not one of the plan's nodes {list(plan.cluster.nodes)}"
            )
        if not SAFE_NAME.match(node):  # the plan validated it; it is an argv element all the same
            raise BlastRadiusError(f"node {node!r} is not a safe name")
    return chosen


def _arm(arm: str) -> str:
    if arm not in ARMS:
        raise CedanaError(f"arm {arm!r} is not one of {ARMS}")
    return arm


# --- Slurm -----------------------------------------------------------------------------------


def _srun(plan: Plan, node: str, command: list[str]) -> tuple[str, ...]:
    # One task on exactly that node, in the PoC's partition: no other node can run it.
    return ("srun", "-w", node, "-p", plan.cluster.queue, "-N1", "-n1", *command)


def slurm_install_steps(
    plan: Plan, config: CedanaConfig, nodes: Iterable[str] | None = None
) -> list[Step]:
    """Per node: plugins, worker setup, health check; the controller only if named (see top)."""
    chosen = plan_nodes(plan, "slurm", nodes)
    controller = config.controller_node
    if controller is not None:
        plan_nodes(plan, "slurm", [controller])
    steps: list[Step] = []
    for node in chosen:
        plugins = ["slurm", *(["gpu"] if plan.workload.gpus > 0 else [])]
        for plugin in plugins:
            steps.append(
                Step(
                    _srun(plan, node, ["cedana", "plugin", "install", plugin]),
                    node,
                    f"Cedana's {plugin} plugin",
                )
            )
        steps.append(
            Step(
                _srun(plan, node, ["cedana", "slurm", "setup", "--node-role", "worker"]),
                node,
                "SPANK/task plugins and the daemon on a worker",
            )
        )
        if node == controller:
            steps.append(
                Step(
                    _srun(plan, node, ["cedana", "slurm", "setup", "--node-role", "controller"]),
                    node,
                    "cli_filter/job_submit plugins on the controller (named in the config)",
                )
            )
        steps.append(
            Step(
                _srun(plan, node, ["cedana", "daemon", "check", "--full"]),
                node,
                "the daemon answers before any job opts in",
            )
        )
    return steps


def slurm_uninstall_steps(plan: Plan, nodes: Iterable[str] | None = None) -> list[Step]:
    """``cedana slurm destroy`` per node; what it leaves is checked, not deleted by us."""
    return [
        Step(_srun(plan, node, ["cedana", "slurm", "destroy"]), node, "Cedana's own removal")
        for node in plan_nodes(plan, "slurm", nodes)
    ]


def sbatch_opt_in_args(arm: str) -> list[str]:
    """The managed arm opts in; the unmanaged arm never does."""
    return [SBATCH_OPT_IN] if _arm(arm) == MANAGED else []


def sbatch_argv(
    plan: Plan, *, arm: str, node: str, job_name: str, script_argv: list[str]
) -> list[str]:
    """One attempt's sbatch argv, pinned to a plan node in the plan's partition."""
    plan_nodes(plan, "slurm", [node])
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={job_name}",
        f"--partition={plan.cluster.queue}",
        f"--nodelist={node}",
        "--nodes=1",
        "--no-requeue",  # recovery submits a new, linked job; Slurm never requeues ours
    ]
    if plan.workload.gpus:
        argv.append(f"--gres=gpu:{plan.workload.gpus}")
    return [*argv, *sbatch_opt_in_args(arm), *script_argv]


def unmanaged_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The submitting environment for the unmanaged arm: sbatch exports ALL of it by default,
    so a CEDANA_ENABLE set in the caller's shell would opt the unmanaged job in silently."""
    return {k: v for k, v in environ.items() if k != OPT_IN_ENV}


_SBATCH_EXPORT = re.compile(r"^#SBATCH\s+.*\bCEDANA_ENABLE\b", re.M)


def ensure_script_does_not_opt_in(script_text: str) -> None:
    """A production sbatch script with its own ``#SBATCH --export=CEDANA_ENABLE=1`` would opt
    the unmanaged arm in: refuse it rather than edit the user's script."""
    match = _SBATCH_EXPORT.search(script_text)
    if match:
        raise CedanaError(
            f"the workload script opts itself in ({match.group(0)!r}): the unmanaged arm "
            "would be checkpointed too; remove the line and let ckpt-poc opt the managed arm in"
        )


@dataclass(frozen=True, repr=False)
class CedanaRequest:
    """One REST call to Cedana's control plane. ``headers`` is the redacted view for logs and
    events; only ``http_headers()`` (called by ``send``) holds the token itself."""

    method: str
    url: str
    json: dict[str, Any] | None
    token: SecretStr

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": "Bearer **********", "Content-Type": "application/json"}

    def http_headers(self) -> dict[str, str]:
        return {
            "Authorization": f"Bearer {self.token.get_secret_value()}",
            "Content-Type": "application/json",
        }

    def redacted(self) -> dict[str, Any]:  # a dict: the request as JSON, for a record
        """What an event or dataset may record."""
        return {"method": self.method, "url": self.url, "headers": self.headers, "json": self.json}

    def __repr__(self) -> str:
        return (
            f"CedanaRequest(method={self.method!r}, url={self.url!r}, "
            f"headers={self.headers!r}, json={self.json!r})"
        )

    __str__ = __repr__


def _job_id(value: str) -> str:
    if not _JOB_ID.match(str(value)):
        raise CedanaError(f"{value!r} is not a Slurm job id")
    return str(value)


def checkpoint_request(
    plan: Plan, config: CedanaConfig, token: SecretStr, *, job_id: str, node: str
) -> CedanaRequest:
    """Checkpoint one job; ``node`` is where Slurm placed it (squeue), refused if not ours.
    The body's field names are an assumption: the notes give the route, not the schema."""
    plan_nodes(plan, "slurm", [node])
    body = {"job_id": _job_id(job_id), "cluster_id": config.cluster_id}
    return CedanaRequest("POST", f"{config.url}/v2/slurm/checkpoint/job", body, token)


def restore_request(
    plan: Plan,
    config: CedanaConfig,
    token: SecretStr,
    *,
    job_id: str,
    node: str,
    checkpoint_id: str | None = None,
) -> CedanaRequest:
    """Restore the job ``job_id`` (optionally from one checkpoint); Slurm gives it a new id."""
    plan_nodes(plan, "slurm", [node])
    body: dict[str, Any] = {"job_id": _job_id(job_id), "cluster_id": config.cluster_id}
    if checkpoint_id is not None:
        body["checkpoint_id"] = str(checkpoint_id)
    return CedanaRequest("POST", f"{config.url}/v2/slurm/restore/job", body, token)


def list_checkpoints_request(config: CedanaConfig, token: SecretStr) -> CedanaRequest:
    return CedanaRequest("GET", f"{config.url}/v2/slurm/checkpoints", None, token)


@dataclass(frozen=True)
class RestoreLink:
    """A restored job is a new Slurm job: the report follows the chain by these two ids."""

    old_job_id: str
    new_job_id: str
    checkpoint_id: str | None = None

    def event_detail(self) -> dict[str, str | None]:
        # The same key the harness's own recoveries use for "this attempt recovers that one".
        return {
            "job_id": self.new_job_id,
            "linked_to": self.old_job_id,
            "checkpoint_id": self.checkpoint_id,
        }


def link_restored_job(old_job_id: str, response: Mapping[str, Any]) -> RestoreLink:
    """Read the new job id from the restore response (``job_id``, or ``new_job_id``)."""
    new = response.get("new_job_id", response.get("job_id"))
    if new is None:
        raise CedanaError(f"the restore response names no job id (keys: {sorted(response)})")
    old, new = _job_id(old_job_id), _job_id(str(new))
    if new == old:
        raise CedanaError(f"the restore kept job id {old}: a restored job must be a new job")
    checkpoint = response.get("checkpoint_id")
    return RestoreLink(old, new, None if checkpoint is None else str(checkpoint))


def send(request: CedanaRequest, timeout: float = 30) -> Any:
    """Make the call (only when a caller asks); the JSON answer. Errors never carry the token."""
    data = None if request.json is None else json.dumps(request.json).encode()
    req = urllib.request.Request(
        request.url, data=data, method=request.method, headers=request.http_headers()
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:  # the URL is http(s)
            body = answer.read()
    except OSError as exc:  # HTTPError and URLError are OSErrors; their text has no headers
        raise CedanaError(f"{request.method} {request.url} failed: {exc}") from None
    return json.loads(body) if body.strip() else None


# --- Kubernetes ------------------------------------------------------------------------------


def helm_values(token: SecretStr) -> SecretStr:
    """The values given on Helm's stdin: only the token (everything else is on the argv,
    where an auditor can read it)."""
    text = yaml.safe_dump({"config": {"authToken": token.get_secret_value()}})
    return SecretStr(text)


def helm_install_argv(config: CedanaConfig) -> tuple[str, ...]:
    return (
        "helm",
        "install",
        HELM_RELEASE,
        HELM_CHART,
        "--version",
        config.chart_version,
        "-n",
        HELM_NAMESPACE,
        "--create-namespace",
        # --set-string: `--set …=true` would make a YAML boolean, and a nodeSelector value
        # must be a string; a numeric-looking cluster id would become a number.
        "--set-string",
        f"config.url={config.url}",
        "--set-string",
        f"config.clusterId={config.cluster_id}",
        "--set-string",
        # One argv element, no shell: the backslash tells Helm the dots are in the key.
        "daemonHelper.nodeSelector.cedana\\.ai/enabled=true",
        "--values",
        "-",  # the token arrives on stdin (Step.stdin), never on the argv
    )


def k8s_install_steps(
    plan: Plan, config: CedanaConfig, token: SecretStr, nodes: Iterable[str] | None = None
) -> list[Step]:
    """Label the plan's nodes (no --overwrite: a label already there is an error, so the
    uninstall never removes one it did not put), then the Helm release pinned to the label."""
    chosen = plan_nodes(plan, "kubernetes", nodes)
    steps = [
        Step(
            ("kubectl", "label", "nodes", node, f"{NODE_LABEL}=true"),
            node,
            "the helper DaemonSet runs only where this label is",
        )
        for node in chosen
    ]
    steps.append(Step(helm_install_argv(config), None, "Cedana's Helm release", helm_values(token)))
    return steps


def k8s_uninstall_steps(
    plan: Plan, nodes: Iterable[str] | None = None, labelled_before: Collection[str] = ()
) -> list[Step]:
    """``helm uninstall``, then the label removed from each plan node that did not carry it
    before the install (``labelled_before``: from the before_install snapshot)."""
    chosen = plan_nodes(plan, "kubernetes", nodes)
    plan_nodes(plan, "kubernetes", labelled_before)
    steps = [
        Step(
            ("helm", "uninstall", HELM_RELEASE, "-n", HELM_NAMESPACE),
            None,
            # The chart's pre-delete hook runs on every node (no nodeSelector): see the notes.
            "Cedana's own removal (its pre-delete DaemonSet is cluster-wide)",
        )
    ]
    steps += [
        Step(
            ("kubectl", "label", "nodes", node, f"{NODE_LABEL}-"),
            node,
            "the label this PoC put on",
        )
        for node in chosen
        if node not in labelled_before
    ]
    return steps


def _k8s_name(name: str) -> str:
    if not _DNS_1123.match(name):
        raise CedanaError(f"{name!r} is not a Kubernetes name (lowercase DNS-1123 label)")
    return name


# a dict: a Kubernetes manifest (JSON)
def opt_in_pod(
    pod: Mapping[str, Any], plan: Plan, *, arm: str, node: str, interval_s: float | None = None
) -> dict[str, Any]:
    """A copy of a Pod manifest for one arm: in the plan's namespace, pinned to a plan node;
    the managed arm opts in (runtimeClassName and cedana.ai labels), the unmanaged never."""
    plan_nodes(plan, "kubernetes", [node])
    _arm(arm)
    if pod.get("apiVersion") != "v1" or pod.get("kind") != "Pod":
        raise CedanaError("only a v1 Pod manifest is supported (no Deployment, Job, …)")
    out = copy.deepcopy(dict(pod))
    meta = out.setdefault("metadata", {})
    spec = out.setdefault("spec", {})
    _k8s_name(meta.get("name", ""))
    namespace = meta.get("namespace", plan.cluster.queue)
    if namespace != plan.cluster.queue:
        raise BlastRadiusError(f"namespace {namespace!r} is not the plan's {plan.cluster.queue!r}")
    meta["namespace"] = plan.cluster.queue
    labels = meta.setdefault("labels", {})
    cedana_labels = sorted(k for k in labels if k.startswith("cedana.ai/"))
    runtime = spec.get("runtimeClassName")
    if arm == UNMANAGED and (runtime == RUNTIME_CLASS or cedana_labels):
        raise CedanaError(f"the manifest opts itself in ({runtime!r}, {cedana_labels}): refused")
    if arm == MANAGED and runtime not in (None, RUNTIME_CLASS):
        raise CedanaError(f"the manifest already has runtimeClassName {runtime!r}")
    if not spec.get("containers"):
        raise CedanaError("the Pod manifest has no spec.containers")
    labels["ckpt-poc/arm"] = arm
    # Pinned by the node's hostname label, and the scheduler still places it (no nodeName).
    spec["nodeSelector"] = {**spec.get("nodeSelector", {}), HOSTNAME_LABEL: node}
    if arm == MANAGED:
        spec["runtimeClassName"] = RUNTIME_CLASS
        labels["cedana.ai/node-restore"] = "true"
        every = plan.checkpointer.interval_s if interval_s is None else interval_s
        labels["cedana.ai/heartbeat-checkpoint"] = str(max(1, round(every)))
    return out


# a dict: a Kubernetes manifest (JSON)
def pod_manifest(
    plan: Plan, *, arm: str, node: str, name: str, image: str, command: list[str]
) -> dict[str, Any]:
    """A minimal Pod for one arm (GPUs as the plan's workload asks), opted in by ``opt_in_pod``."""
    plan_nodes(plan, "kubernetes", [node])
    container: dict[str, Any] = {"name": "workload", "image": image, "command": list(command)}
    if plan.workload.gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": plan.workload.gpus}}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": _k8s_name(name), "namespace": plan.cluster.queue},
        "spec": {"restartPolicy": "Never", "containers": [container]},
    }
    return opt_in_pod(pod, plan, arm=arm, node=node)
