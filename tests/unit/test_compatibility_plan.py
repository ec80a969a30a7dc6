"""The plan's `workloads:` (workload: its one-item form) and what `plan check` says of them:
fidelity, CRIU options, prepare, env, compatibility.cycles — each problem naming its field.
No process runs here (well under a second)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tasks.data.errors import PlanError
from tasks.data.plan import Plan, load_plan
from tasks.data.plan_workload import CRIU_DUMP_OPTIONS, criu_option_problems
from tests.support.common import REPO, demo_plan_dict

PROBLEM = re.compile(r"^(?P<file>.+?):(?P<line>\d+): (?P<field>[^ :]+): (?P<message>.+)$")

SERVE: dict[str, Any] = {
    "name": "digits-serve",
    "command": ["python", "-m", "examples.serve_digits", "--port", "{port}"],
    "gpus": 0,
    "ready_probe": {"url": "http://127.0.0.1:{port}/ready"},
    "fidelity": {"query": ["python", "-c", "print(1)"], "expect_same": True},
}


def _plan(tmp_path: Path, **changes: Any) -> Path:
    """The demo plan with top-level keys changed (None: removed)."""
    data = demo_plan_dict()
    data["data_dir"] = str(tmp_path / "data")
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _first() -> dict[str, Any]:
    return copy.deepcopy(demo_plan_dict()["workload"])


def _problems(path: Path) -> list[str]:
    with pytest.raises(PlanError) as info:
        load_plan(path)
    return info.value.problems


def _fields(problems: list[str]) -> dict[str, str]:
    return {m["field"]: m["message"] for p in problems if (m := PROBLEM.match(p))}


def test_the_demo_plan_lists_its_workloads_and_the_first_is_the_comparisons_one() -> None:
    plan = load_plan(REPO / "plans" / "demo.yaml")
    assert plan.workloads[0] == plan.workload
    assert plan.workload.name == "digits-train"
    assert len({w.name for w in plan.workloads}) == len(plan.workloads)


def test_workload_alone_is_the_one_item_form(tmp_path: Path) -> None:
    plan = load_plan(_plan(tmp_path, workloads=None, compatibility=None))
    assert plan.workloads == [plan.workload]
    assert plan.compatibility.cycles == 10  # the default


def test_workloads_alone_make_the_first_the_workload(tmp_path: Path) -> None:
    plan = load_plan(_plan(tmp_path, workload=None, workloads=[_first(), SERVE]))
    assert [w.name for w in plan.workloads] == ["digits-train", "digits-serve"]
    assert plan.workload is plan.workloads[0]


def test_workload_beside_workloads_must_be_its_first_item(tmp_path: Path) -> None:
    other = {**_first(), "name": "other"}
    fields = _fields(_problems(_plan(tmp_path, workloads=[other, SERVE])))
    assert "first item must be that workload" in fields["workloads"]
    fields = _fields(_problems(_plan(tmp_path, workload=None, workloads=[])))
    assert "at least one" in " ".join(fields.values())


def test_an_anchored_first_workload_says_each_problem_once(tmp_path: Path) -> None:
    text = (REPO / "plans" / "demo.yaml").read_text()
    assert "workload: &" in text and "*" in text  # the demo writes the anchor form
    bad = text.replace("gpus: 1", "gpus: 1000", 1)
    path = tmp_path / "plan.yaml"
    path.write_text(bad.replace("data_dir: data", f"data_dir: {tmp_path / 'data'}"))
    problems = _problems(path)
    assert [p for p in problems if "gpus" in p] == [p for p in problems if "workload.gpus" in p]
    assert len([p for p in problems if "gpus" in p]) == 1


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        (
            {"fidelity": {"files": [{"path": "{copy_dir}/x", "numbers": {"regex": "(a"}}]}},
            "workloads.1.fidelity.files.0.numbers.regex",
            "regex does not compile",
        ),
        (
            {"fidelity": {"files": [{"path": "{copy_dir}/x", "numbers": {"regex": "a"}}]}},
            "workloads.1.fidelity.files.0.numbers.regex",
            "capture group",
        ),
        (
            {"fidelity": {"files": [{"path": "/etc/passwd"}]}},
            "workloads.1.fidelity.files.0.path",
            "outside {copy_dir}",
        ),
        (
            {"fidelity": {"files": [{"path": "{copy_dir}/../x"}]}},
            "workloads.1.fidelity.files.0.path",
            "no '..'",
        ),
        ({"criu": {"dump": ["--ext-mount-map", "/:/"]}}, "workloads.1.criu.dump", "allow-list"),
        ({"criu": {"dump": ["-D", "/tmp"]}}, "workloads.1.criu.dump", "set by the harness"),
        (
            {"criu": {"dump": ["--network-lock", "pf"]}},
            "workloads.1.criu.dump",
            "not one of iptables, nftables, skip",
        ),
        ({"criu": {"restore": ["--skip-in-flight"]}}, "workloads.1.criu.restore", "allow-list"),
        ({"env": {"BAD NAME": "1"}}, "workloads.1.env", "not an environment variable name"),
        ({"env": {"CKPT_POC_ARM": "x"}}, "workloads.1.env", "the harness's"),
        ({"prepare": "gmx grompp"}, "workloads.1.prepare", "argv lists"),
        ({"fidelity": {}}, "workloads.1.fidelity", "give files"),
    ],
)
def test_a_bad_workload_item_is_refused_naming_its_field(
    tmp_path: Path, change: dict[str, Any], field: str, message: str
) -> None:
    first = _first()
    path = _plan(tmp_path, workload=None, workloads=[first, {**SERVE, **change}])
    fields = _fields(_problems(path))
    assert field in fields, fields
    assert message in fields[field], fields[field]


def test_plan_wide_workload_problems(tmp_path: Path) -> None:
    first = _first()
    fields = _fields(_problems(_plan(tmp_path, workload=None, workloads=[first, first])))
    assert "names repeat: digits-train" in " ".join(fields.values())
    served_first = [SERVE, first]
    problems = _problems(_plan(tmp_path, workload=None, workloads=served_first))
    assert any("{port} is filled in by the compatibility stage only" in p for p in problems)


@pytest.mark.parametrize("cycles", [0, 1001, 10**9])
def test_compatibility_cycles_are_bounded(tmp_path: Path, cycles: int) -> None:
    fields = _fields(_problems(_plan(tmp_path, compatibility={"cycles": cycles})))
    assert "compatibility.cycles" in fields


def test_good_items_load_with_their_forms(tmp_path: Path) -> None:
    serve = {
        **SERVE,
        "prepare": ["python", "-c", "print('one argv is one command')"],
        "env": {"OMP_NUM_THREADS": "1", "DATA": "{copy_dir}/in"},
        "criu": {
            "dump": ["--tcp-established", "--network-lock", "nftables", "--ghost-limit=1M"],
            "restore": ["--tcp-established"],
        },
        "fidelity": {
            "files": [
                {"path": "{log}", "numbers": {"regex": r"acc=(?P<acc>\S+)", "rel_tol": 1e-9}},
                {"path": "{copy_dir}/out/result.json"},
            ],
            "query": ["python", "-c", "print(1)"],
        },
    }
    path = _plan(tmp_path, workload=None, workloads=[_first(), serve], compatibility={"cycles": 3})
    plan: Plan = load_plan(path)
    w = plan.workloads[1]
    assert w.prepare == [["python", "-c", "print('one argv is one command')"]]
    assert w.uses_port and not plan.workloads[0].uses_port
    assert w.criu.dump[0] == "--tcp-established" and plan.compatibility.cycles == 3
    assert plan.workloads[0].criu.dump == []  # no options: the harness's own only


def test_the_criu_allow_list_reads_values() -> None:
    assert (
        criu_option_problems(["--ghost-limit", "10M", "--tcp-close"], CRIU_DUMP_OPTIONS, "d") == []
    )
    assert criu_option_problems(["--ghost-limit"], CRIU_DUMP_OPTIONS, "d") == [
        "d: --ghost-limit needs a value"
    ]
    assert criu_option_problems(["--tcp-close=yes"], CRIU_DUMP_OPTIONS, "d") == [
        "d: --tcp-close takes no value"
    ]
    assert "given twice" in criu_option_problems(["--file-locks"] * 2, CRIU_DUMP_OPTIONS, "d")[0]


def test_a_slurm_plan_with_criu_runs_the_sweep_and_cedana_is_refused() -> None:
    """A Slurm plan's sweep runs (as jobs on its node:
    tests/integration/test_compatibility_slurm.py); the example's Cedana, contract only
    here, is refused naming both kinds."""
    from tasks.experiments.compatibility import CompatibilityRefused, ensure_compatibility_runs

    plan = load_plan(REPO / "plans" / "slurm-example.yaml", check_cluster=False)
    criu = plan.model_copy(
        update={"checkpointer": plan.checkpointer.model_copy(update={"kind": "criu"})}
    )
    ensure_compatibility_runs(criu)
    with pytest.raises(CompatibilityRefused, match="this plan: 'slurm', 'cedana'"):
        ensure_compatibility_runs(plan)
