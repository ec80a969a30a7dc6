"""A plan's YAML read strictly, and its problems pointed at their lines.

Plain YAML keeps the last of two repeated keys without a word and prints a syntax error over
several lines; here a repeated key at any depth is an error naming both of its lines, a syntax
error is one line ``file:line:col``, and a pydantic field path maps back to the YAML line it
came from, so every problem ``load_plan`` (tasks/data/plan.py) reports reads ``file:line: field:
message``.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import ValidationError

from tasks.data.plan_faults import fault_schema_problem

# --- field paths mapped back to YAML lines ---------------------------------------------------


def yaml_line(root: yaml.Node | None, loc: tuple[int | str, ...]) -> int | None:
    """The 1-based YAML line of the deepest node on ``loc`` that exists in the file."""
    node = root
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == part), None)
            if match is None:
                break
            key, node = match
            line = key.start_mark.line + 1  # the key's line reads best ("success:")
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                break
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def file_line(path: str, root: yaml.Node | None, loc: tuple[int | str, ...]) -> str:
    """``file:line`` of the field at ``loc``, or just ``file`` when the YAML has no such node."""
    line = yaml_line(root, loc)
    return f"{path}:{line}" if line else path


def _is_branch_tag(part: str) -> bool:
    """A baseline.source kind, as pydantic puts it in an error's location."""
    return part.startswith("sacct-") or part == "slurmrestd"


def validation_problems(path: str, root: yaml.Node | None, exc: ValidationError) -> list[str]:
    """One ``file:line: field: message`` line per pydantic error, the field as in the YAML."""
    lines = []
    for err in exc.errors():
        fault = fault_schema_problem(err)  # a fault item, in the plan's words (its kind's)
        if fault is not None:
            loc, message = fault
        else:
            # Drop pydantic's union-branch tags (e.g. 'sacct-file'): paths read as the YAML.
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and _is_branch_tag(p)))
            message = err["msg"].removeprefix("Value error, ")
            if err["type"] == "missing":
                message = "required field is missing"
        field = ".".join(str(p) for p in loc) or "(plan)"
        here = file_line(path, root, loc)
        # A cross-field problem lists its own field paths; split them into separate lines.
        for part in message.split("; ") if loc == () else [message]:
            lines.append(f"{here}: {field}: {part}" if loc else f"{here}: {part}")
    return lines


# --- reading the YAML: duplicate keys refused, syntax errors on one line ---------------------

_MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKeysError(yaml.YAMLError):
    """A mapping repeats a key; plain YAML would silently keep the last value."""

    def __init__(self, duplicates: list[tuple[tuple[str | int, ...], int, int]]) -> None:
        # (field path of the repeated key, line of its first use, line of the repeat)
        self.duplicates = duplicates
        super().__init__(f"{len(duplicates)} duplicate key(s)")


def _duplicate_keys(root: yaml.Node) -> list[tuple[tuple[str | int, ...], int, int]]:
    """Every repeated mapping key under ``root``, at any depth, with both of its lines."""
    duplicates: list[tuple[tuple[str | int, ...], int, int]] = []
    visited: set[int] = set()  # an alias points back at a node already walked

    def walk(node: yaml.Node, path: tuple[str | int, ...]) -> None:
        if id(node) in visited:
            return
        visited.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first_line_by_key: dict[tuple[str, str], int] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    walk(value_node, path)
                    continue
                # `<<: *base` merges are meant to be overridden by the keys beside them.
                if key_node.tag != _MERGE_TAG:
                    key = (key_node.tag, key_node.value)  # tag resolved: "a" and a are one key
                    line = key_node.start_mark.line + 1
                    if key in first_line_by_key:
                        duplicates.append(((*path, key_node.value), first_line_by_key[key], line))
                    else:
                        first_line_by_key[key] = line
                walk(value_node, (*path, key_node.value))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, (*path, i))

    walk(root, ())
    return duplicates


class PlanLoader(yaml.SafeLoader):
    """yaml.SafeLoader that raises DuplicateKeysError on a repeated key at any depth."""

    def compose_document(self) -> yaml.Node:
        root = super().compose_document()
        duplicates = _duplicate_keys(root)
        if duplicates:
            raise DuplicateKeysError(duplicates)
        return root


def parse_yaml(text: str) -> tuple[yaml.Node | None, Any]:
    """One parse: the node tree (for YAML lines) and the data built from that same tree."""
    loader = PlanLoader(text)
    try:
        root = loader.get_single_node()
        return root, (loader.construct_document(root) if root is not None else None)
    finally:
        loader.dispose()


def _one_line(text: str) -> str:
    return " ".join(text.split())


def yaml_error_line(path: str, text: str, exc: yaml.YAMLError) -> str:
    """``file:line:col: not valid YAML: what is wrong``, one line (yaml's str() is several)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        what = _one_line(exc.problem or exc.context or "invalid YAML")
        if exc.problem and exc.context and exc.context_mark is not None:
            what += f" ({_one_line(exc.context)} at line {exc.context_mark.line + 1})"
        return f"{path}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {what}"
    if isinstance(exc, yaml.reader.ReaderError):
        # The reader counts characters, not lines: find the line and column ourselves.
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        return (
            f"{path}:{line}:{column}: not valid YAML: unacceptable character #x{code:04x}: "
            f"{_one_line(exc.reason)}"
        )
    return f"{path}: not valid YAML: {_one_line(str(exc))}"


def duplicate_key_problems(path: str, exc: DuplicateKeysError) -> list[str]:
    """One ``file:line: field: duplicate key ...`` line per repeated key."""
    return [
        f"{path}:{again}: {'.'.join(str(p) for p in loc)}: duplicate key "
        f"{str(loc[-1])!r}, first at line {first}, again at line {again} "
        "(YAML would silently keep the last)"
        for loc, first, again in exc.duplicates
    ]
