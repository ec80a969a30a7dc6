"""The JSON form of a typed result: what `--json` prints and a flow run returns.

A stage's result is a frozen dataclass (tasks/<stage>/...); its JSON form is derived from its
fields, in their order, so the keys are declared once, by the fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any


def _json(value: Any) -> Any:
    """A result's field in its JSON form: results by their to_json, tuples as lists,
    mappings as dicts, the rest as it is."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, tuple):
        return [_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _json(v) for k, v in value.items()}
    return value


class JsonForm:
    """``to_json`` from the dataclass's fields, in their order. ``_OMIT_NONE``: fields whose
    key is absent, not null, when they are None."""

    _OMIT_NONE: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:  # a dict: the JSON form itself
        out: dict[str, Any] = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is None and f.name in self._OMIT_NONE:
                continue
            out[f.name] = _json(value)
        return out
