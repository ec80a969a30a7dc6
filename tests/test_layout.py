"""tasks/ is grouped by stage, and imports flow one way: flows → stage packages → data.

Each stage package may import itself and the packages before it in LAYERS, never one after
it, and nothing in tasks/ imports flows/ (the domain logic tests without Prefect's flows).
Lazy imports inside functions count too: they are imports all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TASKS = REPO / "tasks"
# In the order a newcomer reads them; each may import only those before it (and itself).
LAYERS = ("data", "baseline", "engine", "experiments", "window", "exit", "poc")


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in the file, at any depth."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # `from tasks.x import y` may name a module y: count it as tasks.x.y.
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if parts[0] == "tasks" and len(parts) > 1 else None


def test_every_task_module_is_in_a_stage_package() -> None:
    top = sorted(p.name for p in TASKS.glob("*.py"))
    assert top == ["__init__.py"], f"modules outside a stage package: {top}"
    packages = sorted(p.name for p in TASKS.iterdir() if (p / "__init__.py").exists())
    assert packages == sorted(LAYERS)


def test_imports_flow_one_way() -> None:
    wrong: list[str] = []
    for path in sorted(TASKS.rglob("*.py")):
        rel = path.relative_to(REPO)
        own = rel.parts[1] if len(rel.parts) > 2 else None
        for line, module in _imported_modules(path):
            if module.split(".")[0] == "flows":
                wrong.append(f"{rel}:{line} imports {module} (tasks never import flows)")
                continue
            other = _package(module)
            if own is None or other is None or other == own or other not in LAYERS:
                continue
            if LAYERS.index(other) > LAYERS.index(own):
                wrong.append(f"{rel}:{line} imports {module} ({own} is before {other})")
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_a_wrong_way_import(tmp_path: Path) -> None:
    # The test above cannot pass vacuously: a data module importing a stage is caught.
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from tasks.window.weekly import build_weekly_report\n")
    modules = [m for _, m in _imported_modules(bad)]
    assert "tasks.window.weekly" in modules
    assert LAYERS.index(_package("tasks.window.weekly") or "") > LAYERS.index("data")
