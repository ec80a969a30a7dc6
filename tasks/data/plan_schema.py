"""The plan's JSON Schema, generated from its pydantic model (tasks/data/plan.py).

Published as docs/plan.schema.json, so an editor with a YAML language server checks a plan as
it is typed: each plan in plans/ names it on its first line
(``# yaml-language-server: $schema=../docs/plan.schema.json``). The file is written the same
way every time (keys sorted, indent 2, a trailing newline) and never by hand::

    scripts/plan-schema            # write docs/plan.schema.json from the model
    scripts/plan-schema --check    # exit 1 when the file is not what the model gives today

It is JSON Schema draft-07 (what YAML language servers support), with the model's field
descriptions and docstrings, and both forms of each short form
(tasks/data/plan_short_forms.py). What needs more than one field, a file or the cluster
(``plan check``: tasks/data/plan.py) is no part of it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tasks.data import generated
from tasks.data.generated import Generated
from tasks.data.plan import Plan

REPO_ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = REPO_ROOT / "docs" / "plan.schema.json"
# What writes the file again; said whenever it is out of date.
REGENERATE = "scripts/plan-schema"
DRAFT_07 = "http://json-schema.org/draft-07/schema#"
TITLE = "ckpt-poc plan"
DESCRIPTION = (
    "A ckpt-poc PoC plan (plans/*.yaml): the workload, the baseline, what counts as success "
    "and the way out, plus where it runs. `ckpt-poc plan check PLAN` checks what this schema "
    "cannot (across fields, files, the cluster). Generated from the plan model by "
    f"{REGENERATE}; never edited by hand."
)


def plan_json_schema() -> dict[str, Any]:  # a dict: a JSON Schema document
    """The plan's JSON Schema (draft-07: the definitions under ``definitions``)."""
    schema = Plan.model_json_schema(ref_template="#/definitions/{model}")
    definitions = schema.pop("$defs", {})
    schema.pop("title", None)
    return {
        "$schema": DRAFT_07,
        "title": TITLE,
        "description": DESCRIPTION,
        **schema,
        # A plan gives workload (one) or workloads (a list), or both (Plan's own check).
        "anyOf": [{"required": ["workload"]}, {"required": ["workloads"]}],
        "definitions": definitions,
    }


def schema_text() -> str:
    """The schema as docs/plan.schema.json holds it: keys sorted, indent 2, one newline."""
    return json.dumps(plan_json_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


SCHEMA = Generated(
    "docs/plan.schema.json",
    "the plan model (tasks/data/plan.py)",
    REGENERATE,
    lambda _current: schema_text(),  # written whole: what the file held is not kept
)


def main(argv: list[str] | None = None) -> int:
    return generated.main([SCHEMA], "Write the plan's JSON Schema from the plan model.", argv)


if __name__ == "__main__":
    sys.exit(main())
