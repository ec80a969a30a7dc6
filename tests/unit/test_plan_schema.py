"""The plan's JSON Schema (docs/plan.schema.json) is the model's, and the short forms a new
user writes first load to the full forms (tasks/data/plan_schema.py, plan_short_forms.py)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tasks.data.errors import PlanError
from tasks.data.plan import Fidelity, FidelityFile, load_plan
from tasks.data.plan_schema import REGENERATE, SCHEMA_FILE, main, plan_json_schema, schema_text

REPO = Path(__file__).resolve().parents[2]
PLANS = sorted((REPO / "plans").glob("*.yaml"))
MODELINE = "# yaml-language-server: $schema=../docs/plan.schema.json"
NOW = dt.datetime(2027, 1, 4, 12, tzinfo=dt.UTC)


def _validator() -> jsonschema.Draft7Validator:
    schema = plan_json_schema()
    return jsonschema.Draft7Validator(
        schema, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER
    )


def _as_typed(value: Any) -> Any:
    """YAML data as an editor's language server sees it: a date or time is its text."""
    if isinstance(value, dict):
        return {k: _as_typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_as_typed(v) for v in value]
    if isinstance(value, dt.date | dt.datetime):
        return value.isoformat()
    return value


def _schema_errors(data: dict[str, Any]) -> list[str]:
    return [
        f"{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
        for e in _validator().iter_errors(_as_typed(data))
    ]


# --- the published schema is the model's ---------------------------------------------------


def test_the_published_schema_is_what_the_model_gives_today() -> None:
    assert SCHEMA_FILE == REPO / "docs" / "plan.schema.json"
    written = SCHEMA_FILE.read_text(encoding="utf-8") if SCHEMA_FILE.exists() else None
    assert written == schema_text(), (
        f"docs/plan.schema.json is out of date with the plan model: run {REGENERATE}"
    )


