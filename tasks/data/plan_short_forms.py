"""The short forms a plan takes beside its full ones: what a new user writes first.

Each has one meaning only, read into the full form before the field validates, so the rest of
the code (and every check) sees the full form alone; the plan's JSON Schema
(tasks/data/plan_schema.py) offers both forms, so an editor accepts what the model accepts.

- A list of names or lines takes one alone: ``cluster.nodes: gpu-01`` is ``[gpu-01]``; so are
  ``exit.verification``, ``decision.criteria`` and ``fidelity.files`` (`OneOrList`).
- A fidelity file is its bare path: ``files: [result.txt]`` is ``[{path:
  "{copy_dir}/result.txt"}]``, that file under the copy's folder compared byte for byte
  (tasks/data/plan_workload.py).
- A fault is its bare kind, for the kinds without a field of their own: ``faults: [scancel]``
  is ``[{kind: scancel}]`` (tasks/data/plan_faults.py).

An argv (``command``, ``exit.uninstall``, ``fidelity.query``, a ready probe's ``exec``) never
takes a string: splitting one would guess at a shell's quoting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema


def _listed(value: Any) -> Any:
    """One item alone is the one-item list (a list, or nothing given, stays as it is)."""
    return value if isinstance(value, list | tuple) or value is None else [value]


@dataclass(frozen=True)
class OneOrList:
    """Marks a list field (``Annotated[list[X], OneOrList()]``) that also takes one item
    alone; the list's own constraints (min_length, max_length) still apply to the list."""

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_before_validator_function(_listed, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        listed = handler(schema)
        return {"anyOf": [listed["items"], listed]}


@dataclass(frozen=True)
class ShortForm:
    """Marks a field (``Annotated[X, ShortForm(expand, schema)]``) that also takes the short
    form ``schema`` (a JSON Schema) describes: ``expand`` reads a value in that form into the
    full one and leaves any other value as it is, for the field to validate (or refuse)."""

    expand: Callable[[Any], Any]
    schema: dict[str, Any]

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_before_validator_function(self.expand, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"anyOf": [dict(self.schema), handler(schema)]}

    def __hash__(self) -> int:  # the schema is a dict: hashed by what it says
        return hash((self.expand, repr(sorted(self.schema.items()))))
