"""tasks/ is grouped by stage, and imports flow one way: flows → stage packages → data.

Each stage package may import itself and the packages before it in LAYERS, never one after
it, and nothing in tasks/ imports flows/ (the domain logic tests without Prefect's flows).
Lazy imports inside functions count too: they are imports all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
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


# --- the house's other rules --------------------------------------------------------------------

PACKAGES = ("flows", "tasks", "cli")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _import_graph() -> dict[str, set[str]]:
    """module → the project modules it imports (at any depth: lazy imports count)."""
    paths = [p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))]
    modules = {_module_name(p): p for p in paths}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for _, imported in _imported_modules(path):
            # `from a.b import c` names a.b.c when c is a module, else a.b
            if imported in modules and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle_anywhere() -> None:
    # A package importing its own submodules (an __init__ that lists them) is no circle
    # unless a submodule imports the package back; both count here.
    cycles = _cycles(_import_graph())
    assert not cycles, "import circles:\n" + "\n".join(" ↔ ".join(c) for c in cycles)


def test_the_circle_check_sees_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_flows_import_no_cli_and_tasks_no_cli() -> None:
    wrong = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for pkg in ("flows", "tasks")
        for path in sorted((REPO / pkg).rglob("*.py"))
        for line, module in _imported_modules(path)
        if module.split(".")[0] == "cli"
    ]
    assert not wrong, "\n".join(wrong)


def test_flows_holds_flows_only() -> None:
    # Every module in flows/ defines a Prefect flow, or is a helper the flows share.
    helpers = {"__init__.py", "common.py", "deploy_settings.py", "results.py", "short_window.py"}
    without = [
        p.name
        for p in sorted((REPO / "flows").glob("*.py"))
        if p.name not in helpers and "@flow(" not in p.read_text()
    ]
    assert not without, f"modules in flows/ without a flow: {without}"


def test_every_stage_has_a_flow_a_deployment_and_a_status_line(write_plan) -> None:
    import importlib

    import yaml

    from tasks.data.plan import load_plan
    from tasks.poc.progress import poc_state, state_lines
    from tasks.poc.stages import REGISTRY

    spec = yaml.safe_load((REPO / "prefect.yaml").read_text())
    entrypoints: dict[str, str] = {}
    for dep in spec["deployments"]:
        path, function = dep["entrypoint"].split(":")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        flow_name = getattr(module, function).name
        entrypoints[f"{flow_name}/{dep['name']}"] = dep["entrypoint"]
    plan = load_plan(write_plan(), check_cluster=False)
    lines = state_lines(poc_state(plan, plan.data_dir, scheduled=False).to_json())
    for stage in REGISTRY:
        assert stage.deployment in entrypoints, f"{stage.name}: no deployment {stage.deployment}"
        for call in stage.flows:
            function = getattr(importlib.import_module(call.module), call.function)
            assert hasattr(function, "fn"), f"{stage.name}: {call.target} is not a Prefect flow"
        if stage.flows:  # the deployment runs the stage's (last) flow
            last = stage.flows[-1]
            assert entrypoints[stage.deployment] == (
                f"{last.module.replace('.', '/')}.py:{last.function}"
            ), stage.name
        assert any(line.split()[0] == stage.name for line in lines), f"{stage.name}: no line"
        assert all(n in {s.name for s in REGISTRY} for n in stage.needs), stage.name
        # A stage needs only stages before it: the order `poc` runs them in is a gate order.
        order = [s.name for s in REGISTRY]
        assert all(order.index(n) < order.index(stage.name) for n in stage.needs), stage.name


MODULE_LINES = 600
FUNCTION_LINES = 80


def test_no_module_or_function_too_long_to_read() -> None:
    # A function may stay longer when the line above its `def` says why (`# long: ...`).
    wrong: list[str] = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            text = path.read_text()
            lines = text.splitlines()
            rel = path.relative_to(REPO)
            if len(lines) > MODULE_LINES:
                wrong.append(f"{rel}: {len(lines)} lines (over {MODULE_LINES})")
            for node in ast.walk(ast.parse(text)):
                if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                said = first >= 2 and lines[first - 2].strip().startswith("# long:")
                if length > FUNCTION_LINES and not said:
                    wrong.append(f"{rel}:{node.lineno} {node.name}: {length} lines")
    assert not wrong, "\n".join(wrong)


# --- backends: one package per layer, reached through the registries ----------------------------

BACKENDS = REPO / "tasks" / "engine" / "clusters"
STAGE_BACKENDS = REPO / "tasks" / "experiments" / "backends"
# What may name a backend package: the backends themselves, the two registries, and this
# machine's slots (machine.py: the registry's light part, for a bare GPU node).
MAY_IMPORT_A_BACKEND = (BACKENDS / "registry.py", BACKENDS / "machine.py", STAGE_BACKENDS)


def _backend_kinds() -> list[str]:
    return sorted(p.name for p in BACKENDS.iterdir() if (p / "__init__.py").exists())


def _imports_of_backends(path: Path, kinds: list[str]) -> list[str]:
    """The imports of a backend package in ``path``, a module outside every backend."""
    wrong = []
    for line, module in _imported_modules(path):
        for kind in kinds:
            if (module + ".").startswith(f"tasks.engine.clusters.{kind}."):
                wrong.append(f"{path.name}:{line} imports {module}")
    return wrong


def _outside_the_backends(path: Path, kinds: list[str]) -> bool:
    if any(path == p or path.is_relative_to(p) for p in MAY_IMPORT_A_BACKEND):
        return False
    return not any(path.is_relative_to(BACKENDS / kind) for kind in kinds)


def test_no_module_outside_a_backend_imports_one() -> None:
    """A stage reaches a backend through the `Cluster` protocol and the registries, never by
    importing its package (its cluster class, its faults, its job wrapper)."""
    kinds = _backend_kinds()
    assert kinds == ["local", "slurm"]
    wrong: list[str] = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if _outside_the_backends(path, kinds):
                wrong += [
                    f"{path.parent.relative_to(REPO)}/{w}"
                    for w in _imports_of_backends(path, kinds)
                ]
    assert not wrong, "\n".join(wrong)


def test_the_backend_check_sees_a_stage_importing_a_cluster_class(tmp_path: Path) -> None:
    bad = tmp_path / "stage.py"
    bad.write_text("def f():\n    from tasks.engine.clusters.local.cluster import LocalCluster\n")
    assert _imports_of_backends(bad, ["local", "slurm"])
    assert _outside_the_backends(TASKS / "experiments" / "overhead.py", ["local", "slurm"])
    assert not _outside_the_backends(BACKENDS / "slurm" / "job.py", ["local", "slurm"])


def test_a_backend_is_one_package_per_layer_and_one_entry_per_registry() -> None:
    from tasks.engine.clusters.registry import BUILT_KINDS, CLUSTER_KINDS
    from tasks.experiments.backends.registry import STAGE_RUNNERS

    kinds = _backend_kinds()
    assert sorted(BUILT_KINDS) == kinds, "a built kind without its package, or one unlisted"
    assert sorted(STAGE_RUNNERS) == kinds, "a backend without its stages' entry"
    stages = sorted(p.name for p in STAGE_BACKENDS.iterdir() if (p / "__init__.py").exists())
    assert stages == kinds
    for kind in kinds:
        assert (BACKENDS / kind / "backend.py").exists(), f"{kind}: its registry entry's module"
        assert CLUSTER_KINDS[kind].build is not None


# --- configuration: read from the environment by the settings modules alone -------------------

# Settings (tasks/data/settings.py) and the reading of three of them where pydantic is not
# (settings_bare.py) read CKPT_POC_* configuration; env_markers.py names the variables the PoC
# hands to its children. No other module spells a CKPT_POC_ name.
SETTINGS_MODULES = (TASKS / "data" / "settings.py", TASKS / "data" / "settings_bare.py")
MAY_SPELL_POC_NAMES = (*SETTINGS_MODULES, TASKS / "data" / "env_markers.py")


def _prose(tree: ast.AST) -> set[int]:
    """The string statements (docstrings, and the like): prose about a name, not the name."""
    return {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }


def _setting_names(tree: ast.AST, variables: set[str]) -> set[str]:
    """Constants bound to a setting's variable: ``X = env_name(...)``, ``X = "CKPT_POC_..."``."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _is_setting(node.value, variables, set()):
            found |= {t.id for t in node.targets if isinstance(t, ast.Name) and t.id.isupper()}
    return found