def test_the_schema_is_draft_07_sorted_with_the_models_descriptions() -> None:
    schema = plan_json_schema()
    jsonschema.Draft7Validator.check_schema(schema)
    assert schema["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert schema["title"] == "ckpt-poc plan"
    assert schema["additionalProperties"] is False
    text = schema_text()
    assert text.endswith("}\n") and json.loads(text) == schema
    assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    # Field descriptions and model docstrings both come along.
    assert (
        "GPU-h" in schema["definitions"]["Success"]["properties"]["work_lost_gpu_h"]["description"]
    )
    assert schema["definitions"]["Fidelity"]["description"].startswith("How to tell a restored")


def test_check_mode_says_what_to_run_and_writes_nothing(tmp_path: Path, capsys) -> None:
    out = tmp_path / "plan.schema.json"
    assert main(["--check", "--output", str(out)]) == 1
    assert not out.exists()
    assert REGENERATE in capsys.readouterr().err
    assert main(["--output", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == schema_text()
    assert main(["--check", "--output", str(out)]) == 0
    out.write_text(schema_text().replace('"ckpt-poc plan"', '"an older plan"'), encoding="utf-8")
    assert main(["--check", "--output", str(out)]) == 1
    assert f"out of date with the plan model (tasks/data/plan.py): run {REGENERATE}" in (
        capsys.readouterr().err
    )


# --- every shipped plan names the schema and fits it ---------------------------------------


@pytest.mark.parametrize("path", PLANS, ids=[p.name for p in PLANS])
def test_every_plan_names_the_schema_and_validates_against_it(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert text.splitlines()[0] == MODELINE
    assert (path.parent / "../docs/plan.schema.json").resolve() == SCHEMA_FILE
    assert _schema_errors(yaml.safe_load(text)) == []


def test_the_schema_refuses_what_the_model_refuses(write_plan) -> None:
    data = yaml.safe_load(write_plan().read_text())
    assert _schema_errors(data) == []
    data["cluster"]["nodes"] = ["node1; rm -rf /"]
    data["faults"] = ["drain", {"kind": "meteor-strike"}]
    data["window"]["start"] = "next tuesday"
    data["surprise"] = 1
    del data["success"]
    errors = "\n".join(_schema_errors(data))
    for where in ("cluster.nodes", "faults.0", "faults.1", "window.start", "surprise", "success"):
        assert where in errors, f"{where} not refused:\n{errors}"


def test_the_schema_takes_the_relative_dates() -> None:
    dates = _validator().schema["definitions"]["Window"]["properties"]["start"]
    validator = jsonschema.Draft7Validator(dates, format_checker=jsonschema.FormatChecker())
    for good in ("today", "+21d", "+3w", "2027-01-04"):
        assert validator.is_valid(good), good
    for bad in ("tomorrow", "+3m", "2027-13-01", "21d"):
        assert not validator.is_valid(bad), bad


# --- the short forms load to the full forms -------------------------------------------------


def _load(write_plan, overrides: dict[str, Any]) -> Any:
    path = write_plan(overrides)
    assert _schema_errors(yaml.safe_load(path.read_text())) == [], "the schema refuses it"
    return load_plan(path, check_cluster=False, now=NOW)


def test_a_bare_fidelity_file_is_that_file_under_copy_dir_byte_for_byte(write_plan) -> None:
    short = _load(write_plan, {"workload.fidelity": {"files": ["result.txt"]}})
    full = _load(write_plan, {"workload.fidelity": {"files": [{"path": "{copy_dir}/result.txt"}]}})
    expected = Fidelity(files=[FidelityFile(path="{copy_dir}/result.txt", numbers=None)])
    assert short.workload.fidelity == expected
    assert short.workloads[0].fidelity == expected
    assert short.model_dump() == full.model_dump()


SHORT_FORMS = {
    "fidelity.files: one file alone": (
        {"workload.fidelity": {"files": "out/result.txt"}},
        {"workload.fidelity": {"files": [{"path": "{copy_dir}/out/result.txt"}]}},
    ),
    "fidelity.files: {log} and {copy_dir}/... as written": (
        {"workload.fidelity": {"files": ["{log}", "{copy_dir}/a.txt"]}},
        {"workload.fidelity": {"files": [{"path": "{log}"}, {"path": "{copy_dir}/a.txt"}]}},
    ),
    "cluster.nodes: one node alone": (
        {"cluster.nodes": "local-a"},
        {"cluster.nodes": ["local-a"]},
    ),
    "exit.verification: one line alone": (
        {"exit.verification": "the node snapshot after uninstall equals the one before"},
        {"exit.verification": ["the node snapshot after uninstall equals the one before"]},
    ),
    "decision.criteria: one criterion alone": (
        {"decision.criteria": "exit"},
        {"decision.criteria": ["exit"]},
    ),
    "faults: a kind alone": (
        {"faults": ["sigkill", "sigkill-group", {"kind": "sigterm-grace", "grace_s": 2}]},
        {
            "faults": [
                {"kind": "sigkill"},
                {"kind": "sigkill-group"},
                {"kind": "sigterm-grace", "grace_s": 2},
            ]
        },
    ),
}


@pytest.mark.parametrize("short, full", SHORT_FORMS.values(), ids=list(SHORT_FORMS))
def test_each_short_form_loads_to_its_full_form(write_plan, short, full) -> None:
    assert _load(write_plan, short).model_dump() == _load(write_plan, full).model_dump()


def _problems(write_plan, overrides: dict[str, Any]) -> str:
    with pytest.raises(PlanError) as info:
        load_plan(write_plan(overrides), check_cluster=False, now=NOW)
    return "\n".join(info.value.problems)


@pytest.mark.parametrize(
    "files, said",
    [
        (["../escape.txt"], "must name a file under {copy_dir}"),
        (["/etc/passwd"], "'/etc/passwd' is outside {copy_dir}"),
        ([""], "must name a file under {copy_dir}"),
    ],
)
def test_a_bare_fidelity_file_is_checked_as_the_full_form_is(write_plan, files, said) -> None:
    text = _problems(write_plan, {"workload.fidelity": {"files": files}})
    assert "workload.fidelity.files.0.path" in text and said in text


def test_a_bare_kind_that_needs_a_field_is_refused_naming_it(write_plan) -> None:
    text = _problems(write_plan, {"faults": ["sigterm-grace"]})
    assert "faults.0.grace_s: a sigterm-grace fault needs its grace period" in text


@pytest.mark.parametrize(
    "field, value",
    [
        ("workload.command", "python -m examples.train_digits"),
        ("exit.uninstall", "scripts/uninstall-criu --all"),
        ("workload.prepare", "python -m examples.weights out.safetensors"),
    ],
)
def test_an_argv_still_never_takes_a_string(write_plan, field, value) -> None:
    text = _problems(write_plan, {field: value})
    assert "not a string" in text