def _is_setting(node: ast.AST, variables: set[str], names: set[str]) -> bool:
    """``node`` stands for a setting's variable: its name spelled out, env_name(...), or a
    name bound to one (``names``, also as an attribute: ``par.WORKERS_ENV``)."""
    if isinstance(node, ast.Constant):
        return node.value in variables
    if isinstance(node, ast.Call):
        function = node.func
        return getattr(function, "id", getattr(function, "attr", None)) == "env_name"
    if isinstance(node, ast.Name | ast.Attribute):
        return getattr(node, "id", getattr(node, "attr", None)) in names
    return False


def _setting_reads(tree: ast.AST, variables: set[str], names: set[str]) -> list[int]:
    """Lines reading a setting's variable from a mapping: ``.get(X)``, ``getenv(X)``,
    ``environ[X]``, ``X in environ`` (writing one, ``env[X] = ...``, is handing it on)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            function = getattr(node.func, "attr", getattr(node.func, "id", None))
            hit = function in ("get", "getenv", "pop", "setdefault") and node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            hit = node.slice
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], ast.In | ast.NotIn):
            hit = node.left
        else:
            continue
        if hit and _is_setting(hit, variables, names):
            lines.append(node.lineno)
    return lines


def _configuration_problems(paths: list[Path], variables: set[str], fields: set[str]) -> list[str]:
    import re

    poc_name = re.compile(r"CKPT_POC_[A-Z0-9]")
    trees = {path: ast.parse(path.read_text(), str(path)) for path in paths}
    names = set().union(
        *(_setting_names(t, variables) for p, t in trees.items() if p not in SETTINGS_MODULES)
    )
    wrong: list[str] = []
    for path, tree in trees.items():
        rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        prose = _prose(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "env_name":
                field = node.args[0] if node.args else None
                if isinstance(field, ast.Constant) and field.value not in fields:
                    wrong.append(f"{rel}:{node.lineno}: env_name({field.value!r}) is no setting")
            if path in MAY_SPELL_POC_NAMES or id(node) in prose:
                continue
            if isinstance(node, ast.Constant) and isinstance(node.value, str | bytes):
                text = node.value if isinstance(node.value, str) else node.value.decode("latin-1")
                if poc_name.search(text):
                    wrong.append(f"{rel}:{node.lineno}: {text[:60]!r} (env_markers or settings)")
        if path not in SETTINGS_MODULES:
            wrong += [
                f"{rel}:{line}: reads a setting's variable (tasks.data.settings reads it)"
                for line in _setting_reads(tree, variables, names)
            ]
    return wrong


def test_configuration_is_read_by_the_settings_modules_alone(tmp_path: Path) -> None:
    """No module but the settings modules reads a CKPT_POC_* setting from the environment
    (os.environ, getenv, a caller's mapping), by its name or a constant bound to it; and no
    module but those and env_markers spells a CKPT_POC_ name in a string (prose may)."""
    from tasks.data.settings import Settings, env_name

    fields = set(Settings.model_fields)
    variables = {env_name(field) for field in fields}
    paths = [p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))]
    wrong = _configuration_problems(paths, variables, fields)
    assert not wrong, "\n".join(wrong)
    # The check cannot pass vacuously: each way of reading one, and a marker spelled out.
    bad = tmp_path / "bad.py"
    bad.write_text(
        '"""CKPT_POC_JOB in prose is fine."""\n'
        "import os\n"
        "from tasks.data.settings import env_name\n"
        'DIR_ENV = env_name("lock_dir")\n'
        'a = os.environ.get("CKPT_POC_LOCK_DIR")\n'
        "b = os.environ[DIR_ENV]\n"
        "c = os.getenv(env_name('criu'))\n"
        "d = DIR_ENV in os.environ\n"
        'e = {"CKPT_POC_JOB": "x"}\n'
        "f = env_name('no_such_setting')\n"
        "os.environ[DIR_ENV] = 'fine: handed on'\n"
    )
    found = _configuration_problems([bad], variables, fields)
    assert sorted(int(line.split(":")[1]) for line in found) == [5, 5, 6, 7, 8, 9, 10], found


# --- measures and checks: each declared once, named through its registry -----------------------

MEASURE_REGISTRY = TASKS / "data" / "measures.py"
CHECK_CATALOGUE = TASKS / "data" / "checks.py"
# Where a registered measure's name may be spelled besides the registry and the module that
# computes it, by file: there the word names something else (a column or a dataset that
# shares the name, a key of an output format), or the module still names the measure itself.
MEASURE_NAMES_ELSEWHERE: dict[str, frozenset[str]] = {
    # The datasets' declarations: trials and utilization columns, the utilization dataset.
    "tasks/data/datasets.py": frozenset(
        {"recovery_s", "work_lost_gpu_h", "goodput", "goodput_job_span", "utilization"}
    ),
    # The utilization gate, named after its stage.
    "tasks/data/checks.py": frozenset({"utilization"}),
    # The utilization flow's schedule, a plan field.
    "tasks/data/plan_window.py": frozenset({"utilization"}),
    # The utilization stage: its flow, command and dataset, and the columns it writes or shows.
    "tasks/window/utilization.py": frozenset({"goodput", "goodput_job_span"}),
    "flows/utilization.py": frozenset({"utilization", "goodput", "goodput_job_span"}),
    "cli/app.py": frozenset({"utilization"}),
    "cli/window.py": frozenset({"goodput"}),
    "tasks/poc/stages.py": frozenset({"utilization"}),
    "tasks/poc/record/figures.py": frozenset({"utilization"}),
    # The recovery stage's trials columns, as it writes and summarises them.
    "tasks/experiments/recovery.py": frozenset({"recovery_s", "work_lost_gpu_h"}),
    "tasks/experiments/results.py": frozenset({"recovery_s", "work_lost_gpu_h"}),
    # A key of compare_paired's result, which the overhead stage prints (--json): read back.
    "tasks/experiments/stats_results.py": frozenset({"overhead_pct"}),
    # A key of the GPU check's summary JSON (plain Python: it imports no registry).
    "tasks/poc/gpu_check/check.py": frozenset({"overhead_pct"}),
    # The goodput readings' column heading, the goodput section's key in the weekly report's
    # --json, the goodput figure's id, and the side-by-side table's goodput line.
    "tasks/window/weekly/goodput.py": frozenset({"goodput"}),
    "tasks/window/weekly/stage.py": frozenset({"goodput"}),
    "tasks/window/weekly/plots.py": frozenset({"goodput"}),
    "tasks/poc/record/sections.py": frozenset({"goodput"}),
}


def _project_files() -> list[Path]:
    return [p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py"))]


def _module_path(module: str) -> Path:
    return REPO / (module.replace(".", "/") + ".py")


def _string_literals(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string constant in the file, f-strings' parts included, prose
    (docstrings and other string statements) left out."""
    tree = ast.parse(path.read_text(), str(path))
    prose = _prose(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
    ]


def _measure_names_spelled(paths: list[Path]) -> tuple[list[str], set[tuple[str, str]]]:
    """Literal measure names outside the registry, their computation and the allowed files;
    and the (file, name) pairs of the allowed ones that were seen."""
    from tasks.data.measures import MEASURES

    wrong: list[str] = []
    seen: set[tuple[str, str]] = set()
    for path in paths:
        rel = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
        for line, text in _string_literals(path):
            measure = MEASURES.get(text)
            if measure is None or path in (MEASURE_REGISTRY, _module_path(measure.computed_in)):
                continue
            if text in MEASURE_NAMES_ELSEWHERE.get(rel, ()):
                seen.add((rel, text))
            else:
                wrong.append(
                    f"{rel}:{line}: {text!r} is a measure: read it from tasks.data.measures"
                )
    return wrong, seen


def test_each_measure_is_named_by_its_declaration_and_computation_alone(tmp_path: Path) -> None:
    """A measure's name is spelled in the registry and the module that computes it; every
    other module reads the registry. The exceptions are listed, each with why, and each is
    still needed."""
    wrong, seen = _measure_names_spelled(_project_files())
    assert not wrong, "\n".join(wrong)
    allowed = {(f, n) for f, names in MEASURE_NAMES_ELSEWHERE.items() for n in names}
    assert allowed <= seen, f"allowed but no longer spelled there: {sorted(allowed - seen)}"
    # The check cannot pass vacuously: a row compared with a spelled-out measure is caught,
    # prose about it is not.
    bad = tmp_path / "bad.py"
    bad.write_text('"""overhead_pct in prose is fine."""\nx = r["measure"] == "overhead_pct"\n')
    found = _measure_names_spelled([bad])[0]
    assert len(found) == 1 and found[0].endswith(
        ":2: 'overhead_pct' is a measure: read it from tasks.data.measures"
    ), found


def _checks_spelled(paths: list[Path]) -> list[str]:
    """Literal check names (a parametrised one's ``name[`` too) outside the catalogue and the
    modules that implement each."""
    from tasks.data.checks import CHECKS

    wrong = []
    for path in paths:
        rel = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        for line, text in _string_literals(path):
            for check in CHECKS:
                spelled = text == check.name or check.matches(text)
                home = {CHECK_CATALOGUE, *(_module_path(m) for m in check.modules)}
                if spelled and path not in home:
                    wrong.append(f"{rel}:{line}: {text!r} (tasks.data.checks: {check.name})")
    return wrong


def test_every_check_is_named_through_the_catalogue(tmp_path: Path) -> None:
    """A gate's check is spelled only in the catalogue and the modules that implement it;
    its readers (the six mistakes, the weekly rows) find it by its declaration. Each module
    the catalogue names does implement it: spells it or uses its constant."""
    import re

    from tasks.data import checks

    assert not (wrong := _checks_spelled(_project_files())), "\n".join(wrong)
    constants = {
        id(getattr(value, "check", value)): name
        for name, value in vars(checks).items()
        if isinstance(value, checks.Check | checks.ColumnRule | checks.TableRule)
    }
    for check in checks.CHECKS:
        for module in check.modules:
            path = _module_path(module)
            spelled = any(
                text == check.name or check.matches(text) for _, text in _string_literals(path)
            )
            used = re.search(rf"\b{constants[id(check)]}\b", path.read_text())
            assert spelled or used, f"{module} does not implement {check.name}"
    bad = tmp_path / "bad.py"
    bad.write_text('ok = not e.startswith("arms_differ_only_in_managed[")\n')
    assert len(_checks_spelled([bad])) == 1


def test_the_measure_registry_holds_together() -> None:
    """What the registry declares exists: each trials.measure has its clock, each module
    computes what it is said to, each decision criterion says what settles it, and the
    plan's `success:` has one field per criterion, in its order."""
    from tasks.data.checks import GATES
    from tasks.data.measures import CRITERIA, DECISION_CRITERIA, MEASURES, by_decision
    from tasks.data.plan import DecisionCriterion, Success
    from tasks.experiments.clocks import MEASURE_CLOCKS

    for m in MEASURES.values():
        assert m.trials is None or m.trials in MEASURE_CLOCKS, m.name
        assert set(m.gates) <= set(GATES), m.name
        assert _module_path(m.computed_in).exists(), m.name
    for criterion in DECISION_CRITERIA:
        assert by_decision(criterion).evidence is not None, criterion
    assert list(Success.model_fields) == [c.name for c in CRITERIA]
    assert DecisionCriterion.__args__ == DECISION_CRITERIA


def _arms_spelled(paths: list[Path]) -> list[str]:
    """Where an arm's name is written as a string outside tasks/data/arms.py."""
    arms_module = _module_path("tasks.data.arms")
    return [
        f"{path}:{line} {text!r}"
        for path in paths
        if path != arms_module
        for line, text in _string_literals(path)
        if text in ("managed", "unmanaged")
    ]


def test_the_arms_are_named_through_tasks_data_arms(tmp_path: Path) -> None:
    assert not _arms_spelled(_project_files()), "use MANAGED / UNMANAGED / ARMS of tasks.data.arms"
    planted = tmp_path / "planted.py"
    planted.write_text('ARM = "managed"\n')
    assert _arms_spelled([planted]) == [f"{planted}:1 'managed'"]  # the check can fail


# What may cross a layer as a bare ``dict[str, Any]``: a JSON document (read, printed or sent),
# a job spec, a template's context, a JSON form itself. Everything else has a type.
DICT_RETURNS_AT_MOST = 40


def _dict_returns(path: Path) -> list[tuple[int, bool]]:
    """Each function returning ``dict[str, Any]`` (or None): its line, and whether a
    ``# a dict: why`` comment stands on its def or just above it."""
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.returns is None:
            continue
        if ast.unparse(node.returns) not in ("dict[str, Any]", "dict[str, Any] | None"):
            continue
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        around = lines[max(first - 3, 0) : node.body[0].lineno - 1]
        found.append((node.lineno, any("# a dict:" in line for line in around)))
    return found


def test_a_dict_crosses_a_layer_only_where_it_is_the_honest_type(tmp_path: Path) -> None:
    returns = {
        f"{path.relative_to(REPO)}:{line}": said
        for path in _project_files()
        for line, said in _dict_returns(path)
    }
    unsaid = sorted(where for where, said in returns.items() if not said)
    assert not unsaid, f"say why a dict is the honest type (# a dict: …): {unsaid}"
    assert len(returns) <= DICT_RETURNS_AT_MOST, (
        f"{len(returns)} functions return dict[str, Any]; type what crosses a layer"
    )
    planted = tmp_path / "planted.py"
    planted.write_text("def f() -> dict[str, Any]:\n    return {}\n")
    assert _dict_returns(planted) == [(1, False)]  # the check can fail
